// The system prompt and sampling settings sent with each turn, and named presets of them,
// kept in this browser (localStorage).

const $ = (id) => document.getElementById(id);
const FIELDS = ["system", "temperature", "top_p", "max_output_tokens"];
const PRESETS = "podium.presets";
const CURRENT = "podium.settings";

const read = (name) => JSON.parse(localStorage.getItem(name) || "{}");

function values() {
  return Object.fromEntries(FIELDS.map((f) => [f, $(f).value]));
}

function fill(saved) {
  for (const f of FIELDS) $(f).value = saved[f] ?? "";
}

function showPresets(chosen) {
  const names = Object.keys(read(PRESETS)).sort();
  $("preset").replaceChildren(new Option("(none)", ""), ...names.map((n) => new Option(n, n)));
  $("preset").value = names.includes(chosen) ? chosen : "";
}

export function initSettings() {
  fill(read(CURRENT));
  showPresets();
  $("settings").addEventListener("input", () => localStorage.setItem(CURRENT, JSON.stringify(values())));
  $("settings").addEventListener("submit", (event) => event.preventDefault());
  $("settings-toggle").addEventListener("click", () => {
    const shown = $("settings").hidden;
    $("settings").hidden = !shown;
    $("settings-toggle").setAttribute("aria-expanded", String(shown));
  });
  $("preset").addEventListener("change", () => {
    const preset = read(PRESETS)[$("preset").value];
    if (preset) {
      fill(preset);
      localStorage.setItem(CURRENT, JSON.stringify(values()));
    }
  });
  $("save-preset").addEventListener("click", () => {
    const name = prompt("Preset name", $("preset").value || "")?.trim();
    if (!name) return;
    localStorage.setItem(PRESETS, JSON.stringify({ ...read(PRESETS), [name]: values() }));
    showPresets(name);
  });
  $("delete-preset").addEventListener("click", () => {
    const presets = read(PRESETS);
    delete presets[$("preset").value];
    localStorage.setItem(PRESETS, JSON.stringify(presets));
    showPresets();
  });
  return {
    // the Responses API's fields for these settings (empty ones: the server's defaults)
    request() {
      const v = values();
      const out = {};
      if (v.system.trim()) out.instructions = v.system;
      for (const f of ["temperature", "top_p"]) if (v[f] !== "") out[f] = Number(v[f]);
      if (v.max_output_tokens !== "") out.max_output_tokens = Number(v.max_output_tokens);
      return out;
    },
  };
}
