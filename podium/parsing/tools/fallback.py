"""Bare or fenced JSON calls, as small models write them instead of their template's markup.

    ```json
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    ```

Only at the start of the answer, only when tools were sent, and only for a declared name;
anything else goes to the family's own parser untouched (JSON without markup that names no
declared tool is an answer, not a call). Once calls were read, the rest of the answer goes
to the family's parser too: an object in the list that is no call is dropped, and a stray
quote or brace and the closing fence are skipped.
"""

from __future__ import annotations

from podium.parsing.events import Event
from podium.parsing.tools.base import STRAY, ToolParser, ToolSet

_WS = " \t\r\n"


class FallbackJsonParser(ToolParser):
    LANE_STATE = "object"       # _s_object: call_object(buf) alone while it reads ("more")

    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._state = "start"
        self._fenced = False
        self._in_list = False
        self._raw: list[str] = []     # all text seen while no call has begun, in pieces
        self._object: list[str] = []  # a later object's text until it names its tool
        self.gave_up = False
        self.handed_over = False      # calls were read: the rest is the family parser's
        self.handed_text = ""         # blanks held when it handed over
        self._junk_logged = False

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
        if self.calls:                # calls were made: the rest is the family parser's
            return self._hand_over()
        self.gave_up = True
        return None

    def _hand_over(self) -> int | None:
        """Stop here: the unprocessed text (held blanks first) goes to the family parser;
        inside a fence, what is no call is dropped up to the fence instead."""
        if self._fenced:
            self.take_blanks()
            self._state, self._junk_logged = "junk", False
            return 0
        self.handed_over, self.handed_text = True, self.take_blanks()
        self._state = "text"
        return None

    def _step(self, buf: str) -> int | None:
        if self.gave_up or self.handed_over:
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
            self.keep_unnamed(self._object, buf)
        if outcome == "no call":
            if self.calls:            # after calls: an object that is no call is dropped
                skipping = self.drop_call_object(self._object, buf, used)
                self._state = "skip" if skipping else "next"
                return used
            return self._give_up()
        if outcome == "broken" and self._fenced:    # the rest of the fence is the call's
            self._state, self._junk_logged = "junk", False
        elif outcome != "more":
            self._state = "next"
        return used

    def _s_junk(self, buf: str) -> int | None:
        """What follows a call whose JSON broke inside a fence, up to the fence: dropped."""
        pos = buf.find("```")
        end = pos if pos >= 0 else len(buf) - (len(buf) - len(buf.rstrip("`")))
        if buf[:end].strip(_WS) and not self._junk_logged:
            self._junk_logged = True             # once: it comes in many deltas
            self.stray(buf[:end].strip(_WS)[:40], "tool call (what followed its broken JSON)")
        if pos < 0:
            return end or None
        self._fenced, self._in_list, self._state = False, False, "next"
        return pos + 3

    def _s_skip(self, buf: str) -> int | None:
        end = self.skipping(buf)
        if end < 0:
            return len(buf)
        self._state = "next"
        return end

    def _s_next(self, buf: str) -> int | None:
        blanks = self.hold_blanks(buf)      # content only if what follows is
        if blanks:
            return blanks
        if buf.startswith("```") or "```".startswith(buf):
            return self._closing_fence(buf)
        if self._in_list and buf[0] == ",":
            self.take_blanks()
            self._state = "start"
            return 1
        if self._in_list and buf[0] == "]":
            self.take_blanks()
            self._in_list = False
            return 1
        if buf[0] == "{":                   # objects one after another (in a list: its
            self.take_blanks()              # comma left out)
            if self._in_list:
                self.stray("',' left out", "tool call list")
            self._state = "start"
            return 0
        stray = self.skip_stray(buf)
        if stray:
            self.take_blanks()
            return stray
        return self._hand_over()

    def _closing_fence(self, buf: str) -> int | None:
        """A fence after calls closes them (and one more is a stray), unless it opens a new
        block (a language follows it): then it is the family parser's, as content."""
        if self._fenced and buf.startswith("```"):      # the closing fence, whatever follows
            self._fenced = self._in_list = False
            self.take_blanks()
            return 3
        newline = buf.find("\n")
        line = buf[3:] if newline < 0 else buf[3:newline]
        if line.strip(_WS + "`" + STRAY):          # a language: a new block
            return self._hand_over()
        if newline < 0:
            return None                     # the end of the line decides
        if not self._fenced:
            self.stray("```")
        self._fenced = False
        self.take_blanks()
        return 3

    def _finish(self, rest: str) -> None:
        if not self.calls and self._state != "text":
            self.gave_up = True       # the output ended before any call: it was text
        elif self._state == "next" and rest.strip(_WS + "`" + STRAY):
            self.handed_over, self.handed_text = True, self.take_blanks() + rest


class WithJsonFallback:
    """Runs the fallback at the start of an answer; hands the text to ``primary`` otherwise."""

    def __init__(self, primary: ToolParser, tools: ToolSet):
        self._primary = primary
        self._fallback = FallbackJsonParser(tools)
        self._active: ToolParser | None = None     # None: undecided; else the one in charge
        self._held: list[str] = []     # the text so far, in pieces
        self._start = ""               # ... after its leading whitespace (at most "``")

    @property
    def calls(self) -> int:     # the primary counts on from the fallback's calls
        return max(self._primary.calls, self._fallback.calls)

    def add_markup(self, *markup: str) -> None:
        self._primary.add_markup(*markup)
        self._fallback.add_markup(*markup)

    def feed(self, text: str) -> list[Event]:
        if self._active is not None:
            return self._to_active(text)
        self._held.append(text)
        self._start += text if self._start else text.lstrip(_WS)
        if not self._start or "```".startswith(self._start):
            return []
        held, self._held = self._held, []
        if self._start[0] in "{[`":
            self._active = self._fallback
        else:
            self._settle()
        return self._feed_all(held)

    def _settle(self) -> None:
        """The primary is in charge for good: ``feed`` is its own ``feed`` from now on (what
        ``_to_active`` would do, without two calls more on every delta)."""
        self._active = self._primary
        self.feed = self._primary.feed      # type: ignore[method-assign]

    def _feed_all(self, pieces: list[str]) -> list[Event]:
        """Held text, piece by piece: a long run of blanks is never made one string."""
        events: list[Event] = []
        for piece in pieces:
            events += self._to_active(piece)
        return events

    def _to_active(self, text: str) -> list[Event]:
        active = self._active or self._primary
        events = active.feed(text)
        if active is self._fallback:
            if self._fallback.gave_up:
                self._settle()
                events += self._replay()
            elif self._fallback.handed_over:
                events += self._hand_over()
        return events

    def _hand_over(self) -> list[Event]:
        """Calls were read: what follows is the family parser's (its markup, its calls)."""
        fallback, primary = self._fallback, self._primary
        self._settle()
        rest, fallback._buf = fallback.handed_text + fallback._buf, ""
        primary.calls = fallback.calls        # call indices go on from the fallback's
        primary.called()
        return primary.feed(rest) if rest else []

    def _replay(self) -> list[Event]:
        events: list[Event] = []
        for piece in self._fallback.take_raw():
            events += self._primary.feed(piece)
        return events

    def flush(self) -> list[Event]:
        if self._active is None:
            self._settle()
            held, self._held = self._held, []
            return self._feed_all(held) + self._primary.flush()
        if self._active is self._fallback:
            events = self._fallback.flush()
            if self._fallback.gave_up:
                return self._replay() + self._primary.flush()
            if self._fallback.handed_over:
                return events + self._hand_over() + self._primary.flush()
            return events
        return self._primary.flush()
