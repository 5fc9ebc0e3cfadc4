"""Small incremental scanners the output parsers are built from.

``Markers`` finds fixed strings (``<tool_call>``, ``</think>`` ...) in streamed text while
holding back only a suffix that could still grow into one. ``JsonValue`` follows one JSON value
through streamed text and says where it ends. ``JsonPrefix`` checks that text stays a valid
JSON prefix and knows how to close it.
Both do work proportional to the new text, never to what came before.
"""

from __future__ import annotations

import re


_DERIVED: dict[tuple[str, ...], tuple[int, str, re.Pattern[str] | None]] = {}
_DERIVED_MAX = 256          # a family's markup is a handful of sets; never grows past this


class Markers:
    """A set of marker strings to look for in streamed text."""

    def __init__(self, *markers: str):
        self.markers = kept = tuple(m for m in markers if m)
        # What is derived from the markers (every parser of a family builds the same sets,
        # several per request): made once per set. Markers never change after this.
        derived = _DERIVED.get(kept)
        if derived is None:
            firsts = "".join(sorted({m[0] for m in kept}))
            derived = (max((len(m) for m in kept), default=0), firsts,
                       re.compile("[" + re.escape(firsts) + "]") if len(firsts) > 1 else None)
            if len(_DERIVED) < _DERIVED_MAX:
                _DERIVED[kept] = derived
        self._longest, self._firsts, self._any_first = derived

    def absent(self, text: str) -> bool:
        """No character of ``text`` begins a marker: ``find`` would find none in it and
        ``held`` would hold none of it (known without their scans)."""
        if self._any_first is None:         # one first character, or none
            return not self._firsts or self._firsts not in text
        return self._any_first.search(text) is None

    def find(self, text: str, start: int = 0) -> tuple[int, str | None]:
        """The earliest complete marker at or after ``start``: (position, marker) or (-1, None)."""
        best, found = -1, ""
        for marker in self.markers:
            i = text.find(marker, start)
            if i >= 0 and (best < 0 or i < best or (i == best and len(marker) > len(found))):
                best, found = i, marker
        return best, (found if best >= 0 else None)

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

    __slots__ = ("_stack", "_in_string", "_escape", "_kind", "done", "_parts", "last")

    def __init__(self) -> None:
        self._stack: list[str] = []     # open containers, '{' or '['
        self._in_string = False
        self._escape = False
        self._kind = ""                 # "", "container", "string", "scalar"
        self.done = False
        self._parts: list[str] = []     # the value's text (leading space skipped), in pieces
        self.last = ""                  # the value's text taken by the last feed

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def feed(self, chunk: str) -> int:
        """Consume ``chunk``; the index in it just past the value's end, or -1 (not ended).

        A scalar (number, true, false, null) ends before the first delimiter after it.
        """
        i = start = 0
        if not self._kind:
            while i < len(chunk) and chunk[i] in _WS:
                i += 1
            if i == len(chunk):
                self.last = ""
                return -1
            start, c = i, chunk[i]
            if c in "{[":
                self._kind = "container"
            elif c == '"':
                self._kind, self._in_string = "string", True
                i += 1
            else:
                self._kind = "scalar"
        end = self._scan(chunk, i)
        self.last = chunk[start:len(chunk) if end < 0 else end]
        self._parts.append(self.last)
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


_NUMBER_CHARS = frozenset("0123456789+-.eE")
_STRING_SPECIAL = re.compile(r'["\\\x00-\x1f]')
_HEX = frozenset("0123456789abcdefABCDEF")
_LITERALS = ("true", "false", "null")


