// A model's answer as safe HTML. Model output is untrusted: markdown is parsed with raw HTML
// shown as text, the result is sanitized (no script, no event handlers, no javascript: or
// data: links, no images, forms or frames), remote images become links the user may click,
// and links open in a new tab without a referrer. The page's Content-Security-Policy (no
// inline script, images only from the server itself) stops whatever a sanitizer might miss.

import { Marked } from "../vendor/marked/marked.esm.js";
import DOMPurify from "../vendor/dompurify/purify.es.js";
import hljs from "../vendor/highlight/core.min.js";
import bash from "../vendor/highlight/languages/bash.min.js";
import c from "../vendor/highlight/languages/c.min.js";
import cpp from "../vendor/highlight/languages/cpp.min.js";
import css from "../vendor/highlight/languages/css.min.js";
import diff from "../vendor/highlight/languages/diff.min.js";
import go from "../vendor/highlight/languages/go.min.js";
import java from "../vendor/highlight/languages/java.min.js";
import javascript from "../vendor/highlight/languages/javascript.min.js";
import json from "../vendor/highlight/languages/json.min.js";
import markdown from "../vendor/highlight/languages/markdown.min.js";
import python from "../vendor/highlight/languages/python.min.js";
import rust from "../vendor/highlight/languages/rust.min.js";
import shell from "../vendor/highlight/languages/shell.min.js";
import sql from "../vendor/highlight/languages/sql.min.js";
import typescript from "../vendor/highlight/languages/typescript.min.js";
import xml from "../vendor/highlight/languages/xml.min.js";
import yaml from "../vendor/highlight/languages/yaml.min.js";

const LANGUAGES = { bash, c, cpp, css, diff, go, java, javascript, json, markdown, python,
  rust, shell, sql, typescript, xml, yaml };
for (const [name, grammar] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, grammar);
hljs.configure({ ignoreUnescapedHTML: true });

const HIGHLIGHT_LIMIT = 100_000;    // characters of code highlighted; longer stays plain

const escape = (text) => text.replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);

// $$…$$ and \[…\] as blocks, $…$ and \(…\) inline: a placeholder KaTeX fills after sanitizing
function math(name, level, pattern, display) {
  return {
    name, level,
    start: (src) => src.search(level === "block" ? /^(\$\$|\\\[)/m : /\$|\\\(/),
    tokenizer(src) {
      const found = pattern.exec(src);
      if (found) return { type: name, raw: found[0], tex: found.slice(1).find((g) => g !== undefined).trim() };
      return undefined;
    },
    renderer: (token) => (display
      ? `<div class="math display" data-tex="${escape(token.tex)}"></div>\n`
      : `<span class="math" data-tex="${escape(token.tex)}"></span>`),
  };
}

const marked = new Marked({
  gfm: true,
  extensions: [
    math("blockMath", "block", /^(?:\$\$([\s\S]+?)\$\$|\\\[([\s\S]+?)\\\])[ \t]*(?:\n|$)/, true),
    math("inlineMath", "inline",
      /^(?:\$\$([^$]+?)\$\$|\$(?!\s)([^$\n]+?)(?<!\s)\$(?!\d)|\\\(([\s\S]+?)\\\))/, false),
  ],
  renderer: {
    html: ({ text }) => escape(text),                   // raw HTML is shown, never parsed
    image: ({ href, text }) =>
      `<a class="image-link" href="${escape(href)}">image: ${escape(text || href)}</a>`,
  },
});

const PURIFY = {
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option", "iframe",
    "object", "embed", "svg", "math", "img", "video", "audio", "source", "picture", "link",
    "meta", "base", "dialog"],
  FORBID_ATTR: ["style", "srcset", "id", "name", "action", "formaction"],
  ALLOW_DATA_ATTR: false,
  ADD_ATTR: ["data-tex", "target"],
};
const CLASSES = { CODE: /^language-[\w+#.-]{1,40}$/, SPAN: /^math$/, DIV: /^math display$/,
  A: /^image-link$/ };

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  const allowed = CLASSES[node.nodeName];
  if (node.hasAttribute("class") && !(allowed && allowed.test(node.getAttribute("class")))) {
    node.removeAttribute("class");
  }
  if (node.hasAttribute("data-tex") && !(node.nodeName === "SPAN" || node.nodeName === "DIV")) {
    node.removeAttribute("data-tex");
  }
  if (node.nodeName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

// Fills ``into`` with the answer ``text`` rendered; ``final``: also highlight code and
// typeset math (skipped while it streams, where the text is rendered again and again).
export function renderMarkdown(into, text, final) {
  into.replaceChildren(DOMPurify.sanitize(marked.parse(text), { ...PURIFY,
    RETURN_DOM_FRAGMENT: true }));
  for (const code of into.querySelectorAll("pre > code")) decorateCode(code, final);
  const formulas = into.querySelectorAll("[data-tex]");
  if (formulas.length) typeset(formulas);
}

function decorateCode(code, final) {
  const pre = code.parentElement;
  const bar = document.createElement("div");
  bar.className = "code-bar";
  const language = (code.className.match(/^language-(.+)$/) || [])[1] || "text";
  const label = document.createElement("span");
  label.textContent = language;
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "copy";
  copy.textContent = "Copy";
  copy.setAttribute("aria-label", `Copy ${language} code`);
  copy.addEventListener("click", () => copyText(code.textContent, copy));
  bar.append(label, copy);
  pre.before(bar);
  if (final && code.textContent.length <= HIGHLIGHT_LIMIT && hljs.getLanguage(language)) {
    hljs.highlightElement(code);
  }
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Copy failed";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}

let katexReady = null;

// KaTeX (a classic script, 75 KB compressed) is fetched the first time an answer has math.
function loadKatex() {
  katexReady ??= new Promise((resolve, reject) => {
    const style = document.createElement("link");
    style.rel = "stylesheet";
    style.href = "/ui/vendor/katex/katex.min.css";
    document.head.append(style);
    const script = document.createElement("script");
    script.src = "/ui/vendor/katex/katex.min.js";
    script.onload = () => resolve(window.katex);
    script.onerror = reject;
    document.head.append(script);
  });
  return katexReady;
}

async function typeset(nodes) {
  const katex = await loadKatex();
  for (const node of nodes) {
    if (!node.isConnected) continue;
    // trust false: no \href, \url or HTML from the formula; bounded sizes and macro expansion
    katex.render(node.dataset.tex, node, { displayMode: node.nodeName === "DIV",
      throwOnError: false, trust: false, maxSize: 50, maxExpand: 1000, strict: "ignore" });
  }
}
