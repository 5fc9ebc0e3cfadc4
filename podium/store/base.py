"""The response store boundary: a handful of async methods, nothing else.

It keeps responses (the whole response object, and the response it continues), their input
items, and an append-only log of each streamed or background response's events. A
conversation is rebuilt from its chain (``chain``): each response's own input items and
output, oldest first, so storage grows linearly along a ``previous_response_id`` chain.
The SQL implementation (``podium.store.sql``) is the only one: SQLite by default, any
SQLAlchemy URL (PostgreSQL) for several replicas.

Every response belongs to an owner: the API key that made it, as an identifier derived from
the key (never the key itself), or ``NO_OWNER`` on a server without keys. The methods a
client reaches (``get``, ``delete``, ``input_items``) take the caller's owner and treat
another owner's response exactly like a missing one.

A response that others continue from is not removed when it is deleted: it becomes a
tombstone that every client-facing method treats as missing, kept (without its event log)
only for ``chain`` to walk through, and removed with the last response that continues it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
NO_OWNER = ""       # the one owner of a server without API keys (and of pre-owner rows)
# How an interrupted response is failed (the Responses API's ``log.fail_response``): given
# its body, its logged events and a message, it makes the body the failed response and
# returns the events (sequence numbers stamped) that close its log; none when it has no log.
CloseLog = Callable[[dict[str, Any], list[dict[str, Any]], str], list[dict[str, Any]]]


@dataclass
class StoredResponse:
    id: str
    body: dict[str, Any]                 # the response object, as clients see it
    # Legacy: responses stored before chains carry their whole conversation here (every
    # item before their output, their own input items included); new ones store [] and are
    # rebuilt from their chain instead.
    history: list[dict[str, Any]] = field(default_factory=list)
    input_items: list[dict[str, Any]] = field(default_factory=list)   # this request's own
    owner: str = NO_OWNER
    parent_id: str | None = None         # the previous_response_id it continues

    @property
    def status(self) -> str:
        return self.body.get("status") or "completed"


class ResponseStore(Protocol):
    async def put(self, record: StoredResponse, lease: tuple[str, float] | None = None
                  ) -> None:
        """Insert a response with its input items and parent (or replace them); ``lease``:
        (the replica that runs it, until when it holds it) for a response that runs."""

    async def update(self, response_id: str, body: dict[str, Any]) -> None:
        """Replace the response object of a response still queued or in progress (a
        finished one, or none: nothing happens)."""

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The response, if it exists and belongs to ``owner`` (without its input items)."""

    async def chain(self, response_id: str, owner: str) -> list[StoredResponse] | None:
        """The response and the responses it continues, oldest first, each with its input
        items; None if ``owner`` has no such response. The walk goes through deleted
        responses that are kept for this (tombstones) and stops at a parent that no longer
        exists: a chain whose oldest responses were pruned starts at the oldest remaining
        one. A legacy record (non-empty ``history``) already holds everything before it."""

    async def delete(self, response_id: str, owner: str) -> bool:
        """Delete the response, its input items and its event log; False if ``owner`` has no
        such response. A response that others continue from keeps its row and input items
        as a tombstone (missing to every other method but ``chain``) until the last response
        that continues it is deleted."""

    async def input_items(self, response_id: str, owner: str, *, after: str | None,
                          limit: int, order: str) -> tuple[list[dict[str, Any]], bool]:
        """A page of input items, and whether more follow."""

    async def append_events(self, response_id: str, events: list[dict[str, Any]]) -> bool:
        """Add events (each carrying its ``sequence_number``) to the response's log, only
        while the response exists: False, and nothing added, once it has been deleted."""

    async def events_after(self, response_id: str, after: int,
                           limit: int | None = None) -> list[dict[str, Any]]:
        """Logged events with ``sequence_number`` > ``after``, in order (the first ``limit``
        of them when given)."""

    async def fail_unfinished(self, message: str, close: CloseLog,
                              now: float | None = None) -> list[str]:
        """Mark failed the queued / in-progress responses whose lease lapsed before ``now``
        (their replica died) or that hold none, each body made the failed response and its
        log closed by ``close``, in the transaction that fails it; their ids."""

    async def renew(self, ids: list[str], replica: str, until: float
                    ) -> tuple[set[str], set[str]]:
        """Extend ``replica``'s leases on running responses to ``until``: of ``ids``, (the
        ones whose cancel was requested, the ones it no longer holds)."""

    async def request_cancel(self, response_id: str, owner: str) -> bool:
        """Ask whichever replica runs the response to cancel it; False if it is not
        running."""

    async def start(self, on_cancel: Callable[[str], None]) -> None:
        """Hear other replicas: ``changed`` events are set, and ``on_cancel(id)`` is called
        for each cancel request."""

    def changed(self, response_id: str) -> asyncio.Event:
        """An event set when any replica next writes to this response (never, where the
        database cannot tell)."""

    async def ping(self) -> None:
        """A small write that is undone: raises ``StoreUnavailable`` if nothing can be
        stored now (the disk is full, the database is down)."""

    async def prune(self, older_than: float) -> int:
        """Delete responses created before ``older_than`` (epoch seconds), tombstones
        included, whether or not others continue from them; how many."""

    async def aclose(self) -> None: ...
