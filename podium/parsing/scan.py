"""Small incremental scanners the output parsers are built from.

``Markers`` finds fixed strings (``<tool_call>``, ``</think>`` ...) in streamed text while
holding back only a suffix that could still grow into one. ``JsonValue`` follows one JSON value
through streamed text and says where it ends. ``JsonPrefix`` checks that text stays a valid
JSON prefix and knows how to close it.
Both do work proportional to the new text, never to what came before.
"""

from __future__ import annotations

import json
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
_CLOSED_AFTER_COMMA = 2         # "accepted": a closer that dropped the comma before it
_STRING_OPENS = ("value", "value_or_end", "key", "key_or_end")     # where a quote opens one
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
        # What the caller must look at before it passes the accepted text on (see
        # ``ToolParser._append``): an escape, a structural comma, a closer that followed a
        # comma, Python literals. Set by the slow paths only; the caller clears it.
        self.attention = False
        self.closers: list[int] = []     # where a closer dropped the comma before it (this feed)
        self._py: PyJson | None = None   # Python-literal mode (see ``PyJson``), once entered
        self._converting = False         # ... checking the JSON it made (``_feed_py``)
        self.out: str | None = None      # in that mode: the JSON text the last feed made

    def feed(self, text: str) -> int:
        """How much of ``text`` keeps the prefix valid: all of it, or up to the first bad
        character (then ``broken``), or just past the value's end (then ``done``).

        One pass, one branch per kind of character, the commonest first: plain string
        text (skipped to the next quote, backslash or control character in one search),
        then blanks, quotes and colons between values; escapes, numbers and literals, and
        brackets and commas in the methods below."""
        if self.broken:
            return 0
        if self._py is not None and not self._converting:
            return self._feed_py(text, 0)
        i, n = 0, len(text)
        ok: bool | int | None
        while i < n:
            if self._in_string:
                if self._escape:
                    ok = self._escaped(text[i])
                else:
                    m = _STRING_SPECIAL.search(text, i)
                    if m is None:
                        break
                    i = m.start()
                    c = text[i]
                    if c == '"':                    # the string ends
                        self._in_string = False
                        if self._is_key:
                            self._expect = "colon"
                        else:
                            self._after_value()
                        ok = True
                    elif c == "\\":
                        self._escape, ok = "\\", True
                    else:                           # a raw control character
                        ok = False
            elif self._token:
                ok = self._token_char(text[i])
                if ok is None:                      # it ended before this character,
                    continue                        # read next as structure
            else:
                c, expect = text[i], self._expect
                if c in _WS:
                    ok = True
                elif c == '"' and expect in _STRING_OPENS:
                    self._in_string, self._is_key = True, expect in ("key", "key_or_end")
                    ok = True
                elif c == ":" and expect == "colon":
                    self._expect, ok = "value", True
                else:
                    ok = self._structural(c)
            if not ok:
                if self._py is None and self._pythonic(text[i]):
                    return self._feed_py(text, i)
                self.broken = True
                if self._escape:          # broken after a backslash: it is held back too
                    self.attention = True
                return i
            if ok == _CLOSED_AFTER_COMMA:
                self.closers.append(i)
            i += 1
            if self.done:                 # stop right after the value's last character
                return i
        if self._escape:                  # cut inside an escape: the caller holds it back
            self.attention = True
        return n

    # -- Python literals (``{'city': 'Paris', 'metric': True}``) ----------------------------

    def _pythonic(self, c: str) -> bool:
        """``c`` is where JSON breaks and a Python literal begins (a quote, True / False /
        None): the rest is read as Python from here."""
        if self._in_string or self._token:
            return False
        if self._expect in ("value", "value_or_end"):
            return c == "'" or c in "TFN"
        return c == "'" and self._expect in ("key", "key_or_end")

    def _feed_py(self, text: str, i: int) -> int:
        """Convert ``text[i:]`` to JSON (``PyJson``) and check that, a character at a time
        (rare, and never on the usual path); ``out`` is the JSON text of ``text[:end]``."""
        if self._py is None:
            self._py = PyJson()
            out = [text[:i]]
        else:
            out = []
        self.attention = True
        py = self._py
        n = len(text)
        self._converting = True
        try:
            while i < n:
                piece = py.char(text[i])
                if piece:
                    m = self.feed(piece)
                    if m < len(piece) or self.broken:
                        self.broken = True
                        out.append(piece[:m])
                        i += m > 0      # it let out a word's JSON: taken, so it is sent
                        break
                    out.append(piece)
                i += 1
                if self.done:
                    break
        finally:
            self._converting = False
        self.out = "".join(out)
        return i

    def _escaped(self, c: str) -> bool:
        """A character after a backslash in a string, or one of a ``\\u`` escape's digits."""
        if self._escape == "\\":
            if c == "u":
                self._escape = "u"
                self.attention = True       # a surrogate's half, perhaps: the caller looks
                return True
            if c not in '"\\/bfnrt':
                return False                # still after the backslash: completion() knows
            self._escape = ""
            return True
        if c not in _HEX:
            return False
        self._escape += c
        if len(self._escape) == 5:
            self._escape = ""
        return True

    def _token_char(self, c: str) -> bool | None:
        """A character after a number's or a literal's first: taken (True), breaking the
        prefix (False), or after the number's end (None: the number is a value, and ``c``
        is read again as structure)."""
        token = self._token
        if token[0] in "tfn":
            word = token + c
            if any(lit.startswith(word) for lit in _LITERALS):
                self._token = word
                if word in _LITERALS:
                    self._token = ""
                    self._after_value()
                return True
            return False
        if c in _NUMBER_CHARS:
            if not _number_prefix_ok(token + c):     # "1-", "01", "1.e"
                return False
            self._token += c
            return True
        if not _number_ok(token):
            return False
        self._token = ""
        self._after_value()
        return None

    def _structural(self, c: str) -> bool | int:
        """A character between values that ``feed`` does not take itself (blanks, a quote
        that opens a string, a colon): a bracket, a comma, a number's or literal's first."""
        expect = self._expect
        if expect in ("value", "value_or_end"):
            if c == "]" and (expect == "value_or_end" or self._after_comma()):
                if expect == "value":               # [1, 2,]: the comma goes
                    self.attention = True
                    self._close("[")
                    return _CLOSED_AFTER_COMMA
                return self._close("[")
            if c in "{[":
                self._stack.append(c)
                self._expect = "key_or_end" if c == "{" else "value_or_end"
                return True
            if c in "-0123456789" or c in "tfn":
                self._token = c
                return True
            return False
        if expect in ("key", "key_or_end"):
            if c == "}":
                if expect == "key":                 # {"a": 1,}: the comma goes
                    self.attention = True
                    self._close("{")
                    return _CLOSED_AFTER_COMMA
                return self._close("{")
            return False
        if expect != "comma_or_end":                # "end", or "colon" (not a colon)
            return False
        top = self._stack[-1]
        if c == ",":
            self._expect = "key" if top == "{" else "value"
            self.attention = True           # the caller holds it until a key or value follows
            return True
        if c == ("}" if top == "{" else "]"):
            return self._close(top)
        return False

    def _close(self, kind: str) -> bool:
        self._stack.pop()
        self._after_value()
        return True

    def _after_comma(self) -> bool:
        """Expecting a value after a comma in a list (not after ``[`` or a colon)."""
        return self._expect == "value" and bool(self._stack) and self._stack[-1] == "["

    @property
    def comma_pending(self) -> bool:
        """A structural comma was read and nothing after it yet (but blanks)."""
        return (not self._in_string and not self._token
                and (self._expect == "key" or self._after_comma()))

    def _after_value(self) -> None:
        if self._stack:
            self._expect = "comma_or_end"
        else:
            self._expect, self.done = "end", True

    def completion(self) -> str:
        """A suffix that closes what was accepted into a valid JSON document.

        An escape cut short and a comma with nothing after it are left out, not completed
        (``\\u00`` is no character the model chose; ``{"a": 1,`` closes as ``{"a": 1}``):
        the caller held them back and drops them (``ToolParser._append``)."""
        out = ""
        if self._py is not None:
            tail = self._py.finish()
            if tail and not self.broken:
                self._converting = True
                m = self.feed(tail)
                self._converting = False
                out += tail[:m]
        if self._in_string:
            out += '"'
            if self._is_key:
                out += ": null"
        elif self._token:
            if self._token[0] in "tfn":
                out += next(lit for lit in _LITERALS if lit.startswith(self._token))[
                    len(self._token):]
            elif not _number_ok(self._token):
                out += "0" if self._token[-1] in "-.eE+" else ""
        elif self.comma_pending:
            pass
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


