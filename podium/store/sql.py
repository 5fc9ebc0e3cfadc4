"""The response store on SQL: SQLite (a file in the data directory) or any SQLAlchemy URL.

SQLAlchemy Core with plain tables and portable types, so the same statements run on SQLite
and PostgreSQL. Calls run on a worker thread (``asyncio.to_thread``): each is a short
statement, and the event loop never waits on disk. Look-ups are by primary key: O(1) in the
size of the store (well, O(log n)). The driver's operational failures (disk full, database
unreachable) leave as ``StoreUnavailable`` (503), translated in one place (``_mapped``).

Conversations: a response row keeps its own input items and the id of the response it
continues (``parent_id``), so a chain of n turns stores O(n), not the O(n²) of repeating
every earlier turn in each row (rows written before this carry their whole conversation in
``history``; new rows write ``[]``). ``chain`` reads a response's ancestry with one recursive
CTE and their input items with one more query, whatever the chain's length.

Deleting a response that others continue from: its descendants still need its input items
and output, so its row stays as a tombstone (``deleted``), without its event log, that every
client-facing read treats as missing and ``chain`` walks through. Deleting a response nobody
continues removes its row, then every tombstone above it left with no children, in the same
transaction. A delete holds the row it deletes (``FOR UPDATE`` on PostgreSQL; SQLite
serializes writers) and each parent it climbs to, and ``put`` holds the parent of the row it
writes (``FOR KEY SHARE``), so a concurrent delete of that parent sees the new child.

Deleting a response while it is still being logged: an event batch is inserted only while
its response row exists and is not a tombstone, by one guarded ``INSERT ... SELECT ... WHERE
EXISTS`` that on PostgreSQL also takes a ``FOR KEY SHARE`` lock on that row, and a delete
takes the row (``FOR UPDATE``) before it touches its events. On SQLite the writes are
serialized anyway; on PostgreSQL the delete waits for an append that holds the row and then
sees its events, and an append that comes after the delete finds no row, or a tombstone.
Either way nothing outlives the delete, on any replica. (A foreign
key with ``ON DELETE CASCADE`` would do the same, but SQLite enforces foreign keys only when
every connection asks for it, cannot add one to the tables of an existing database without
rebuilding them, and a violated key is an error that aborts a PostgreSQL transaction rather
than an answer the writer can act on.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import sqlalchemy as sa

from podium.errors import StoreUnavailable
from podium.store.base import NO_OWNER, TERMINAL, CloseLog, StoredResponse
from podium.store.listen import CANCELS, EVENTS, Listener

log = logging.getLogger(__name__)

metadata = sa.MetaData()

responses = sa.Table(
    "podium_responses", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("history", sa.Text, nullable=False),
    # the API key that made it, as ``owner_id`` gives it (NO_OWNER without keys)
    sa.Column("owner", sa.String(64), nullable=False, server_default=NO_OWNER),
    # the response it continues (its previous_response_id); may since have been pruned
    sa.Column("parent_id", sa.String(64), nullable=True, index=True),
    # a tombstone: deleted, but kept for the responses that continue from it
    sa.Column("deleted", sa.Boolean, nullable=False, server_default=sa.false()),
    # while it runs: the replica running it and until when (epoch seconds) it holds it;
    # a replica renews its leases, and any replica fails a response whose lease lapsed
    sa.Column("lease_owner", sa.String(32), nullable=True),
    sa.Column("lease_until", sa.Float, nullable=True),
    # a cancel sent to another replica than the one running it: that one acts on it
    sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()),
)
input_items = sa.Table(
    "podium_input_items", metadata,
    sa.Column("response_id", sa.String(64), primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("item_id", sa.String(64), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
)
events = sa.Table(
    "podium_events", metadata,
    sa.Column("response_id", sa.String(64), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("body", sa.Text, nullable=False),
)
schema_version = sa.Table(   # one row: the schema version this database is at
    "podium_schema", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
)
probes = sa.Table(        # /ready's write probe: rows live for one call
    "podium_probes", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("body", sa.LargeBinary, nullable=False),
)
_PROBE_BYTES = 4096       # a page or more: a full database cannot find room for it
CHAIN_LIMIT = 100_000     # the most responses ``chain`` walks (the newest ones)
_LIVE = sa.not_(responses.c.deleted)
_RUNNING = responses.c.status.in_(["queued", "in_progress"])
_EVENTS, _CANCELS = EVENTS, CANCELS         # LISTEN / NOTIFY channels (``listen``)


def data_dir() -> Path:
    """``$PODIUM_DATA_DIR``, else ``$XDG_DATA_HOME/podium``, else ``~/.local/share/podium``."""
    if os.environ.get("PODIUM_DATA_DIR"):
        return Path(os.environ["PODIUM_DATA_DIR"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return Path(base) / "podium"


def default_url() -> str:
    directory = data_dir()
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{directory / 'podium.db'}"


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


class SQLStore:
    def __init__(self, url: str | None = None):
        url = url or default_url()
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url[len("postgresql://"):]
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        self.engine = sa.create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        try:
            _create_schema(self.engine)
        except BaseException:
            self.engine.dispose()
            raise
        self.listener = Listener(
            self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
            if self.engine.dialect.name == "postgresql" else None)

    async def start(self, on_cancel: Callable[[str], None]) -> None:
        """Hear other replicas' writes and cancel requests from now on (PostgreSQL)."""
        await self.listener.start(on_cancel)

    def changed(self, response_id: str) -> asyncio.Event:
        """Set at the next write to this response by any replica (see ``listen``)."""
        return self.listener.changed(response_id)

    async def _run(self, fn, *args):
        with _mapped():
            return await asyncio.to_thread(fn, *args)

    # -- responses ----------------------------------------------------------------------

    async def put(self, record: StoredResponse, lease: tuple[str, float] | None = None
                  ) -> None:
        await self._run(self._put, record, lease)

    def _put(self, record: StoredResponse, lease: tuple[str, float] | None = None) -> None:
        body = record.body
        with self.engine.begin() as db:
            db.execute(sa.delete(input_items).where(input_items.c.response_id == record.id))
            db.execute(sa.delete(responses).where(responses.c.id == record.id))
            if record.parent_id is not None:
                # hold the parent: a delete of it waits, then sees this child (and keeps it)
                db.execute(sa.select(responses.c.id).where(
                    responses.c.id == record.parent_id).with_for_update(read=True,
                                                                        key_share=True))
            db.execute(sa.insert(responses).values(
                id=record.id, created_at=body.get("created_at") or time.time(),
                status=body.get("status") or "completed", body=_dumps(body),
                history=_dumps(record.history), owner=record.owner,
                parent_id=record.parent_id, deleted=False,
                lease_owner=lease[0] if lease else None,
                lease_until=lease[1] if lease else None))
            if record.input_items:
                db.execute(sa.insert(input_items), [
                    {"response_id": record.id, "position": i, "item_id": item["id"],
                     "body": _dumps(item)} for i, item in enumerate(record.input_items)])

    async def update(self, response_id: str, body: dict[str, Any]) -> None:
        await self._run(self._update, response_id, body)

    def _update(self, response_id: str, body: dict[str, Any]) -> None:
        """A finished response is final: once failed by another replica (its lease lapsed)
        or finished, no late write of the replica that ran it changes it."""
        with self.engine.begin() as db:
            if db.execute(sa.update(responses).where(
                    responses.c.id == response_id, _RUNNING, _LIVE).values(
                    status=body.get("status") or "completed", body=_dumps(body))).rowcount:
                self._notify(db, _EVENTS, response_id)

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        return await self._run(self._get, response_id, owner)

    def _get(self, response_id: str, owner: str) -> StoredResponse | None:
        r = responses
        with self.engine.connect() as db:
            row = db.execute(sa.select(r.c.body, r.c.history, r.c.parent_id).where(
                r.c.id == response_id, r.c.owner == owner, _LIVE)).first()
        if row is None:
            return None
        return StoredResponse(response_id, orjson.loads(row.body), orjson.loads(row.history),
                              owner=owner, parent_id=row.parent_id)

    async def chain(self, response_id: str, owner: str) -> list[StoredResponse] | None:
        return await self._run(self._chain, response_id, owner)

    def _chain(self, response_id: str, owner: str) -> list[StoredResponse] | None:
        """Two statements whatever the chain's length: the ancestors' rows, then their input
        items; the chain is put in order here, from the response up by ``parent_id``."""
        r, t = responses, input_items
        found = _ancestry(response_id, owner)
        with self.engine.connect() as db:
            rows = {row.id: row for row in db.execute(
                sa.select(r.c.id, r.c.parent_id, r.c.body, r.c.history).join_from(
                    found, r, r.c.id == found.c.id)).all()}
            # their input items, and (rows with none: a NULL body) which of them the walk
            # still reaches now: a response pruned in between ends the chain there
            items: dict[str, list[dict[str, Any]]] = {}
            for item in db.execute(
                    sa.select(found.c.id, t.c.body).outerjoin_from(
                        found, t, t.c.response_id == found.c.id).order_by(found.c.id,
                                                                           t.c.position)):
                items.setdefault(item.id, [])
                if item.body is not None:
                    items[item.id].append(orjson.loads(item.body))
        chain: list[StoredResponse] = []
        at: str | None = response_id
        while at in rows and at in items and len(chain) < CHAIN_LIMIT:
            row = rows.pop(at)          # popped: a cycle cannot come back to it
            chain.append(StoredResponse(row.id, orjson.loads(row.body),
                                        orjson.loads(row.history), items[row.id], owner,
                                        row.parent_id))
            at = row.parent_id
        return chain[::-1] or None

    async def delete(self, response_id: str, owner: str) -> bool:
        return await self._run(self._delete, response_id, owner)

    def _delete(self, response_id: str, owner: str) -> bool:
        r = responses
        with self.engine.begin() as db:
            # hold the row (PostgreSQL: waits for a log append holding it, and a later
            # append waits for this and then finds it gone or a tombstone)
            row = db.execute(sa.select(r.c.parent_id).where(
                r.c.id == response_id, r.c.owner == owner, _LIVE).with_for_update()).first()
            if row is None:
                return False
            # the first write (SQLite: from here on, this transaction is the only writer)
            if not db.execute(sa.update(r).where(
                    r.c.id == response_id, r.c.owner == owner, _LIVE).values(
                    deleted=True)).rowcount:
                return False                # deleted by someone else meanwhile
            db.execute(sa.delete(events).where(events.c.response_id == response_id))
            if not _has_children(db, response_id):
                _remove(db, response_id)
                _collect(db, row.parent_id)
            self._notify(db, _EVENTS, response_id)     # its followers end
            self._notify(db, _CANCELS, response_id)    # the replica running it stops
        return True

    # -- input items --------------------------------------------------------------------

    async def input_items(self, response_id: str, owner: str, *, after: str | None,
                          limit: int, order: str) -> tuple[list[dict[str, Any]], bool]:
        return await self._run(self._input_items, response_id, owner, after, limit, order)

    def _input_items(self, response_id: str, owner: str, after: str | None, limit: int,
                     order: str) -> tuple[list[dict[str, Any]], bool]:
        t = input_items
        query = sa.select(t.c.position, t.c.body).where(t.c.response_id == response_id)
        with self.engine.connect() as db:
            if db.execute(sa.select(responses.c.id).where(
                    responses.c.id == response_id, responses.c.owner == owner,
                    _LIVE)).first() is None:
                return [], False
            if after is not None:
                pos = db.execute(sa.select(t.c.position).where(
                    t.c.response_id == response_id, t.c.item_id == after)).scalar()
                if pos is not None:
                    query = query.where(t.c.position > pos if order == "asc"
                                        else t.c.position < pos)
            query = query.order_by(t.c.position.asc() if order == "asc" else t.c.position.desc())
            rows = db.execute(query.limit(limit + 1)).all()
        return [orjson.loads(r.body) for r in rows[:limit]], len(rows) > limit

    # -- the event log ------------------------------------------------------------------

    async def append_events(self, response_id: str, batch: list[dict[str, Any]]) -> bool:
        return await self._run(self._append, response_id, batch) if batch else True

    def _append(self, response_id: str, batch: list[dict[str, Any]]) -> bool:
        first, *rest = [{"response_id": response_id, "seq": e["sequence_number"],
                         "body": _dumps(e)} for e in batch]
        with self.engine.begin() as db:
            # the guarded insert holds the response row (write lock / FOR KEY SHARE) until
            # commit, so the rest of the batch is safe from a delete too
            if not db.execute(_GUARDED_APPEND, first).rowcount:
                return False            # deleted: the writer stops
            if rest:
                db.execute(sa.insert(events), rest)
            self._notify(db, _EVENTS, response_id)
        return True

    async def events_after(self, response_id: str, after: int,
                           limit: int | None = None) -> list[dict[str, Any]]:
        return await self._run(self._events_after, response_id, after, limit)

    def _events_after(self, response_id: str, after: int,
                      limit: int | None) -> list[dict[str, Any]]:
        query = sa.select(events.c.body).where(
            events.c.response_id == response_id, events.c.seq > after).order_by(events.c.seq)
        with self.engine.connect() as db:
            rows = db.execute(query if limit is None else query.limit(limit)).all()
        return [orjson.loads(r.body) for r in rows]

    # -- housekeeping -------------------------------------------------------------------

    async def fail_unfinished(self, message: str, close: CloseLog,
                              now: float | None = None) -> list[str]:
        return await self._run(self._fail_unfinished, message, close,
                               time.time() if now is None else now)

    def _fail_unfinished(self, message: str, close: CloseLog, now: float) -> list[str]:
        """Fail the queued / in-progress responses whose lease lapsed before ``now`` (their
        replica died or lost the database) or that hold none (written before leases). Each
        is held while it is failed, and one held by another replica's pass is skipped
        (PostgreSQL: ``SKIP LOCKED``), so two replicas never fail the same response twice."""
        r = responses
        lapsed = sa.or_(r.c.lease_until.is_(None), r.c.lease_until < now)
        with self.engine.begin() as db:
            rows = db.execute(sa.select(r.c.id, r.c.body).where(_RUNNING, lapsed, _LIVE)
                              .with_for_update(skip_locked=True)).all()
            for row in rows:
                self._fail(db, row.id, orjson.loads(row.body), message, close)
                self._notify(db, _EVENTS, row.id)
        return [row.id for row in rows]

    # -- leases and cancels across replicas ---------------------------------------------

    async def renew(self, ids: list[str], replica: str, until: float
                    ) -> tuple[set[str], set[str]]:
        return await self._run(self._renew, ids, replica, until) if ids else (set(), set())

    def _renew(self, ids: list[str], replica: str, until: float) -> tuple[set[str], set[str]]:
        """Extend ``replica``'s leases on these responses to ``until``; of them, (those whose
        cancel was requested, those it no longer holds: finished, failed by another replica
        after the lease lapsed, or deleted)."""
        r = responses
        with self.engine.begin() as db:
            held = {row.id: row.cancel_requested for row in db.execute(
                sa.update(r).where(r.c.id.in_(ids), r.c.lease_owner == replica, _RUNNING,
                                   _LIVE).values(lease_until=until)
                .returning(r.c.id, r.c.cancel_requested)).all()}
        return {i for i, cancel in held.items() if cancel}, set(ids) - set(held)

    async def request_cancel(self, response_id: str, owner: str) -> bool:
        return await self._run(self._request_cancel, response_id, owner)

    def _request_cancel(self, response_id: str, owner: str) -> bool:
        """Ask the replica running this response to cancel it (its next lease renewal sees
        the request; on PostgreSQL it hears at once); False if it is not running."""
        r = responses
        with self.engine.begin() as db:
            if not db.execute(sa.update(r).where(
                    r.c.id == response_id, r.c.owner == owner, _RUNNING, _LIVE).values(
                    cancel_requested=True)).rowcount:
                return False
            self._notify(db, _CANCELS, response_id)
        return True

    def _notify(self, db: sa.Connection, channel: str, response_id: str) -> None:
        """PostgreSQL: tell every replica's listener, at commit, that something about this
        response changed (SQLite replicas share a file on one machine and poll)."""
        if db.dialect.name == "postgresql":
            db.execute(sa.select(sa.func.pg_notify(channel, response_id)))

    def _fail(self, db: sa.Connection, response_id: str, body: dict[str, Any],
              message: str, close: CloseLog) -> None:
        """Fail one interrupted response: ``close`` (the API's) makes ``body`` the failed
        response from what its log holds and gives the events that close its log, appended
        in the same transaction so followers end."""
        logged = [orjson.loads(r.body) for r in db.execute(
            sa.select(events.c.body).where(events.c.response_id == response_id).order_by(
                events.c.seq)).all()]
        tail = close(body, logged, message)
        db.execute(sa.update(responses).where(responses.c.id == response_id).values(
            status="failed", body=_dumps(body)))
        if not tail:
            return                      # a non-streamed response: it has no log to close
        db.execute(sa.insert(events), [
            {"response_id": response_id, "seq": e["sequence_number"], "body": _dumps(e)}
            for e in tail])

    async def prune(self, older_than: float) -> int:
        return await self._run(self._prune, older_than)

    def _prune(self, older_than: float) -> int:
        """By age alone: a response others continue from goes too (retention is retention),
        and their chains then start at the oldest response that remains."""
        with self.engine.begin() as db:
            old = sa.select(responses.c.id).where(
                responses.c.created_at < older_than,
                sa.or_(responses.c.status.in_(list(TERMINAL)), responses.c.deleted))
            ids = [r.id for r in db.execute(old).all()]
            for table, column in ((responses, responses.c.id),
                                  (input_items, input_items.c.response_id),
                                  (events, events.c.response_id)):
                if ids:
                    db.execute(sa.delete(table).where(column.in_(ids)))
        return len(ids)

    def count(self) -> int:
        """Stored responses, tombstones aside (sync: read by the metrics collector on a
        worker thread)."""
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).select_from(responses).where(
                _LIVE)).scalar() or 0

    async def ping(self) -> None:
        await self._run(self._probe)

    def _probe(self) -> None:
        """Write a page-sized row and commit it, then remove it: a read would succeed on a
        full disk, a rolled-back write never reaches the disk."""
        with self.engine.begin() as db:
            db.execute(sa.insert(probes).values(id=secrets.token_hex(16),
                                                body=os.urandom(_PROBE_BYTES)))
        with self.engine.begin() as db:
            db.execute(sa.delete(probes))     # this one, and any a failed clean-up left

    async def aclose(self) -> None:
        await self.listener.aclose()
        await self._run(self.engine.dispose)


