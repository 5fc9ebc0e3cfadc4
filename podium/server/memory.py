"""Giving memory back after a burst of traffic.

A thousand streams cost tens of megabytes of small Python objects. When they end, CPython's
small-object allocator (pymalloc) can hand a 1 MiB arena back to the OS only once every
object in it is gone, and glibc keeps freed heap memory unless asked. So once the server goes
idle after traffic, ``return_memory_when_idle`` runs a full collection, renews the C free
lists a burst leaves filled with scattered objects, and trims the heap.

What still pins arenas after a 1,000-stream burst (a census of pymalloc's pools, see
docs/architecture.md): a handful of objects that periodic tasks re-create forever (uvicorn's
0.1 s tick and its date header, this loop's own sleep) and that therefore stay in whatever
pool they first landed in, one or two per otherwise empty arena.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
from typing import Callable


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):       # not glibc: nothing to hand back this way
        pass


async def return_memory_when_idle(busy: Callable[[], bool], every: float = 5.0) -> None:
    """After a burst of traffic, give freed memory back to the OS once the server is idle.

    CPython and glibc keep freed memory for reuse; after a thousand streams that can be tens
    of megabytes. A full collection and ``malloc_trim`` while nothing runs costs a few
    milliseconds and brings RSS back near its baseline.
    """
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
    out, allocating as many fresh ones (after the full collection, mostly from pools that
    hold older objects), then releasing the fresh ones first refills the free lists with
    them and really frees the old ones; it helps, it does not guarantee where they land. (`bench/load.py`, 1,000 streams, three runs each: RSS once idle was +19 / +26 /
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
