// The chat: a conversation kept on the server (the Conversations API), each turn a streamed
// background response (the Responses API) that appends its input and output to it when it
// finishes; stop cancels the response, regenerate and edit delete the turn's items and send
// again. What is shown after a turn is what the server holds.

import { ApiError, call, enc, listAll, stream } from "./api.js";
import { initHistory } from "./history.js";
import { currentModel, refreshModels, watchModel } from "./models.js";
import { initSettings } from "./settings.js";
import { renderMarkdown } from "./render.js";

const $ = (id) => document.getElementById(id);
const RENDER_MS = 120;                          // a streaming answer is redrawn at most this often
const MAX_ATTACHMENT = 512 * 1024;              // bytes of one attached file
const TERMINAL = new Set(["response.completed", "response.incomplete", "response.failed"]);

const state = { conversation: null, items: [], running: null, attachments: [] };

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(text, onClick, className = "small") {
  const node = el("button", className, text);
  node.type = "button";
  node.addEventListener("click", onClick);
  return node;
}

const textOf = (parts) => (typeof parts === "string" ? parts
  : (parts ?? []).map((p) => p.text ?? p.refusal ?? `[${p.type}]`).join("\n\n"));

// -- showing items ---------------------------------------------------------------------

function userMessage(item, index) {
  const box = el("div", "message user");
  const who = el("div", "who", "You");
  const body = el("div", "body", textOf(item.content));
  box.append(who, body);
  if (index !== undefined) {
    const actions = el("div", "actions");
    actions.append(button("Edit", () => edit(index, box)));
    box.append(actions);
  }
  return box;
}

function assistantTurn() {
  const box = el("div", "message assistant");
  box.append(el("div", "who", "Assistant"));
  const body = el("div", "body");
  box.append(body);
  return { box, body };
}

function reasoningBlock(text, open) {
  const details = el("details", "reasoning");
  details.open = open;
  details.append(el("summary", "", "Reasoning"), el("div", "text", text));
  return details;
}

function toolBlock(item) {
  const block = el("div", "tool");
  const title = el("div", "title");
  const args = el("pre", "args");
  const result = el("pre", "result");
  result.hidden = true;
  block.append(title, args, result);
  updateTool({ title, args, result }, item);
  return { block, title, args, result };
}

function updateTool(view, item) {
  const where = item.type === "mcp_call" ? `${item.server_label}.${item.name}` : item.name;
  const status = item.error ? `failed: ${typeof item.error === "string" ? item.error
    : JSON.stringify(item.error)}` : (item.status ?? "");
  view.title.textContent = `${item.type === "mcp_call" ? "MCP call" : "Tool call"} ${where} ${status}`;
  view.args.textContent = item.arguments ?? item.input ?? "";
  const output = item.output ?? null;
  view.result.hidden = output === null;
  if (output !== null) view.result.textContent = `→ ${typeof output === "string" ? output : JSON.stringify(output)}`;
}

function itemView(item) {
  switch (item.type) {
    case "message": {
      const body = el("div", "markdown");
      renderMarkdown(body, textOf(item.content), true);
      return body;
    }
    case "reasoning":
      return reasoningBlock(textOf(item.content?.length ? item.content : item.summary), false);
    case "function_call": case "mcp_call": case "custom_tool_call":
      return toolBlock(item).block;
    case "function_call_output":
      return el("pre", "tool", `Tool output: ${item.output}`);
    case "mcp_list_tools":
      return el("div", "tool", `Listed the tools of ${item.server_label}`);
    default:
      return el("div", "tool", item.type);
  }
}

// The conversation's items: user messages, and each run of the model's items as one turn.
function showItems() {
  const list = $("messages");
  list.replaceChildren();
  let turn = null;
  const lastUser = state.items.findLastIndex((i) => i.type === "message" && i.role === "user");
  state.items.forEach((item, index) => {
    if (item.type === "message" && item.role === "user") {
      turn = null;
      list.append(userMessage(item, index));
      return;
    }
    if (!turn) {
      turn = assistantTurn();
      list.append(turn.box);
    }
    turn.body.append(itemView(item));
    if (index === state.items.length - 1 && lastUser >= 0) {
      const actions = el("div", "actions");
      actions.append(button("Regenerate", regenerate));
      turn.box.append(actions);
    }
  });
  list.scrollTop = list.scrollHeight;
}

// -- a streamed turn -------------------------------------------------------------------

