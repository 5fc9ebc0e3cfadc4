"""Reasoning split off the visible text: ``<think>`` ... ``</think>`` and ``[THINK]`` ... ``[/THINK]``.

The opening tag is honoured at the start of the answer, or already in the prompt: templates
that open ``<think>`` themselves (DeepSeek-R1, some Qwen3 modes) leave the model inside
reasoning from its first token, which ``starts_inside(prompt)`` detects.
"""

from __future__ import annotations

import logging

from podium.parsing.events import Event, ReasoningDelta, TextDelta
from podium.parsing.scan import Markers

_WS = " \t\r\n"
log = logging.getLogger(__name__)


class ReasoningParser:
    def __init__(self, open_tag: str, close_tag: str, *, inside: bool = False):
        self.open_tag, self.close_tag = open_tag, close_tag
        self._close = Markers(close_tag)
        self._close_start = close_tag[0]    # text without it can neither hold nor begin the tag
        # "start" (not yet known), "reasoning", "after" (the close tag seen), "content", in
        # that order (or "start" to "content"): text comes out only on reaching "content"
        self.state = "reasoning" if inside else "start"
        self._buf = ""
        self._lead: list[str] = []  # blank text at the start, before we know what follows
        self.finished = False       # reasoning is over and nothing is held: all is content

    @classmethod
    def starts_inside(cls, prompt: str, open_tag: str, close_tag: str) -> bool:
        tail = prompt.rstrip(_WS)
        return tail.endswith(open_tag)

    def feed(self, text: str) -> list[Event]:
        # Nearly every token: reasoning text with nothing held and nothing in it that could
        # begin the close tag is reasoning as it stands (what _s_reasoning would find after
        # its scans). The state stays "reasoning", so ``finished`` stays False.
        if (self.state == "reasoning" and not self._buf and text
                and self._close_start not in text):
            return [ReasoningDelta(text)]
        self._buf += text
        out: list[Event] = []
        while self._buf:
            used = getattr(self, "_s_" + self.state)(self._buf, out)
            if used is None:
                break
            self._buf = self._buf[used:]
        self.finished = self.state == "content" and not self._buf
        return out

    def flush(self) -> list[Event]:
        rest, self._buf = "".join(self._lead) + self._buf, ""
        self._lead = []
        if not rest or self.state == "after":
            return []
        if self.state == "reasoning":
            return [ReasoningDelta(rest)]
        return [TextDelta(rest)]

    def _s_start(self, buf: str, out: list[Event]) -> int | None:
        stripped = buf.lstrip(_WS)
        if len(stripped) < len(buf):        # held aside, not rescanned with every delta
            self._lead.append(buf[:len(buf) - len(stripped)])
            return len(buf) - len(stripped)
        if self.open_tag.startswith(buf) and buf != self.open_tag:
            return None
        lead, self._lead = "".join(self._lead), []
        if buf.startswith(self.open_tag):
            self.state = "reasoning"
            return len(self.open_tag)
        self.state = "content"
        if lead:
            out.append(TextDelta(lead + buf))
            return len(buf)
        return 0

    def _s_reasoning(self, buf: str, out: list[Event]) -> int | None:
        pos, marker = self._close.find(buf)
        if marker is None:
            safe = len(buf) - self._close.held(buf)
            if safe:
                out.append(ReasoningDelta(buf[:safe]))
            return safe or None
        if pos:
            out.append(ReasoningDelta(buf[:pos]))
        self.state = "after"
        return pos + len(marker)

    def _s_after(self, buf: str, out: list[Event]) -> int | None:
        """Whitespace between the reasoning and the answer belongs to neither; nor does the
        close tag written again (dropped, logged)."""
        stripped = buf.lstrip(_WS)
        if not stripped:
            return len(buf)
        close = self.close_tag
        if close.startswith(stripped) and stripped != close:
            return None
        if stripped.startswith(close):
            log.warning("dropped stray %r from the model's answer", close)
            return len(buf) - len(stripped) + len(close)
        self.state = "content"
        return len(buf) - len(stripped)

    def _s_content(self, buf: str, out: list[Event]) -> int | None:
        out.append(TextDelta(buf))
        return len(buf)
