"""Vector stores on SQL: stores, their files, file batches and the files' chunks with their
vectors, in the response store's database (SQLite by default, PostgreSQL for replicas).

Four tables on the store's ``metadata`` and engine, so every replica sees every store:

- ``podium_vector_stores``: a row per store (owner, name, metadata, the embedding model it
  was made with and keeps, its default chunking, its expiry), and ``revision``, moved on in
  every transaction that changes which chunks a search sees (a search's cache of the store's
  vectors is good while the revision is the one it read).
- ``podium_vector_store_files``: a row per file in a store: ``in_progress`` (its chunks being
  made, under a replica's lease, as batch requests are), ``completed``, ``failed`` (with
  ``last_error``) or ``cancelled``; its attributes, chunking and ``usage_bytes``.
- ``podium_vector_store_batches``: file batches (the counts are their files').
- ``podium_vector_chunks``: a file's chunks: text and float32 vector (little-endian bytes).

File counts and ``usage_bytes`` are counted from the files' rows when asked, so they are
exact by construction. A file's chunks are written only while its replica holds its lease
(each write one transaction that first renews the lease: a file deleted or cancelled
meanwhile makes the write, and every later one, a no-op), and a search sees chunks of
``completed`` files only: a file is seen whole or not at all. Ownership: every read and write
the API makes filters by owner, so another key's store is as missing as one that never was.

An expired store (``expires_at`` passed) keeps its row and its expiry (activity no longer
moves it), but its files, their chunks and vectors are removed (``expire``, ``sweep``): it
counts no files and no bytes, and its batches are cancelled.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Iterable

import orjson
import sqlalchemy as sa

from podium.store.sql import _mapped, create_tables, metadata

_JSON = ("meta", "attributes", "last_error")

stores = sa.Table(
    "podium_vector_stores", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("name", sa.Text, nullable=True),
    sa.Column("description", sa.Text, nullable=True),
    sa.Column("meta", sa.Text, nullable=True),                  # metadata, as JSON
    sa.Column("embedding_model", sa.Text, nullable=False),
    sa.Column("chunk_size", sa.Integer, nullable=False),        # the files' default
    sa.Column("chunk_overlap", sa.Integer, nullable=False),
    sa.Column("created_at", sa.BigInteger, nullable=False),
    sa.Column("expires_days", sa.Integer, nullable=True),
    sa.Column("expires_at", sa.BigInteger, nullable=True),
    sa.Column("last_active_at", sa.BigInteger, nullable=True),
    sa.Column("revision", sa.BigInteger, nullable=False, server_default="0"),
    sa.Index("ix_podium_vector_stores_owner", "owner", "id"),
)
store_files = sa.Table(
    "podium_vector_store_files", metadata,
    sa.Column("store_id", sa.String(64), primary_key=True),
    sa.Column("file_id", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("batch_id", sa.String(64), nullable=True, index=True),
    sa.Column("status", sa.String(16), nullable=False),   # in_progress|completed|failed|...
    sa.Column("filename", sa.Text, nullable=False),
    sa.Column("attributes", sa.Text, nullable=True),
    sa.Column("chunk_size", sa.Integer, nullable=False),
    sa.Column("chunk_overlap", sa.Integer, nullable=False),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("usage_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("created_at", sa.BigInteger, nullable=False),
    sa.Column("lease_owner", sa.String(32), nullable=True),
    sa.Column("lease_until", sa.Float, nullable=True),
    sa.Index("ix_podium_vector_store_files_status", "status", "lease_until"),
)
file_batches = sa.Table(
    "podium_vector_store_batches", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("store_id", sa.String(64), nullable=False, index=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),       # in_progress | cancelled
    sa.Column("created_at", sa.BigInteger, nullable=False),
)
chunks = sa.Table(
    "podium_vector_chunks", metadata,
    sa.Column("store_id", sa.String(64), primary_key=True),
    sa.Column("file_id", sa.String(64), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("vector", sa.LargeBinary, nullable=False),        # float32, little-endian
)
TABLES = [stores, store_files, file_batches, chunks]


def _row(row: Any) -> dict[str, Any] | None:
    if row is None:
        return None
    out = dict(row._mapping)
    for key in _JSON:
        if key in out:
            out[key] = orjson.loads(out[key]) if out[key] else None
    return out


def _dumps(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _bump(db: sa.Connection, store_id: str) -> None:
    db.execute(sa.update(stores).where(stores.c.id == store_id).values(
        revision=stores.c.revision + 1))


def _expired(now: float) -> Any:
    return sa.and_(stores.c.expires_at.is_not(None), stores.c.expires_at <= now)


def _drop_chunks(db: sa.Connection, store_id: str, file_id: str | None = None) -> None:
    query = sa.delete(chunks).where(chunks.c.store_id == store_id)
    if file_id is not None:
        query = query.where(chunks.c.file_id == file_id)
    db.execute(query)


class VectorStoreStore:
    """Vector stores, their files, batches and chunks, on the response store's engine."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        create_tables(engine, TABLES)
        self._busy = 0                  # calls running on worker threads
        self._lock = threading.Lock()

    async def _run(self, fn, *args):
        with _mapped():
            return await asyncio.to_thread(self._counted, fn, *args)

    def _counted(self, fn, *args):
        with self._lock:
            self._busy += 1
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._busy -= 1

    async def settle(self, seconds: float) -> None:
        """Wait (at most ``seconds``) for the calls running on worker threads to end: a
        caller cancelled mid-call leaves its thread running, holding a connection, and the
        engine must not be disposed under it (the connection would never be closed)."""
        deadline = time.monotonic() + seconds
        while self._busy and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    # -- stores -------------------------------------------------------------------------

    async def create(self, values: dict[str, Any], files: list[dict[str, Any]]) -> None:
        """A store and the files it starts with, in one transaction."""
        await self._run(self._create, values, files)

    def _create(self, values: dict[str, Any], files: list[dict[str, Any]]) -> None:
        with self.engine.begin() as db:
            db.execute(sa.insert(stores).values(**{**values, "meta": _dumps(values["meta"])}))
            self._insert_files(db, files)

    async def get(self, store_id: str, owner: str) -> dict[str, Any] | None:
        return await self._run(self._get, store_id, owner)

    def _get(self, store_id: str, owner: str) -> dict[str, Any] | None:
        s = stores.c
        with self.engine.connect() as db:
            return _row(db.execute(sa.select(stores).where(s.id == store_id,
                                                          s.owner == owner)).first())

    async def count(self, owner: str) -> int:
        return await self._run(self._count, owner)

    def _count(self, owner: str) -> int:
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).select_from(stores).where(
                stores.c.owner == owner)).scalar() or 0

    async def page(self, owner: str, after: str | None, before: str | None, limit: int,
                   order: str) -> tuple[list[dict[str, Any]], bool]:
        """The owner's stores by id (ids sort by creation), and whether more follow."""
        return await self._run(self._page, owner, after, before, limit, order)

    def _page(self, owner: str, after: str | None, before: str | None, limit: int,
              order: str) -> tuple[list[dict[str, Any]], bool]:
        s = stores.c
        query = _paged(sa.select(stores).where(s.owner == owner), s.id, after, before, order)
        with self.engine.connect() as db:
            rows = db.execute(query.limit(limit + 1)).all()
        return [_row(r) for r in rows[:limit]], len(rows) > limit  # type: ignore[misc]

    async def update(self, store_id: str, owner: str, values: dict[str, Any]) -> bool:
        return await self._run(self._update, store_id, owner, values)

    def _update(self, store_id: str, owner: str, values: dict[str, Any]) -> bool:
        if "meta" in values:
            values = {**values, "meta": _dumps(values["meta"])}
        s = stores.c
        with self.engine.begin() as db:
            return bool(db.execute(sa.update(stores).where(
                s.id == store_id, s.owner == owner).values(**values)).rowcount)

    async def delete(self, store_id: str, owner: str) -> bool:
        """The store, its files, batches and chunks, in one transaction."""
        return await self._run(self._delete, store_id, owner)

    def _delete(self, store_id: str, owner: str) -> bool:
        s = stores.c
        with self.engine.begin() as db:
            if not db.execute(sa.delete(stores).where(s.id == store_id,
                                                      s.owner == owner)).rowcount:
                return False
            db.execute(sa.delete(store_files).where(store_files.c.store_id == store_id))
            db.execute(sa.delete(file_batches).where(file_batches.c.store_id == store_id))
            _drop_chunks(db, store_id)
        return True

    async def stats(self, store_ids: list[str]) -> dict[str, tuple[dict[str, int], int]]:
        """Each store's file counts by status and its usage in bytes, counted now."""
        return await self._run(self._stats, store_ids)

    def _stats(self, store_ids: list[str]) -> dict[str, tuple[dict[str, int], int]]:
        f = store_files.c
        out: dict[str, tuple[dict[str, int], int]] = {i: ({}, 0) for i in store_ids}
        if not store_ids:
            return out
        with self.engine.connect() as db:
            for row in db.execute(sa.select(
                    f.store_id, f.status, sa.func.count().label("n"),
                    sa.func.sum(f.usage_bytes).label("used")).where(
                    f.store_id.in_(store_ids)).group_by(f.store_id, f.status)):
                counts, used = out[row.store_id]
                counts[row.status] = row.n
                out[row.store_id] = (counts, used + int(row.used or 0))
        return out

    async def touch(self, store_id: str, now: int) -> None:
        """The store was used (searched, files added): its expiry moves on."""
        await self._run(self._touch, store_id, now)

    def _touch(self, store_id: str, now: int) -> None:
        s = stores.c
        with self.engine.begin() as db:     # an expired store stays expired
            db.execute(sa.update(stores).where(s.id == store_id, ~_expired(now)).values(
                last_active_at=now, expires_at=sa.case(
                    (s.expires_days.is_(None), None), else_=now + s.expires_days * 86400)))

    async def expire(self, store_id: str, now: float) -> bool:
        """If the store has expired, remove its files, their chunks and vectors, and cancel
        its batches; whether there was anything to remove."""
        return await self._run(self._expire, store_id, now)

    def _expire(self, store_id: str, now: float) -> bool:
        f, b = store_files.c, file_batches.c
        with self.engine.begin() as db:
            if db.execute(sa.select(stores.c.id).where(
                    stores.c.id == store_id, _expired(now))).first() is None:
                return False
            if db.execute(sa.select(f.file_id).where(f.store_id == store_id).limit(1)
                          ).first() is None:
                return False
            _drop_chunks(db, store_id)
            db.execute(sa.delete(store_files).where(f.store_id == store_id))
            db.execute(sa.update(file_batches).where(
                b.store_id == store_id, b.status == "in_progress").values(status="cancelled"))
            _bump(db, store_id)
        return True

    async def sweep(self, now: float, limit: int = 100) -> list[str]:
        """``expire`` every expired store that still holds files (at most ``limit``); the
        stores it emptied."""
        return await self._run(self._sweep, now, limit)

    def _sweep(self, now: float, limit: int) -> list[str]:
        f = store_files.c
        with self.engine.connect() as db:
            found = list(db.execute(sa.select(stores.c.id).where(
                _expired(now), sa.exists().where(f.store_id == stores.c.id)).limit(
                limit)).scalars())
        return [store_id for store_id in found if self._expire(store_id, now)]

    # -- files --------------------------------------------------------------------------

    def _insert_files(self, db: sa.Connection, files: list[dict[str, Any]]) -> None:
        """Attach files (a file attached again starts over: its chunks go)."""
        for values in files:
            f = store_files.c
            if db.execute(sa.delete(store_files).where(
                    f.store_id == values["store_id"], f.file_id == values["file_id"])).rowcount:
                _drop_chunks(db, values["store_id"], values["file_id"])
                _bump(db, values["store_id"])
            db.execute(sa.insert(store_files).values(
                **{**values, "attributes": _dumps(values.get("attributes")),
                   "status": "in_progress", "usage_bytes": 0}))

    async def add_files(self, files: list[dict[str, Any]],
                        batch: dict[str, Any] | None = None) -> None:
        """Attach files to a store (and make the batch they came in), in one transaction."""
        await self._run(self._add_files, files, batch)

    def _add_files(self, files: list[dict[str, Any]], batch: dict[str, Any] | None) -> None:
        with self.engine.begin() as db:
            if batch is not None:
                db.execute(sa.insert(file_batches).values(**batch))
            self._insert_files(db, files)

    async def file_count(self, store_id: str) -> int:
        return await self._run(self._file_count, store_id)

    def _file_count(self, store_id: str) -> int:
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).select_from(store_files).where(
                store_files.c.store_id == store_id)).scalar() or 0

    async def get_file(self, store_id: str, file_id: str, owner: str
                       ) -> dict[str, Any] | None:
        return await self._run(self._get_file, store_id, file_id, owner)

    def _get_file(self, store_id: str, file_id: str, owner: str) -> dict[str, Any] | None:
        f = store_files.c
        with self.engine.connect() as db:
            return _row(db.execute(sa.select(store_files).where(
                f.store_id == store_id, f.file_id == file_id, f.owner == owner)).first())

    async def page_files(self, store_id: str, owner: str, *, status: str | None,
                         batch_id: str | None, after: str | None, before: str | None,
                         limit: int, order: str) -> tuple[list[dict[str, Any]], bool]:
        return await self._run(self._page_files, store_id, owner, status, batch_id, after,
                               before, limit, order)

    def _page_files(self, store_id: str, owner: str, status: str | None,
                    batch_id: str | None, after: str | None, before: str | None, limit: int,
                    order: str) -> tuple[list[dict[str, Any]], bool]:
        f = store_files.c
        query = sa.select(store_files).where(f.store_id == store_id, f.owner == owner)
        if status is not None:
            query = query.where(f.status == status)
        if batch_id is not None:
            query = query.where(f.batch_id == batch_id)
        query = _paged(query, f.file_id, after, before, order)
        with self.engine.connect() as db:
            rows = db.execute(query.limit(limit + 1)).all()
        return [_row(r) for r in rows[:limit]], len(rows) > limit  # type: ignore[misc]

    async def set_attributes(self, store_id: str, file_id: str, owner: str,
                             attributes: dict[str, Any]) -> bool:
        return await self._run(self._set_attributes, store_id, file_id, owner, attributes)

    def _set_attributes(self, store_id: str, file_id: str, owner: str,
                        attributes: dict[str, Any]) -> bool:
        f = store_files.c
        with self.engine.begin() as db:
            done = db.execute(sa.update(store_files).where(
                f.store_id == store_id, f.file_id == file_id, f.owner == owner).values(
                attributes=_dumps(attributes))).rowcount
            if done:
                _bump(db, store_id)         # filters read attributes with the vectors
        return bool(done)

    async def delete_file(self, store_id: str, file_id: str, owner: str) -> bool:
        return await self._run(self._delete_file, store_id, file_id, owner)

    def _delete_file(self, store_id: str, file_id: str, owner: str) -> bool:
        f = store_files.c
        with self.engine.begin() as db:
            if not db.execute(sa.delete(store_files).where(
                    f.store_id == store_id, f.file_id == file_id, f.owner == owner)).rowcount:
                return False
            _drop_chunks(db, store_id, file_id)
            _bump(db, store_id)
        return True

    async def file_chunks(self, store_id: str, file_id: str, limit: int) -> list[str]:
        """A file's chunks' texts in order (the first ``limit``)."""
        return await self._run(self._file_chunks, store_id, file_id, limit)

    def _file_chunks(self, store_id: str, file_id: str, limit: int) -> list[str]:
        c = chunks.c
        with self.engine.connect() as db:
            return list(db.execute(sa.select(c.text).where(
                c.store_id == store_id, c.file_id == file_id).order_by(c.seq).limit(
                limit)).scalars())

    # -- batches ------------------------------------------------------------------------

    async def get_batch(self, store_id: str, batch_id: str, owner: str
                        ) -> tuple[dict[str, Any], dict[str, int]] | None:
        """The batch's row and its files' counts by status."""
        return await self._run(self._get_batch, store_id, batch_id, owner)

    def _get_batch(self, store_id: str, batch_id: str, owner: str
                   ) -> tuple[dict[str, Any], dict[str, int]] | None:
        b, f = file_batches.c, store_files.c
        with self.engine.connect() as db:
            row = _row(db.execute(sa.select(file_batches).where(
                b.id == batch_id, b.store_id == store_id, b.owner == owner)).first())
            if row is None:
                return None
            counts = {r.status: r.n for r in db.execute(
                sa.select(f.status, sa.func.count().label("n")).where(
                    f.store_id == store_id, f.batch_id == batch_id).group_by(f.status))}
        return row, counts

    async def cancel_batch(self, store_id: str, batch_id: str, owner: str) -> bool:
        """The batch ``cancelled``, its files not done yet too (their chunks go)."""
        return await self._run(self._cancel_batch, store_id, batch_id, owner)

    def _cancel_batch(self, store_id: str, batch_id: str, owner: str) -> bool:
        b, f = file_batches.c, store_files.c
        with self.engine.begin() as db:
            if not db.execute(sa.update(file_batches).where(
                    b.id == batch_id, b.store_id == store_id, b.owner == owner,
                    b.status == "in_progress").values(status="cancelled")).rowcount:
                return False
            pending = list(db.execute(sa.select(f.file_id).where(
                f.store_id == store_id, f.batch_id == batch_id,
                f.status == "in_progress")).scalars())
            if pending:
                db.execute(sa.update(store_files).where(
                    f.store_id == store_id, f.file_id.in_(pending)).values(
                    status="cancelled", lease_owner=None, lease_until=None))
                db.execute(sa.delete(chunks).where(chunks.c.store_id == store_id,
                                                   chunks.c.file_id.in_(pending)))
        return True

    # -- ingestion: claims and leases, as batch requests ---------------------------------

    async def claim_file(self, replica: str, until: float, now: float
                         ) -> dict[str, Any] | None:
        """A file to ingest, held by ``replica`` until ``until``: one in progress that no
        replica holds, or whose replica's lease lapsed (it died), of a store not expired;
        with its store's embedding model. Its chunks from an earlier attempt are removed."""
        return await self._run(self._claim_file, replica, until, now)

    def _claim_file(self, replica: str, until: float, now: float) -> dict[str, Any] | None:
        f, s = store_files.c, stores.c
        free = sa.and_(f.status == "in_progress",
                       sa.or_(f.lease_until.is_(None), f.lease_until < now))
        with self.engine.begin() as db:
            for row in db.execute(sa.select(store_files, s.embedding_model).join(
                    stores, s.id == f.store_id).where(free, ~_expired(now)).order_by(
                    f.created_at, f.file_id).limit(8)).all():
                if db.execute(sa.update(store_files).where(
                        f.store_id == row.store_id, f.file_id == row.file_id, free).values(
                        lease_owner=replica, lease_until=until)).rowcount:
                    _drop_chunks(db, row.store_id, row.file_id)
                    return _row(row)
        return None

    def _hold(self, db: sa.Connection, key: tuple[str, str], replica: str,
              until: float) -> bool:
        f = store_files.c
        return bool(db.execute(sa.update(store_files).where(
            f.store_id == key[0], f.file_id == key[1], f.status == "in_progress",
            f.lease_owner == replica).values(lease_until=until)).rowcount)

    async def add_chunks(self, key: tuple[str, str], replica: str, until: float,
                         rows: list[tuple[int, str, bytes]]) -> bool:
        """Write (seq, text, vector) chunks of a file ``replica`` holds, renewing its lease;
        False (nothing written) once it holds it no more (deleted, cancelled, taken)."""
        return await self._run(self._add_chunks, key, replica, until, rows)

    def _add_chunks(self, key: tuple[str, str], replica: str, until: float,
                    rows: list[tuple[int, str, bytes]]) -> bool:
        with self.engine.begin() as db:
            if not self._hold(db, key, replica, until):
                return False
            if rows:
                db.execute(sa.insert(chunks), [
                    {"store_id": key[0], "file_id": key[1], "seq": seq, "text": text,
                     "vector": vector} for seq, text, vector in rows])
        return True

    async def finish_file(self, key: tuple[str, str], replica: str, status: str,
                          usage: int, error: dict[str, Any] | None,
                          chunking: tuple[int, int] | None = None) -> bool:
        """End a file ``replica`` holds ``completed`` (its chunks seen by searches from this
        commit; ``chunking``: the chunk size and overlap its chunks were cut with) or
        ``failed`` (its chunks removed); False if it no longer holds it."""
        return await self._run(self._finish_file, key, replica, status, usage, error,
                               chunking)

    def _finish_file(self, key: tuple[str, str], replica: str, status: str, usage: int,
                     error: dict[str, Any] | None, chunking: tuple[int, int] | None) -> bool:
        f = store_files.c
        values: dict[str, Any] = dict(status=status, usage_bytes=usage,
                                      last_error=_dumps(error), lease_owner=None,
                                      lease_until=None)
        if chunking is not None:
            values.update(chunk_size=chunking[0], chunk_overlap=chunking[1])
        with self.engine.begin() as db:
            if not db.execute(sa.update(store_files).where(
                    f.store_id == key[0], f.file_id == key[1], f.status == "in_progress",
                    f.lease_owner == replica).values(**values)).rowcount:
                return False
            if status == "completed":
                _bump(db, key[0])
            else:
                _drop_chunks(db, *key)
        return True

    async def release(self, keys: Iterable[tuple[str, str]], replica: str) -> None:
        """Give files back (a shutdown): the next claim, here or elsewhere, starts them."""
        await self._run(self._release, list(keys), replica)

    def _release(self, keys: list[tuple[str, str]], replica: str) -> None:
        f = store_files.c
        with self.engine.begin() as db:
            for store_id, file_id in keys:
                db.execute(sa.update(store_files).where(
                    f.store_id == store_id, f.file_id == file_id,
                    f.lease_owner == replica).values(lease_owner=None, lease_until=None))

    # -- search -------------------------------------------------------------------------

    async def revision(self, store_id: str) -> int | None:
        return await self._run(self._revision, store_id)

    def _revision(self, store_id: str) -> int | None:
        with self.engine.connect() as db:
            return db.execute(sa.select(stores.c.revision).where(
                stores.c.id == store_id)).scalar()

    async def vectors(self, store_id: str) -> tuple[int, list[dict[str, Any]],
                                                    list[tuple[int, int, bytes]]]:
        """What a search scans, read in one transaction: the store's revision, its completed
        files (id, filename, attributes), and every chunk of them as (file's index in that
        list, seq, vector bytes)."""
        return await self._run(self._vectors, store_id)

    def _vectors(self, store_id: str) -> tuple[int, list[dict[str, Any]],
                                               list[tuple[int, int, bytes]]]:
        f, c = store_files.c, chunks.c
        with self.engine.begin() as db:
            revision = db.execute(sa.select(stores.c.revision).where(
                stores.c.id == store_id)).scalar() or 0
            files = [_row(r) for r in db.execute(sa.select(
                f.file_id, f.filename, f.attributes).where(
                f.store_id == store_id, f.status == "completed").order_by(f.file_id))]
            index = {row["file_id"]: i for i, row in enumerate(files)}  # type: ignore[index]
            rows = [(index[r.file_id], r.seq, bytes(r.vector)) for r in db.execute(
                sa.select(c.file_id, c.seq, c.vector).where(c.store_id == store_id))
                if r.file_id in index]
        return revision, files, rows  # type: ignore[return-value]

    async def texts(self, store_id: str, keys: list[tuple[str, int]]) -> dict[tuple[str, int],
                                                                              str]:
        return await self._run(self._texts, store_id, keys)

    def _texts(self, store_id: str, keys: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
        c = chunks.c
        if not keys:
            return {}
        with self.engine.connect() as db:
            return {(r.file_id, r.seq): r.text for r in db.execute(
                sa.select(c.file_id, c.seq, c.text).where(
                    c.store_id == store_id,
                    sa.tuple_(c.file_id, c.seq).in_([tuple(k) for k in keys])))}


def _paged(query: Any, key: Any, after: str | None, before: str | None, order: str) -> Any:
    """A page by ``key`` in ``order``: after the cursor ``after`` (in that order), before
    ``before`` (which need not exist any more)."""
    if after is not None:
        query = query.where(key > after if order == "asc" else key < after)
    if before is not None:
        query = query.where(key < before if order == "asc" else key > before)
    return query.order_by(key if order == "asc" else key.desc())