class JsonPrefix:
    """Checks that streamed text stays a valid prefix of one JSON value.

    ``feed`` returns how much of the text keeps the prefix valid (it stops at the first bad
    character and stays stopped); ``completion()`` is a suffix that closes the prefix into a
    valid document. Together they let a tool call stream its arguments as written and still
    end with valid JSON whatever the model does.
    """

    def __init__(self) -> None:
        self._stack: list[str] = []      # "{" / "["
        self._expect = "value"           # value, key, key_or_end, colon, comma_or_end,
                                         # value_or_end, end
        self._token = ""                 # a number or literal being read
        self._in_string = False
        self._is_key = False
        self._escape = ""                # "" | "\\" | "u" + hex digits seen
        self.broken = False
        self.done = False

    def feed(self, text: str) -> int:
        if self.broken:
            return 0
        i, n = 0, len(text)
        while i < n:
            if self._in_string:
                if not self._escape:                    # skip plain string text at once
                    m = _STRING_SPECIAL.search(text, i)
                    i = m.start() if m else n
                    if i == n:
                        break
                    if text[i] == '"':                  # the string ends (as _string_char)
                        self._in_string = False
                        if self._is_key:
                            self._expect = "colon"
                        else:
                            self._after_value()
                        i += 1
                        if self.done:
                            return i
                        continue
            elif not self._token:                       # the commonest structure inline,
                c = text[i]                             # as _structural does it
                if c in " \t\r\n":
                    i += 1
                    if self.done:                       # after the value: one at a time
                        return i
                    continue
                expect = self._expect
                if c == '"' and expect != "end" and expect != "colon" and (
                        expect != "comma_or_end"):
                    self._in_string, self._is_key = True, expect in ("key", "key_or_end")
                    i += 1
                    continue
                if c == ":" and expect == "colon":
                    self._expect = "value"
                    i += 1
                    continue
            if not self._char(text[i]):
                self.broken = True
                return i
            i += 1
            if self.done:                 # stop right after the value's last character
                return i
        return n

    def _char(self, c: str) -> bool:
        if self._in_string:
            return self._string_char(c)
        if self._token:
            if self._token[0] in "tfn":
                word = self._token + c
                if any(lit.startswith(word) for lit in _LITERALS):
                    self._token = word
                    if word in _LITERALS:
                        self._token = ""
                        self._after_value()
                    return True
                return False
            if c in _NUMBER_CHARS:
                if not _number_prefix_ok(self._token + c):     # "1-", "01", "1.e"
                    return False
                self._token += c
                return True
            if not _number_ok(self._token):
                return False
            self._token = ""
            self._after_value()
        return self._structural(c)

    def _structural(self, c: str) -> bool:
        if c in " \t\r\n":
            return True
        expect = self._expect
        if expect == "end":
            return False
        if expect in ("value", "value_or_end"):
            if c == "]" and expect == "value_or_end":
                return self._close("[")
            if c in "{[":
                self._stack.append(c)
                self._expect = "key_or_end" if c == "{" else "value_or_end"
                return True
            if c == '"':
                self._in_string, self._is_key = True, False
                return True
            if c in "-0123456789" or c in "tfn":
                self._token = c
                return True
            return False
        if expect in ("key", "key_or_end"):
            if c == "}" and expect == "key_or_end":
                return self._close("{")
            if c == '"':
                self._in_string, self._is_key = True, True
                return True
            return False
        if expect == "colon":
            if c == ":":
                self._expect = "value"
                return True
            return False
        # comma_or_end
        top = self._stack[-1]
        if c == ",":
            self._expect = "key" if top == "{" else "value"
            return True
        if c == ("}" if top == "{" else "]"):
            return self._close(top)
        return False

    def _string_char(self, c: str) -> bool:
        if self._escape:
            if self._escape == "\\":
                if c == "u":
                    self._escape = "u"
                    return True
                if c not in '"\\/bfnrt':
                    return False            # still after the backslash: completion() knows
                self._escape = ""
                return True
            if c not in _HEX:
                return False
            self._escape += c
            if len(self._escape) == 5:
                self._escape = ""
            return True
        if c == "\\":
            self._escape = "\\"
            return True
        if c == '"':
            self._in_string = False
            if self._is_key:
                self._expect = "colon"
            else:
                self._after_value()
            return True
        return c >= " "

    def _close(self, kind: str) -> bool:
        self._stack.pop()
        self._after_value()
        return True

    def _after_value(self) -> None:
        if self._stack:
            self._expect = "comma_or_end"
        else:
            self._expect, self.done = "end", True

    def completion(self) -> str:
        """A suffix that closes what was accepted into a valid JSON document."""
        out = ""
        if self._in_string:
            if self._escape == "\\":
                out += "n"
            elif self._escape:
                out += "0" * (5 - len(self._escape))
            out += '"'
            if self._is_key:
                out += ": null"
        elif self._token:
            if self._token[0] in "tfn":
                out += next(lit for lit in _LITERALS if lit.startswith(self._token))[
                    len(self._token):]
            elif not _number_ok(self._token):
                out += "0" if self._token[-1] in "-.eE+" else ""
        elif self._expect == "value" and self._stack:
            out += "null"
        elif self._expect == "key" or (self._expect == "value" and not self._stack):
            out += '"_": null' if self._stack else "{}"
        elif self._expect == "colon":
            out += ": null"
        for kind in reversed(self._stack):
            out += "}" if kind == "{" else "]"
        return out


def _number_ok(token: str) -> bool:
    return re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", token) is not None


def _number_prefix_ok(token: str) -> bool:
    """``token`` can still grow into a number (``completion`` then appends a ``0``)."""
    return _number_ok(token) or _number_ok(token + "0")
