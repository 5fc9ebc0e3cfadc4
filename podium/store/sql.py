"""The response store on SQL: SQLite (a file in the data directory) or any SQLAlchemy URL.

SQLAlchemy Core with plain tables and portable types, so the same statements run on SQLite
and PostgreSQL. Calls run on a worker thread (``asyncio.to_thread``): each is a short
statement, and the event loop never waits on disk. Look-ups are by primary key: O(1) in the
size of the store (well, O(log n)).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa

from podium.store.base import TERMINAL, StoredResponse

metadata = sa.MetaData()

responses = sa.Table(
    "podium_responses", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("history", sa.Text, nullable=False),
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
        metadata.create_all(self.engine)

    async def _run(self, fn, *args):
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
                history=_dumps(record.history)))
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

    async def get(self, response_id: str) -> StoredResponse | None:
        return await self._run(self._get, response_id)

    def _get(self, response_id: str) -> StoredResponse | None:
        with self.engine.connect() as db:
            row = db.execute(sa.select(responses.c.body, responses.c.history).where(
                responses.c.id == response_id)).first()
        if row is None:
            return None
        return StoredResponse(response_id, orjson.loads(row.body), orjson.loads(row.history))

    async def delete(self, response_id: str) -> bool:
        return await self._run(self._delete, response_id)

    def _delete(self, response_id: str) -> bool:
        with self.engine.begin() as db:
            for table, column in ((input_items, input_items.c.response_id),
                                  (events, events.c.response_id)):
                db.execute(sa.delete(table).where(column == response_id))
            return db.execute(sa.delete(responses).where(
                responses.c.id == response_id)).rowcount > 0

    # -- input items --------------------------------------------------------------------

    async def input_items(self, response_id: str, *, after: str | None, limit: int,
                          order: str) -> tuple[list[dict[str, Any]], bool]:
        return await self._run(self._input_items, response_id, after, limit, order)

    def _input_items(self, response_id: str, after: str | None, limit: int,
                     order: str) -> tuple[list[dict[str, Any]], bool]:
        t = input_items
        query = sa.select(t.c.position, t.c.body).where(t.c.response_id == response_id)
        with self.engine.connect() as db:
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

    async def append_events(self, response_id: str, batch: list[dict[str, Any]]) -> None:
        if batch:
            await self._run(self._append, response_id, batch)

    def _append(self, response_id: str, batch: list[dict[str, Any]]) -> None:
        with self.engine.begin() as db:
            db.execute(sa.insert(events), [
                {"response_id": response_id, "seq": e["sequence_number"], "body": _dumps(e)}
                for e in batch])

    async def events_after(self, response_id: str, after: int) -> list[dict[str, Any]]:
        return await self._run(self._events_after, response_id, after)

    def _events_after(self, response_id: str, after: int) -> list[dict[str, Any]]:
        with self.engine.connect() as db:
            rows = db.execute(sa.select(events.c.body).where(
                events.c.response_id == response_id, events.c.seq > after).order_by(
                events.c.seq)).all()
        return [orjson.loads(r.body) for r in rows]

    # -- housekeeping -------------------------------------------------------------------

    async def fail_unfinished(self, message: str) -> list[str]:
        return await self._run(self._fail_unfinished, message)

    def _fail_unfinished(self, message: str) -> list[str]:
        with self.engine.begin() as db:
            rows = db.execute(sa.select(responses.c.id, responses.c.body).where(
                responses.c.status.in_(["queued", "in_progress"]))).all()
            for row in rows:
                body = orjson.loads(row.body)
                body["status"] = "failed"
                body["error"] = {"code": "server_error", "message": message}
                db.execute(sa.update(responses).where(responses.c.id == row.id).values(
                    status="failed", body=_dumps(body)))
                last = db.execute(sa.select(sa.func.max(events.c.seq)).where(
                    events.c.response_id == row.id)).scalar()
                seq = 0 if last is None else last + 1    # close the log: followers end
                db.execute(sa.insert(events).values(
                    response_id=row.id, seq=seq, body=_dumps({
                        "type": "response.failed", "sequence_number": seq, "response": body})))
        return [row.id for row in rows]

    async def prune(self, older_than: float) -> int:
        return await self._run(self._prune, older_than)

    def _prune(self, older_than: float) -> int:
        with self.engine.begin() as db:
            old = sa.select(responses.c.id).where(responses.c.created_at < older_than,
                                                  responses.c.status.in_(list(TERMINAL)))
            ids = [r.id for r in db.execute(old).all()]
            for table, column in ((input_items, input_items.c.response_id),
                                  (events, events.c.response_id), (responses, responses.c.id)):
                if ids:
                    db.execute(sa.delete(table).where(column.in_(ids)))
        return len(ids)

    def count(self) -> int:
        """Stored responses (sync: read by the metrics collector on a worker thread)."""
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).select_from(responses)).scalar() or 0

    async def ping(self) -> None:
        await self._run(self.count)

    async def aclose(self) -> None:
        await self._run(self.engine.dispose)


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
