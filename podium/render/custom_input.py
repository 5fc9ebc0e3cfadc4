"""A custom tool's input, decoded from its call's arguments while they stream.

The model calls a custom tool as a function of one string (``conversation.custom_tool``):
families that write JSON arguments write ``{"input": "..."}``. Clients want the string
itself, streamed (Responses' ``response.custom_tool_call_input.delta``, Chat's
``custom.input`` deltas), so ``CustomInput`` decodes the JSON string a delta at a time.
Its one buffer is an escape cut between deltas (at most 11 characters); the cost is linear
in the arguments' length.

The arguments' whole text decides the input (``result``); the deltas say what was decoded
so far, and ``rest`` what they have not said of it yet. Arguments of another shape (another
key first, not JSON at all) stream nothing until the call ends, then all at once.
"""

from __future__ import annotations

import json
import re

_HEAD = '{"input":"'            # what comes before the string, blanks aside
_BLANK_AT = frozenset({0, 1, len('{"input"'), len('{"input":')})   # where JSON allows them
_SPECIAL = re.compile(r'["\\]')
_ESCAPE = re.compile(r'\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})')
_PARTIAL = re.compile(r'\\(?:u[0-9a-fA-F]{0,3})?\Z')       # an escape cut by the delta's end
_LOW = re.compile(r'\\u[dD][c-fC-F][0-9a-fA-F]{2}')
_SURROGATE = re.compile("[\ud800-\udfff]")

# states
_AT_HEAD, _IN_STRING, _DONE, _OFF = range(4)


def call_input(arguments: str) -> str:
    """The input a call's whole ``arguments`` carry: the string under ``input`` when they
    are a JSON object that has one (raw control characters allowed, as a small model
    writes them); nothing when they are ``{}`` or ``{"input": null}`` (a call the token
    limit cut before its input began, closed as valid JSON); else the arguments as
    written."""
    try:
        value = json.loads(arguments, strict=False)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return _whole(value["input"])
    if value == {} or value == {"input": None}:
        return ""
    return arguments


def _whole(text: str) -> str:
    """Lone surrogates (an escape ``\\ud800`` without its pair) as U+FFFD: no encoder can
    write them."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


class CustomInput:
    """One call's input, decoded as its arguments arrive: ``feed(delta) -> text``."""

    __slots__ = ("_state", "_head", "_pending", "_said")

    def __init__(self) -> None:
        self._state = _AT_HEAD
        self._head = 0              # characters of ``_HEAD`` matched
        self._pending = ""          # an escape not yet whole
        self._said: list[str] = []

    @property
    def said(self) -> str:
        return "".join(self._said)

    def feed(self, delta: str) -> str:
        """The input text ``delta`` completes (empty while the head or an escape is cut)."""
        if self._state == _AT_HEAD:
            delta = self._match_head(delta)
        if self._state != _IN_STRING or not delta:
            return ""
        if not self._pending and _SPECIAL.search(delta) is None:    # most deltas: as they are
            self._said.append(delta)
            return delta
        text = self._decode(self._pending + delta)
        if text:
            self._said.append(text)
        return text

    def result(self, arguments: str) -> str:
        """The input of the call whose arguments, as far as they came, are ``arguments``:
        ``call_input``'s, or, for arguments cut inside the string (a call the token limit
        ended), what was decoded of it."""
        value = call_input(arguments)
        if value is arguments and self._state == _IN_STRING:
            return self.said
        return value

    def rest(self, value: str) -> str:
        """What the deltas have not said of ``value`` (nothing if they said otherwise)."""
        said = self.said
        return value[len(said):] if value.startswith(said) else ""

    def _match_head(self, delta: str) -> str:
        for i, char in enumerate(delta):
            if char == _HEAD[self._head]:
                self._head += 1
                if self._head == len(_HEAD):
                    self._state = _IN_STRING
                    return delta[i + 1:]
            elif not (char in " \t\n\r" and self._head in _BLANK_AT):
                self._state = _OFF
                return ""
        return ""

    def _decode(self, text: str) -> str:
        self._pending = ""
        out: list[str] = []
        pos = 0
        while (special := _SPECIAL.search(text, pos)) is not None:
            start = special.start()
            out.append(text[pos:start])
            if text[start] == '"':
                self._state = _DONE
                return "".join(out)
            escape = _ESCAPE.match(text, start)
            if escape is None:
                if _PARTIAL.match(text, start):
                    self._pending = text[start:]
                else:           # not JSON: ``result`` tells what the arguments carry
                    self._state = _OFF
                return "".join(out)
            char, pos = json.loads(f'"{escape.group()}"'), escape.end()
            if "\ud800" <= char <= "\udbff":        # its low half should follow
                low = _LOW.match(text, pos)
                if low is not None:
                    char, pos = json.loads(f'"{escape.group()}{low.group()}"'), low.end()
                elif pos == len(text) or _PARTIAL.match(text, pos):
                    self._pending = text[start:]
                    return "".join(out)
            out.append(_whole(char))
        out.append(text[pos:])
        return "".join(out)
