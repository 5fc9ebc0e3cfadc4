"""Files on SQL: the Files API's files, their bytes in chunk rows, in the store's database.

Two tables on the response store's ``metadata`` and engine, so every replica sees every file:
a row per file (owner, purpose, name, size, times, and whether it is still uploading) and
its bytes in rows of at most ``CHUNK_BYTES``, keyed by (file, position). An upload writes
each chunk in a transaction of its own as the body arrives, so neither a replica nor the
database holds a whole file in memory; a download reads them back one at a time.

An upload in progress is a row with status ``uploading``, written with its first chunk and
touched with each next one; it becomes ``processed`` with its last chunk and its metadata,
in one transaction. Every read filters on ``processed`` (and on expiry), so a file is seen
whole or not at all. An upload that ends badly is removed by its replica; one whose replica
died is removed by ``prune`` once no chunk has come for ``STALE_SECONDS``.

Ownership: a file belongs to the API key that uploaded it (``owner``), and every read and
delete filters by it in SQL: another owner's file is as missing as one that never was.

Order: a file's ``created_ms`` is written into its id (``new_id``), so a list's cursor
(``after``) says where it is even after the file it names was deleted; lists are ordered by
(``created_ms``, ``id``), the same order the row comparison of the cursor uses.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from podium.store.sql import _mapped, create_tables, metadata

CHUNK_BYTES = 1 << 20           # bytes of a file a chunk row holds (the last one: the rest)
STALE_SECONDS = 3600.0          # an upload with no chunk for this long is abandoned
_PRUNE_BATCH = 64               # files one prune removes at most (chunks of each included)
_ID_TIME, _ID_RANDOM = 9, 16    # base-36 digits of an id: its milliseconds, then random
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"

files = sa.Table(
    "podium_files", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),       # uploading | processed
    sa.Column("purpose", sa.String(32), nullable=False),
    sa.Column("filename", sa.Text, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("expires_at", sa.BigInteger, nullable=True, index=True),
    sa.Column("updated_at", sa.Float, nullable=False),        # the last chunk written
    sa.Index("ix_podium_files_owner_order", "owner", "created_ms", "id"),
    sa.Index("ix_podium_files_status_updated", "status", "updated_at"),
)
file_chunks = sa.Table(
    "podium_file_chunks", metadata,
    sa.Column("file_id", sa.String(64), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
)


def new_id(now_ms: int | None = None, prefix: str = "file-") -> str:
    """``prefix`` + the time in milliseconds (9 base-36 digits: sortable until the year
    5188) + 16 random base-36 digits (82 bits). Ids of one prefix sort by creation."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    stamp = ""
    for _ in range(_ID_TIME):
        ms, digit = divmod(ms, 36)
        stamp = _DIGITS[digit] + stamp
    return prefix + stamp + "".join(secrets.choice(_DIGITS) for _ in range(_ID_RANDOM))


def id_time(file_id: str, prefix: str = "file-") -> int | None:
    """The milliseconds written into an id by ``new_id``; None if it is not one."""
    n = len(prefix)
    if (not file_id.startswith(prefix) or len(file_id) != n + _ID_TIME + _ID_RANDOM
            or not all(c in _DIGITS for c in file_id[n:])):
        return None
    return int(file_id[n:n + _ID_TIME], 36)


class UploadLost(Exception):
    """The upload's row is gone: ``prune`` took it for abandoned (no chunk came for
    ``STALE_SECONDS``). Nothing of it is kept."""


@dataclass
class StoredFile:
    id: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    expires_at: int | None


def _file(row: Any) -> StoredFile:
    return StoredFile(row.id, row.purpose, row.filename, row.bytes, row.created_ms // 1000,
                      row.expires_at)


def _live(now: float) -> sa.ColumnElement[bool]:
    f = files.c
    return sa.and_(f.status == "processed",
                   sa.or_(f.expires_at.is_(None), f.expires_at > int(now)))


