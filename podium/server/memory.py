"""Giving memory back after a burst of traffic.

A thousand streams cost tens of megabytes of small Python objects. When they end, CPython's
small-object allocator (pymalloc) can hand a 1 MiB arena back to the OS only once every
object in it is gone, and glibc keeps freed heap memory unless asked. So once the server has
gone idle after traffic (``podium.server.lifecycle.Server`` decides when),
``give_back_memory`` lets go of every object it can find that would keep a burst's arena
alive, then trims the heap.

Which objects those are was found by a census of pymalloc's pools after a 1,000-stream load
(``bench/pool_census.py``; docs/architecture.md, Lessons): objects that periodic tasks
re-create (so the server runs none while idle), the C free lists of asyncio and uvloop,
CPython's type attribute cache and its own free lists. Anything allocated after a burst lands
in the burst's arenas, so the only objects that can safely live on are those made before it.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import gc
import sys
from typing import Callable


def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):       # not glibc: nothing to hand back this way
        return None


_malloc_trim = _libc_malloc_trim()
# Python 3.13 deprecates sys._clear_type_cache for the more general _clear_internal_caches
_clear_type_cache = getattr(sys, "_clear_internal_caches", None) or sys._clear_type_cache


async def give_back_memory(reserve: FreeListReserve, still_idle: Callable[[], bool]) -> None:
    """Give the memory freed since the last call back to the OS, as far as it can go.

    CPython and glibc keep freed memory for reuse; after a thousand streams that can be tens
    of megabytes. A full collection, the type attribute cache cleared, the C free lists
    swapped for start-up objects (``reserve``), and a moment later, if the server is
    ``still_idle``, another collection and ``malloc_trim``: a few milliseconds while
    nothing runs.
    """
    gc.collect()
    # CPython's type attribute cache holds a reference to every attribute name it was last
    # asked for; C code that looks names up from a C string (``datetime``'s ``dst``, for
    # the Date header) makes a new string each time, and the cache keeps them, one per slot.
    _clear_type_cache()
    await reserve.swap()
    asyncio.get_running_loop().call_later(FINISH_AFTER, _finish, still_idle)


FINISH_AFTER = 0.5       # seconds


def _finish(still_idle: Callable[[], bool]) -> None:
    """The last step, from a bare timer callback once the steps before have unwound.

    What they made and freed (frames, tuples, lists, contexts) went to CPython's own free
    lists, which keep freed objects where they were, in the burst's pools: a full collection
    empties those lists (that alone gave back about 3 MB after 1,000 streams). Nothing is
    allocated after it, so ``malloc_trim`` (about a millisecond) runs here too, rather than
    on a worker thread whose hand-off would leave objects behind again.
    """
    if not still_idle():
        return
    gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)


# How many freed objects each free list keeps: FI_FREELIST_MAXLEN in CPython's
# Modules/_asynciomodule.c, DEFAULT_FREELIST_SIZE in uvloop's includes/consts.pxi.
FUTURE_ITER_KEPT = 255
UVLOOP_HANDLES_KEPT = 250


class FreeListReserve:
    """Start-up objects to swap into C free lists once a burst is over.

    Some C types keep freed objects for reuse: asyncio's future iterator (CPython keeps up to
    255), uvloop's ``Handle`` and ``TimerHandle`` (250 each). After a burst the objects kept
    are the last ones freed, a few to a pool across the burst's arenas, and they pin those
    arenas for as long as the server stays idle. Renewing them does not help: whatever is
    allocated after a burst lands in the burst's arenas (the start-up arenas are full).
    Objects allocated at start-up do: the reserve holds as many of each kind as its free list
    keeps. ``swap`` takes the kept objects out of each free list, lets the reserve's objects
    refill it, frees the kept ones for real, then takes the reserve's objects back out, so
    the free list ends empty and the reserve is ready for the next burst.

    Made on the running loop at start-up, before traffic; it holds about 80 KB.
    """

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._kinds: list[tuple[Callable[[], object], int]] = [
            (future.__await__, FUTURE_ITER_KEPT)]
        if type(loop).__module__.startswith("uvloop"):
            context = contextvars.copy_context()    # one, made now, for every handle

            def handle() -> object:
                return _cancelled(loop.call_soon(_nothing, context=context))

            def timer() -> object:
                return _cancelled(loop.call_later(3600, _nothing, context=context))

            self._kinds += [(handle, UVLOOP_HANDLES_KEPT), (timer, UVLOOP_HANDLES_KEPT)]
        self._held = [[make() for _ in range(size)] for make, size in self._kinds]

    async def swap(self) -> None:
        for i, (make, size) in enumerate(self._kinds):
            kept = [make() for _ in range(size)]     # empties the free list
            self._held[i] = []                        # start-up objects refill it
            del kept                                  # the kept ones are freed for real
            await _loop_turns()                       # (handles: once the loop lets go)
            self._held[i] = [make() for _ in range(size)]
        await _loop_turns()


def _cancelled(handle: asyncio.Handle) -> asyncio.Handle:
    handle.cancel()
    return handle


async def _loop_turns() -> None:
    """Let the loop run a few iterations: it drops cancelled handles and closes timers."""
    for _ in range(3):
        await asyncio.sleep(0)


def _nothing() -> None:
    pass
