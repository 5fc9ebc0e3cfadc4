// The model picker: the server's chat models with their state (loaded, unloaded, loading
// with how far it is, failed with its cause), followed while one loads.

import { ApiError, call, enc } from "./api.js";

const $ = (id) => document.getElementById(id);
const MODEL = "podium.model";
const EVERY_MS = 500;               // how often a loading model's state is read again

const picker = { cards: [], watching: null, since: new Map(), hints: new Map(), expect: null };

// What the picker says of a model. A load's fraction is the server's (``load_progress``:
// llama.cpp reports one, vLLM does not); its seconds are counted here, from when this page
// first saw it loading.
export function describe(card, now = Date.now()) {
  if (!card) return ["", ""];
  if (card.state === "failed") return [`failed: ${card.error ?? "unknown cause"}`, "failed"];
  if (card.state === "loading") {
    const seconds = Math.round((now - (picker.since.get(card.id) ?? now)) / 1000);
    const part = typeof card.load_progress === "number"
      ? ` ${Math.floor(card.load_progress * 100)}%` : "";
    return [`loading…${part} ${seconds} s`, "loading"];
  }
  const hint = card.state === "unloaded" ? picker.hints.get(card.id) : undefined;
  return [hint ? `unloaded: ${hint}` : card.state, card.state];
}

function selected() {
  return picker.cards.find((c) => c.id === $("model").value);
}

function showState() {
  const [text, kind] = describe(selected());
  $("model-state").textContent = text;
  $("model-state").className = `state ${kind}`;
}

function noteLoading() {
  for (const card of picker.cards) {
    if (card.state !== "loading") picker.since.delete(card.id);
    else if (!picker.since.has(card.id)) picker.since.set(card.id, Date.now());
  }
}

export async function refreshModels() {
  const { data } = await call("GET", "/v1/models");
  picker.cards = data.filter((c) => (c.kind ?? "chat") === "chat");
  for (const card of picker.cards) {
    // asked for by this page and not begun yet (its estimate read, room made): on its way
    if (card.id === picker.expect && card.state === "unloaded") card.state = "loading";
  }
  noteLoading();
  const select = $("model");
  const want = select.value || localStorage.getItem(MODEL);
  select.replaceChildren(...picker.cards.map((card) => new Option(card.id, card.id)));
  if (picker.cards.some((c) => c.id === want)) select.value = want;
  showState();
  return picker.cards;
}

// Shown as loading at once, and followed until it is loaded or failed; ``expect`` holds
// while the request that loads it (``settle`` ends it) may not have reached the server.
function loading(card) {
  card.state = "loading";
  card.load_progress = null;
  picker.since.set(card.id, Date.now());
  picker.expect = card.id;
  showState();
  watch();
  return () => {
    if (picker.expect === card.id) picker.expect = null;
  };
}

// Choosing an unloaded model loads it; without the operator's key (403) the model loads
// with its first message instead, and the picker says so.
export async function choose() {
  localStorage.setItem(MODEL, $("model").value);
  const card = selected();
  if (card?.state !== "unloaded" && card?.state !== "failed") {
    showState();
    if (card?.state === "loading") watch();     // (another client's load: followed too)
    return;
  }
  const settle = loading(card);
  try {
    await call("POST", `/v1/models/${enc(card.id)}/load`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 403) {
      picker.hints.set(card.id, "loads with the first message");
    }
  } finally {
    settle();
  }
  await refreshModels().catch(() => {});
}

function watch() {
  clearInterval(picker.watching);
  picker.watching = setInterval(async () => {
    await refreshModels().catch(() => {});
    if (!picker.cards.some((c) => c.state === "loading")) {
      clearInterval(picker.watching);
      picker.watching = null;
    }
  }, EVERY_MS);
}

export function currentModel() {
  return $("model").value;
}

// A message to a model not loaded loads it: shown as loading from now until the message's
// request ends (the function returned).
export function watchModel() {
  const card = selected();
  return card && card.state !== "loaded" ? loading(card) : () => {};
}
