"""Vector store ingestion: every replica runs an ``Ingestor``, and any of them ingests any
file, as batch requests are run (``api/batch_worker.py``).

A file attached to a store is ``in_progress`` until a replica claims it under a lease
(``VectorStoreStore.claim_file``; a lapsed lease, its replica dead, is claimed again and
the file begun again: durable across restarts), reads its text (UTF-8 text formats: prose,
markup, code, JSON; others end ``failed`` with ``unsupported_file``), cuts it into chunks
measured in the store's embedding model's own tokens (``chunk_text``), embeds them at
``BATCH_PRIORITY`` (interactive embeddings and searches go first in the engine's queue) and
writes them a batch at a time, each write renewing the lease; the file ends ``completed``
(its chunks seen by searches from that commit) or ``failed`` with ``last_error``.

The ingestor also sweeps, every ``SWEEP_SECONDS``: expired stores' files, chunks and vectors
are removed from the database (``VectorStoreStore.sweep``; the service does the same for an
expired store it reads before the sweep comes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from typing import Any, Callable

import numpy as np

from podium.api.batch_worker import BATCH_PRIORITY
from podium.api.vector_stores import (MAX_FILE_CHUNKS, MAX_FILE_TEXT, MAX_STORE_BYTES,
                                      Embedders, fitted)
from podium.errors import PodiumError, StoreUnavailable
from podium.generation import off_loop
from podium.store.files import FileStore
from podium.store.vector_stores import VectorStoreStore

log = logging.getLogger(__name__)
Obj = dict[str, Any]

POLL_SECONDS = 1.0              # a look for files when nothing here wakes the loop
SWEEP_SECONDS = 60.0            # a sweep of expired stores
STOP_SECONDS = 5.0              # a stop waits this long for a store call under way
EMBED_BATCH = 32                # chunks embedded (and written) together
# what is read as text; anything else (PDF, DOCX, images) fails with unsupported_file
TEXT_SUFFIXES = frozenset(
    "txt md markdown rst adoc org tex html htm xml json jsonl ndjson yaml yml toml ini cfg "
    "conf csv tsv log sql py pyi js mjs cjs ts tsx jsx java kt kts scala go rs c h cc cpp "
    "cxx hpp hh cs rb php pl pm sh bash zsh ps1 swift m mm r lua dart css scss less vue "
    "svelte proto graphql gql dockerfile makefile".split())
# a chunk is made of whole pieces: a run of at most 16 non-space characters and the space
# after it (so a long run without spaces, base64, still makes pieces of a few tokens)
_PIECE = re.compile(r"\S{1,16}\s*|\s+")


class Failed(Exception):
    """The file cannot be ingested: its ``last_error`` (``code``, ``message``)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.error = {"code": code, "message": message}


def chunk_text(text: str, count: Callable[[str], int], size: int, overlap: int) -> list[str]:
    """``text`` cut into chunks of at most ``size`` tokens (as ``count`` measures a piece)
    made of whole pieces, each next chunk starting with up to ``overlap`` tokens of the one
    before; the text of every chunk is the file's own, spacing and case kept."""
    pieces = _PIECE.findall(text)
    costs = [count(p) for p in pieces]
    out: list[str] = []
    start = 0
    while start < len(pieces):
        end, total = start, 0
        while end < len(pieces) and (end == start or total + costs[end] <= size):
            total += costs[end]
            end += 1
        chunk = "".join(pieces[start:end])
        if chunk.strip():
            out.append(chunk)
        if end == len(pieces):
            break
        back, kept = end, 0
        while back > start + 1 and kept + costs[back - 1] <= overlap:
            back -= 1
            kept += costs[back]
        start = back
    return out


def counter(tokenizer: Any) -> Callable[[str], int]:
    """A piece's tokens in the model's own tokenizer (no special tokens), remembered: a
    text repeats its words."""
    known: dict[str, int] = {}

    def count(piece: str) -> int:
        found = known.get(piece)
        if found is None:
            found = known[piece] = len(tokenizer.encode(piece, add_special=False))
        return found
    return count


def decode_text(filename: str, data: bytes) -> str:
    """The file's text: a text format by its name, in UTF-8 (a byte-order mark dropped)."""
    name = filename.lower().rsplit("/", 1)[-1]
    suffix = name.rsplit(".", 1)[-1] if "." in name else name
    if suffix not in TEXT_SUFFIXES:
        raise Failed("unsupported_file", f"{filename!r} is not a text format Podium reads "
                     "(text, Markdown, HTML, JSON, code...): PDF, DOCX and other binary "
                     "formats are not supported")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise Failed("invalid_file", f"{filename!r} is not UTF-8 text (byte "
                     f"{exc.start})") from None
    if not text.strip():
        raise Failed("invalid_file", f"{filename!r} holds no text")
    return text


