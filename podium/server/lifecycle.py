"""Stopping cleanly: after SIGTERM (or Ctrl-C) running streams get a grace period, then end
with a proper in-band terminal event instead of a dropped connection.

uvicorn stops accepting connections at once and waits for open ones; ``Drain`` fires when the
grace period is over, and every ``SSEResponse`` still streaming then ends itself.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import uvicorn

log = logging.getLogger(__name__)


class Drain:
    """Ends the streams still running when the grace period is over.

    Streams register a callback rather than each waiting on an event: one task and one
    waiter fewer per open stream.
    """

    def __init__(self) -> None:
        self._watchers: set[Callable[[], object]] = set()
        self.started = False
        self.fired = False

    def watch(self, end: Callable[[], object]) -> Callable[[], None]:
        """Call ``end`` when the grace period is over (at once if it is); returns the
        function that stops watching."""
        if self.fired:
            end()
        self._watchers.add(end)
        return lambda: self._watchers.discard(end)

    def begin(self, grace: float) -> None:
        """Start the grace period (from the event loop's thread)."""
        if self.started:
            return
        self.started = True
        asyncio.get_running_loop().call_later(grace, self._fire)
        log.info("shutting down: running streams have %.0f s to finish", grace)

    def _fire(self) -> None:
        self.fired = True
        for end in list(self._watchers):
            end()


class Server(uvicorn.Server):
    """uvicorn, telling the app's ``Drain`` when a stop signal arrives."""

    def __init__(self, config: uvicorn.Config, drain: Drain, grace: float):
        super().__init__(config)
        self._drain, self._grace = drain, grace

    def handle_exit(self, sig: int, frame) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            loop.call_soon_threadsafe(self._drain.begin, self._grace)
        super().handle_exit(sig, frame)
