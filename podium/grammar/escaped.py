"""A custom tool's grammar, constrained inside a JSON string (issue 40).

OpenAI's custom tools declare their input's language as a Lark grammar or a regex
(``format: {"type": "grammar", "syntax": "lark"|"regex", "definition": ...}``). Hermes models
write a call as ``{"name": ..., "arguments": {"input": "<JSON string>"}}``, so what decoding
must constrain is the *JSON-escaped* form of that language. ``quoted_lark`` makes an
llguidance Lark rule set whose rule ``<prefix>_input`` matches ``"`` + escaped text + ``"``
for exactly the strings of the client's grammar, to embed in a tool-call grammar.

Escapings accepted are llguidance's own for JSON strings (``%json`` ``pattern``), so both
syntaxes agree: ``"`` and ``\\`` as ``\\"`` and ``\\\\``; controls U+0000-U+001F and DEL as
``\\uXXXX`` (either hex case) or, where JSON has one, the short escape (``\\n``, ``\\t``,
``\\r``, ``\\b``, ``\\f``); every other character raw (``\\/`` and ``\\u0041`` are refused).
Decoding an accepted text always gives a string of the language.

- ``regex``: llguidance's ``%json {"type": "string", "pattern": "^(?:R)$"}`` quotes it.
- ``lark``: the grammar is parsed with the ``lark`` package's grammar of Lark, and every
  terminal rewritten to the regex of its escaped form (literals, classes incl. negated ones,
  ``.``, repeats, groups, alternations). llguidance ends a lexeme on one byte of lookahead,
  and escapes share the ``\\`` byte, so ``/(.*)/ LF`` split into two lexemes would refuse
  ``...\\n``: rules that no recursion runs through are therefore emitted as terminals, one
  lexeme each (a non-recursive grammar, like Codex's apply_patch, becomes a single regex),
  which also makes their language the grammar's own (no greedy-lexing surprises).
  Only recursive rules stay rules.

Refused, as a 400 naming ``param`` and the construct: regex anchors, lookarounds, lazy
quantifiers, backreferences, ``\\p`` classes, flags other than ``s``; ``%ignore`` (it would
apply to the whole embedding grammar), ``%override``/``%declare``, templates, priorities,
case-insensitive literals, ``{m,n}`` on rules (write ``~ m..n``); imports other than
``%import common.NAME``.
"""

from __future__ import annotations

import ast
import importlib.resources
import json
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import llguidance
from lark import Lark, Token, Tree
from lark.exceptions import LarkError

from podium.errors import InvalidRequestError

MAX_DEFINITION_CHARS = 64 * 1024
MAX_OUTPUT_CHARS = 1024 * 1024     # an escaped character is at most ~60 regex characters
MAX_REPEAT = 10_000                # {n,m} bounds: llguidance's regex compiler unrolls them

_SHORT = {0x08: "b", 0x09: "t", 0x0A: "n", 0x0C: "f", 0x0D: "r"}
_RAW_ONLY = r'[^\x00-\x1f\x7f"\\]'     # what stands for itself inside a JSON string
_WHITE = frozenset(range(0x09, 0x0E))   # the specials in \s (Unicode White_Space)
_SPECIALS = tuple(list(range(0x20)) + [0x22, 0x5C, 0x7F])


def quoted_lark(syntax: str, definition: str, param: str, prefix: str = "ci") -> str:
    """Lark rules (names starting ``prefix``) whose rule ``<prefix>_input`` matches a JSON
    string, quotes included, holding exactly the strings ``definition`` describes."""
    if len(definition) > MAX_DEFINITION_CHARS:
        raise _refuse(param, f"the definition is longer than {MAX_DEFINITION_CHARS} characters")
    if syntax == "regex":
        text = _quoted_regex(definition, prefix)
    elif syntax == "lark":
        text = _Rewrite(param, prefix).run(definition)
    else:
        raise _refuse(param, f"unknown grammar syntax {syntax!r} (expected 'lark' or 'regex')")
    if len(text) > MAX_OUTPUT_CHARS:
        raise _refuse(param, "the grammar is too large once escaped for JSON")
    _validate(f"start: {prefix}_input\n{text}", param)
    return text


