"""Hermes / Qwen2.5 / Qwen3 tool calls, and the JSON shared by several families.

    Let me check.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {}}
    </tool_call>

A ``<tool_call>`` that is not followed by a call object naming a declared tool is content.
"""

from __future__ import annotations

from podium.parsing.scan import Markers
from podium.parsing.tools.base import ToolParser, ToolSet


class HermesParser(ToolParser):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._open = Markers(self.OPEN)
        self._state = "text"
        self._raw: list[str] = []  # the call's text until it names its tool: content again
                                   # if it is no call (pieces: a call can be 400 KB)

    def _step(self, buf: str) -> int | None:
        if self._state == "call":
            return self._in_call(buf)
        if self._state == "text":
            used, marker = self.scan_text(buf, self._open)
            if marker is not None:
                self._state, self._raw = "call", [marker]
                self.start_call_object()
            return used
        return self._after_call(buf)

    def _in_call(self, buf: str) -> int | None:
        outcome, used = self.call_object(buf)
        if outcome == "more":
            if self._json.name is None:
                self._raw.append(buf)
            else:
                self._raw.clear()               # named: a call whatever follows
        elif outcome == "no call":              # never a call: what was held is content
            self._state = "text"
            self.text("".join(self._raw) + buf[:used])
        else:
            self._state = "after"
        return used

    def _after_call(self, buf: str) -> int | None:
        """Skip the whitespace and ``</tool_call>`` that close a call; anything else is text."""
        blanks = self.hold_blanks(buf, None)
        if blanks:
            return blanks
        if self.CLOSE.startswith(buf) and buf != self.CLOSE:
            return None
        gap, self._state = self.take_blanks(), "text"
        if buf.startswith(self.CLOSE):
            return len(self.CLOSE)
        self.text(gap)
        return 0

    def _finish(self, rest: str) -> None:
        if self._state == "call" and self._json.name is None:
            self.text("".join(self._raw) + rest)
        elif self._state == "text":
            self.text(rest)
