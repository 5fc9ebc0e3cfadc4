"""Bare or fenced JSON calls, as small models write them instead of their template's markup.

    ```json
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    ```

Only at the start of the answer, only when tools were sent, and only for a declared name;
anything else goes to the family's own parser untouched.
"""

from __future__ import annotations

from podium.parsing.events import Event
from podium.parsing.tools.base import ToolParser, ToolSet

_WS = " \t\r\n"


class FallbackJsonParser(ToolParser):
    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._state = "start"
        self._fenced = False
        self._in_list = False
        self._raw: list[str] = []     # all text seen while no call has begun, in pieces
        self._object: list[str] = []  # a later object's text until it names its tool
        self.gave_up = False

    def take_raw(self) -> list[str]:
        """All text seen while no call had begun, in pieces (the primary's, if this gave up)."""
        raw, self._raw = self._raw, []
        return raw

    def feed(self, text: str) -> list[Event]:
        if self.calls:
            return super().feed(text)
        self._raw.append(text)
        events = super().feed(text)
        if self.calls:                # a call began: the text before it is never replayed
            self._raw = []
        return events

    def _give_up(self) -> int | None:
        if self.calls:                # calls were made: the rest is plain content
            self._state = "text"
            self.text(self.take_blanks())
            return 0
        self.gave_up = True
        return None

    def _step(self, buf: str) -> int | None:
        if self.gave_up:
            return None
        return getattr(self, "_s_" + self._state)(buf)

    def _s_start(self, buf: str) -> int | None:
        blanks = self.hold_blanks(buf)      # content only if this gives up after calls
        if blanks:
            return blanks
        if buf.startswith("```") or "```".startswith(buf):     # a fence, or its start
            newline = buf.find("\n")
            if newline < 0:
                return None
            if buf[3:newline].strip().lower() not in ("", "json"):
                return self._give_up()
            self._fenced = True
            self.take_blanks()
            return newline + 1
        if buf[0] == "[" and not self._in_list:
            self._in_list = True
            self.take_blanks()
            return 1
        if buf[0] == "{":
            self.start_call_object()
            self._state, self._object = "object", []
            self.take_blanks()
            return 0
        return self._give_up()

    def _s_object(self, buf: str) -> int | None:
        outcome, used = self.call_object(buf)
        if outcome == "more" and self.calls:
            if self._json.name is None:
                self._object.append(buf)
            else:
                self._object.clear()
        if outcome == "no call":
            if self.calls:            # after calls: this object is content, all of it
                self._state = "text"
                self.text("".join(self._object) + buf[:used])
                return used
            return self._give_up()
        if outcome != "more":
            self._state = "next" if outcome == "done" else "text"
        return used

    def _s_next(self, buf: str) -> int | None:
        blanks = self.hold_blanks(buf)      # content only if what follows is
        if blanks:
            return blanks
        if self._fenced and "```".startswith(buf) and buf != "```":
            return None
        gap = self.take_blanks()
        if self._in_list and buf[0] == ",":
            self._state = "start"
            return 1
        if self._in_list and buf[0] == "]":
            self._in_list = False
            return 1
        if not self._in_list and buf[0] == "{":       # objects one after another
            self._state = "start"
            return 0
        if self._fenced and buf.startswith("```"):
            self._fenced = False
            return 3
        self._state = "text"
        self.text(gap)
        return 0

    def _s_text(self, buf: str) -> int | None:
        self.text(buf)
        return len(buf)

    def _finish(self, rest: str) -> None:
        if not self.calls and self._state != "text":
            self.gave_up = True       # the output ended before any call: it was text
        elif self._state == "text":
            self.text(rest)


class WithJsonFallback:
    """Runs the fallback at the start of an answer; hands the text to ``primary`` otherwise."""

    def __init__(self, primary: ToolParser, tools: ToolSet):
        self._primary = primary
        self._fallback = FallbackJsonParser(tools)
        self._active: ToolParser | None = None     # None: undecided; else the one in charge
        self._held: list[str] = []     # the text so far, in pieces
        self._start = ""               # ... after its leading whitespace (at most "``")

    @property
    def calls(self) -> int:
        return self._primary.calls + self._fallback.calls

    def feed(self, text: str) -> list[Event]:
        if self._active is not None:
            return self._to_active(text)
        self._held.append(text)
        self._start += text if self._start else text.lstrip(_WS)
        if not self._start or "```".startswith(self._start):
            return []
        held, self._held = self._held, []
        self._active = self._fallback if self._start[0] in "{[`" else self._primary
        return self._feed_all(held)

    def _feed_all(self, pieces: list[str]) -> list[Event]:
        """Held text, piece by piece: a long run of blanks is never made one string."""
        events: list[Event] = []
        for piece in pieces:
            events += self._to_active(piece)
        return events

    def _to_active(self, text: str) -> list[Event]:
        active = self._active or self._primary
        events = active.feed(text)
        if active is self._fallback and self._fallback.gave_up:
            self._active = self._primary
            events += self._replay()
        return events

    def _replay(self) -> list[Event]:
        events: list[Event] = []
        for piece in self._fallback.take_raw():
            events += self._primary.feed(piece)
        return events

    def flush(self) -> list[Event]:
        if self._active is None:
            self._active = self._primary
            held, self._held = self._held, []
            return self._feed_all(held) + self._primary.flush()
        if self._active is self._fallback:
            events = self._fallback.flush()
            if self._fallback.gave_up:
                return self._replay() + self._primary.flush()
            return events
        return self._primary.flush()