def _quoted_regex(definition: str, prefix: str) -> str:
    schema = {"type": "string", "pattern": f"^(?:{definition})$"}
    return f"{prefix}_input: %json {json.dumps(schema)}\n"


def _validate(grammar: str, param: str) -> None:
    error = llguidance.LLMatcher.validate_grammar(
        llguidance.LLMatcher.grammar_from_lark(grammar))
    if error:
        raise _refuse(param, _cause(error))


def _cause(error: str) -> str:
    """llguidance's message without Podium's grammar text or positions in it: its first
    line, and for a regex the line that says what is wrong (``error: unclosed group``)."""
    lines = [line.strip() for line in error.splitlines()]
    first = re.sub(r"^at \d+\(\d+\): ", "", lines[0] if lines else error)
    first = first.removeprefix("failed to compile JSON schema: ").rstrip(":.")
    said = next((line for line in lines if line.startswith("error: ")), "")
    return f"{first}: {said.removeprefix('error: ')}" if said else first


def _refuse(param: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid custom tool grammar: {what}.", param=param)


# --- escaping characters and classes ----------------------------------------------------


def _escapes(codes: list[int]) -> list[str]:
    """Regexes for the ways the special characters ``codes`` may be written in a JSON string:
    one class of short escapes, and ``\\u00XX`` grouped by the high hex digit."""
    shorts = "".join(_SHORT.get(c) or _hex(c) for c in codes if c in _SHORT or c in (0x22, 0x5C))
    forms = [rf"\x5c[{shorts}]"] if shorts else []
    by_high: dict[int, str] = {}
    for code in (c for c in codes if c not in (0x22, 0x5C)):
        digit = f"{code & 15:X}"
        by_high[code >> 4] = by_high.get(code >> 4, "") + digit + digit.lower() * digit.isalpha()
    if by_high:
        forms.append(r"\x5cu00(?:" + "|".join(f"{high}[{lows}]" for high, lows in by_high.items())
                     + ")")
    return forms


def _hex(code: int) -> str:
    return f"\\x{{{code:x}}}"


def _literal(char: str) -> str:
    code = ord(char)
    if code in _SPECIALS:
        return "(?:" + "|".join(_escapes([code])) + ")"
    return char if char.isalnum() else _hex(code)


@dataclass
class _Class:
    """A character class: ranges and shorthand classes (``d``, ``W``...), maybe negated."""

    ranges: list[tuple[int, int]] = field(default_factory=list)
    shorthands: list[str] = field(default_factory=list)
    negated: bool = False

    def contains(self, code: int) -> bool:
        hit = any(lo <= code <= hi for lo, hi in self.ranges) or any(
            _shorthand_contains(s, code) for s in self.shorthands)
        return hit != self.negated

    def escaped(self) -> str:
        items = "".join(f"{_hex(lo)}-{_hex(hi)}" for lo, hi in self.ranges)
        items += "".join("\\" + s for s in self.shorthands)
        raw = f"[{'^' if self.negated else ''}{items}]" if items else "[^\\x{0}-\\x{10ffff}]"
        forms = [f"[{raw}&&{_RAW_ONLY}]"]
        forms += _escapes([code for code in _SPECIALS if self.contains(code)])
        return "(?:" + "|".join(forms) + ")"


def _shorthand_contains(shorthand: str, code: int) -> bool:
    """Whether a special character (ASCII control, ``"`` or ``\\``) is in ``\\d``...``\\S``."""
    inside = shorthand.lower() == "s" and code in _WHITE
    return inside != shorthand.isupper()


def _dot(dotall: bool) -> _Class:
    """``.``: any character, but a newline unless ``s`` (dot-all) is set."""
    return _Class(ranges=[(0, 0x10FFFF)]) if dotall else _Class([(0x0A, 0x0A)], negated=True)


# --- regexes -----------------------------------------------------------------------------


class _Regex:
    """Rewrites a regex (Rust ``regex`` syntax, the common subset with Python's) into the
    regex of its JSON-escaped form, by recursive descent over its syntax."""

    def __init__(self, source: str, dotall: bool, fail: "_Fail"):
        self.src, self.pos, self.dotall, self.fail = source, 0, dotall, fail

    def run(self) -> str:
        out = self.alternation()
        if self.pos < len(self.src):
            raise self.fail(f"unbalanced ')' in regex /{self.src}/")
        return out

    def peek(self, n: int = 1) -> str:
        return self.src[self.pos:self.pos + n]

    def take(self) -> str:
        if self.pos >= len(self.src):
            raise self.fail(f"regex /{self.src}/ ends early")
        self.pos += 1
        return self.src[self.pos - 1]

    def alternation(self) -> str:
        branches = [self.concatenation()]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.concatenation())
        return "|".join(branches)

    def concatenation(self) -> str:
        parts = []
        while self.peek() not in ("", "|", ")"):
            parts.append(self.quantified(self.atom()))
        return "".join(parts)

    def quantified(self, atom: str) -> str:
        while self.peek() and self.peek() in "*+?{":
            op = self.take()
            if op == "{":
                op = self.bounds()
            if self.peek() == "?":
                raise self.fail(f"lazy quantifier in regex /{self.src}/")
            atom = f"(?:{atom}){op}"
        return atom

    def bounds(self) -> str:
        end = self.src.find("}", self.pos)
        parts = self.src[self.pos:end].split(",") if end > 0 else []
        if not 1 <= len(parts) <= 2 or not parts[0].isdigit() or not all(
                p.isdigit() or p == "" for p in parts):
            raise self.fail(f"'{{' that is not a repetition in regex /{self.src}/")
        if any(p and int(p) > MAX_REPEAT for p in parts):
            raise self.fail(f"repetition over {MAX_REPEAT} in regex /{self.src}/")
        self.pos = end + 1
        return "{" + ",".join(parts) + "}"

    def atom(self) -> str:
        char = self.take()
        if char == "(":
            return self.group()
        if char == "[":
            return self.char_class().escaped()
        if char == ".":
            return _dot(self.dotall).escaped()
        if char == "\\":
            escape = self.escape()
            return escape.escaped() if isinstance(escape, _Class) else _literal(escape)
        if char in "^$":
            raise self.fail(f"anchor {char!r} in regex /{self.src}/")
        if char in "*+?{)":
            raise self.fail(f"{char!r} with nothing to repeat in regex /{self.src}/")
        return _literal(char)

    def group(self) -> str:
        saved = self.dotall
        if self.peek() == "?":
            self.group_kind()
        inner = self.alternation()
        if self.take() != ")":
            raise self.fail(f"unclosed group in regex /{self.src}/")
        self.dotall = saved
        return f"(?:{inner})"

    def group_kind(self) -> None:
        self.pos += 1
        if self.peek() in ("=", "!") or self.peek(2) in ("<=", "<!"):
            raise self.fail(f"lookaround in regex /{self.src}/")
        if self.peek() in ("<", "P"):
            self.pos = self.src.index(">", self.pos) + 1 if ">" in self.src[self.pos:] else -1
            if self.pos < 0:
                raise self.fail(f"unclosed group name in regex /{self.src}/")
            return
        flags_end = self.pos
        while self.src[flags_end:flags_end + 1].isalpha() or self.src[flags_end:flags_end + 1] == "-":
            flags_end += 1
        flags, self.pos = self.src[self.pos:flags_end], flags_end
        if flags.strip("s") or self.take() != ":":
            raise self.fail(f"regex flags '(?{flags}' in /{self.src}/ (only (?s:...) is taken)")
        self.dotall = self.dotall or flags == "s"

    def escape(self) -> "_Class | str":
        char = self.take()
        if char in "dDwWsS":
            return _Class(shorthands=[char])
        if char in "nrtfv0a":
            return {"n": "\n", "r": "\r", "t": "\t", "f": "\f", "v": "\v", "0": "\0",
                    "a": "\a"}[char]
        if char in "xu":
            return chr(self.code_point(char))
        if char.isascii() and not char.isalnum():
            return char
        raise self.fail(f"escape '\\{char}' in regex /{self.src}/ (anchors, backreferences "
                        "and Unicode classes are not supported)")

    def code_point(self, kind: str) -> int:
        if self.peek() == "{":
            end = self.src.find("}", self.pos)
            digits, self.pos = self.src[self.pos + 1:end], end + 1
        else:
            width = 2 if kind == "x" else 4
            digits, self.pos = self.src[self.pos:self.pos + width], self.pos + width
        try:
            code = int(digits, 16)
            chr(code)
        except (ValueError, OverflowError):
            raise self.fail(f"bad '\\{kind}' escape in regex /{self.src}/") from None
        return code

    def char_class(self) -> _Class:
        cls = _Class(negated=self.peek() == "^")
        self.pos += cls.negated
        first = True
        while first or self.peek() != "]":
            first = False
            self.class_item(cls)
        self.pos += 1
        return cls

    def class_item(self, cls: _Class) -> None:
        low = self.class_char()
        if isinstance(low, _Class):
            cls.shorthands += low.shorthands
            return
        if self.peek() == "-" and self.peek(2) != "-]" and self.src[self.pos + 1:self.pos + 2] not in ("]", ""):
            self.pos += 1
            high = self.class_char()
            if isinstance(high, _Class) or ord(high) < ord(low):
                raise self.fail(f"bad range in regex /{self.src}/")
            cls.ranges.append((ord(low), ord(high)))
        else:
            cls.ranges.append((ord(low), ord(low)))

    def class_char(self) -> "_Class | str":
        char = self.take()
        if char == "[" or self.peek(2) in ("&&", "--", "~~") or char + self.peek() in ("&&", "--", "~~"):
            raise self.fail(f"nested class or class operation in regex /{self.src}/")
        return self.escape() if char == "\\" else char


