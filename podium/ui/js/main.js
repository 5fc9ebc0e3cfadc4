// The page: the key prompt and the two views (chat, server).

import { ApiError, apiKey, forgetApiKey, setApiKey, unauthorized } from "./api.js";
import { initChat } from "./chat.js";
import { choose, refreshModels } from "./models.js";
import { initServer } from "./server.js";

const $ = (id) => document.getElementById(id);

// -- the key ---------------------------------------------------------------------------

function askKey(why) {
  $("key-why").textContent = why;
  if ($("key-dialog").open) return;
  $("key-input").value = "";
  $("key-dialog").showModal();
}

function initKey() {
  $("key-form").addEventListener("submit", () => {     // (a dialog form: it closes the dialog)
    setApiKey($("key-input").value.trim(), $("key-remember").checked);
    start();
  });
  $("key-forget").addEventListener("click", () => {
    forgetApiKey();
    location.reload();
  });
  $("key-button").addEventListener("click", () => askKey(
    apiKey() ? "Replace the API key this page sends." : "Enter an API key to send."));
  unauthorized.addEventListener("401", () => askKey(
    apiKey() ? "The server refused this key: enter another." : "This server needs an API key."));
}

// -- views -----------------------------------------------------------------------------

function initViews(server) {
  const show = (chat) => {
    $("chat-view").hidden = !chat;
    $("server-view").hidden = chat;
    $("tab-chat").setAttribute("aria-pressed", String(chat));
    $("tab-server").setAttribute("aria-pressed", String(!chat));
    server.visible(!chat);
  };
  $("tab-chat").addEventListener("click", () => show(true));
  $("tab-server").addEventListener("click", () => show(false));
  $("menu").addEventListener("click", () => {
    const open = $("sidebar").classList.toggle("open");
    $("menu").setAttribute("aria-expanded", String(open));
  });
}

let chat = null;

async function start() {
  try {
    await refreshModels();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return;    // the key prompt is up
    $("model-state").textContent = `cannot reach the server: ${error.message}`;
    return;
  }
  await chat.start();
}

initKey();
$("model").addEventListener("change", choose);
chat = initChat();
initViews(initServer());
start();
