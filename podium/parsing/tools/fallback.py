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
        self.gave_up = False

    @property
    def raw(self) -> str:
        """All text seen while no call had begun (the primary parser's, if this gives up)."""
        if len(self._raw) > 1:
            self._raw = ["".join(self._raw)]
        return self._raw[0] if self._raw else ""

    def feed(self, text: str) -> list[Event]:
        if not self.calls:
            self._raw.append(text)
        return super().feed(text)

    def _give_up(self) -> int | None:
        if self.calls:                # calls were made: the rest is plain content
            self._state = "text"
            return 0
        self.gave_up = True
        return None

    def _step(self, buf: str) -> int | None:
        if self.gave_up:
            return None
        return getattr(self, "_s_" + self._state)(buf)

    def _s_start(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS)
        skipped = len(buf) - len(stripped)
        if not stripped:
            return None
        if stripped.startswith("```"):
            newline = stripped.find("\n")
            if newline < 0:
                return None
            if stripped[3:newline].strip().lower() not in ("", "json"):
                return self._give_up()
            self._fenced = True
            return skipped + newline + 1
        if stripped[0] == "[" and not self._in_list:
            self._in_list = True
            return skipped + 1
        if stripped[0] == "{":
            self.start_call_object()
            self._state = "object"
            return skipped
        return self._give_up()

    def _s_object(self, buf: str) -> int | None:
        outcome, used = self.call_object(buf)
        if outcome == "no call":
            return self._give_up()
        if outcome != "more":
            self._state = "next" if outcome == "done" else "text"
        return used

    def _s_next(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS)
        if not stripped:
            return None
        skipped = len(buf) - len(stripped)
        if self._in_list and stripped[0] == ",":
            self._state = "start"
            return skipped + 1
        if self._in_list and stripped[0] == "]":
            self._in_list = False
            return skipped + 1
        if not self._in_list and stripped[0] == "{":       # objects one after another
            self._state = "start"
            return skipped
        if self._fenced:
            if stripped.startswith("```"):
                self._fenced = False
                return skipped + 3
            if "```".startswith(stripped):
                return None
        self._state = "text"
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
        self._active = None            # None: undecided; else the parser in charge
        self._held = ""

    @property
    def calls(self) -> int:
        return self._primary.calls + self._fallback.calls

    def feed(self, text: str) -> list[Event]:
        if self._active is not None:
            return self._to_active(text)
        self._held += text
        start = self._held.lstrip(_WS)
        if not start or "```".startswith(start):
            return []
        held, self._held = self._held, ""
        self._active = self._fallback if start[0] in "{[`" else self._primary
        return self._to_active(held)

    def _to_active(self, text: str) -> list[Event]:
        events = self._active.feed(text)
        if self._active is self._fallback and self._fallback.gave_up:
            self._active = self._primary
            return events + self._primary.feed(self._fallback.raw)
        return events

    def flush(self) -> list[Event]:
        if self._active is None:
            return self._primary.feed(self._held) + self._primary.flush()
        if self._active is self._fallback:
            events = self._fallback.flush()
            if self._fallback.gave_up:
                return self._primary.feed(self._fallback.raw) + self._primary.flush()
            return events
        return self._primary.flush()
