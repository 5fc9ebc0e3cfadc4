"""What other replicas do to a response, heard as it happens: PostgreSQL's LISTEN / NOTIFY.

Every write to a response's event log, status or existence sends ``NOTIFY podium_events``
with its id, and a cancel request sends ``NOTIFY podium_cancels``, in the writing transaction
(so the news arrives at its commit, never before the data). Each replica keeps one connection
that listens on both channels:

- a follower waiting for a response's next events waits on ``changed(response_id)``, which
  is set when any replica writes to that response;
- a cancel request goes to the callback the Responses service gives (the replica running the
  response cancels it; the others ignore it).

The listening connection reconnects after a failure. Nothing depends on a notification
alone: followers also look again after a short timeout, and leases carry cancel requests
too, so a notification lost while reconnecting delays, never loses, what it announced.
SQLite has no such channel: ``changed`` is never set, and followers on another process look
again after their timeout.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Callable

log = logging.getLogger(__name__)

EVENTS, CANCELS = "podium_events", "podium_cancels"
RECONNECT_SECONDS = 1.0


class Listener:
    def __init__(self, conninfo: str | None):
        """``conninfo``: a libpq URL (PostgreSQL), or None for a database without NOTIFY."""
        self._conninfo = conninfo
        self._changed: weakref.WeakValueDictionary[str, asyncio.Event] = \
            weakref.WeakValueDictionary()
        self._on_cancel: Callable[[str], None] = lambda _: None
        self._task: asyncio.Task | None = None
        self.connected = asyncio.Event() if conninfo else None

    def changed(self, response_id: str) -> asyncio.Event:
        """An event set at the next write of any replica to this response. Take it before
        reading what is there, then wait on it: a write in between still sets it."""
        event = self._changed.get(response_id)
        if event is None:
            event = self._changed[response_id] = asyncio.Event()
        return event

    async def start(self, on_cancel: Callable[[str], None]) -> None:
        """Listen from now on (returns once listening, or after a first failed attempt)."""
        self._on_cancel = on_cancel
        if self._conninfo is None or self._task is not None:
            return
        self._task = asyncio.create_task(self._listen(), name="podium-store-listener")
        assert self.connected is not None
        try:
            await asyncio.wait_for(self.connected.wait(), 10)
        except asyncio.TimeoutError:
            log.warning("response store: not listening for other replicas' writes yet")

    async def _listen(self) -> None:
        import psycopg

        assert self._conninfo is not None
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        self._conninfo, autocommit=True,
                        application_name="podium-listener") as conn:
                    await conn.execute(f"LISTEN {EVENTS}")
                    await conn.execute(f"LISTEN {CANCELS}")
                    assert self.connected is not None
                    self.connected.set()
                    self._wake_all()        # whatever happened while not listening
                    async for note in conn.notifies():
                        self._heard(note.channel, note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnect after any failure
                log.warning("response store: listening connection lost (%s); reconnecting",
                            exc)
            if self.connected is not None:
                self.connected.clear()
            await asyncio.sleep(RECONNECT_SECONDS)

    def _heard(self, channel: str, response_id: str) -> None:
        if channel == EVENTS:
            event = self._changed.pop(response_id, None)
            if event is not None:
                event.set()
        elif channel == CANCELS:
            try:
                self._on_cancel(response_id)
            except Exception:  # noqa: BLE001 - one bad callback must not stop listening
                log.exception("response store: cancel of %s failed", response_id)

    def _wake_all(self) -> None:
        for response_id in list(self._changed.keys()):
            event = self._changed.pop(response_id, None)
            if event is not None:
                event.set()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