class Ingestor:
    def __init__(self, store: VectorStoreStore, files: FileStore, embedders: Embedders,
                 lease_seconds: float):
        self._store, self._files, self._embedders = store, files, embedders
        self.lease = lease_seconds
        self.replica = secrets.token_hex(8)
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task | None = None
        self._held: tuple[str, str] | None = None       # the file being ingested here
        self._next_sweep = 0.0                          # time.monotonic() of the next

    def poke(self) -> None:
        """A file was attached here: look now."""
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="podium-vector-ingest")

    async def stop(self) -> None:
        """Stop: a file being ingested is given back (the next claim begins it again).
        The loop is asked to end at its next step and given ``STOP_SECONDS`` for it, so a
        store call under way on a worker thread finishes (a cancel would leave the thread
        holding a connection of a database about to be closed)."""
        held = self._held
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), STOP_SECONDS)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            await self._store.settle(STOP_SECONDS)      # its store call, if one is running
        if held is not None:
            with contextlib.suppress(StoreUnavailable):
                await self._store.release([held], self.replica)

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                await self.sweep()
                while await self.turn():
                    pass
            except StoreUnavailable as exc:
                log.warning("vector stores: %s", exc.message)
            except Exception:  # noqa: BLE001 - the worker must outlive any one failure
                log.exception("vector stores: a turn of the ingestor failed")
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)

    async def sweep(self) -> None:
        """Expired stores emptied, when a sweep is due."""
        if time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + SWEEP_SECONDS
        for store_id in await self._store.sweep(time.time()):
            log.info("vector store %s: expired; its files and chunks removed", store_id)

    async def turn(self) -> bool:
        """Claim one file and ingest it; whether there was one (and the ingestor goes on)."""
        if self._stopping:
            return False
        now = time.time()
        row = await self._store.claim_file(self.replica, now + self.lease, now)
        if row is None:
            return False
        key = (row["store_id"], row["file_id"])
        self._held = key
        try:
            await self._ingest(key, row)
        finally:
            self._held = None
        return True

    async def _ingest(self, key: tuple[str, str], row: Obj) -> None:
        try:
            usage, chunking = await self._chunks(key, row)
        except Failed as exc:
            if await self._store.finish_file(key, self.replica, "failed", 0, exc.error):
                log.info("vector store %s: file %s failed: %s", *key, exc)
            return
        except _Lost:
            log.info("vector store %s: file %s was deleted, cancelled or taken over (or "
                     "this replica stops)", *key)
            return
        if await self._store.finish_file(key, self.replica, "completed", usage, None,
                                         chunking):
            log.info("vector store %s: file %s completed (%d bytes)", *key, usage)

    async def _chunks(self, key: tuple[str, str], row: Obj) -> tuple[int, tuple[int, int]]:
        """Read, cut, embed and write the file's chunks; its usage in bytes and the chunking
        used (fitted to the model's context)."""
        text = decode_text(row["filename"], await self._read(row))
        try:
            async with self._embedders(row["embedding_model"]) as engine:
                return await self._embed(key, row, text, engine)
        except PodiumError as exc:          # the model is gone, or not an embedding model
            raise Failed("server_error", f"The store's embedding model "
                         f"{row['embedding_model']!r} cannot embed: {exc.message}") from None

    async def _embed(self, key: tuple[str, str], row: Obj, text: str, engine: Any
                     ) -> tuple[int, tuple[int, int]]:
        context = engine.info.context_length
        size, overlap = fitted((row["chunk_size"], row["chunk_overlap"]), context)
        pieces = await off_loop(chunk_text, text, counter(engine.tokenizer), size, overlap)
        if len(pieces) > MAX_FILE_CHUNKS:
            raise Failed("invalid_file", f"The file makes {len(pieces)} chunks, more than "
                         f"the {MAX_FILE_CHUNKS} one file may")
        used = (await self._store.stats([key[0]]))[key[0]][1]
        usage = 0
        for start in range(0, len(pieces), EMBED_BATCH):
            if self._stopping:
                raise _Lost()       # left to its lease (``stop`` gives it back)
            batch = pieces[start:start + EMBED_BATCH]
            ids = await off_loop(lambda: [engine.tokenizer.encode(p)[:context] for p in batch])
            vectors = np.asarray(await engine.embed(ids, BATCH_PRIORITY), dtype="<f4")
            rows = [(start + i, p, vectors[i].tobytes()) for i, p in enumerate(batch)]
            usage += sum(len(p.encode()) + len(v) for _, p, v in rows)
            if used + usage > MAX_STORE_BYTES:
                raise Failed("invalid_file", f"The store would hold more than "
                             f"{MAX_STORE_BYTES} bytes")
            if not await self._store.add_chunks(key, self.replica, time.time() + self.lease,
                                                rows):
                raise _Lost()
        return usage, (size, overlap)

    async def _read(self, row: Obj) -> bytes:
        found = await self._files.get(row["file_id"], row["owner"], time.time())
        if found is None:
            raise Failed("invalid_file", f"File {row['file_id']} was deleted (or expired) "
                         "before it was read")
        if found.bytes > MAX_FILE_TEXT:
            raise Failed("invalid_file", f"The file is {found.bytes} bytes; a vector store "
                         f"reads at most {MAX_FILE_TEXT}")
        data, seq = bytearray(), 0
        while len(data) < found.bytes:
            piece = await self._files.chunk(found.id, seq)
            if piece is None:
                raise Failed("invalid_file", f"File {found.id} was deleted while it was read")
            data += piece
            seq += 1
        return bytes(data)


class _Lost(Exception):
    pass
