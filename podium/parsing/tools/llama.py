"""Llama 3.x tool calls: JSON objects, or a pythonic list (Llama 3.2 / 4 templates).

JSON (3.1 / 3.2 / 3.3), the whole answer, optionally after ``<|python_tag|>``, several
separated by ``;``::

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}

Pythonic::

    [get_weather(city="Paris"), get_time()]

A call list is recognised only at the start of the answer; an object or list that does not
name declared tools is content (no markup says it is a call), except after
``<|python_tag|>``, which does: then it is dropped. Once calls were read, a later object that
is no call is dropped; a stray quote or brace and a doubled ``;`` are skipped.
``<|python_tag|>`` never reaches content. Pythonic calls are emitted when the list closes
(a list cut short is closed first); calls to undeclared tools in it are dropped.
"""

from __future__ import annotations

import ast
import json

from podium.parsing.scan import Markers
from podium.parsing.tools.base import ToolParser, ToolSet

PYTHON_TAG = "<|python_tag|>"
_WS = " \t\r\n"


class _StartOfAnswer(ToolParser):
    """Shared start: skip whitespace and ``<|python_tag|>``, then look at the first character."""

    opener = "{"
    MARKUP = (PYTHON_TAG,)

    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._state = "start"
        self._raw: list[str] = []     # text held while it may be content, in pieces
        self._tagged = False          # <|python_tag|> came first: calls, not content
        self._text_marks = Markers(PYTHON_TAG)

    def _step(self, buf: str) -> int | None:
        return getattr(self, "_s_" + self._state)(buf)

    def _s_start(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS)
        if len(stripped) < len(buf):        # held with the rest, not rescanned every delta
            self._raw.append(buf[:len(buf) - len(stripped)])
            return len(buf) - len(stripped)
        if buf.startswith(PYTHON_TAG):
            self._tagged = True
            return len(PYTHON_TAG)
        if PYTHON_TAG.startswith(buf):
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
        used, _ = self.scan_text(buf, self._text_marks, ())
        return used

    def _finish(self, rest: str) -> None:
        if not self.calls and self._state in ("start", "text"):
            self.text("".join(self._raw) + rest)
        elif self._state == "text":
            self.text(rest)
        self._raw = []


class Llama3JsonParser(_StartOfAnswer):
    def _begin(self, skipped: int) -> int:
        self.start_call_object()
        self._state = "object"
        return skipped

    def _s_object(self, buf: str) -> int | None:
        outcome, used = self.call_object(buf)
        if outcome == "more":
            if self._json.name is None:
                self._raw.append(buf)
            else:
                self._raw = []
            return used
        if outcome == "done":
            self._state, self._raw = "between", []
            return used
        if outcome == "no call":
            if not self.calls and not self._tagged:
                return self._content(used, buf)
            self.drop_call(self._json.seen_name, self._json.why)    # markup said: a call
            raw, self._raw = "".join(self._raw) + buf[:used], []
            end = self.skip_json(raw)
            if end < 0:
                self._state = "skip"
                return used
            self.push_back(raw[end:])
            self._state = "between"
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
        return self.skip_stray(buf) or self._tag_or_text(buf, "between")

    def _tag_or_text(self, buf: str, state: str) -> int | None:
        if PYTHON_TAG.startswith(buf) and buf != PYTHON_TAG:
            return None
        if buf.startswith(PYTHON_TAG):      # before each call: markup
            self._state = "next"
            return len(PYTHON_TAG)
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
        calls = _pythonic_calls(raw.strip(_WS) + closing)
        if not calls:
            self.text(raw)
            return used
        if closing:
            self.stray(f"{closing!r} left out", "tool call list")
        for name, arguments in calls:
            if self.tools.allows(name):
                self.emit_whole_call(name, arguments)
            else:
                self.drop_call(name)
        return used

    def _finish(self, rest: str) -> None:
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
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List):
        return None
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            return None
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        except ValueError:
            return None
        calls.append((node.func.id, arguments))
    try:                        # bytes, sets, complex, 1e999: Python literals, not JSON
        json.dumps([arguments for _, arguments in calls], allow_nan=False)
    except (TypeError, ValueError):
        return None
    return calls
