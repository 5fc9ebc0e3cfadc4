"""Reading one ``{"name": ..., "arguments": {...}}`` object from streamed text.

Used by every family whose calls are JSON objects (Hermes / Qwen, Llama 3, Mistral's list
form, the bare-JSON fallback). The arguments value streams out as the model writes it; the
name must be complete (and declared) before the call begins. A key or a value written in
single quotes (the object as a Python dict) is read as Python's string.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from typing import Callable, ClassVar, Optional, Tuple

from podium.parsing.scan import JsonPrefix, JsonValue, json_text

log = logging.getLogger(__name__)
ARGUMENT_KEYS = ("arguments", "parameters")
_WS = " \t\r\n"
_NOT_PLAIN = re.compile(r'[\\\x00-\x1f]')     # an escape, or a character JSON refuses raw
# The open call's own validator and what takes text it accepted, if the call has none yet
# (see ``JsonCall.lane``).
Lane = Optional[Tuple[JsonPrefix, Callable[[str], None]]]


class JsonCall:
    """State machine over one call object.

    After each ``feed``: ``failed`` (this is not a call object; nothing was begun if
    ``name`` is None), ``name`` (once known and allowed), ``done`` (the object closed).
    ``on_begin(name)`` and ``on_args(text)`` are called as the call unfolds.
    """

    _handlers: ClassVar[dict[str, Callable[["JsonCall", str, int], int]]]   # state -> _s_*

    def __init__(self, allows: Callable[[str], bool], on_begin: Callable[[str], None],
                 on_args: Callable[[str], None], lane: Callable[[], Lane] | None = None):
        self._allows = allows
        self._on_begin = on_begin
        self._on_args = on_args
        self._lane = lane
        # The arguments object being streamed with the open call's own validator (one scan
        # checks it, not two): that JsonPrefix while in "args_object", else None. The text
        # it accepts goes to ``_on_valid`` as it stands.
        self.lane: JsonPrefix | None = None
        self._on_valid: Callable[[str], None] | None = None
        self._ahead = 0                # characters of the next chunk taken already (feed_args)
        self._state = "start"
        self._key: str | None = None
        self._value = JsonValue()
        self._early_args: list[str] = []   # arguments written before the name
        self.name: str | None = None
        self.seen_name: str | None = None  # the name written, declared or not
        self.failed = False
        self.done = False
        self.had_args = False
        self.stopped_at = 0            # where the last feed stopped (the failing character)
        self._quoted: list[str] = []   # a single-quoted key or value so far
        self._quoted_escape = False
        self._quoted_next = ""         # the state after it

    def feed(self, chunk: str) -> int:
        """Consume ``chunk``; the index just past the object's end, or -1."""
        i, self._ahead = self._ahead, 0
        n = len(chunk)
        while i < n and not (self.done or self.failed):
            i = self._handlers[self._state](self, chunk, i)
        self.stopped_at = i
        return i if self.done else -1

    def _skip(self, chunk: str, i: int) -> int:
        while i < len(chunk) and chunk[i] in _WS:
            i += 1
        return i

    def _s_start(self, chunk: str, i: int) -> int:
        i = self._skip(chunk, i)
        if i < len(chunk):
            if chunk[i] != "{":
                self.failed = True
                return i
            self._state = "key"
            return i + 1
        return i

    def _s_key(self, chunk: str, i: int) -> int:
        i = self._skip(chunk, i)
        if i >= len(chunk):
            return i
        c = chunk[i]
        if c == "}":
            self._close()
            return i + 1
        if c == ",":
            return i + 1
        if c == "'":
            return self._start_quoted(i, "colon")
        if c != '"':
            self.failed = True
            return i
        self._value, self._state = JsonValue(), "key_text"
        return i

    def _start_quoted(self, i: int, after: str) -> int:
        self._quoted, self._quoted_escape, self._quoted_next = [], False, after
        self._state = "quoted"
        return i + 1

    def _s_quoted(self, chunk: str, i: int) -> int:
        """A single-quoted string (a Python dict's key or value), up to its quote."""
        n = len(chunk)
        j = i
        while j < n:
            c = chunk[j]
            if self._quoted_escape:
                self._quoted_escape = False
            elif c == "\\":
                self._quoted_escape = True
            elif c == "'":
                break
            j += 1
        self._quoted.append(chunk[i:j])
        if j == n:
            return n
        try:
            value = ast.literal_eval("'" + "".join(self._quoted) + "'")
        except (ValueError, SyntaxError):
            self.failed = True
            return j
        self._quoted = []
        if self._quoted_next == "colon":
            self._key, self._state = value, "colon"
        else:
            self._value = JsonValue()
            self._value.feed(json_text(value))
            self._value_done()
            self._state = "after"
        return j + 1

    def _s_key_text(self, chunk: str, i: int) -> int:
        end = self._value.feed(chunk[i:])
        if end < 0:
            return len(chunk)
        try:
            self._key = _string(self._value.text)
        except ValueError:                  # a raw control character: not JSON
            self.failed = True
        self._state = "colon"
        return i + end

    def _s_colon(self, chunk: str, i: int) -> int:
        i = self._skip(chunk, i)
        if i < len(chunk):
            if chunk[i] != ":":
                self.failed = True
                return i
            self._state = "value_start"
            return i + 1
        return i

    def _s_value_start(self, chunk: str, i: int) -> int:
        """Arguments objects take the fast lane: validated and streamed in one scan."""
        i = self._skip(chunk, i)
        if i < len(chunk):
            if self._key in ARGUMENT_KEYS and chunk[i] == "{":
                lane = (self._lane() if self._lane is not None and self.name is not None
                        else None)
                if lane is not None:        # named, nothing written to the call yet
                    self._prefix, self._on_valid = lane
                    self.lane = self._prefix
                else:
                    self._prefix, self._on_valid = JsonPrefix(), None
                self._state = "args_object"
            elif chunk[i] == "'":
                return self._start_quoted(i, "after")
            else:
                self._value, self._state = JsonValue(), "value"
        return i

    def _s_args_object(self, chunk: str, i: int) -> int:
        piece = chunk[i:] if i else chunk
        if self.feed_args(piece):
            return len(chunk)
        n, self._ahead = self._ahead, 0
        return i + n

    def feed_args(self, piece: str) -> bool:
        """More of the arguments object (``feed``'s step there): True if it took all of
        ``piece`` and the object goes on. Else where it stopped (the object ended or broke)
        is where the next ``feed`` goes on from.

        On the lane (``lane`` set: nearly every token of a call's arguments) the owner takes
        this step ahead of ``feed``, and of its own step: on True that is all they would do."""
        prefix, on_valid = self._prefix, self._on_valid
        n = prefix.feed(piece)
        if n:
            text = piece if n == len(piece) else piece[:n]
            if on_valid is not None:
                self.had_args = True
                on_valid(text)              # accepted by the call's own validator
            else:
                self._args(text)
        if prefix.broken:
            self.failed, self.lane = True, None
        elif prefix.done:
            self._state, self.lane = "after", None
        elif n == len(piece):
            self.stopped_at = n
            return True
        self._ahead = n
        return False

    def _s_value(self, chunk: str, i: int) -> int:
        end = self._value.feed(chunk[i:])
        if self._key in ARGUMENT_KEYS and self._value.kind == "container":
            self._args(self._value.last)      # an array: not an object, but keep it
        if end < 0:
            return len(chunk)
        self._value_done()
        self._state = "after"
        return i + end

    def _value_done(self) -> None:
        text = self._value.text
        if self._key == "name":
            if self.name is not None:       # a second name: the object broke
                self.failed = True
                return
            try:
                name = _string(text) if self._value.kind == "string" else json.loads(text)
            except ValueError:
                name = None
            if isinstance(name, str):
                self.seen_name = name
            if not isinstance(name, str) or not self._allows(name):
                self.failed = True
                return
            self.name = name
            self._on_begin(name)
            for part in self._early_args:
                self._on_args(part)
            self._early_args = []
        elif self._key in ARGUMENT_KEYS and self._value.kind != "container":
            self._args(string_arguments(text))

    def _s_after(self, chunk: str, i: int) -> int:
        i = self._skip(chunk, i)
        if i >= len(chunk):
            return i
        if chunk[i] == ",":
            self._state = "key"
            return i + 1
        if chunk[i] == "}":
            self._close()
            return i + 1
        self.failed = True
        return i

    def _close(self) -> None:
        if self.name is None:
            self.failed = True      # an object without a name is not a call
            return
        self.done = True

    @property
    def why(self) -> str:
        """Why a failed object is no call."""
        return "not a declared tool" if self.seen_name is not None else "not a call object"

    def _args(self, text: str) -> None:
        if not text:
            return
        self.had_args = True
        if self.name is None:
            self._early_args.append(text)
        else:
            self._on_args(text)


JsonCall._handlers = {name[3:]: fn for name, fn in vars(JsonCall).items()
                      if name.startswith("_s_")}


def _string(text: str) -> str:
    """A JSON string's value from its whole text (quotes included): ``json.loads(text)``,
    without the decoder's work when the text is plain (no escape, no raw control character:
    then the value is what is between the quotes)."""
    if _NOT_PLAIN.search(text) is None:
        return text[1:-1]
    return json.loads(text)


def string_arguments(text: str) -> str:
    """Arguments written as a JSON string (``"{\\"city\\": \\"Paris\\"}"``, double-encoded),
    or null: the object's text. A string holding a Python dict (``"{'city': 'Paris'}"``)
    is read as Python; anything else stays a string (not an object: sent as ``{}``)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if value is None:
        return "{}"
    if isinstance(value, str):
        try:
            json.loads(value)
            return value
        except ValueError:
            pass
        try:
            literal = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            literal = None
        if isinstance(literal, dict):
            try:
                text = json_text(literal)
                log.warning("tool call arguments were a Python dict in a string; read as one")
                return text
            except (TypeError, ValueError):      # sets, bytes: no JSON
                pass
        return json.dumps(value)
    return text
