"""Leases: every stored response that runs is held by the replica running it.

A lease is renewed every third of its length while the response runs; a cancel request made
on another replica travels with the renewal (or, on PostgreSQL, at once through the store);
a lease that lapses (its replica died) lets any replica fail the response, its log closed
(``log.fail_response``), at its next renewal or start.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Callable

from podium.api.responses.log import fail_response
from podium.errors import StoreUnavailable
from podium.store.base import ResponseStore

log = logging.getLogger(__name__)


class Leases:
    def __init__(self, store: ResponseStore, seconds: float, cancel: Callable[[str], None]):
        self._store = store
        self.seconds = seconds
        self._cancel = cancel                   # ends a response if it runs here
        self.replica = secrets.token_hex(8)     # this process, as a lease holder
        self.held: set[str] = set()             # stored responses running here
        self._keeper: asyncio.Task | None = None

    def new(self) -> tuple[str, float]:
        """A lease for a response about to be stored: its holder and expiry."""
        return self.replica, time.time() + self.seconds

    async def start(self) -> None:
        await self._store.start(self.cancel_here)
        await self.fail_abandoned()
        self._keeper = asyncio.create_task(self._keep(), name="podium-leases")

    async def stop_keeping(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)

    async def give_up(self) -> None:
        """Let this replica's leases lapse now: the next start, or another replica at once,
        fails their responses with their logs closed."""
        try:
            await self._store.renew(sorted(self.held), self.replica, 0)
        except StoreUnavailable as exc:
            log.warning("response leases not given up (they lapse): %s", exc.message)

    def cancel_here(self, response_id: str) -> None:
        """A cancel request heard from another replica (or a lease lost)."""
        self._cancel(response_id)

    async def _keep(self) -> None:
        """Renew this replica's leases every third of a lease; act on the cancel requests
        they carry; stop what it no longer holds; fail other replicas' lapsed responses."""
        while True:
            await asyncio.sleep(self.seconds / 3)
            try:
                cancel, lost = await self._store.renew(sorted(self.held), self.replica,
                                                       time.time() + self.seconds)
                self.held -= lost
                for response_id in cancel | lost:
                    self.cancel_here(response_id)
                await self.fail_abandoned()
            except StoreUnavailable as exc:
                log.warning("response leases not renewed: %s", exc.message)
            except Exception:  # noqa: BLE001 - the keeper must outlive any one failure
                log.exception("response leases: renewal failed")

    async def fail_abandoned(self) -> None:
        failed = await self._store.fail_unfinished(
            "The server running this response stopped before it finished", fail_response)
        if failed:
            log.warning("marked %d interrupted responses failed: %s", len(failed),
                        ", ".join(failed))