_ALIVE = (sa.select(responses.c.id).where(responses.c.id == sa.bindparam("response_id"),
                                          _LIVE, _RUNNING)
          .with_for_update(read=True, key_share=True))
_GUARDED_APPEND = sa.insert(events).from_select(
    ["response_id", "seq", "body"],
    sa.select(sa.bindparam("response_id", type_=sa.String), sa.bindparam("seq", type_=sa.Integer),
              sa.bindparam("body", type_=sa.Text)).where(sa.exists(_ALIVE)),
).execution_options(preserve_rowcount=True)      # (psycopg's is dropped otherwise)


def _ancestry(response_id: str, owner: str) -> sa.Subquery:
    """The ids of the live response and its ancestors: parent by parent (tombstones too)
    while the parent exists and is the owner's, in one recursive CTE. UNION (not UNION ALL)
    drops a row already found, so a cycle ends the walk; the LIMIT bounds a chain too long
    to rebuild (``chain`` keeps its newest ``CHAIN_LIMIT``)."""
    r = responses
    walk = sa.select(r.c.id, r.c.parent_id).where(
        r.c.id == response_id, r.c.owner == owner, _LIVE).cte("chain", recursive=True)
    walk = walk.union(sa.select(r.c.id, r.c.parent_id).join_from(
        walk, r, r.c.id == walk.c.parent_id).where(r.c.owner == owner))
    return sa.select(walk.c.id).limit(CHAIN_LIMIT + 1).subquery()


