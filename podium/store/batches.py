"""Batches on SQL: the Batch API's batches and each one's requests, in the store's database.

Two tables on the response store's ``metadata`` and engine, so every replica sees and runs
every batch:

- ``podium_batches``: a row per batch, in OpenAI's terms (status, the times of each step,
  the files, ``errors``), its request counts and token usage summed as results are written,
  and a lease for the steps one replica does alone (validating the input file, writing the
  output files), as stored responses have.
- ``podium_batch_requests``: a row per line of the input file (its ``custom_id`` and body),
  ``queued``, ``running`` (held by a replica's lease), ``done`` (its output line written
  here, once) or ``closed`` (the batch ended before it ran).

Any replica claims queued requests, and requests whose lease lapsed (their replica died),
of batches whose model it serves (replicas on one database may serve different models: a
request for a model none serves waits, and ends with its batch's window), with a
conditional ``UPDATE`` whose ``rowcount`` says whether it won: portable to SQLite and
PostgreSQL (which re-checks the condition on the row it locked), so two replicas never run
one request at once, and a result is written only by the replica holding the request
(``finish_request``), in the transaction that counts it: a request answered twice (a lease
lost mid-run) is counted and kept once.

A batch's rows are read back in line order when its files are written, and removed in the
transaction that ends the batch: the output and error files are then the batch's record.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Collection

import sqlalchemy as sa

from podium.store.sql import _mapped, create_tables, metadata

ID_PREFIX = "batch_"
_INSERT_ROWS = 500                  # request rows an insert statement writes at most

batches = sa.Table(
    "podium_batches", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("endpoint", sa.String(64), nullable=False),
    sa.Column("model", sa.Text, nullable=True),               # the lines' model, once read
    sa.Column("input_file_id", sa.String(64), nullable=False),
    sa.Column("completion_window", sa.String(16), nullable=False),
    sa.Column("meta", sa.Text, nullable=True),                # metadata, as JSON
    sa.Column("output_expires", sa.BigInteger, nullable=True),  # seconds the files live
    sa.Column("created_at", sa.BigInteger, nullable=False),
    sa.Column("expires_at", sa.BigInteger, nullable=False),
    sa.Column("in_progress_at", sa.BigInteger, nullable=True),
    sa.Column("finalizing_at", sa.BigInteger, nullable=True),
    sa.Column("completed_at", sa.BigInteger, nullable=True),
    sa.Column("failed_at", sa.BigInteger, nullable=True),
    sa.Column("expired_at", sa.BigInteger, nullable=True),
    sa.Column("cancelling_at", sa.BigInteger, nullable=True),
    sa.Column("cancelled_at", sa.BigInteger, nullable=True),
    sa.Column("output_file_id", sa.String(64), nullable=True),
    sa.Column("error_file_id", sa.String(64), nullable=True),
    sa.Column("errors", sa.Text, nullable=True),              # the format's errors, JSON
    sa.Column("total", sa.Integer, nullable=False, server_default="0"),
    sa.Column("completed", sa.Integer, nullable=False, server_default="0"),
    sa.Column("failed", sa.Integer, nullable=False, server_default="0"),
    sa.Column("input_tokens", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("cached_tokens", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("output_tokens", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("reasoning_tokens", sa.BigInteger, nullable=False, server_default="0"),
    # validating and finalizing: the replica doing it, and until when
    sa.Column("lease_owner", sa.String(32), nullable=True),
    sa.Column("lease_until", sa.Float, nullable=True),
    sa.Index("ix_podium_batches_owner", "owner", "id"),
)
batch_requests = sa.Table(
    "podium_batch_requests", metadata,
    sa.Column("batch_id", sa.String(64), primary_key=True),
    sa.Column("line", sa.Integer, primary_key=True),          # 1-based, as in the file
    sa.Column("custom_id", sa.Text, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("state", sa.String(8), nullable=False),         # queued|running|done|closed
    sa.Column("lease_owner", sa.String(32), nullable=True),
    sa.Column("lease_until", sa.Float, nullable=True),
    sa.Column("not_before", sa.Float, nullable=True),         # retried after a 429 / 503
    sa.Column("error", sa.Boolean, nullable=True),            # done: in the error file
    sa.Column("result", sa.Text, nullable=True),              # done: its output line
    sa.Index("ix_podium_batch_requests_state", "state", "batch_id", "line"),
)

OPEN = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL = ("completed", "failed", "expired", "cancelled")
STATUSES = OPEN + TERMINAL


@dataclass
class Claimed:
    """A request a replica holds: run it, then ``finish_request`` or ``release``."""
    batch_id: str
    line: int
    custom_id: str
    body: str
    owner: str
    endpoint: str

    @property
    def key(self) -> tuple[str, int]:
        return self.batch_id, self.line


@dataclass
class Usage:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


def _row(row: Any) -> dict[str, Any] | None:
    return None if row is None else dict(row._mapping)


class BatchStore:
    """Batches and their requests, on the response store's engine."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        create_tables(engine, [batches, batch_requests])

    async def _run(self, fn, *args):
        with _mapped():
            return await asyncio.to_thread(fn, *args)

    # -- the API's reads and writes -----------------------------------------------------

    async def create(self, values: dict[str, Any]) -> None:
        await self._run(self._create, values)

    def _create(self, values: dict[str, Any]) -> None:
        with self.engine.begin() as db:
            db.execute(sa.insert(batches).values(**values))

    async def get(self, batch_id: str, owner: str | None) -> dict[str, Any] | None:
        """The batch's row; ``owner`` None: whoever owns it (the runner)."""
        return await self._run(self._get, batch_id, owner)

    def _get(self, batch_id: str, owner: str | None) -> dict[str, Any] | None:
        query = sa.select(batches).where(batches.c.id == batch_id)
        if owner is not None:
            query = query.where(batches.c.owner == owner)
        with self.engine.connect() as db:
            return _row(db.execute(query).first())

    async def page(self, owner: str, after: str | None, limit: int
                   ) -> tuple[list[dict[str, Any]], bool]:
        """The owner's batches, newest first (ids sort by creation), after the id
        ``after`` (which need not exist any more); and whether more follow."""
        return await self._run(self._page, owner, after, limit)

    def _page(self, owner: str, after: str | None, limit: int
              ) -> tuple[list[dict[str, Any]], bool]:
        b = batches.c
        query = sa.select(batches).where(b.owner == owner)
        if after is not None:
            query = query.where(b.id < after)
        with self.engine.connect() as db:
            rows = db.execute(query.order_by(b.id.desc()).limit(limit + 1)).all()
        return [dict(r._mapping) for r in rows[:limit]], len(rows) > limit

    async def count(self, owner: str) -> int:
        """The owner's batches not ended yet."""
        return await self._run(self._count, owner)

    def _count(self, owner: str) -> int:
        b = batches.c
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).select_from(batches).where(
                b.owner == owner, b.status.in_(OPEN))).scalar() or 0

    async def cancel(self, batch_id: str, owner: str, now: int) -> dict[str, Any] | None:
        """Mark the batch ``cancelling`` if it is validating or running; its row after."""
        return await self._run(self._cancel, batch_id, owner, now)

    def _cancel(self, batch_id: str, owner: str, now: int) -> dict[str, Any] | None:
        b = batches.c
        with self.engine.begin() as db:
            db.execute(sa.update(batches).where(
                b.id == batch_id, b.owner == owner,
                b.status.in_(("validating", "in_progress"))).values(
                status="cancelling", cancelling_at=now))
            return _row(db.execute(sa.select(batches).where(b.id == batch_id,
                                                           b.owner == owner)).first())

    # -- the steps one replica does alone: validating, finalizing -------------------------

    async def claim_batch(self, replica: str, until: float, now: float
                          ) -> dict[str, Any] | None:
        """A batch with a step to do, held by ``replica`` until ``until``: one validating,
        one whose requests are all answered, past its window or cancelled (with none
        running any more), or one whose finalizing replica died."""
        return await self._run(self._claim_batch, replica, until, now)

    def _claim_batch(self, replica: str, until: float, now: float) -> dict[str, Any] | None:
        b, r = batches.c, batch_requests.c
        open_ = sa.exists().where(r.batch_id == b.id, r.state.in_(("queued", "running")))
        running = sa.exists().where(r.batch_id == b.id, r.state == "running",
                                    r.lease_until >= now)
        free = sa.or_(b.lease_until.is_(None), b.lease_until < now)
        due = sa.or_(
            b.status.in_(("validating", "finalizing")),
            sa.and_(b.status == "in_progress",
                    sa.or_(sa.not_(open_), sa.and_(b.expires_at <= int(now),
                                                   sa.not_(running)))),
            sa.and_(b.status == "cancelling", sa.not_(running)))
        with self.engine.begin() as db:
            for batch_id in db.execute(sa.select(b.id).where(free, due).order_by(b.id)
                                       .limit(8)).scalars():
                if db.execute(sa.update(batches).where(b.id == batch_id, free).values(
                        lease_owner=replica, lease_until=until)).rowcount:
                    return _row(db.execute(sa.select(batches).where(
                        b.id == batch_id)).first())
        return None

    async def renew_batch(self, batch_id: str, replica: str, until: float) -> bool:
        """Keep holding a batch's step; False if another replica took it (a long pause)."""
        return await self._run(self._renew_batch, batch_id, replica, until)

    def _renew_batch(self, batch_id: str, replica: str, until: float) -> bool:
        b = batches.c
        with self.engine.begin() as db:
            return bool(db.execute(sa.update(batches).where(
                b.id == batch_id, b.lease_owner == replica).values(
                lease_until=until)).rowcount)

    async def clear_requests(self, batch_id: str) -> None:
        """Remove a batch's request rows (a validation begun again)."""
        await self._run(self._clear_requests, batch_id)

    def _clear_requests(self, batch_id: str) -> None:
        with self.engine.begin() as db:
            db.execute(sa.delete(batch_requests).where(batch_requests.c.batch_id == batch_id))

    async def add_requests(self, batch_id: str, rows: list[tuple[int, str, str]]) -> None:
        """Queue (line, custom_id, body) rows of a batch being validated."""
        await self._run(self._add_requests, batch_id, rows)

    def _add_requests(self, batch_id: str, rows: list[tuple[int, str, str]]) -> None:
        with self.engine.begin() as db:
            for start in range(0, len(rows), _INSERT_ROWS):
                db.execute(sa.insert(batch_requests), [
                    {"batch_id": batch_id, "line": line, "custom_id": custom_id,
                     "body": body, "state": "queued"}
                    for line, custom_id, body in rows[start:start + _INSERT_ROWS]])

    async def step(self, batch_id: str, replica: str, status: str | None,
                   values: dict[str, Any], *, release: bool = True,
                   drop_requests: bool = False) -> bool:
        """Move a batch held by ``replica`` on (``values``; ``status`` the one it must be
        in, None: any), letting the lease go (``release``), its request rows removed
        (``drop_requests``) in the same transaction; False if it no longer holds it."""
        return await self._run(self._step, batch_id, replica, status, values, release,
                               drop_requests)

    def _step(self, batch_id: str, replica: str, status: str | None,
              values: dict[str, Any], release: bool, drop_requests: bool) -> bool:
        b = batches.c
        query = sa.update(batches).where(b.id == batch_id, b.lease_owner == replica)
        if status is not None:
            query = query.where(b.status == status)
        if release:
            values = {**values, "lease_owner": None, "lease_until": None}
        with self.engine.begin() as db:
            if not db.execute(query.values(**values)).rowcount:
                return False
            if drop_requests:
                db.execute(sa.delete(batch_requests).where(
                    batch_requests.c.batch_id == batch_id))
        return True

    async def close_open(self, batch_id: str, replica: str, *, count_failed: bool) -> int:
        """Mark the requests not answered ``closed`` (no late answer lands after this) for
        a batch ``replica`` finalizes, counted as failed (``count_failed``: the batch ran;
        rows a step begun before closed are not counted again); how many it closed."""
        return await self._run(self._close_open, batch_id, replica, count_failed)

    def _close_open(self, batch_id: str, replica: str, count_failed: bool) -> int:
        b, r = batches.c, batch_requests.c
        with self.engine.begin() as db:
            if not db.execute(sa.update(batches).where(
                    b.id == batch_id, b.lease_owner == replica).values(
                    lease_owner=replica)).rowcount:
                return 0
            closed = db.execute(sa.update(batch_requests).where(
                r.batch_id == batch_id, r.state.in_(("queued", "running"))).values(
                state="closed", lease_owner=None, lease_until=None)).rowcount
            if closed and count_failed:
                db.execute(sa.update(batches).where(b.id == batch_id).values(
                    failed=b.failed + closed))
            return closed

    async def results(self, batch_id: str, after: int, limit: int) -> list[dict[str, Any]]:
        """A page of a batch's requests in line order, after line ``after``."""
        return await self._run(self._results, batch_id, after, limit)

    def _results(self, batch_id: str, after: int, limit: int) -> list[dict[str, Any]]:
        r = batch_requests.c
        with self.engine.connect() as db:
            return [dict(row._mapping) for row in db.execute(
                sa.select(r.line, r.custom_id, r.state, r.error, r.result).where(
                    r.batch_id == batch_id, r.line > after).order_by(r.line).limit(limit))]

    # -- requests -----------------------------------------------------------------------

    async def running_models(self, now: float) -> list[tuple[str, str]]:
        """The (model, endpoint) pairs of the batches running now: a replica asks which of
        these models it serves, and claims only their requests (``claim_requests``)."""
        return await self._run(self._running_models, now)

    def _running_models(self, now: float) -> list[tuple[str, str]]:
        b = batches.c
        with self.engine.connect() as db:
            return [(row.model, row.endpoint) for row in db.execute(
                sa.select(b.model, b.endpoint).distinct().where(
                    b.status == "in_progress", b.expires_at > int(now),
                    b.model.is_not(None)))]

    async def claim_requests(self, replica: str, until: float, now: float, limit: int,
                             models: Collection[str]) -> list[Claimed]:
        """Up to ``limit`` requests to run, held by ``replica`` until ``until``: queued
        ones of running batches in their batches' order then line order, or ones whose
        replica's lease lapsed; only of batches for ``models`` (the names, as the lines
        give them, that ``replica`` serves: no replica fails another's requests with a
        model it does not have)."""
        if not models or limit <= 0:
            return []
        return await self._run(self._claim_requests, replica, until, now, limit,
                               sorted(models))

    def _claim_requests(self, replica: str, until: float, now: float, limit: int,
                        models: list[str]) -> list[Claimed]:
        b, r = batches.c, batch_requests.c
        runnable = sa.and_(b.status == "in_progress", b.expires_at > int(now),
                           b.model.in_(models),
                           sa.or_(r.not_before.is_(None), r.not_before <= now))
        claimable = sa.or_(r.state == "queued",
                           sa.and_(r.state == "running", r.lease_until < now))
        columns = (r.batch_id, r.line, r.custom_id, r.body, b.owner, b.endpoint)
        claimed: list[Claimed] = []
        with self.engine.begin() as db:
            for _ in range(3):          # candidates another replica took: look again
                candidates: list[Any] = []
                for state in ("running", "queued"):     # lapsed ones first: they are older
                    query = sa.select(*columns).join(batches, b.id == r.batch_id).where(
                        runnable, r.state == state)
                    if state == "running":
                        query = query.where(r.lease_until < now)
                    want = limit - len(claimed) - len(candidates)
                    candidates += db.execute(
                        query.order_by(r.batch_id, r.line).limit(want)
                        .with_for_update(skip_locked=True, of=batch_requests)).all()
                    if len(claimed) + len(candidates) >= limit:
                        break
                lost = 0
                for row in candidates:
                    if db.execute(sa.update(batch_requests).where(
                            r.batch_id == row.batch_id, r.line == row.line, claimable).values(
                            state="running", lease_owner=replica,
                            lease_until=until)).rowcount:
                        claimed.append(Claimed(*row))
                    else:
                        lost += 1
                if not lost or len(claimed) >= limit:
                    break
        return claimed

    async def renew_requests(self, keys: list[tuple[str, int]], replica: str, until: float
                             ) -> set[tuple[str, int]]:
        """Renew ``replica``'s leases on ``keys``; the keys it no longer holds."""
        return await self._run(self._renew_requests, keys, replica, until)

    def _renew_requests(self, keys: list[tuple[str, int]], replica: str, until: float
                        ) -> set[tuple[str, int]]:
        r = batch_requests.c
        lost = set()
        with self.engine.begin() as db:
            for batch_id, line in keys:
                if not db.execute(sa.update(batch_requests).where(
                        r.batch_id == batch_id, r.line == line, r.state == "running",
                        r.lease_owner == replica).values(lease_until=until)).rowcount:
                    lost.add((batch_id, line))
        return lost

    async def finish_request(self, key: tuple[str, int], replica: str, result: str,
                             error: bool, usage: Usage) -> bool:
        """Write a request's output line, once: only while ``replica`` holds it; counted
        and its usage added to its batch in the same transaction. False if it lost it."""
        return await self._run(self._finish_request, key, replica, result, error, usage)

    def _finish_request(self, key: tuple[str, int], replica: str, result: str, error: bool,
                        usage: Usage) -> bool:
        b, r = batches.c, batch_requests.c
        with self.engine.begin() as db:
            if not db.execute(sa.update(batch_requests).where(
                    r.batch_id == key[0], r.line == key[1], r.state == "running",
                    r.lease_owner == replica).values(
                    state="done", error=error, result=result, lease_owner=None,
                    lease_until=None)).rowcount:
                return False
            counter = b.failed if error else b.completed
            db.execute(sa.update(batches).where(b.id == key[0]).values({
                counter: counter + 1,
                b.input_tokens: b.input_tokens + usage.input_tokens,
                b.cached_tokens: b.cached_tokens + usage.cached_tokens,
                b.output_tokens: b.output_tokens + usage.output_tokens,
                b.reasoning_tokens: b.reasoning_tokens + usage.reasoning_tokens}))
        return True

    async def release(self, keys: list[tuple[str, int]], replica: str,
                      not_before: float | None = None) -> None:
        """Give requests ``replica`` holds back to the queue (a shutdown, a cancel, or a
        retry after ``not_before``)."""
        await self._run(self._release, keys, replica, not_before)

    def _release(self, keys: list[tuple[str, int]], replica: str,
                 not_before: float | None) -> None:
        r = batch_requests.c
        with self.engine.begin() as db:
            for batch_id, line in keys:
                db.execute(sa.update(batch_requests).where(
                    r.batch_id == batch_id, r.line == line, r.state == "running",
                    r.lease_owner == replica).values(
                    state="queued", lease_owner=None, lease_until=None,
                    not_before=not_before))

    async def statuses(self, batch_ids: list[str]) -> dict[str, tuple[str, int]]:
        """Each batch's status and expiry (the runner's batches: cancelled? expired?)."""
        return await self._run(self._statuses, batch_ids)

    def _statuses(self, batch_ids: list[str]) -> dict[str, tuple[str, int]]:
        b = batches.c
        if not batch_ids:
            return {}
        with self.engine.connect() as db:
            return {row.id: (row.status, row.expires_at) for row in db.execute(
                sa.select(b.id, b.status, b.expires_at).where(b.id.in_(batch_ids)))}

    # -- metrics (read at scrape time, on the scraping thread) --------------------------

    def figures(self) -> tuple[dict[str, int], int]:
        """Batches by status, and the requests of running batches still queued."""
        b, r = batches.c, batch_requests.c
        with _mapped(), self.engine.connect() as db:
            by = {row.status: row.n for row in db.execute(
                sa.select(b.status, sa.func.count().label("n")).group_by(b.status))}
            queued = db.execute(sa.select(sa.func.count()).select_from(batch_requests).where(
                r.state == "queued")).scalar() or 0
        return by, queued
