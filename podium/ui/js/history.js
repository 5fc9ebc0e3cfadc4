// The conversations this key has on the server (GET /v1/conversations, newest first, a page
// at a time): open, rename, delete, export as JSON, import from JSON.

import { call, enc, listAll } from "./api.js";

const $ = (id) => document.getElementById(id);
const PAGE = 30;
const IMPORT_CHUNK = 20;            // items per request (the Conversations API's limit)
const FORMAT = "podium.conversation.v1";

export function initHistory({ open, current, changed }) {
  let after = null;

  function entry(conversation) {
    const li = document.createElement("li");
    li.dataset.id = conversation.id;
    const pick = document.createElement("button");
    pick.type = "button";
    pick.textContent = conversation.metadata?.title || conversation.id;
    const when = document.createElement("time");
    when.dateTime = new Date(conversation.created_at * 1000).toISOString();
    when.textContent = new Date(conversation.created_at * 1000).toLocaleString();
    pick.append(when);
    pick.addEventListener("click", () => {
      mark(conversation.id);
      $("sidebar").classList.remove("open");
      open(conversation);
    });
    li.append(pick);
    li.conversation = conversation;
    return li;
  }

  function mark(id) {
    for (const b of $("conversations").querySelectorAll("button")) {
      b.setAttribute("aria-current", String(b.parentElement.dataset.id === id));
    }
  }

  async function load(more = false) {
    if (!more) {
      after = null;
      $("conversations").replaceChildren();
    }
    const query = new URLSearchParams({ limit: String(PAGE), order: "desc" });
    if (after) query.set("after", after);
    const page = await call("GET", `/v1/conversations?${query}`);
    $("conversations").append(...page.data.map(entry));
    after = page.last_id;
    $("more-conversations").hidden = !page.has_more;
    mark(current()?.id);
  }

  function replace(conversation) {
    const old = $("conversations").querySelector(`li[data-id="${CSS.escape(conversation.id)}"]`);
    old?.replaceWith(entry(conversation));
    mark(conversation.id);
  }

  async function rename() {
    const conversation = current();
    const title = prompt("Title", conversation.metadata?.title ?? "")?.trim();
    if (!title) return;
    const updated = await call("POST", `/v1/conversations/${enc(conversation.id)}`,
      { metadata: { ...conversation.metadata, title: title.slice(0, 512) } });
    Object.assign(conversation, updated);
    replace(conversation);
    changed();
  }

  async function remove() {
    const conversation = current();
    if (!confirm(`Delete "${conversation.metadata?.title || conversation.id}" from the server?`)) return;
    await call("DELETE", `/v1/conversations/${enc(conversation.id)}`);
    $("conversations").querySelector(`li[data-id="${CSS.escape(conversation.id)}"]`)?.remove();
    open(null);
  }

  async function exportJSON() {
    const conversation = current();
    const items = await listAll(`/v1/conversations/${enc(conversation.id)}/items`);
    const blob = new Blob([JSON.stringify({ format: FORMAT, conversation, items }, null, 2)],
      { type: "application/json" });
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = `${(conversation.metadata?.title || conversation.id).replace(/[^\w.-]+/g, "_")}.json`;
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 1000);
  }

  // A file exported here (or any {"items": [...]}) becomes a new conversation of this key.
  async function importJSON(file) {
    const data = JSON.parse(await file.text());
    if (!Array.isArray(data?.items)) throw new Error("not a conversation export (no items)");
    const title = String(data.conversation?.metadata?.title || file.name).slice(0, 500);
    const { items } = data;
    const conversation = await call("POST", "/v1/conversations",
      { metadata: { title }, items: items.slice(0, IMPORT_CHUNK) });
    for (let i = IMPORT_CHUNK; i < items.length; i += IMPORT_CHUNK) {
      await call("POST", `/v1/conversations/${enc(conversation.id)}/items`,
        { items: items.slice(i, i + IMPORT_CHUNK) });
    }
    added(conversation);
    open(conversation);
  }

  function added(conversation) {
    $("conversations").prepend(entry(conversation));
    mark(conversation.id);
  }

  const report = (what) => (error) => alert(`${what}: ${error.message}`);
  $("more-conversations").addEventListener("click", () => load(true).catch(report("Listing failed")));
  $("rename").addEventListener("click", () => rename().catch(report("Rename failed")));
  $("delete").addEventListener("click", () => remove().catch(report("Delete failed")));
  $("export").addEventListener("click", () => exportJSON().catch(report("Export failed")));
  $("import").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", (event) => {
    const [file] = event.target.files;
    event.target.value = "";
    if (file) importJSON(file).catch(report("Import failed"));
  });
  return { load, added };
}