def _has_children(db: sa.Connection, response_id: str) -> bool:
    """Whether any stored response (a tombstone too) continues from this one."""
    return db.execute(sa.select(responses.c.id).where(
        responses.c.parent_id == response_id).limit(1)).first() is not None


def _remove(db: sa.Connection, response_id: str) -> None:
    for table, column in ((responses, responses.c.id),
                          (input_items, input_items.c.response_id),
                          (events, events.c.response_id)):
        db.execute(sa.delete(table).where(column == response_id))


def _collect(db: sa.Connection, parent_id: str | None) -> None:
    """After a response is removed: remove its parent if that is a tombstone nobody
    continues from any more, then that one's parent, and so on up the chain. Each parent is
    held before it is looked at, so a delete of it in flight finishes first (and then
    either removed it or left a tombstone this sees)."""
    seen: set[str] = set()
    while parent_id is not None and parent_id not in seen and len(seen) < CHAIN_LIMIT:
        seen.add(parent_id)
        row = db.execute(sa.select(responses.c.parent_id, responses.c.deleted).where(
            responses.c.id == parent_id).with_for_update()).first()
        if row is None or not row.deleted or _has_children(db, parent_id):
            return
        _remove(db, parent_id)
        parent_id = row.parent_id


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    """The driver's operational failures as ``StoreUnavailable``: the one place they are
    translated (the details go to the log, not to clients)."""
    try:
        yield
    except (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError) as exc:
        orig = getattr(exc, "orig", None) or exc
        log.warning("response store failed: %s", orig)
        full = (getattr(orig, "sqlite_errorname", None) == "SQLITE_FULL"
                or getattr(orig, "sqlstate", None) == "53100")      # PostgreSQL: disk_full
        raise StoreUnavailable(
            "The response store is full: there is no room left to write to it"
            if full else "The response store is unavailable: its database cannot be "
            "reached or written") from exc


