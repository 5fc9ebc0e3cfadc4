"""Llama 3.x tool calls: JSON objects, or a pythonic list (Llama 3.2 / 4 templates).

JSON (3.1 / 3.2 / 3.3), the whole answer, optionally after ``<|python_tag|>``, several
separated by ``;``::

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}

Pythonic (Llama 4 between ``<|python_start|>`` and ``<|python_end|>``)::

    [get_weather(city="Paris"), get_time()]
    <|python_start|>[get_weather(city="Paris")]<|python_end|>

Both families also read Llama 3.1's own format, anywhere in the answer::

    <function=get_weather>{"city": "Paris"}</function>

A call list is recognised at the start of the answer, or after ``<|python_tag|>`` /
``<|python_start|>`` anywhere; an object or list that does not name declared tools is
content (no markup says it is a call), except after a tag, which does: then it is dropped.
Once calls were read, a later object that is no call is dropped; a stray quote or brace, a
doubled ``;`` are skipped, and a ``;`` left out between two objects is read as there. The
tags never reach content. Pythonic calls are emitted when the list closes (a list cut short
is closed first, a comma left out between two calls is put back); calls to undeclared
tools in it are dropped; JSON's ``true`` / ``false`` / ``null`` are read as Python's.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from typing import Any

from podium.parsing.scan import JsonValue, Markers
from podium.parsing.tools.base import ToolParser, ToolSet, double_decoded

PYTHON_TAG = "<|python_tag|>"
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"     # Llama 4
TAGS = (PYTHON_TAG, PYTHON_START)                # calls follow
FUNCTION, FUNCTION_END = "<function=", "</function>"                # Llama 3.1
NAME = re.compile(r"[\w.\-]+")
NAME_SO_FAR = re.compile(r"\s*[\"']*[\w.\-]*[\"']*\s*")    # a <function=> name, perhaps cut
_WS = " \t\r\n"


class _StartOfAnswer(ToolParser):
    """Shared start: skip whitespace and ``<|python_tag|>``, then look at the first character."""

    opener = "{"
    MARKUP = (PYTHON_TAG, PYTHON_START, PYTHON_END, FUNCTION, FUNCTION_END)
    after_calls = "text"              # the state after a call

    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._state = "start"
        self._raw: list[str] = []     # text held while it may be content, in pieces
        self._tagged = False          # <|python_tag|> came first: calls, not content
        self._text_marks = Markers(*self.MARKUP)
        self._name: list[str] = []    # <function=NAME>: the name so far
        self._args = JsonValue()

    def _step(self, buf: str) -> int | None:
        return getattr(self, "_s_" + self._state)(buf)

    def _s_start(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS)
        if len(stripped) < len(buf):        # held with the rest, not rescanned every delta
            self._raw.append(buf[:len(buf) - len(stripped)])
            return len(buf) - len(stripped)
        for tag in TAGS:
            if buf.startswith(tag):
                self._tagged = True
                return len(tag)
        if buf.startswith(FUNCTION):
            self._raw = []                  # blanks before a call
            return self._function(len(FUNCTION))
        if any(t.startswith(buf) for t in (*TAGS, FUNCTION)):
            return None
        if buf[0] != self.opener:
            return self._content(0)
        return self._begin(0)

    def _begin(self, skipped: int) -> int:
        raise NotImplementedError

    def _content(self, used: int, buf: str = "") -> int:
        """Not calls after all: everything held, and all that follows, is content."""
        self.text("".join(self._raw) + buf[:used])
        self._raw = []
        self._state = "text"
        return used

    def _s_text(self, buf: str) -> int | None:
        used, marker = self.scan_text(buf, self._text_marks, (*TAGS, FUNCTION))
        if marker == FUNCTION and used is not None:
            return self._function(used)
        if marker is not None:              # a tag: what follows is read as at the start
            self._state, self._tagged, self._raw = "start", True, []
        return used

    # -- Llama 3.1: <function=NAME>{...}</function> ------------------------------------

    def _function(self, used: int) -> int:
        self._state, self._name = "function", []
        return used

    def _s_function(self, buf: str) -> int | None:
        """The name, up to ``>``; anything else after ``<function=`` was prose. What may
        still become a name is read on (``NAME_SO_FAR``: every start of one passes it, so
        the verdict is the same however the text is cut)."""
        close = buf.find(">")
        piece = buf if close < 0 else buf[:close]
        written = "".join(self._name) + piece
        if not NAME_SO_FAR.fullmatch(written) or len(written) > 200:
            return self._not_a_function()
        if close < 0:
            self._name.append(piece)
            return len(buf)
        name = written.strip().strip("\"'")
        if not NAME.fullmatch(name):
            return self._not_a_function()
        self._name, self._args = [], JsonValue()
        if not self.begin_declared(name):
            self._skip = JsonValue()
        self._state = "function_args"
        return close + 1

    def _not_a_function(self) -> int:
        """The name read so far is prose (the tag goes); the rest is read as text."""
        self.stray(FUNCTION)
        self.text("".join(self._name))
        self._name, self._state = [], "text"
        return 0

    def _s_function_args(self, buf: str) -> int | None:
        """The arguments object (or a JSON string holding it) up to its end; none before
        ``</function>`` is ``{}``."""
        if not self._args.kind and not (self._skip and self._skip.kind):
            lead = buf.lstrip(_WS)
            if not lead:
                return len(buf)
            if lead[0] not in "{\"":           # no arguments (</function>, or junk)
                self._end_function()
                return len(buf) - len(lead)
        if self._call is None:              # an undeclared tool: followed, not kept
            end = self.skipping(buf)
        else:
            end = self.value_args(self._args, buf)
        if end < 0:
            return len(buf)
        self._end_function()
        return end

    def _end_function(self) -> None:
        self._skip = None
        if self._call is not None:
            self.end_call()
        self._state = "function_end"

    def _s_function_end(self, buf: str) -> int | None:
        blanks = self.hold_blanks(buf)
        if blanks:
            return blanks
        if buf.startswith(FUNCTION_END):
            self.take_blanks()
            self._state = self.after_calls
            return len(FUNCTION_END)
        if FUNCTION_END.startswith(buf):
            return None
        stray = self.skip_stray(buf)
        if stray:
            return stray
        self.text(self.take_blanks())
        self._state = self.after_calls
        return 0

    def _finish(self, rest: str) -> None:
        if not self.calls and self._state in ("start", "text"):
            self.text("".join(self._raw) + rest)
        elif self._state == "text":
            self.text(rest)
        elif self._state == "function":     # cut in the name: a call if it is one
            name = ("".join(self._name) + rest).strip().strip("\"'")
            if NAME.fullmatch(name) and self.tools.allows(name):
                self.begin_call(name)
            elif name:
                self.drop_call(name, "unfinished at the end of the output")
        self._raw, self._name = [], []


class Llama3JsonParser(_StartOfAnswer):
    after_calls = "between"

    def _begin(self, skipped: int) -> int:
        self.start_call_object()
        self._state = "object"
        return skipped

    def _s_object(self, buf: str) -> int | None:
        outcome, used = self.call_object(buf)
        if outcome == "more":
            self.keep_unnamed(self._raw, buf)
            return used
        if outcome == "done":
            self._state, self._raw = "between", []
            return used
        if outcome == "no call":
            if not self.calls and not self._tagged:
                return self._content(used, buf)
            skipping = self.drop_call_object(self._raw, buf, used)    # markup said: a call
            self._state = "skip" if skipping else "between"
            return used
        self._raw = []
        return self._after_calls(used)

    def _s_skip(self, buf: str) -> int | None:
        end = self.skipping(buf)
        if end < 0:
            return len(buf)
        self._state = "between"
        return end

    def _after_calls(self, used: int) -> int:
        self._state = "text"
        return used

    def _s_between(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS)
        if len(stripped) < len(buf):        # blanks between calls are layout
            return len(buf) - len(stripped)
        if buf[0] == ";":
            self._state = "next"
            return 1
        if buf[0] == "{":                   # the next call, its ";" left out
            self.stray("';' left out", "tool call list")
            return self._begin(0)
        return self.skip_stray(buf) or self._tag_or_text(buf, "between")

    def _tag_or_text(self, buf: str, state: str) -> int | None:
        for tag in (*TAGS, PYTHON_END):
            if buf.startswith(tag):         # before each call (or after): markup
                if tag != PYTHON_END:
                    self._state = "next"
                return len(tag)
        if buf.startswith(FUNCTION):
            return self._function(len(FUNCTION))
        if any(t.startswith(buf) for t in (*TAGS, PYTHON_END, FUNCTION)):
            return None
        return self._after_calls(0)

    def _s_next(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS + ";")    # blanks, and a doubled separator
        if len(stripped) < len(buf):
            return len(buf) - len(stripped)
        if buf[0] == "{":
            return self._begin(0)
        return self._tag_or_text(buf, "next")


class PythonicParser(_StartOfAnswer):
    opener = "["

    def _begin(self, skipped: int) -> int:
        self._state, self._quote, self._escape = "list", "", False
        self._open: list[str] = []            # the brackets open, innermost last
        return skipped

    def _s_list(self, buf: str) -> int | None:
        for i, c in enumerate(buf):
            if self._quote:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == self._quote:
                    self._quote = ""
            elif c in "'\"":
                self._quote = c
            elif c in "([{":
                self._open.append(c)
            elif c in ")]}":
                if self._open:
                    self._open.pop()
                if not self._open:
                    self._raw.append(buf[:i + 1])
                    return self._parse(i + 1)
        self._raw.append(buf)
        return len(buf)

    def _parse(self, used: int, closing: str = "") -> int:
        raw, self._raw, self._state = "".join(self._raw), [], "text"
        text = raw.strip(_WS) + closing
        calls = _pythonic_calls(text)
        if calls is None:
            separated = _separated(text)
            calls = _pythonic_calls(separated) if separated is not None else None
            if calls:
                self.stray("',' left out between calls", "tool call list")
        if not calls:
            self.text(raw)
            return used
        if closing:
            self.stray(f"{closing!r} left out", "tool call list")
        for name, arguments in calls:
            self.emit_whole_call(name, {k: double_decoded(v, self.tools.param_type(name, k))
                                        for k, v in arguments.items()})
        self._state = "list_end"
        return used

    def _s_list_end(self, buf: str) -> int | None:
        """Llama 4 closes the list with ``<|python_end|>``: markup, read silently."""
        blanks = self.hold_blanks(buf)
        if blanks:
            return blanks
        if PYTHON_END.startswith(buf) and buf != PYTHON_END:
            return None
        self._state = "text"
        if buf.startswith(PYTHON_END):
            self.take_blanks()
            return len(PYTHON_END)
        self.text(self.take_blanks())
        return 0

    def _finish(self, rest: str) -> None:
        if self._state == "list_end":
            self._state = "text"
        if self._state == "list":           # cut short: closed, if that makes it a list
            self._raw.append(rest)
            closing = self._quote + "".join({"(": ")", "[": "]", "{": "}"}[c]
                                            for c in reversed(self._open))
            self._parse(0, closing)
            return
        super()._finish(rest)


def _pythonic_calls(text: str) -> list[tuple[str, dict]] | None:
    """``[f(a=1), g(b="x")]`` as (name, arguments) pairs; None if it is anything else."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree, ast.List):
        return None
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            return None
        try:
            arguments = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg}
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        calls.append((node.func.id, arguments))
    try:                        # bytes, sets, complex, 1e999: Python literals, not JSON
        json.dumps([arguments for _, arguments in calls], allow_nan=False)
    except (TypeError, ValueError):
        return None
    return calls


_JSON_NAMES = {"true": True, "false": False, "null": None}


class _JsonNames(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> Any:
        if node.id in _JSON_NAMES:
            return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
        return node


def _literal(node: ast.expr) -> Any:
    """A keyword's value: a Python literal (JSON's ``true`` / ``false`` / ``null`` too)."""
    return ast.literal_eval(_JsonNames().visit(node))


def _separated(text: str) -> str | None:
    """``[f(a=1) g()]``, ``[f(a=1)g()]``: the commas a model left out between calls put
    back (found with Python's tokenizer, so never inside a string); None if none was."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return None
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    depth, closed, inserts = 0, False, []
    for token in tokens:
        if token.type == tokenize.OP:
            if token.string in "([{":
                depth += 1
            elif token.string in ")]}":
                depth -= 1
            closed = token.string == ")" and depth == 1
            continue
        if token.type == tokenize.NAME and closed:
            inserts.append(starts[token.start[0] - 1] + token.start[1])
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            closed = False
    for at in reversed(inserts):
        text = text[:at] + ", " + text[at:]
    return text if inserts else None