// Follows one response's events into its turn's blocks (one per output item).
class TurnView {
  constructor() {
    Object.assign(this, assistantTurn());
    this.blocks = new Map();
    this.note = el("div", "note", "…");
    this.box.append(this.note);
    $("messages").append(this.box);
    this.timer = null;
  }

  event(event) {
    const block = this.blocks.get(event.output_index);
    switch (event.type) {
      case "response.created":
        return event.response.id;
      case "response.output_item.added":
        this.open(event.output_index, event.item);
        break;
      case "response.output_text.delta": case "response.reasoning_text.delta":
      case "response.function_call_arguments.delta": case "response.mcp_call_arguments.delta":
      case "response.custom_tool_call_input.delta":
        if (block) { block.text += event.delta; this.redraw(block); }
        break;
      case "response.output_item.done":
        if (block) this.done(block, event.item);
        break;
      case "error":
        this.finish("failed", event.message ?? event.error?.message ?? "error");
        break;
      default:
        if (TERMINAL.has(event.type)) this.finish(event.response.status, event.response.error?.message
          ?? event.response.incomplete_details?.reason);
    }
    return null;
  }

  open(index, item) {
    let block;
    if (item.type === "message") {
      block = { kind: "text", view: el("div", "markdown"), text: "" };
    } else if (item.type === "reasoning") {
      const view = reasoningBlock("", true);
      block = { kind: "reasoning", view, target: view.querySelector(".text"), text: "" };
    } else if (["function_call", "mcp_call", "custom_tool_call"].includes(item.type)) {
      const tool = toolBlock(item);
      block = { kind: "tool", view: tool.block, tool, item, text: "" };
    } else {
      block = { kind: "other", view: itemView(item), text: "" };
    }
    this.blocks.set(index, block);
    this.body.append(block.view);
  }

  redraw(block) {
    if (block.kind === "reasoning") {
      block.target.textContent = block.text;
    } else if (block.kind === "tool") {
      block.tool.args.textContent = block.text;
    } else if (block.kind === "text" && !block.pending) {
      block.pending = true;                     // markdown is redrawn at most every RENDER_MS
      const wait = block.text.length > 200_000 ? 1000 : RENDER_MS;
      setTimeout(() => {
        block.pending = false;
        renderMarkdown(block.view, block.text, false);
        this.follow();
      }, wait);
    }
    this.follow();
  }

  done(block, item) {
    if (block.kind === "text") {
      block.text = textOf(item.content);
      renderMarkdown(block.view, block.text, true);
    } else if (block.kind === "reasoning") {
      block.view.open = false;
    } else if (block.kind === "tool") {
      updateTool(block.tool, item);
    }
  }

  follow() {
    const list = $("messages");
    if (list.scrollHeight - list.scrollTop - list.clientHeight < 120) list.scrollTop = list.scrollHeight;
  }

  finish(status, detail) {
    this.status = status;
    const words = { completed: "", incomplete: `Stopped early (${detail ?? "incomplete"})`,
      failed: `Failed: ${detail ?? "error"}`, cancelled: "Stopped" };
    this.note.textContent = words[status] ?? status;
    this.note.className = `note ${status}`;
  }
}

function running(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("prompt").toggleAttribute("aria-busy", on);
}

function showError(message) {
  $("composer-error").textContent = message;
  $("composer-error").hidden = !message;
}

async function ensureConversation(parts) {
  if (state.conversation) return;
  const title = textOf(parts.slice(0, 1)).trim().slice(0, 80) || "Untitled";
  state.conversation = await call("POST", "/v1/conversations", { metadata: { title } });
  history.added(state.conversation);
  showHeader();
}

async function send(parts) {
  const model = currentModel();
  if (!model) return showError("No chat model to talk to.");
  if (state.running) return;
  showError("");
  await ensureConversation(parts);
  $("messages").append(userMessage({ content: parts }));
  const turn = new TurnView();
  const controller = new AbortController();
  state.running = { controller, id: null, turn };
  running(true);
  await refreshModels().catch(() => {});
  const settle = watchModel();
  const body = { model, conversation: state.conversation.id, stream: true, background: true,
    store: true, input: [{ type: "message", role: "user", content: parts }],
    ...settings.request() };
  try {
    for await (const event of stream("/v1/responses", body, controller.signal)) {
      const id = turn.event(event);
      if (id) state.running.id = id;
    }
  } catch (error) {
    if (controller.signal.aborted) turn.finish("cancelled");
    else turn.finish("failed", error.message);
  } finally {
    settle();
    state.running = null;
    running(false);
  }
  if (turn.status === "completed" || turn.status === "incomplete") await reload();
}