# --- Lark grammars -----------------------------------------------------------------------


class _Fail:
    def __init__(self, param: str):
        self.param = param

    def __call__(self, what: str) -> InvalidRequestError:
        return _refuse(self.param, what)


@cache
def _meta() -> Lark:
    """The parser of Lark grammar text (the ``lark`` package's own grammar of Lark)."""
    return Lark.open_from_package("lark", "lark.lark", ("grammars",), parser="lalr")


@cache
def _common() -> dict[str, Tree]:
    """``%import common.NAME``'s definitions (``lark``'s common.lark)."""
    text = importlib.resources.files("lark").joinpath("grammars/common.lark").read_text()
    items: list[Any] = _meta().parse(text).children
    return {str(item.children[0]): item.children[-1] for item in items
            if isinstance(item, Tree) and item.data == "token"}


class _Rewrite:
    """One client Lark grammar made into prefixed llguidance rules over escaped terminals."""

    def __init__(self, param: str, prefix: str):
        self.fail, self.prefix = _Fail(param), prefix
        self.rules: dict[str, Tree] = {}
        self.tokens: dict[str, Tree] = {}
        self.regular: set[str] = set()

    def run(self, definition: str) -> str:
        try:
            tree = _meta().parse(definition)
        except LarkError as exc:
            raise self.fail(f"the Lark grammar does not parse: {str(exc).splitlines()[0]}"
                            ) from None
        items: list[Any] = tree.children
        for item in items:
            self.collect(item)
        if "start" not in self.rules:
            raise self.fail("the Lark grammar has no 'start' rule")
        self.regular = self.non_recursive()
        lines = [f'{self.prefix}_input: "\\"" {self.name("start")} "\\""']
        lines += [f"{self.name(n)}: {self.expr(t)}" for n, t in {**self.rules, **self.tokens}.items()]
        return "\n".join(lines) + "\n"

    def collect(self, item: Tree) -> None:
        kind = item.data
        if kind in ("rule", "token"):
            name, params, *rest = item.children
            if any(params.children) or len(rest) > 1:
                raise self.fail(f"templates and priorities are not supported ({name})")
            table = self.rules if kind == "rule" else self.tokens
            table[str(name).lstrip("!?")] = rest[-1]
        elif kind == "import":
            self.import_common(item)
        else:
            raise self.fail(f"%{kind.split('_')[0]} is not supported in a custom tool grammar")

    def import_common(self, item: Tree) -> None:
        path = [str(n.children[0]) for n in item.children[0].children if isinstance(n, Tree)]
        alias = item.children[1]
        if len(path) != 2 or path[0] != "common" or path[1] not in _common():
            raise self.fail(f"%import {'.'.join(path)} (only common.NAME imports are taken)")
        todo = [(path[1], str(alias.children[0]) if alias else path[1])]
        while todo:
            source, target = todo.pop()
            if target in self.tokens:
                continue
            self.tokens[target] = _common()[source]
            todo += [(r, r) for r in _references(_common()[source])]

    def non_recursive(self) -> set[str]:
        """Rules whose whole reach is free of recursion: these become terminals."""
        graph = {n: {r for r in _references(t) if r in self.rules} for n, t in self.rules.items()}
        for name, tree in {**self.rules, **self.tokens}.items():
            if missing := [r for r in _references(tree) if r not in self.rules and r not in self.tokens]:
                raise self.fail(f"{name!r} refers to undefined {missing[0]!r}")
        reach = {n: _reach(graph, n) for n in graph}
        recursive = {n for n in graph if n in reach[n]}
        return {n for n in graph if not (reach[n] | {n}) & recursive}

    def name(self, name: str) -> str:
        if name in self.tokens:
            return f"{self.prefix}_T_{name}".upper()
        if name in self.regular:
            return f"{self.prefix}_R_{name}".upper()
        return f"{self.prefix}_{name}"

    def expr(self, tree: Tree | Token) -> str:
        if isinstance(tree, Token):
            raise self.fail(f"unexpected {tree!s} in the Lark grammar")
        kind, kids = tree.data, tree.children
        if kind == "expansions":
            return "(" + " | ".join(self.expr(k) for k in kids) + ")"
        if kind == "alias":
            return self.expr(kids[0])
        if kind == "expansion":
            return " ".join(self.expr(k) for k in kids) or '""'
        if kind == "maybe":
            return f"({self.expr(kids[0])})?"
        if kind == "expr":
            return self.repeat(self.expr(kids[0]), kids[1:])
        if kind == "name":
            return self.name(str(kids[0]))
        if kind == "literal":
            return "/" + self.terminal(str(kids[0])) + "/"
        if kind == "literal_range":
            low, high = (_string(str(k), self.fail) for k in kids)
            if len(low) != 1 or len(high) != 1:
                raise self.fail("a literal range of strings longer than one character")
            return "/" + _Class(ranges=[(ord(low), ord(high))]).escaped() + "/"
        raise self.fail(f"{kind.replace('_', ' ')} is not supported")

    def repeat(self, inner: str, ops: list[Any]) -> str:
        low, high = (list(ops) + [None, None])[:2]
        if low is None:
            return inner
        if low.type == "OP":
            return f"({inner}){low}"
        if any(int(n) > MAX_REPEAT for n in (low, high) if n is not None):
            raise self.fail(f"repetition over {MAX_REPEAT}")
        return f"({inner}){{{low}}}" if high is None else f"({inner}){{{low},{high}}}"

    def terminal(self, text: str) -> str:
        if text.startswith('"'):
            if text.endswith("i"):
                raise self.fail(f"case-insensitive literal {text}")
            return "".join(_literal(c) for c in _string(text, self.fail))
        body, flags = text[1:text.rindex("/")], text[text.rindex("/") + 1:]
        if flags.strip("s"):
            raise self.fail(f"regex flags '{flags}' on /{body}/ (only s is taken)")
        return _Regex(body.replace("\\/", "/"), "s" in flags, self.fail).run()


def _string(text: str, fail: _Fail) -> str:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise fail(f"bad string literal {text}") from None
    if not isinstance(value, str):
        raise fail(f"bad string literal {text}")
    return value


def _references(tree: Tree) -> list[str]:
    return [str(t.children[0]) for t in tree.iter_subtrees() if t.data == "name"]


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += graph[node]
    return seen
