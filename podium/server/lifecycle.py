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
            await _renew_free_lists(asyncio.get_running_loop())
            await asyncio.to_thread(_malloc_trim)


FREE_LIST_ROOM = 512     # more than the free lists below keep (CPython 255, uvloop 250)


async def _renew_free_lists(loop: asyncio.AbstractEventLoop) -> None:
    """Let the objects C free lists kept from a burst go back to the allocator.

    Some C types keep a few hundred freed objects for reuse (asyncio's future iterators,
    uvloop's handles and timer handles). Those kept after a burst were allocated at its peak,
    scattered over arenas that are otherwise empty, and pin them. Taking every kept object
    out, allocating as many fresh ones (they come from the fullest arenas), then releasing the
    fresh ones first refills the free lists with objects that pin nothing and really frees the
    old ones. (`bench/load.py`, 1,000 streams, three runs each: RSS once idle was +19 / +26 /
    +20% over baseline without this, +16 / +17 / +11% with it.)
    """
    futures = [loop.create_future() for _ in range(2 * FREE_LIST_ROOM)]
    kept = [f.__await__() for f in futures[:FREE_LIST_ROOM]]
    fresh = [f.__await__() for f in futures[FREE_LIST_ROOM:]]
    del fresh, kept, futures
    for make in (lambda: loop.call_soon(_nothing), lambda: loop.call_later(3600, _nothing)):
        kept = [make() for _ in range(FREE_LIST_ROOM)]
        fresh = [make() for _ in range(FREE_LIST_ROOM)]
        for handle in kept + fresh:
            handle.cancel()
        await asyncio.sleep(0.05)           # the loop lets go of them; then we do, fresh first
        del fresh
        del kept


def _nothing() -> None:
    pass
