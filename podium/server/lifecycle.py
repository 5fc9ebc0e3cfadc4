"""The server process's stop: running streams get a grace period, then end cleanly.

After SIGTERM (or Ctrl-C) uvicorn stops accepting connections at once and waits for open
ones; ``Drain`` fires when the grace period is over, and every ``SSEResponse`` (and every
non-streamed request, ``podium.server.watch``) still running then ends itself with a proper
in-band terminal event (or a 503) instead of a dropped connection.

``Server`` is uvicorn's own, run through its public ``Config`` / ``Server`` API, with one
override: ``handle_exit``, the method uvicorn registers for SIGINT and SIGTERM, also begins
the drain. Nothing else of uvicorn's is replaced, so the server wakes ten times a second
like any uvicorn (its tick refreshes the Date header and looks for a stop request).
``tests/server/test_lifecycle.py`` sends a real SIGTERM and fails if uvicorn stops routing
its stop signals through ``handle_exit``.
"""

from __future__ import annotations

import asyncio
import logging
from types import FrameType
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
    """uvicorn's server, telling the app's ``Drain`` when a stop signal arrives."""

    def __init__(self, config: uvicorn.Config, drain: Drain, grace: float):
        super().__init__(config)
        self._drain, self._grace = drain, grace

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        super().handle_exit(sig, frame)
        if loop is not None:
            # a signal handler runs between two steps of the loop: hand over to it
            loop.call_soon_threadsafe(self._drain.begin, self._grace)
