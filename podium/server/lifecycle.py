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
    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self.started = False

    def event(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def begin(self, grace: float) -> None:
        """Start the grace period (from the event loop's thread)."""
        if self.started:
            return
        self.started = True
        event = self.event()
        asyncio.get_running_loop().call_later(grace, event.set)
        log.info("shutting down: running streams have %.0f s to finish", grace)


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


def _malloc_trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):       # not glibc: nothing to hand back this way
        pass


async def return_memory_when_idle(busy: Callable[[], bool], every: float = 5.0) -> None:
    """After a burst of traffic, give freed memory back to the OS once the server is idle.

    CPython and glibc keep freed memory for reuse; after a thousand streams that can be tens
    of megabytes. A full collection and ``malloc_trim`` while nothing runs costs a few
    milliseconds and brings RSS back near its baseline.
    """
    import gc

    dirty = False
    while True:
        await asyncio.sleep(every)
        if busy():
            dirty = True
        elif dirty:
            dirty = False
            gc.collect()
            await asyncio.to_thread(_malloc_trim)
