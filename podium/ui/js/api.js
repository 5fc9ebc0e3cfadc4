// Podium's own API, as any client calls it: the key as a Bearer token (never in a URL),
// JSON in and out, server-sent events read from a fetch body.

const KEY = "podium.key";

export function apiKey() {
  return sessionStorage.getItem(KEY) ?? localStorage.getItem(KEY) ?? "";
}

// Kept for this tab only (session storage), or on this device when the user asks.
export function setApiKey(key, remember) {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
  (remember ? localStorage : sessionStorage).setItem(KEY, key);
}

export function forgetApiKey() {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, body) {
    const error = body?.error;
    super(typeof error === "object" && error ? error.message : `HTTP ${status}`);
    this.status = status;
    this.code = error?.code ?? null;
  }
}

// Listeners told when the server refuses the key (the app asks for another).
export const unauthorized = new EventTarget();

function headers(json) {
  const out = {};
  const key = apiKey();
  if (key) out.authorization = `Bearer ${key}`;
  if (json) out["content-type"] = "application/json";
  return out;
}

async function send(method, path, body, signal) {
  const response = await fetch(path, {
    method, signal, headers: headers(body !== undefined), cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) {
    const error = new ApiError(response.status, await response.json().catch(() => null));
    if (response.status === 401) unauthorized.dispatchEvent(new Event("401"));
    throw error;
  }
  return response;
}

export async function call(method, path, body, signal) {
  return (await send(method, path, body, signal)).json();
}

// The events of a server-sent stream, each data line's JSON, as they arrive.
export async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart()).join("\n");
      if (data && data !== "[DONE]") yield JSON.parse(data);
    }
  }
}

export async function* stream(path, body, signal) {
  yield* events(await send("POST", path, body, signal));
}

// Every page of a list endpoint (``after`` cursors), oldest first where the API allows.
export async function listAll(path, limit = 100) {
  const out = [];
  let after = null;
  for (;;) {
    const query = new URLSearchParams({ limit: String(limit), order: "asc" });
    if (after) query.set("after", after);
    const page = await call("GET", `${path}?${query}`);
    out.push(...page.data);
    if (!page.has_more || !page.last_id) return out;
    after = page.last_id;
  }
}

export const enc = encodeURIComponent;
