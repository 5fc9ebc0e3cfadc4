"""A request handed to an engine's worker, and its outputs as the caller reads them.

An engine whose work runs off the caller's event loop (a thread, or another loop) queues a
``Job`` and returns a ``JobOutputs``: its worker ``emit``s outputs (or an exception) from
wherever it runs; the caller reads them on its own loop through the job's ``asyncio.Queue``.
The reading side is written here once. Each engine says only how the end of a request
reaches its worker (``JobOutputs._over``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Generic, Self, TypeVar

from podium.engine.base import EngineOutput, EngineRequest
from podium.errors import EngineError, PodiumError


@dataclass(eq=False)
class Job:
    """One request on its way through an engine's worker."""

    request: EngineRequest
    loop: asyncio.AbstractEventLoop             # the caller's loop
    outputs: asyncio.Queue                      # EngineOutput, or an exception, in order
    aborted: bool = False

    def emit(self, item: EngineOutput | BaseException) -> None:
        """From the worker's thread: hand ``item`` to the caller's loop; none to hand it to
        once that loop is closed (its caller is gone: the job is over, the worker goes on)."""
        try:
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)
        except RuntimeError:        # "Event loop is closed"
            self.aborted = True


J = TypeVar("J", bound=Job)


class JobOutputs(Generic[J]):
    """One job's outputs, in order, ending with the one that carries a finish reason (an
    ``engine.base.Generation``).

    An exception the worker emits ends them too: a ``PodiumError`` (the request's own fault)
    is raised as itself, anything else as ``EngineError``. Closing them early, cancelling
    their reader, or dropping them unread ends the request (``_over(early=True)``).
    """

    def __init__(self, job: J):
        self._job = job
        self._done = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> EngineOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._job.outputs.get()
        except BaseException:           # the consumer was cancelled: nobody reads on
            self._end(early=True)
            raise
        if isinstance(item, BaseException):
            self._end(early=False)
            if isinstance(item, PodiumError):      # the request's own fault, said as such
                raise item
            raise EngineError(f"The engine failed: {item}") from item
        if item.finish_reason is not None:
            self._end(early=False)
        return item

    async def aclose(self) -> None:
        self._end(early=True)

    def __del__(self) -> None:
        self._end(early=True)

    def _end(self, early: bool) -> None:
        if not self._done:
            self._done = True
            self._over(early)

    def _over(self, early: bool) -> None:
        """The reader is done, once: ``early`` when before the job's last output (closed,
        cancelled, dropped), else after its last output or error. The engine's part."""
        raise NotImplementedError