# The schema's versions: 1 the first; 2 added ``owner``; 3 ``parent_id`` (and its index) and
# ``deleted``; 4 the lease columns and ``cancel_requested``, and the conversations' tables.
# A database records its version in ``podium_schema``; one made before that table has none,
# and its steps are found from its columns.
SCHEMA_VERSION = 4
_MIGRATION_LOCK = 0x706F6469756D     # PostgreSQL advisory lock: one replica migrates at once


def _create_schema(engine: sa.Engine) -> None:
    """Create what is missing, then bring an older database to this version, in one
    transaction that holds an advisory lock on PostgreSQL (replicas starting together
    migrate one after the other, the others find it done). On SQLite, several processes on
    one file race to create the same tables; the loser finds them made on its next look.
    A database from a newer Podium is refused.

    SQLite answers a writer whose snapshot went stale with "database is locked" at once,
    without waiting out its busy timeout, so a start racing another can lose several times in
    a row: it looks again, a little later each time."""
    attempts = 10
    for attempt in range(attempts):
        try:
            with engine.begin() as db:
                if db.dialect.name == "postgresql":
                    db.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"),
                               {"key": _MIGRATION_LOCK})
                found = _schema_version(db)
                if found is not None and found > SCHEMA_VERSION:
                    raise RuntimeError(
                        f"The response store's database is at schema version {found}, newer "
                        f"than this Podium's ({SCHEMA_VERSION}): run a Podium as new as the "
                        f"one that wrote it")
                metadata.create_all(db)
                if found != SCHEMA_VERSION:
                    _migrate(db)
                    if found is None:
                        db.execute(sa.insert(schema_version).values(id=1,
                                                                    version=SCHEMA_VERSION))
                    else:
                        db.execute(sa.update(schema_version).where(
                            schema_version.c.id == 1).values(version=SCHEMA_VERSION))
                    log.info("response store: schema version %s -> %d", found or "unrecorded",
                             SCHEMA_VERSION)
            return
        except sa.exc.DBAPIError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.02 * (attempt + 1))


