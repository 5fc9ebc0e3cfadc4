"""The response store on SQL: SQLite (a file in the data directory) or any SQLAlchemy URL.

SQLAlchemy Core with plain tables and portable types, so the same statements run on SQLite
and PostgreSQL. Calls run on a worker thread (``asyncio.to_thread``): each is a short
statement, and the event loop never waits on disk. Look-ups are by primary key: O(1) in the
size of the store (well, O(log n)). The driver's operational failures (disk full, database
unreachable) leave as ``StoreUnavailable`` (503), translated in one place (``_mapped``).

Deleting a response while it is still being logged: an event batch is inserted only while
its response row exists, by one guarded ``INSERT ... SELECT ... WHERE EXISTS`` that on
PostgreSQL also takes a ``FOR KEY SHARE`` lock on that row, and a delete removes the row
before its events. On SQLite the writes are serialized anyway; on PostgreSQL the delete waits
for an append that holds the row and then sees its events, and an append that comes after
the delete finds no row. Either way nothing outlives the delete, on any replica. (A foreign
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
from typing import Any, Iterator

import orjson
import sqlalchemy as sa

from podium.errors import StoreUnavailable
from podium.render.responses import Sequencer, recover
from podium.store.base import NO_OWNER, TERMINAL, StoredResponse

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
probes = sa.Table(        # /ready's write probe: rows live for one call
    "podium_probes", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("body", sa.LargeBinary, nullable=False),
)
_PROBE_BYTES = 4096       # a page or more: a full database cannot find room for it


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
        _create_schema(self.engine)

    async def _run(self, fn, *args):
        with _mapped():
            return await asyncio.to_thread(fn, *args)

    # -- responses ----------------------------------------------------------------------

    async def put(self, record: StoredResponse) -> None:
        await self._run(self._put, record)

    def _put(self, record: StoredResponse) -> None:
        body = record.body
        with self.engine.begin() as db:
            db.execute(sa.delete(input_items).where(input_items.c.response_id == record.id))
            db.execute(sa.delete(responses).where(responses.c.id == record.id))
            db.execute(sa.insert(responses).values(
                id=record.id, created_at=body.get("created_at") or time.time(),
                status=body.get("status") or "completed", body=_dumps(body),
                history=_dumps(record.history), owner=record.owner))
            if record.input_items:
                db.execute(sa.insert(input_items), [
                    {"response_id": record.id, "position": i, "item_id": item["id"],
                     "body": _dumps(item)} for i, item in enumerate(record.input_items)])

    async def update(self, response_id: str, body: dict[str, Any]) -> None:
        await self._run(self._update, response_id, body)

    def _update(self, response_id: str, body: dict[str, Any]) -> None:
        with self.engine.begin() as db:
            db.execute(sa.update(responses).where(responses.c.id == response_id).values(
                status=body.get("status") or "completed", body=_dumps(body)))

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        return await self._run(self._get, response_id, owner)

    def _get(self, response_id: str, owner: str) -> StoredResponse | None:
        with self.engine.connect() as db:
            row = db.execute(sa.select(responses.c.body, responses.c.history).where(
                responses.c.id == response_id, responses.c.owner == owner)).first()
        if row is None:
            return None
        return StoredResponse(response_id, orjson.loads(row.body), orjson.loads(row.history),
                              owner=owner)

    async def delete(self, response_id: str, owner: str) -> bool:
        return await self._run(self._delete, response_id, owner)

    def _delete(self, response_id: str, owner: str) -> bool:
        with self.engine.begin() as db:
            # the row first: a log append holding it finishes before, and its events go too
            if not db.execute(sa.delete(responses).where(
                    responses.c.id == response_id, responses.c.owner == owner)).rowcount:
                return False
            for table, column in ((input_items, input_items.c.response_id),
                                  (events, events.c.response_id)):
                db.execute(sa.delete(table).where(column == response_id))
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
                    responses.c.id == response_id, responses.c.owner == owner)).first() is None:
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

    async def fail_unfinished(self, message: str) -> list[str]:
        return await self._run(self._fail_unfinished, message)

    def _fail_unfinished(self, message: str) -> list[str]:
        with self.engine.begin() as db:
            rows = db.execute(sa.select(responses.c.id, responses.c.body).where(
                responses.c.status.in_(["queued", "in_progress"]))).all()
            for row in rows:
                self._fail(db, row.id, orjson.loads(row.body), message)
        return [row.id for row in rows]

    def _fail(self, db: sa.Connection, response_id: str, body: dict[str, Any],
              message: str) -> None:
        """Fail one interrupted response: its output is what its log holds, and its log is
        closed (open items done, then ``response.failed``) so followers end."""
        logged = [orjson.loads(r.body) for r in db.execute(
            sa.select(events.c.body).where(events.c.response_id == response_id).order_by(
                events.c.seq)).all()]
        output, closing = recover(logged)
        body.update(status="failed", error={"code": "server_error", "message": message})
        if logged:
            body["output"] = output
        db.execute(sa.update(responses).where(responses.c.id == response_id).values(
            status="failed", body=_dumps(body)))
        if not logged and not body.get("background"):
            return                      # a non-streamed response: it has no log to close
        seq = Sequencer(logged[-1]["sequence_number"] + 1 if logged else 0)
        tail = seq.stamp([*closing, {"type": "response.failed", "response": body}])
        db.execute(sa.insert(events), [
            {"response_id": response_id, "seq": e["sequence_number"], "body": _dumps(e)}
            for e in tail])

    async def prune(self, older_than: float) -> int:
        return await self._run(self._prune, older_than)

    def _prune(self, older_than: float) -> int:
        with self.engine.begin() as db:
            old = sa.select(responses.c.id).where(responses.c.created_at < older_than,
                                                  responses.c.status.in_(list(TERMINAL)))
            ids = [r.id for r in db.execute(old).all()]
            for table, column in ((responses, responses.c.id),
                                  (input_items, input_items.c.response_id),
                                  (events, events.c.response_id)):
                if ids:
                    db.execute(sa.delete(table).where(column.in_(ids)))
        return len(ids)

    def count(self) -> int:
        """Stored responses (sync: read by the metrics collector on a worker thread)."""
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).select_from(responses)).scalar() or 0

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
        await self._run(self.engine.dispose)


_ALIVE = (sa.select(responses.c.id).where(responses.c.id == sa.bindparam("response_id"))
          .with_for_update(read=True, key_share=True))
_GUARDED_APPEND = sa.insert(events).from_select(
    ["response_id", "seq", "body"],
    sa.select(sa.bindparam("response_id", type_=sa.String), sa.bindparam("seq", type_=sa.Integer),
              sa.bindparam("body", type_=sa.Text)).where(sa.exists(_ALIVE)),
).execution_options(preserve_rowcount=True)      # (psycopg's is dropped otherwise)


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


def _create_schema(engine: sa.Engine) -> None:
    """Create what is missing, then migrate. Replicas starting together race to create the
    same tables; the loser finds them made on its next look."""
    for attempt in range(3):
        try:
            metadata.create_all(engine)
            break
        except sa.exc.DBAPIError:
            if attempt == 2:
                raise
    _migrate(engine)


def _migrate(engine: sa.Engine) -> None:
    """Bring a database made by an earlier Podium to this schema. Added so far: the owner
    column (existing responses belong to NO_OWNER, the owner of a server without keys).
    Safe when several replicas start at once."""
    def columns() -> set[str]:
        return {c["name"] for c in sa.inspect(engine).get_columns(responses.name)}

    if "owner" in columns():
        return
    try:
        with engine.begin() as db:
            db.execute(sa.text(f"ALTER TABLE {responses.name} ADD COLUMN owner VARCHAR(64) "
                               f"NOT NULL DEFAULT '{NO_OWNER}'"))
    except sa.exc.DBAPIError:
        if "owner" not in columns():        # else another replica added it first
            raise
    log.info("response store: added the owner column (existing responses: no-key owner)")


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