class FileStore:
    """Files and their chunks, on the response store's engine."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        create_tables(engine, [files, file_chunks])

    async def _run(self, fn, *args):
        with _mapped():
            return await asyncio.to_thread(fn, *args)

    # -- uploads ------------------------------------------------------------------------

    async def write_chunk(self, file_id: str, owner: str, seq: int, data: bytes) -> None:
        """One chunk of an upload in progress (the first one makes its ``uploading`` row)."""
        await self._run(self._write_chunk, file_id, owner, seq, data)

    def _write_chunk(self, file_id: str, owner: str, seq: int, data: bytes) -> None:
        now = time.time()
        with self.engine.begin() as db:
            if seq == 0:
                db.execute(sa.insert(files).values(
                    id=file_id, owner=owner, status="uploading", purpose="", filename="",
                    bytes=0, created_ms=id_time(file_id), expires_at=None, updated_at=now))
            elif not db.execute(sa.update(files).where(files.c.id == file_id).values(
                    updated_at=now)).rowcount:
                raise UploadLost(file_id)
            db.execute(sa.insert(file_chunks).values(file_id=file_id, seq=seq, data=data))

    async def finish(self, file_id: str, owner: str, seq: int, data: bytes,
                     meta: StoredFile) -> None:
        """The upload's last chunk (``seq``; it may be empty) and its metadata: the file is
        seen from this commit on, whole."""
        await self._run(self._finish, file_id, owner, seq, data, meta)

    def _finish(self, file_id: str, owner: str, seq: int, data: bytes,
                meta: StoredFile) -> None:
        values = dict(status="processed", purpose=meta.purpose, filename=meta.filename,
                      bytes=meta.bytes, expires_at=meta.expires_at, updated_at=time.time())
        with self.engine.begin() as db:
            if seq == 0:
                db.execute(sa.insert(files).values(id=file_id, owner=owner,
                                                   created_ms=id_time(file_id), **values))
            elif not db.execute(sa.update(files).where(files.c.id == file_id).values(
                    **values)).rowcount:
                raise UploadLost(file_id)
            if data:
                db.execute(sa.insert(file_chunks).values(file_id=file_id, seq=seq, data=data))

    async def discard(self, file_id: str) -> None:
        """Remove an upload that did not finish, and whatever chunks it wrote."""
        await self._run(self._discard, file_id)

    def _discard(self, file_id: str) -> None:
        with self.engine.begin() as db:
            _remove(db, [file_id])

    async def count(self, owner: str, now: float) -> int:
        """The owner's files, uploads in progress included."""
        return await self._run(self._count, owner, now)

    def _count(self, owner: str, now: float) -> int:
        f = files.c
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).select_from(files).where(
                f.owner == owner, sa.or_(f.expires_at.is_(None), f.expires_at > int(now)))
            ).scalar() or 0

    # -- reads --------------------------------------------------------------------------

    async def get(self, file_id: str, owner: str, now: float) -> StoredFile | None:
        return await self._run(self._get, file_id, owner, now)

    def _get(self, file_id: str, owner: str, now: float) -> StoredFile | None:
        f = files.c
        with self.engine.connect() as db:
            row = db.execute(sa.select(files).where(f.id == file_id, f.owner == owner,
                                                    _live(now))).first()
        return None if row is None else _file(row)

    async def page(self, owner: str, now: float, *, purpose: str | None,
                   after: tuple[int, str] | None, limit: int, order: str
                   ) -> tuple[list[StoredFile], bool]:
        """A page of the owner's files by creation, and whether more follow; ``after``:
        the (milliseconds, id) of the cursor, which need not exist any more."""
        return await self._run(self._page, owner, now, purpose, after, limit, order)

    def _page(self, owner: str, now: float, purpose: str | None,
              after: tuple[int, str] | None, limit: int, order: str
              ) -> tuple[list[StoredFile], bool]:
        f = files.c
        query = sa.select(files).where(f.owner == owner, _live(now))
        if purpose is not None:
            query = query.where(f.purpose == purpose)
        key = sa.tuple_(f.created_ms, f.id)
        if after is not None:
            cursor = sa.tuple_(sa.literal(after[0], sa.BigInteger), sa.literal(after[1]))
            query = query.where(key > cursor if order == "asc" else key < cursor)
        query = query.order_by(*((f.created_ms, f.id) if order == "asc"
                                 else (f.created_ms.desc(), f.id.desc())))
        with self.engine.connect() as db:
            rows = db.execute(query.limit(limit + 1)).all()
        return [_file(r) for r in rows[:limit]], len(rows) > limit

    async def chunk(self, file_id: str, seq: int) -> bytes | None:
        """A file's chunk ``seq``; None if there is none (past the end, or deleted)."""
        return await self._run(self._chunk, file_id, seq)

    def _chunk(self, file_id: str, seq: int) -> bytes | None:
        c = file_chunks.c
        with self.engine.connect() as db:
            data = db.execute(sa.select(c.data).where(c.file_id == file_id,
                                                      c.seq == seq)).scalar()
        return None if data is None else bytes(data)

    # -- deletes ------------------------------------------------------------------------

    async def delete(self, file_id: str, owner: str, now: float) -> bool:
        return await self._run(self._delete, file_id, owner, now)

    def _delete(self, file_id: str, owner: str, now: float) -> bool:
        f = files.c
        with self.engine.begin() as db:
            if not db.execute(sa.delete(files).where(f.id == file_id, f.owner == owner,
                                                     _live(now))).rowcount:
                return False
            db.execute(sa.delete(file_chunks).where(file_chunks.c.file_id == file_id))
        return True

    async def prune(self, now: float) -> int:
        """Remove up to ``_PRUNE_BATCH`` expired files and abandoned uploads (no chunk for
        ``STALE_SECONDS``), with their chunks; how many."""
        return await self._run(self._prune, now)

    def _prune(self, now: float) -> int:
        f = files.c
        gone = sa.or_(f.expires_at <= int(now),
                      sa.and_(f.status == "uploading", f.updated_at < now - STALE_SECONDS))
        with self.engine.begin() as db:
            ids = list(db.execute(sa.select(f.id).where(gone).limit(_PRUNE_BATCH)).scalars())
            _remove(db, ids)
        return len(ids)


def _remove(db: sa.Connection, ids: list[str]) -> None:
    if ids:
        db.execute(sa.delete(files).where(files.c.id.in_(ids)))
        db.execute(sa.delete(file_chunks).where(file_chunks.c.file_id.in_(ids)))