_PY_WORDS = {"True": "true", "False": "false", "None": "null"}
_PY_ESCAPES = {"'": "'", '"': '\\"', "\n": ""}     # \' is a quote; \" stays escaped


class PyJson:
    """Python literal text to JSON text, a character at a time: single-quoted strings,
    ``True`` / ``False`` / ``None``, a comma before a closer (dropped: it is held until the
    next character shows it), raw tabs and control characters in strings (escaped; a raw line
    break passes raw and breaks the string, as in Python and JSON). Double-quoted
    strings and everything else pass as they are (``JsonPrefix`` judges the result)."""

    __slots__ = ("_quote", "_escape", "_word", "_comma")

    def __init__(self) -> None:
        self._quote = ""        # the open string's quote
        self._escape = False
        self._word = ""         # a bare word (True) being read
        self._comma = ""        # a comma and the blanks after it, held

    def char(self, c: str) -> str:
        if self._quote:
            return self._string_char(c)
        out = ""
        if self._word:
            if c.isalnum() or c == "_":
                self._word += c
                return ""
            out, self._word = _PY_WORDS.get(self._word, self._word), ""
        if self._comma:
            if c in " \t\r\n":
                self._comma += c
                return out
            if c not in "}]":
                out += self._comma
            self._comma = ""
        if c == ",":
            self._comma = c
        elif c in "'\"":
            self._quote = c
            out += '"'
        elif c.isalpha():
            self._word = c
        else:
            out += c
        return out

    def _string_char(self, c: str) -> str:
        single = self._quote == "'"
        if self._escape:
            self._escape = False
            if c == "'":
                return "'"
            return "\\" + c
        if c == "\\":
            self._escape = True
            return ""
        if c == self._quote:
            self._quote = ""
            return '"'
        if c == '"' and single:
            return '\\"'
        if c < " ":
            if c in "\r\n":             # no '...' or "..." holds a raw line break (Python's
                return c                # rule): passed raw, it breaks the string as in JSON
            return json.dumps(c)[1:-1]
        return c

    def finish(self) -> str:
        """What is held at the end of the text: a word cut short is completed (``Tr``:
        ``true``) if it can only be one; a held comma and a cut escape go."""
        word, self._word, self._comma = self._word, "", ""
        if not word:
            return ""
        return next((v for k, v in _PY_WORDS.items() if k.startswith(word)), word)


