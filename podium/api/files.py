"""The Files API: upload, list, retrieve, download and delete files, kept in the store's
database (``store/files.py``), so every replica serves every file.

An upload streams: the body is parsed as it arrives (``protocol.files.FormReader``) and the
file's bytes go to the database ``CHUNK_BYTES`` at a time, each chunk written on a worker
thread while the body waits (the server stops reading the socket meanwhile), so an upload
holds at most about one chunk in memory, whatever its size. What bounds it:
``--max-file-bytes`` (413, before anything is read when the body's announced length is
over it plus ``FORM_BYTES``, else as soon as the file's bytes counted are), ``FORM_BYTES``
for the rest of the body (its parts' headers, fields, and anything around them: 413 naming
the form, not the file, as soon as they are past it), ``MAX_UPLOADS`` at once in a process (429),
``MAX_FILES`` per API key (400), and the form's own bounds (``FormReader``). An upload that
fails leaves nothing behind. What OpenAI checks at upload is checked here too: the purpose,
and for ``batch`` a ``.jsonl`` name and UTF-8 bytes (checked as they pass); the lines
themselves are the Batch API's to check when a batch is made.

A file belongs to the API key that uploaded it: another key's file is a 404, as a missing
one is. Files expire when their ``expires_after`` says, ``batch`` files after 30 days by
default (as OpenAI's); an expired file is missing at once, and its rows are removed by the
next upload on any replica (``FileStore.prune``), with uploads whose replica died.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import time
from typing import Any, AsyncIterator

from podium.errors import InvalidRequestError, NotFoundError, Overloaded, PayloadTooLarge
from podium.protocol.files import (Field, FileBegin, FileData, FileEnd, FormReader,
                                   boundary_of, check_filename, check_purpose, expires_after,
                                   file_object)
from podium.settings import Settings
from podium.store.files import (CHUNK_BYTES, FileStore, StoredFile, UploadLost, id_time,
                                new_id)

log = logging.getLogger(__name__)
Obj = dict[str, Any]

MAX_UPLOADS = 32                 # uploads in progress at once in this process (429 past it)
MAX_FILES = 10_000               # files one API key keeps (a list's largest page)
FORM_BYTES = 64 * 1024           # a body's bytes besides the file's: headers, fields
# file bytes python-multipart may hold back at a piece's end while it checks for a boundary
# there (counted as the form's until it passes them on), besides the boundary's own length:
# the CRLF and dashes before it, and a little more
HELD_BACK = 8
BATCH_EXPIRES = 30 * 86400       # a batch file's default lifetime, as OpenAI's


class Upload:
    """One upload's state: the file's bytes pending a chunk write, its size, its fields."""

    def __init__(self, store: FileStore, owner: str, limit: int):
        self.store, self.owner, self.limit = store, owner, limit
        self.id = new_id()
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.done = False               # the file part ended
        self.size = 0
        self.seq = 0                    # the next chunk's position
        self.pending = bytearray()
        self.utf8: bool = True
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def take(self, event: Any) -> None:
        """A form event: a field kept, the file's bytes counted (413 past the limit) and
        kept for the next chunk."""
        if isinstance(event, Field):
            if event.name in self.fields:
                raise InvalidRequestError(f"'{event.name}' is given twice", param=event.name)
            self.fields[event.name] = event.value
        elif isinstance(event, FileBegin):
            if self.filename is not None:
                raise InvalidRequestError("An upload holds one file", param="file")
            self.filename = check_filename(event.filename)
        elif isinstance(event, FileData):
            self.size += len(event.data)
            if self.size > self.limit:
                raise PayloadTooLarge(f"The file is larger than {self.limit} bytes "
                                      "(--max-file-bytes)", param="file")
            self.pending += event.data
        elif isinstance(event, FileEnd):
            self.done = True

    def _check_utf8(self, data: bytes, final: bool = False) -> None:
        if self.utf8:
            try:
                self._decoder.decode(data, final)
            except UnicodeDecodeError:
                self.utf8 = False

    async def flush(self) -> None:
        """Write the pending bytes while there is a whole chunk of them."""
        while len(self.pending) >= CHUNK_BYTES:
            data = bytes(self.pending[:CHUNK_BYTES])
            del self.pending[:CHUNK_BYTES]
            self._check_utf8(data)
            await self.store.write_chunk(self.id, self.owner, self.seq, data)
            self.seq += 1

    async def finish(self, now: float) -> StoredFile:
        if self.filename is None or not self.done:
            raise InvalidRequestError("Missing required parameter: 'file'.", param="file")
        purpose = check_purpose(self.fields.get("purpose"))
        seconds = expires_after(self.fields.get("expires_after[anchor]"),
                                self.fields.get("expires_after[seconds]"))
        data = bytes(self.pending)
        self._check_utf8(data, final=True)
        if purpose == "batch":
            if not self.filename.lower().endswith(".jsonl"):
                raise InvalidRequestError("Invalid file format for Batch API. Must be .jsonl",
                                          param="file")
            if not self.utf8:
                raise InvalidRequestError("Invalid file for Batch API. Must be utf-8 encoded",
                                          param="file")
            seconds = BATCH_EXPIRES if seconds is None else seconds
        created = (id_time(self.id) or 0) // 1000
        meta = StoredFile(self.id, purpose, self.filename, self.size, created,
                          None if seconds is None else created + seconds)
        await self.store.finish(self.id, self.owner, self.seq, data, meta)
        return meta


def _form_too_large() -> PayloadTooLarge:
    """The body besides the file (its parts' headers, fields, and bytes before or after
    them) is past ``FORM_BYTES``: the form is too large, whatever the file's size."""
    return PayloadTooLarge(f"The upload's form is larger than {FORM_BYTES} bytes besides the "
                           "file (its parts' headers, its fields and anything around them)")


