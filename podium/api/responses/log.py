"""A response's event log: written in batches while it runs, followed by any number of
readers on any replica, and the last writes of runs that ended, kept until they are done.

``EventLog`` appends one response's events to the store and wakes the followers waiting on
it on this replica (followers on other replicas hear of the write from the store: ``changed``); it stops for good (``gone``) when the response is deleted: at once on this replica
(``discard``), at its next append on any other (the store refuses it). It is handed each
event as it is numbered (``put``) and writes it once its consumer has had it (``reached``),
or at the end (``flush``), by one write at a time: so the log holds every number the run
gave, in order, whatever cut the run short (a cancel while the consumer waits on the
store), and a finished turn's terminal event is written only after its consumer had it. ``Logs`` holds the
logs open on this replica, ``follow`` replays a log and then tails it, and ``Finalizers``
runs the last writes of a stream whose client has gone, each tracked until it finishes, so a
shutdown waits for all of them. ``fail_response`` closes the log of a response whose replica
stopped (the store calls it when it fails one: the store renders no events itself).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncGenerator, Awaitable

from podium.errors import StoreUnavailable
from podium.render.responses import Sequencer, recover
from podium.store.base import TERMINAL, ResponseStore

log = logging.getLogger(__name__)

Obj = dict[str, Any]
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
FLUSH_EVENTS, FLUSH_SECONDS, POLL_SECONDS = 32, 0.05, 0.25


class EventLog:
    def __init__(self, store: ResponseStore, response_id: str):
        self._store, self.response_id = store, response_id
        self._batch: list[Obj] = []         # numbered, not yet written (in order)
        self._ready = -1                    # written up to this number when flushed
        self._last = time.monotonic()
        self._writing: asyncio.Future[None] | None = None
        self.changed = asyncio.Event()      # set (and replaced) after each write
        self.gone = False

    def put(self, events: list[Obj]) -> None:
        """Events as they are numbered (``Sequencer.sink``): held until ``reached``."""
        if not self.gone:
            self._batch += events

    async def reached(self, event: Obj) -> None:
        """The consumer has ``event`` (put before): write up to it when a batch is due."""
        self._ready = event["sequence_number"]
        if (len(self._batch) >= FLUSH_EVENTS or event["type"] in TERMINAL_EVENTS
                or time.monotonic() - self._last >= FLUSH_SECONDS):
            await self._write()

    async def flush(self) -> None:
        """Write every event put, had by the consumer or not (the run has ended)."""
        if self._batch:
            self._ready = max(self._ready, self._batch[-1]["sequence_number"])
        await self._write()

    async def _write(self) -> None:
        """One task writes, batch after batch: a caller cancelled while it waits leaves the
        write going (shielded), and a later caller waits for it, so no batch is lost or
        written after a later one (a follower would find a gap)."""
        self._last = time.monotonic()
        if self._writing is None or self._writing.done():
            self._writing = asyncio.ensure_future(self._drain())
            self._writing.add_done_callback(_retrieve)
        await asyncio.shield(self._writing)

    async def _drain(self) -> None:
        try:
            while not self.gone:
                ready = 0
                while ready < len(self._batch) and \
                        self._batch[ready]["sequence_number"] <= self._ready:
                    ready += 1
                if not ready:
                    return
                batch = self._batch[:ready]
                self.gone = not await self._store.append_events(self.response_id, batch)
                del self._batch[:ready]
        finally:
            self.wake()

    def discard(self) -> None:
        self.gone, self._batch = True, []
        self.wake()

    def wake(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


class Logs:
    """The event logs open on this replica, and their followers."""

    def __init__(self, store: ResponseStore):
        self._store = store
        self._open: dict[str, EventLog] = {}

    def open(self, response_id: str) -> EventLog:
        writer = self._open[response_id] = EventLog(self._store, response_id)
        return writer

    def close(self, writer: EventLog) -> None:
        if self._open.get(writer.response_id) is writer:
            del self._open[writer.response_id]
        writer.wake()                   # followers look at the store from now on

    def get(self, response_id: str) -> EventLog | None:
        return self._open.get(response_id)

    async def follow(self, response_id: str, after: int,
                     owner: str) -> AsyncGenerator[Obj, None]:
        """The logged events after ``after``, then live ones, up to the terminal event."""
        store = self._store
        while True:
            changed = store.changed(response_id)    # taken before reading: a write after
            events = await store.events_after(response_id, after)
            for event in events:
                yield event
                after = event["sequence_number"]
                if event["type"] in TERMINAL_EVENTS:
                    return
            writer = self._open.get(response_id)
            if writer is not None and writer.gone:
                writer = None           # deleted: the store says so at once
            if not events and writer is None:
                record = await store.get(response_id, owner)
                if record is None or (record.status in TERMINAL and not
                                      await store.events_after(response_id, after, 1)):
                    return
            try:
                # written here: this replica's writer says so; elsewhere: the store hears
                # it (PostgreSQL's NOTIFY), else it is looked at again after a short while
                await asyncio.wait_for((writer.changed if writer is not None
                                        else changed).wait(), POLL_SECONDS)
            except asyncio.TimeoutError:
                pass


class Finalizers:
    """Last writes that must run to their end although their caller is going: each task is
    kept until it is done, and ``drain`` waits for all of them (at shutdown)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except StoreUnavailable as exc:
                log.warning("a stored response could not be finished: %s", exc.message)

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _retrieve(task: asyncio.Future[None]) -> None:
    """A write's failure reaches the caller waiting on it; one whose caller was cancelled
    meanwhile is not "never retrieved" (the next write, or the run's end, meets it)."""
    if not task.cancelled():
        task.exception()


def fail_response(body: Obj, logged: list[Obj], message: str) -> list[Obj]:
    """Fail one interrupted response (``ResponseStore.fail_unfinished``'s ``close``): its
    output is what its log holds, and its log is closed (open items done, then
    ``response.failed``) so followers end: the closing events, stamped after the log's last.
    A non-streamed response has no log to close: no events."""
    output, closing = recover(logged)
    body.update(status="failed", error={"code": "server_error", "message": message})
    if logged:
        body["output"] = output
    if not logged and not body.get("background"):
        return []
    seq = Sequencer(logged[-1]["sequence_number"] + 1 if logged else 0)
    return seq.stamp([*closing, {"type": "response.failed", "response": body}])