# An escape in JSON text that starts at an escape boundary: \uXXXX (perhaps cut short), or
# a backslash and one character, or a backslash at the very end.
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{0,4})|.|\Z)", re.S)
REPLACEMENT = "\\ufffd"        # what a lone surrogate escape becomes


def split_escapes(text: str) -> tuple[str, str, int]:
    """Valid JSON text (from an escape boundary) as (what may go out now, what must wait,
    lone surrogates replaced). An escape cut short waits for its end, a high surrogate
    for its low half; a surrogate without its other half becomes ``\\ufffd``: a lone
    surrogate is valid JSON text but no character (orjson and serde refuse it)."""
    out: list[str] = []
    last, lone = 0, 0
    high: re.Match[str] | None = None       # a high surrogate waiting for its low half
    for m in _ESCAPE.finditer(text):
        digits = m.group(1)
        if (digits is None and m.end() - m.start() == 1) or (
                digits is not None and len(digits) < 4):          # cut short: wait
            start = high.start() if high is not None and high.end() == m.start() else m.start()
            if high is not None and start != high.start():
                out.append(text[last:high.start()] + REPLACEMENT)
                last, lone = high.end(), lone + 1
            out.append(text[last:start])
            return "".join(out), text[start:], lone
        code = int(digits, 16) if digits else -1
        if high is not None:
            if 0xDC00 <= code < 0xE000 and high.end() == m.start():
                high = None                 # a pair: one character
                continue
            out.append(text[last:high.start()] + REPLACEMENT)
            last, lone, high = high.end(), lone + 1, None
        if 0xD800 <= code < 0xDC00:
            high = m
        elif 0xDC00 <= code < 0xE000:
            out.append(text[last:m.start()] + REPLACEMENT)
            last, lone = m.end(), lone + 1
    if high is not None:
        if high.end() == len(text):         # its low half may come next
            out.append(text[last:high.start()])
            return "".join(out), text[high.start():], lone
        out.append(text[last:high.start()] + REPLACEMENT)
        last, lone = high.end(), lone + 1
    out.append(text[last:])
    return "".join(out), "", lone


_RAW_SURROGATE = re.compile("[\ud800-\udfff]")


def json_text(value: object) -> str:
    """``json.dumps(value, ensure_ascii=False)`` without lone surrogates (a Python literal
    or a decoded escape can hold one; written raw, no UTF-8 encoder takes it): each
    becomes U+FFFD."""
    text = json.dumps(value, ensure_ascii=False)
    if _RAW_SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