def _object(f: StoredFile) -> Obj:
    return file_object(f.id, f.purpose, f.filename, f.bytes, f.created_at, f.expires_at)


class FilesService:
    def __init__(self, store: FileStore, settings: Settings):
        self._store = store
        self._limit = settings.max_file_bytes
        self._uploads = 0

    @staticmethod
    def _missing(file_id: str) -> NotFoundError:
        return NotFoundError(f"No such File object: {file_id}", param="id")

    async def create(self, owner: str, content_type: str | None, length: str | None,
                     body: AsyncIterator[bytes]) -> Obj:
        """Upload a file from a multipart body (``length``: its announced Content-Length)."""
        boundary = boundary_of(content_type)
        reader = FormReader(boundary)
        cap = self._limit + FORM_BYTES
        if length is not None and length.isdigit() and int(length) > cap:
            raise PayloadTooLarge(f"The upload's body ({int(length)} bytes) is larger than a "
                                  f"file of at most {self._limit} bytes (--max-file-bytes) "
                                  f"and {FORM_BYTES} bytes of form around it")
        if self._uploads >= MAX_UPLOADS:
            raise Overloaded(f"The server is at its limit of {MAX_UPLOADS} uploads at once")
        self._uploads += 1
        try:
            now = time.time()
            await self._store.prune(now)
            if await self._store.count(owner, now) >= MAX_FILES:
                raise InvalidRequestError(f"An API key keeps at most {MAX_FILES} files: "
                                          "delete some first", param="file")
            return await self._upload(owner, reader, len(boundary) + HELD_BACK, body)
        finally:
            self._uploads -= 1

    async def _upload(self, owner: str, reader: FormReader, held: int,
                      body: AsyncIterator[bytes]) -> Obj:
        """``held``: the file's bytes the reader may hold back (``HELD_BACK``), which count
        as the form's until it passes them on."""
        upload = Upload(self._store, owner, self._limit)
        received = 0
        try:
            async for piece in body:
                received += len(piece)
                for event in reader.feed(piece):
                    upload.take(event)              # the file past its limit: 413 "file"
                if received - upload.size > FORM_BYTES + held:
                    raise _form_too_large()
                await upload.flush()
            for event in reader.finish():
                upload.take(event)
            stored = await upload.finish(time.time())
        except UploadLost:
            raise InvalidRequestError("The upload stalled for too long and was dropped",
                                      param="file") from None
        except BaseException:
            if upload.seq:          # chunks were written: remove them (a cancel waits)
                await asyncio.shield(self._store.discard(upload.id))
            raise
        log.info("file %s uploaded: %d bytes, purpose %s", stored.id, stored.bytes,
                 stored.purpose)
        return _object(stored)

    async def list(self, owner: str, *, purpose: str | None, after: str | None, limit: int,
                   order: str) -> Obj:
        cursor = None
        if after is not None:
            ms = id_time(after)
            if ms is None:
                raise InvalidRequestError(f"Invalid 'after': {after[:64]!r} is not a file id",
                                          param="after")
            cursor = (ms, after)
        found, more = await self._store.page(owner, time.time(), purpose=purpose,
                                             after=cursor, limit=limit, order=order)
        data = [_object(f) for f in found]
        return {"object": "list", "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": more}

    async def retrieve(self, file_id: str, owner: str) -> Obj:
        found = await self._store.get(file_id, owner, time.time())
        if found is None:
            raise self._missing(file_id)
        return _object(found)

    async def content(self, file_id: str, owner: str) -> tuple[Obj, AsyncIterator[bytes]]:
        """The file object and its bytes, read a chunk at a time as they are sent."""
        found = await self._store.get(file_id, owner, time.time())
        if found is None:
            raise self._missing(file_id)
        return _object(found), self._chunks(found)

    async def _chunks(self, found: StoredFile) -> AsyncIterator[bytes]:
        sent, seq = 0, 0
        while sent < found.bytes:
            data = await self._store.chunk(found.id, seq)
            if data is None:        # deleted while it was being sent: the body ends short
                raise RuntimeError(f"file {found.id} was deleted while it was being read")
            sent += len(data)
            seq += 1
            yield data

    async def delete(self, file_id: str, owner: str) -> Obj:
        if not await self._store.delete(file_id, owner, time.time()):
            raise self._missing(file_id)
        log.info("file %s deleted", file_id)
        return {"id": file_id, "object": "file", "deleted": True}