function stop() {
  const run = state.running;
  if (!run) return;
  if (run.id) call("POST", `/v1/responses/${enc(run.id)}/cancel`).catch(() => {});
  run.controller.abort();
}

async function reload() {
  state.items = await listAll(`/v1/conversations/${enc(state.conversation.id)}/items`);
  showItems();
}

// Deletes the items from ``index`` on (a turn and everything after it), then sends again.
async function resend(index, parts) {
  if (state.running) return;
  try {
    for (const item of state.items.slice(index)) {
      await call("DELETE", `/v1/conversations/${enc(state.conversation.id)}/items/${enc(item.id)}`);
    }
  } catch (error) {
    return showError(`Could not change the conversation: ${error.message}`);
  }
  state.items = state.items.slice(0, index);
  showItems();
  await send(parts);
}

function regenerate() {
  const index = state.items.findLastIndex((i) => i.type === "message" && i.role === "user");
  if (index >= 0) resend(index, state.items[index].content);
}

function edit(index, box) {
  const parts = state.items[index].content;
  const area = el("textarea", "edit-box");
  area.value = parts[0]?.text ?? "";
  area.setAttribute("aria-label", "Edit message");
  const actions = el("div", "actions");
  actions.append(
    button("Send", () => resend(index, [{ type: "input_text", text: area.value }, ...parts.slice(1)]), ""),
    button("Cancel", showItems));
  box.querySelector(".body").replaceChildren(area);
  box.querySelector(".actions").replaceWith(actions);
  area.focus();
}

// -- composing -------------------------------------------------------------------------

function showAttachments() {
  $("attachments").replaceChildren(...state.attachments.map((file, i) => {
    const chip = el("span", "chip", file.name);
    chip.append(button("×", () => { state.attachments.splice(i, 1); showAttachments(); }, ""));
    chip.lastChild.setAttribute("aria-label", `Remove ${file.name}`);
    return chip;
  }));
}

// Text files become input text; anything else is refused with the reason, one line a
// file (Podium's models read text only: an image would be a 400).
async function attach(files) {
  const refused = [];
  for (const file of files) {
    const why = await addAttachment(file);
    if (why) refused.push(why);
  }
  showError(refused.join("\n"));
  showAttachments();
}

async function addAttachment(file) {
  if (file.type.startsWith("image/")) {
    return `${file.name}: images cannot be sent; the models this server runs read text only.`;
  }
  if (file.size > MAX_ATTACHMENT) return `${file.name} is larger than ${MAX_ATTACHMENT / 1024} KB.`;
  const bytes = new Uint8Array(await file.arrayBuffer());
  try {
    state.attachments.push({ name: file.name,
      text: new TextDecoder("utf-8", { fatal: true }).decode(bytes) });
  } catch {
    return `${file.name} is not a text file (not UTF-8).`;
  }
  return null;
}

function submit() {
  const text = $("prompt").value;
  if (!text.trim() && !state.attachments.length) return;
  const parts = [{ type: "input_text", text },
    ...state.attachments.map((f) => ({ type: "input_text",
      text: `File ${f.name}:\n\`\`\`\n${f.text}\n\`\`\`` }))];
  $("prompt").value = "";
  state.attachments = [];
  showAttachments();
  send(parts).catch((error) => showError(error instanceof ApiError ? error.message : String(error)));
}

function initComposer() {
  $("composer").addEventListener("submit", (event) => { event.preventDefault(); submit(); });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      submit();
    }
  });
  document.addEventListener("keydown", (event) => { if (event.key === "Escape") stop(); });
  $("stop").addEventListener("click", stop);
  $("attach-button").addEventListener("click", () => $("attach").click());
  $("attach").addEventListener("change", (event) => {
    attach([...event.target.files]);
    event.target.value = "";
  });
}

// -- conversations ---------------------------------------------------------------------

function showHeader() {
  const c = state.conversation;
  $("chat-title").textContent = c ? (c.metadata?.title || c.id) : "New chat";
  $("chat-actions").hidden = !c;
}

async function open(conversation) {
  stop();
  state.conversation = conversation;
  showHeader();
  if (!conversation) {
    state.items = [];
    showItems();
    $("prompt").focus();
    return;
  }
  await reload();
}

let history = null;
let settings = null;

export function initChat() {
  initComposer();
  settings = initSettings();
  history = initHistory({ open, current: () => state.conversation, changed: showHeader });
  $("new-chat").addEventListener("click", () => open(null));
  return { start: () => open(null).then(() => history.load()) };
}
