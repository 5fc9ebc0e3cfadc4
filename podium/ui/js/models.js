// The model picker: the server's chat models with their state (loaded, unloaded, loading,
// failed with its cause), followed while one loads.

import { ApiError, call, enc } from "./api.js";

const $ = (id) => document.getElementById(id);
const MODEL = "podium.model";

const picker = { cards: [], watching: null };

function describe(card) {
  if (!card) return ["", ""];
  if (card.state === "failed") return [`failed: ${card.error ?? "unknown cause"}`, "failed"];
  if (card.state === "loading") {
    const since = picker.loadingSince ?? Date.now();
    return [`loading… ${Math.round((Date.now() - since) / 1000)} s`, "loading"];
  }
  return [card.state, card.state];
}

function selected() {
  return picker.cards.find((c) => c.id === $("model").value);
}

function showState() {
  const [text, kind] = describe(selected());
  $("model-state").textContent = text;
  $("model-state").className = `state ${kind}`;
}

export async function refreshModels() {
  const { data } = await call("GET", "/v1/models");
  picker.cards = data.filter((c) => (c.kind ?? "chat") === "chat");
  const select = $("model");
  const want = select.value || localStorage.getItem(MODEL);
  select.replaceChildren(...picker.cards.map((card) => new Option(card.id, card.id)));
  if (picker.cards.some((c) => c.id === want)) select.value = want;
  showState();
  return picker.cards;
}

// Choosing an unloaded model loads it (an operator's key may load by hand; another key's
// first message loads it); its state is followed until it settles.
export async function choose() {
  localStorage.setItem(MODEL, $("model").value);
  const card = selected();
  if (card?.state === "unloaded") {
    picker.loadingSince = Date.now();
    call("POST", `/v1/models/${enc(card.id)}/load`).catch((error) => {
      if (error instanceof ApiError && error.status === 403) {
        $("model-state").textContent = "unloaded: loads with the first message";
      }
    });
  }
  watch();
}

function watch() {
  clearInterval(picker.watching);
  picker.watching = setInterval(async () => {
    await refreshModels().catch(() => {});
    const state = selected()?.state;
    if (state !== "loading" && state !== "unloaded") {
      clearInterval(picker.watching);
      picker.loadingSince = null;
    }
  }, 1000);
}

export function currentModel() {
  return $("model").value;
}

export function watchModel() {
  picker.loadingSince = Date.now();
  watch();
}

