"""Incremental stop-string matcher.

Text is released as soon as it can no longer be the start of a stop string; the longest
suffix that could still begin one is held back. The held part is shorter than the longest
stop string, so each ``feed`` costs O(len(delta) + longest stop), whatever came before.
"""

from __future__ import annotations


class StopMatcher:
    __slots__ = ("_stops", "_longest", "_held", "stopped", "matched")

    def __init__(self, stops: list[str]):
        self._stops = [s for s in stops if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None     # the stop string that ended the text

    @property
    def active(self) -> bool:
        """There are stop strings to look for."""
        return bool(self._stops)

    def feed(self, delta: str) -> str:
        """The text that is safe to release; sets ``stopped`` when a stop string appears."""
        if self.stopped:
            return ""
        if not self._stops:
            return delta
        text = self._held + delta
        cut = self._first_completed(text)
        if cut >= 0:
            self._held = ""
            self.stopped = True
            return text[:cut]
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        """Release what was held: the output ended without completing a stop string."""
        held, self._held = self._held, ""
        return held

    def _first_completed(self, text: str) -> int:
        """Start of the stop string that completes first (ties: the longer one), or -1.

        Generation ends the moment any stop string is complete, so the one that ends
        earliest wins; this also makes the result independent of how text is chunked.
        """
        best_end, best_start = -1, -1
        for stop in self._stops:
            start = text.find(stop)
            if start < 0:
                continue
            end = start + len(stop)
            if best_end < 0 or end < best_end or (end == best_end and start < best_start):
                best_end, best_start, self.matched = end, start, stop
        return best_start

    def _partial_suffix(self, text: str) -> int:
        for k in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0