def _schema_version(db: sa.Connection) -> int | None:
    if not sa.inspect(db).has_table(schema_version.name):
        return None
    return db.execute(sa.select(schema_version.c.version).where(
        schema_version.c.id == 1)).scalar()


def _migrate(db: sa.Connection) -> None:
    """Add what a database made by an earlier Podium lacks: each step looks at the columns
    and indexes there are, so a step already done (or a database new enough) is left as it
    is. Existing responses belong to NO_OWNER (the owner of a server without keys), have no
    parent (they carry their whole conversation in ``history``), are not deleted, hold no
    lease (so an unfinished one is failed at start, as before) and no cancel request."""
    def columns() -> set[str]:
        return {c["name"] for c in sa.inspect(db).get_columns(responses.name)}

    def indexes() -> set[str]:
        return {str(i["name"]) for i in sa.inspect(db).get_indexes(responses.name)}

    def add(name: str, ddl: Any, present: Callable[[], set[str]]) -> None:
        """Run ``ddl`` unless another process (SQLite: replicas on one file are not held
        off by a lock here) did it first."""
        try:
            db.execute(ddl)
        except sa.exc.DBAPIError:
            if name not in present():
                raise
        log.info("response store: added %s", name)

    have = columns()
    if "owner" not in have:
        add("owner", sa.text(f"ALTER TABLE {responses.name} ADD COLUMN owner VARCHAR(64) "
                             f"NOT NULL DEFAULT '{NO_OWNER}'"), columns)
    for name in ("parent_id", "deleted", "lease_owner", "lease_until", "cancel_requested"):
        if name not in have:
            column = sa.schema.CreateColumn(responses.c[name]).compile(dialect=db.dialect)
            add(name, sa.text(f"ALTER TABLE {responses.name} ADD COLUMN {column}"), columns)
    made = indexes()
    for index in responses.indexes:
        if index.name not in made:
            add(str(index.name), sa.schema.CreateIndex(index), indexes)


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def create_tables(engine: sa.Engine, tables: list[sa.Table]) -> None:
    """Tables a later API added (files, batches), if missing, under the schema's advisory
    lock on PostgreSQL (replicas starting together create them once); SQLite serializes
    the creating writers, and one that lost a race looks again."""
    for attempt in range(10):
        try:
            with engine.begin() as db:
                if db.dialect.name == "postgresql":
                    db.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"),
                               {"key": _MIGRATION_LOCK})
                metadata.create_all(db, tables=tables)
            return
        except sa.exc.DBAPIError:
            if attempt == 9:
                raise
            time.sleep(0.02 * (attempt + 1))
