"""Small incremental scanners the output parsers are built from.

``Markers`` finds fixed strings (``<tool_call>``, ``</think>`` ...) in streamed text while
holding back only a suffix that could still grow into one. ``JsonValue`` follows one JSON value
through streamed text and says where it ends (and how to close it if the text stops early).
Both do work proportional to the new text, never to what came before.
"""

from __future__ import annotations

import json
import re


class Markers:
    """A set of marker strings to look for in streamed text."""

    def __init__(self, *markers: str):
        self.markers = tuple(m for m in markers if m)
        self._longest = max((len(m) for m in self.markers), default=0)
        self._firsts = "".join(sorted({m[0] for m in self.markers}))

    def find(self, text: str, start: int = 0) -> tuple[int, str | None]:
        """The earliest complete marker at or after ``start``: (position, marker) or (-1, None)."""
        best, found = -1, None
        for marker in self.markers:
            i = text.find(marker, start)
            if i >= 0 and (best < 0 or i < best or (i == best and len(marker) > len(found))):
                best, found = i, marker
        return best, found

    def held(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a marker."""
        start = max(0, len(text) - self._longest + 1)
        first = len(text)
        for c in self._firsts:
            i = text.find(c, start)
            while 0 <= i < first:
                tail = text[i:]
                if any(m.startswith(tail) and m != tail for m in self.markers):
                    first = i
                    break
                i = text.find(c, i + 1)
        return len(text) - first


_STRUCT = re.compile(r'[{}\[\]"]')
_IN_STRING = re.compile(r'["\\]')
_SCALAR_END = re.compile(r'[\s,}\]]')
_WS = " \t\r\n"


class JsonValue:
    """Follows one JSON value (object, array, string or scalar) through streamed text."""

    __slots__ = ("_stack", "_in_string", "_escape", "_kind", "done", "text")

    def __init__(self) -> None:
        self._stack: list[str] = []     # open containers, '{' or '['
        self._in_string = False
        self._escape = False
        self._kind = ""                 # "", "container", "string", "scalar"
        self.done = False
        self.text = ""                  # the value's text so far (leading space skipped)

    def feed(self, chunk: str) -> int:
        """Consume ``chunk``; the index in it just past the value's end, or -1 (not ended).

        A scalar (number, true, false, null) ends before the first delimiter after it.
        """
        i = 0
        if not self._kind:
            while i < len(chunk) and chunk[i] in _WS:
                i += 1
            if i == len(chunk):
                return -1
            c = chunk[i]
            if c in "{[":
                self._kind = "container"
            elif c == '"':
                self._kind, self._in_string = "string", True
                self.text += c
                i += 1
            else:
                self._kind = "scalar"
        start = i
        end = self._scan(chunk, i)
        self.text += chunk[start:len(chunk) if end < 0 else end]
        if end >= 0:
            self.done = True
        return end

    def _scan(self, chunk: str, i: int) -> int:
        if self._kind == "scalar":
            m = _SCALAR_END.search(chunk, i)
            return m.start() if m else -1
        n = len(chunk)
        while i < n:
            if self._in_string:
                if self._escape:
                    self._escape = False
                    i += 1
                    continue
                m = _IN_STRING.search(chunk, i)
                if m is None:
                    return -1
                i = m.end()
                if m.group() == "\\":
                    self._escape = True
                else:
                    self._in_string = False
                    if self._kind == "string":
                        return i
                continue
            m = _STRUCT.search(chunk, i)
            if m is None:
                return -1
            c, i = m.group(), m.end()
            if c == '"':
                self._in_string = True
            elif c in "{[":
                self._stack.append(c)
            elif self._stack:
                self._stack.pop()
                if not self._stack:
                    return i
        return -1

    def completion(self) -> str:
        """A suffix that makes ``text`` valid JSON ('' if it already is, or none is found).

        Closes a call cut short: what was streamed cannot be taken back, so the only repair
        is to append (close a string, fill a dangling key or value, close the containers).
        """
        if not self.text.strip():
            return "{}"
        if _valid(self.text):
            return ""
        quote = ('n"' if self._escape else '"') if self._in_string else ""
        closers = "".join("}" if c == "{" else "]" for c in reversed(self._stack))
        word = re.search(r"[a-z]*$", self.text).group()
        rest = next((lit[len(word):] for lit in ("true", "false", "null")
                     if word and lit.startswith(word)), "")
        for filler in ("", rest, "0", "null", " null", ": null", '"_": null'):
            if _valid(self.text + quote + filler + closers):
                return quote + filler + closers
        return ""


def _valid(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False
