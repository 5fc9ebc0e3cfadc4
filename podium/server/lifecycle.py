"""The server process's life: quiet while idle, clean when stopped.

Idle: uvicorn wakes ten times a second to refresh its Date header and look for a stop
request. ``Server`` does that only while connections are open; with none it sleeps until one
arrives (or a stop signal), after giving back the memory a burst of traffic left behind
(``podium.server.memory``). An idle Podium therefore wakes zero times a second, and makes no
objects that would keep a burst's memory pinned.

Stopping: after SIGTERM (or Ctrl-C) running streams get a grace period, then end with a
proper in-band terminal event instead of a dropped connection. uvicorn stops accepting
connections at once and waits for open ones; ``Drain`` fires when the grace period is over,
and every ``SSEResponse`` still streaming then ends itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from email.utils import formatdate
from typing import Callable

import uvicorn

from podium.server.memory import FreeListReserve, give_back_memory

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


class _Connections(set):
    """uvicorn's set of open connections, calling ``arrived`` as the first one opens.

    Every uvicorn protocol (HTTP and WebSocket) adds itself here in ``connection_made``,
    before it reads a byte, so ``arrived`` runs before any request on the connection.
    """

    def __init__(self, arrived: Callable[[], None]):
        super().__init__()
        self._arrived = arrived

    def add(self, connection) -> None:
        if not self:
            self._arrived()
        super().add(connection)


class Server(uvicorn.Server):
    """uvicorn, quiet while idle, telling the app's ``Drain`` when a stop signal arrives.

    ``settle``: seconds without connections after traffic before memory is given back.
    Setting ``should_exit`` (a stop signal does) wakes it, from any thread.
    """

    _loop: asyncio.AbstractEventLoop | None = None
    _wake: asyncio.Event | None = None
    _should_exit = False

    def __init__(self, config: uvicorn.Config, drain: Drain, grace: float,
                 settle: float = 2.0):
        super().__init__(config)
        self._drain, self._grace, self._settle = drain, grace, settle
        self._reserve: FreeListReserve
        self._traffic = False               # connections since memory was last given back
        self.server_state.connections = _Connections(self._connection_arrived)
        self._idle_headers: list[tuple[bytes, bytes]] = []

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        loop, wake = self._loop, self._wake
        if value and loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._reserve = FreeListReserve()
        # made at start-up, standing in while no connection is open (see _go_quiet)
        self._idle_headers = list(self.config.encoded_headers)
        counter = 0
        while not await self.on_tick(counter):
            if self._idle():
                counter = 0                 # the date header is refreshed on waking
                await self._sleep_while_idle()
                continue
            counter = (counter + 1) % 864000
            await asyncio.sleep(0.1)

    def _idle(self) -> bool:
        state = self.server_state
        return not (state.connections or state.tasks or self.should_exit)

    async def _sleep_while_idle(self) -> None:
        """Wait for a connection or a stop signal; after traffic, first give memory back
        once no connection has come for ``settle`` seconds."""
        assert self._wake is not None
        self._wake.clear()
        if self._traffic:
            try:
                await asyncio.wait_for(self._wake.wait(), self._settle)
                return
            except TimeoutError:
                self._traffic = False
                self._go_quiet()
                await give_back_memory(self._reserve, self._idle)
                if not self._idle():
                    return
        await self._wake.wait()

    def _go_quiet(self) -> None:
        """Let go of the last objects made while busy that would otherwise live on through the
        idle spell (each would keep a megabyte arena of the burst alive): the Date header
        uvicorn last made (no connection is open to send it, and the next one to open stamps
        a fresh one first) and uvicorn's request count, which only serves
        ``limit_max_requests`` (Podium sets none)."""
        self.server_state.default_headers = self._idle_headers
        if self.config.limit_max_requests is None:
            self.server_state.total_requests = 0

    def _connection_arrived(self) -> None:
        """The first connection after an idle spell: stamp a fresh Date header at once
        (requests on it may be answered before the main loop runs) and wake the loop."""
        self._traffic = True
        date = ([(b"date", formatdate(time.time(), usegmt=True).encode())]
                if self.config.date_header else [])
        self.server_state.default_headers = date + self.config.encoded_headers
        if self._wake is not None:
            self._wake.set()

    def handle_exit(self, sig: int, frame) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        super().handle_exit(sig, frame)
        if loop is not None:
            loop.call_soon_threadsafe(self._drain.begin, self._grace)
