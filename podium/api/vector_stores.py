"""The Vector Stores API (``/v1/vector_stores``): stores, their files and file batches, and
search; the ingestion is ``api/vector_ingest.py``'s, on whichever replica claims a file.

A store belongs to the API key that made it (another key's store is a 404, as a missing one
is), and so may only hold that key's files (``/v1/files``). It keeps the embedding model it
was made with (Podium's ``embedding_model`` field; by default ``--vector-store-embedding-
model``, else the one embedding model the server serves): its chunks are measured in that
model's tokens and its searches embed their queries with it.

Search is an exact scan: each replica keeps a store's vectors as one float32 matrix
(``Index``, at most ``INDEX_BYTES`` of them, least recently used dropped first), read again
when the store's ``revision`` moved; a query is one matrix-vector product on a worker thread,
cosine similarity (the vectors are normalized), attribute filters applied per file, then the
best ``max_num_results`` (bench/vector_stores.py measures it at 1k to 100k chunks). With a
ranker (``ranking_options.ranker``: the server's reranker by default, or a served model
named), the nearest ``rerank_pool`` chunks are re-scored by it as ``/v1/rerank`` scores
documents, and the best of those by its score are the results.

Bounds (400 past each): ``MAX_STORES`` per key, ``MAX_STORE_FILES`` per store, the protocol's
(attributes, filters, queries, results); at ingestion ``MAX_FILE_TEXT`` bytes and
``MAX_FILE_CHUNKS`` chunks per file and ``MAX_STORE_BYTES`` per store (the file ``failed``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, AsyncContextManager, Callable, Protocol

import numpy as np
from pydantic import ValidationError

from podium.api.conversations import check_metadata
from podium.engine.base import Embedder
from podium.errors import InvalidRequestError, NotFoundError, PodiumError
from podium.generation import PRIORITY, off_loop
from podium.protocol import vector_stores as wire
from podium.store.files import FileStore, id_time, new_id
from podium.store.vector_stores import VectorStoreStore

log = logging.getLogger(__name__)
Obj = dict[str, Any]

MAX_STORES = 10_000              # stores one API key keeps
MAX_STORE_FILES = 10_000         # files one store holds
MAX_STORE_BYTES = 1 << 30        # a store's usage_bytes (chunks' text and vectors)
MAX_FILE_TEXT = 32 << 20         # bytes of one file's text read for ingestion
MAX_FILE_CHUNKS = 10_000         # chunks one file makes
MAX_CONTENT_CHUNKS = 10_000      # chunks the content route returns
INDEX_BYTES = 1 << 30            # vectors this replica keeps in memory for searches
RERANK_MIN, RERANK_MAX = 20, 100  # chunks a ranker re-scores (``rerank_pool``)
SPECIALS = 8                     # a chunk leaves this many of the context's tokens free
STORE_PREFIX, BATCH_PREFIX = "vs_", "vsfb_"

# an embedding model by name, held while the context lasts (404 / 400 if it cannot embed)
Embedders = Callable[[str], AsyncContextManager[Embedder]]


class Rerankers(Protocol):
    """The served models that re-score a search's nearest chunks (``ranking_options``'
    ``ranker``), as ``/v1/rerank`` scores documents."""

    async def pick(self, asked: str | None, param: str) -> str | None:
        """The model a search re-scores with: ``asked`` when it names a served reranker or
        embedding model (else a 400 naming ``param``); for None (OpenAI's ``auto``) the
        server's reranker if it serves one; None (cosine alone) for ``"none"``."""
        ...

    async def score(self, model: str, queries: list[str], documents: list[str]
                    ) -> list[float]:
        """Each document's relevance to the queries (its best with any of them)."""
        ...


@dataclass
class Scan:
    """One store's vectors as a search reads them: a matrix, each row's file (an index in
    ``files``) and chunk number."""

    revision: int
    files: list[Obj]
    matrix: np.ndarray
    file_of: np.ndarray
    seq: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.matrix.nbytes + self.file_of.nbytes + self.seq.nbytes)

    @classmethod
    def build(cls, revision: int, files: list[Obj], rows: list[tuple[int, int, bytes]]
              ) -> Scan:
        if not rows:
            return cls(revision, files, np.zeros((0, 1), np.float32),
                       np.zeros(0, np.int32), np.zeros(0, np.int32))
        matrix = np.frombuffer(b"".join(r[2] for r in rows), dtype="<f4").reshape(
            len(rows), -1)
        return cls(revision, files, matrix, np.fromiter((r[0] for r in rows), np.int32),
                   np.fromiter((r[1] for r in rows), np.int32))

    def top(self, queries: np.ndarray, allowed: np.ndarray, k: int, threshold: float
            ) -> list[tuple[float, int, int]]:
        """The best ``k`` chunks (score, file index, seq) of the files ``allowed`` (a mask
        over ``files``): each chunk scored by its best cosine with any query."""
        if not len(self.matrix) or self.matrix.shape[1] != queries.shape[1]:
            return []
        scores = (self.matrix @ queries.T).max(axis=1)
        scores[~allowed[self.file_of]] = -np.inf
        k = min(k, len(scores))
        best = np.argpartition(-scores, k - 1)[:k]
        best = best[np.argsort(-scores[best], kind="stable")]
        return [(float(scores[i]), int(self.file_of[i]), int(self.seq[i])) for i in best
                if scores[i] > -np.inf and scores[i] >= threshold]


class Index:
    """This replica's cache of stores' vectors, good while a store's revision is unchanged;
    bounded by ``budget`` bytes (least recently searched store dropped first)."""

    def __init__(self, store: VectorStoreStore, budget: int = INDEX_BYTES):
        self._store, self._budget = store, budget
        self._scans: OrderedDict[str, Scan] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    async def scan(self, store_id: str) -> Scan:
        lock = self._locks.setdefault(store_id, asyncio.Lock())
        async with lock:                # one read of a store's vectors at a time
            revision = await self._store.revision(store_id)
            found = self._scans.get(store_id)
            if found is not None and found.revision == revision:
                self._scans.move_to_end(store_id)
                return found
            built = await off_loop(Scan.build, *await self._store.vectors(store_id))
            self._scans[store_id] = built
            self._scans.move_to_end(store_id)
            while sum(s.nbytes for s in self._scans.values()) > self._budget \
                    and len(self._scans) > 1:
                self._scans.popitem(last=False)
        if not lock.locked():
            self._locks.pop(store_id, None)
        return built

    def forget(self, store_id: str) -> None:
        """The store's vectors are gone (deleted, expired): their memory goes too."""
        self._scans.pop(store_id, None)


def _expired(row: Obj, now: float) -> bool:
    return row["expires_at"] is not None and row["expires_at"] <= now


def matches(node: Obj, attributes: Obj) -> bool:
    """Whether a file's attributes pass a filter (checked by ``wire.check_filter``): a
    missing key fails every comparison but ``ne`` and ``nin``; numbers compare with numbers,
    strings with strings."""
    kind = node["type"]
    if kind == "and":
        return all(matches(child, attributes) for child in node["filters"])
    if kind == "or":
        return any(matches(child, attributes) for child in node["filters"])
    value, want = attributes.get(node["key"]), node["value"]
    if kind in ("in", "nin"):
        return (value in want) == (kind == "in")
    if kind in ("eq", "ne"):
        return (value == want and type(value) is type(want)
                or _numbers(value, want) and value == want) == (kind == "eq")
    if not (_numbers(value, want) or isinstance(value, str) and isinstance(want, str)):
        return False
    return {"gt": value > want, "gte": value >= want, "lt": value < want,
            "lte": value <= want}[kind]


def _numbers(a: Any, b: Any) -> bool:
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))


class VectorStoresService:
    def __init__(self, store: VectorStoreStore, files: FileStore, embedders: Embedders,
                 default_model: Callable[[], Any], poke: Callable[[], None] | None = None,
                 rerankers: Rerankers | None = None):
        """``default_model``: the embedding model a store gets when its creator names none
        (awaitable; 400 when there is none to choose). ``rerankers``: None, searches rank
        by cosine alone."""
        self._store, self._files = store, files
        self._embedders = embedders
        self._rerankers = rerankers
        self._default_model = default_model
        self._poke = poke or (lambda: None)
        self.index = Index(store)

    # -- stores -------------------------------------------------------------------------

    async def create(self, req: wire.VectorStoreCreate, owner: str) -> Obj:
        metadata = check_metadata(req.metadata)
        model = req.embedding_model or await self._default_model()
        async with self._embedders(model) as engine:    # 404 / 400 now, not at ingestion
            context = engine.info.context_length        # type: ignore[attr-defined]
        size, overlap = fitted(wire.chunking(req.chunking_strategy), context)
        if await self._store.count(owner) >= MAX_STORES:
            raise InvalidRequestError(f"An API key keeps at most {MAX_STORES} vector stores: "
                                      "delete some first", param="name")
        store_id = new_id(prefix=STORE_PREFIX)
        now = (id_time(store_id, STORE_PREFIX) or 0) // 1000
        days = req.expires_after.days if req.expires_after else None
        files = await self._attach_rows(store_id, owner, [
            (file_id, None, None, f"file_ids[{i}]")
            for i, file_id in enumerate(req.file_ids or ())], (size, overlap), None, now,
            context)
        await self._store.create(dict(
            id=store_id, owner=owner, name=req.name, description=req.description,
            meta=metadata, embedding_model=model, chunk_size=size, chunk_overlap=overlap,
            created_at=now, expires_days=days,
            expires_at=None if days is None else now + days * 86400, last_active_at=now),
            files)
        log.info("vector store %s: made (%d files, model %s)", store_id, len(files), model)
        if files:
            self._poke()
        return await self.retrieve(store_id, owner)

    async def _found(self, store_id: str, owner: str) -> Obj:
        row = await self._store.get(store_id, owner)
        if row is None:
            raise NotFoundError(f"No vector store found with id '{store_id[:80]}'.",
                                param="vector_store_id")
        await self._pruned([row], time.time())
        return row

    async def _pruned(self, rows: list[Obj], now: float) -> None:
        """Expired stores' files, chunks and vectors removed, if the sweep (the ingestor's)
        has not yet: what an expired store is read as is empty."""
        for row in rows:
            if _expired(row, now) and await self._store.expire(row["id"], now):
                self.index.forget(row["id"])
                log.info("vector store %s: expired; its files and chunks removed", row["id"])

    async def _objects(self, rows: list[Obj]) -> list[Obj]:
        now = time.time()
        await self._pruned(rows, now)
        stats = await self._store.stats([r["id"] for r in rows])
        return [wire.store_object(r, *stats[r["id"]], now) for r in rows]

    async def retrieve(self, store_id: str, owner: str) -> Obj:
        return (await self._objects([await self._found(store_id, owner)]))[0]

    async def page(self, owner: str, *, after: str | None, before: str | None, limit: int,
                   order: str) -> Obj:
        rows, more = await self._store.page(owner, after, before, limit, order)
        return wire.page(await self._objects(rows), more)

    async def update(self, store_id: str, req: wire.VectorStoreUpdate, owner: str) -> Obj:
        row = await self._found(store_id, owner)
        if "expires_after" in req.model_fields_set and _expired(row, time.time()):
            raise InvalidRequestError(f"Vector store {store_id} has expired: its expiry "
                                      "cannot change", param="expires_after")
        values: Obj = {}
        if "name" in req.model_fields_set:
            values["name"] = req.name
        if "metadata" in req.model_fields_set:
            values["meta"] = check_metadata(req.metadata)
        if "expires_after" in req.model_fields_set:
            days = req.expires_after.days if req.expires_after else None
            active = row["last_active_at"] or row["created_at"]
            values.update(expires_days=days,
                          expires_at=None if days is None else active + days * 86400)
        if values:
            await self._store.update(store_id, owner, values)
        return await self.retrieve(store_id, owner)

    async def delete(self, store_id: str, owner: str) -> Obj:
        if not await self._store.delete(store_id, owner):
            raise NotFoundError(f"No vector store found with id '{store_id[:80]}'.",
                                param="vector_store_id")
        self.index.forget(store_id)
        log.info("vector store %s: deleted", store_id)
        return {"id": store_id, "object": "vector_store.deleted", "deleted": True}

    async def _live(self, store_id: str, owner: str) -> Obj:
        """The store, refused (400) once it has expired."""
        row = await self._found(store_id, owner)
        if _expired(row, time.time()):
            raise InvalidRequestError(f"Vector store {store_id} has expired: it can no "
                                      "longer be searched or given files",
                                      param="vector_store_id")
        return row

    # -- files --------------------------------------------------------------------------

    async def _attach_rows(self, store_id: str, owner: str,
                           refs: list[tuple[str, Obj | None, Any, str]],
                           default: tuple[int, int], batch_id: str | None,
                           now: int, context: int | None) -> list[Obj]:
        """The rows of files to attach: each the owner's file (a 400 naming it, else),
        its attributes and chunking checked, the chunking fitted to the embedding model's
        ``context`` (None: not known now; the ingestion fits it)."""
        rows, seen = [], set()
        for file_id, attributes, strategy, where in refs:
            if file_id in seen:
                raise InvalidRequestError(f"File {file_id} is given twice", param=where)
            seen.add(file_id)
            found = await self._files.get(file_id, owner, time.time())
            if found is None:
                raise InvalidRequestError(f"No such File object: {file_id}", param=where)
            base = "" if where == "file_id" else f"{where}."    # one file: its own fields
            size, overlap = (fitted(wire.chunking(strategy, f"{base}chunking_strategy"),
                                    context) if strategy is not None else default)
            rows.append(dict(store_id=store_id, file_id=file_id, owner=owner,
                             batch_id=batch_id, filename=found.filename,
                             attributes=wire.attributes(attributes, f"{base}attributes"),
                             chunk_size=size, chunk_overlap=overlap, created_at=now))
        return rows

    async def _context(self, row: Obj) -> int | None:
        """The context of the store's embedding model (None when it cannot be had now: its
        files are fitted to it when they are ingested, or fail)."""
        try:
            async with self._embedders(row["embedding_model"]) as engine:
                return engine.info.context_length       # type: ignore[attr-defined]
        except PodiumError:
            return None

    async def _room(self, store_id: str, adding: int, param: str) -> None:
        if await self._store.file_count(store_id) + adding > MAX_STORE_FILES:
            raise InvalidRequestError(f"A vector store holds at most {MAX_STORE_FILES} files",
                                      param=param)

    async def add_file(self, store_id: str, req: wire.FileCreate, owner: str) -> Obj:
        row = await self._live(store_id, owner)
        await self._room(store_id, 1, "file_id")
        now = int(time.time())
        context = await self._context(row)
        files = await self._attach_rows(
            store_id, owner, [(req.file_id, req.attributes, req.chunking_strategy, "file_id")],
            fitted((row["chunk_size"], row["chunk_overlap"]), context), None, now, context)
        await self._store.add_files(files)
        await self._store.touch(store_id, now)
        self._poke()
        return await self.retrieve_file(store_id, req.file_id, owner)

    async def retrieve_file(self, store_id: str, file_id: str, owner: str) -> Obj:
        return wire.file_object(await self._file(store_id, file_id, owner))

    async def _file(self, store_id: str, file_id: str, owner: str) -> Obj:
        await self._found(store_id, owner)
        row = await self._store.get_file(store_id, file_id, owner)
        if row is None:
            raise NotFoundError(f"No file found with id '{file_id[:80]}' in vector store "
                                f"'{store_id[:80]}'.", param="file_id")
        return row

    async def list_files(self, store_id: str, owner: str, *, status: str | None,
                         batch_id: str | None = None, after: str | None,
                         before: str | None, limit: int, order: str) -> Obj:
        await self._found(store_id, owner)
        rows, more = await self._store.page_files(store_id, owner, status=status,
                                                  batch_id=batch_id, after=after,
                                                  before=before, limit=limit, order=order)
        return wire.page([wire.file_object(r) for r in rows], more)

    async def update_file(self, store_id: str, file_id: str, req: wire.FileUpdate,
                          owner: str) -> Obj:
        await self._file(store_id, file_id, owner)
        await self._store.set_attributes(store_id, file_id, owner,
                                         wire.attributes(req.attributes))
        return await self.retrieve_file(store_id, file_id, owner)

    async def delete_file(self, store_id: str, file_id: str, owner: str) -> Obj:
        await self._found(store_id, owner)
        if not await self._store.delete_file(store_id, file_id, owner):
            raise NotFoundError(f"No file found with id '{file_id[:80]}' in vector store "
                                f"'{store_id[:80]}'.", param="file_id")
        return {"id": file_id, "object": "vector_store.file.deleted", "deleted": True}

    async def content(self, store_id: str, file_id: str, owner: str) -> Obj:
        """The file's text as its chunks hold it, in order (chunks overlap by the file's
        ``chunk_overlap_tokens``)."""
        await self._file(store_id, file_id, owner)
        texts = await self._store.file_chunks(store_id, file_id, MAX_CONTENT_CHUNKS)
        return {"object": "vector_store.file_content.page", "has_more": False,
                "next_page": None, "data": [{"type": "text", "text": t} for t in texts]}

    # -- file batches -------------------------------------------------------------------

    async def create_batch(self, store_id: str, req: wire.FileBatchCreate, owner: str) -> Obj:
        row = await self._live(store_id, owner)
        if req.file_ids and req.files:
            raise InvalidRequestError("Give file_ids or files, not both", param="files")
        refs: list[tuple[str, Obj | None, Any, str]] = (
            [(f.file_id, f.attributes, f.chunking_strategy, f"files[{i}]")
             for i, f in enumerate(req.files)] if req.files else
            [(file_id, req.attributes, req.chunking_strategy, f"file_ids[{i}]")
             for i, file_id in enumerate(req.file_ids or ())])
        if not refs:
            raise InvalidRequestError("A file batch needs file_ids or files", param="file_ids")
        await self._room(store_id, len(refs), "file_ids")
        batch_id = new_id(prefix=BATCH_PREFIX)
        now = int(time.time())
        context = await self._context(row)
        default = fitted(wire.chunking(req.chunking_strategy) if req.chunking_strategy else (
            row["chunk_size"], row["chunk_overlap"]), context)
        files = await self._attach_rows(store_id, owner, refs, default, batch_id, now,
                                        context)
        await self._store.add_files(files, dict(id=batch_id, store_id=store_id, owner=owner,
                                                status="in_progress", created_at=now))
        await self._store.touch(store_id, now)
        self._poke()
        return await self.retrieve_batch(store_id, batch_id, owner)

    async def retrieve_batch(self, store_id: str, batch_id: str, owner: str) -> Obj:
        found = await self._store.get_batch(store_id, batch_id, owner)
        if found is None:
            raise NotFoundError(f"No file batch found with id '{batch_id[:80]}'.",
                                param="batch_id")
        return wire.batch_object(*found)

    async def cancel_batch(self, store_id: str, batch_id: str, owner: str) -> Obj:
        before = await self.retrieve_batch(store_id, batch_id, owner)
        if before["status"] != "in_progress":
            raise InvalidRequestError(f"Cannot cancel a file batch with status "
                                      f"{before['status']!r}.", param="batch_id")
        await self._store.cancel_batch(store_id, batch_id, owner)
        return await self.retrieve_batch(store_id, batch_id, owner)

    async def batch_files(self, store_id: str, batch_id: str, owner: str, **page: Any) -> Obj:
        await self.retrieve_batch(store_id, batch_id, owner)
        return await self.list_files(store_id, owner, batch_id=batch_id, **page)

    # -- search -------------------------------------------------------------------------

    async def search(self, store_id: str, req: wire.SearchRequest, owner: str) -> Obj:
        if req.rewrite_query:
            raise InvalidRequestError("rewrite_query is not supported: the query is searched "
                                      "as it is given", param="rewrite_query")
        texts = wire.queries(req.query)
        asked, threshold = wire.ranking(req.ranking_options)
        ranker = await self._ranker(asked, "ranking_options.ranker")
        flt = wire.check_filter(req.filters) if req.filters is not None else None
        results = await self.find([store_id], owner, texts, req.max_num_results, flt,
                                  threshold, ranker)
        return {"object": "vector_store.search_results.page", "search_query": texts,
                "data": results, "has_more": False, "next_page": None}

    async def _ranker(self, asked: str | None, param: str) -> str | None:
        """The model that re-scores a search's candidates (None: cosine alone)."""
        if self._rerankers is not None:
            return await self._rerankers.pick(asked, param)
        if asked not in (None, wire.NO_RANKER):
            raise InvalidRequestError(f"No reranker {asked!r} is served here", param=param)
        return None

    async def searcher(self, tool: Obj, owner: str, keep: bool) -> FileSearch:
        """A Responses ``file_search`` tool's searches (``tool``: as the request gave it,
        with ``where``, its parameter), checked before the model runs: its fields, its
        ranker, and every store the owner's and live (400 naming the tool's parameter)."""
        where = tool["where"]
        try:
            found = wire.FileSearchTool.model_validate(tool)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise InvalidRequestError(f"Invalid file_search tool: {field}: {first['msg']}",
                                      param=f"{where}.{field}") from None
        flt = (wire.check_filter(found.filters, f"{where}.filters")
               if found.filters is not None else None)
        asked, threshold = wire.ranking(found.ranking_options)
        ranker = await self._ranker(asked, f"{where}.ranking_options.ranker")
        for i, store_id in enumerate(found.vector_store_ids):
            try:
                await self._live(store_id, owner)
            except (NotFoundError, InvalidRequestError) as exc:    # missing, or expired
                raise InvalidRequestError(exc.message,
                                          param=f"{where}.vector_store_ids[{i}]") from None
        return FileSearch(self, found.vector_store_ids, owner, found.max_num_results, flt,
                          threshold, ranker, keep)

    async def find(self, store_ids: list[str], owner: str, texts: list[str], limit: int,
                   flt: Obj | None = None, threshold: float = -1.0,
                   ranker: str | None = None) -> list[Obj]:
        """The best ``limit`` chunks of the stores for the queries, best first, as
        OpenAI's search results: by cosine similarity, or with a ``ranker`` the nearest
        ``rerank_pool(limit)`` by cosine re-scored by it; ``threshold`` bounds the final
        score."""
        pool = limit if ranker is None else rerank_pool(limit)
        found = await self._nearest(store_ids, owner, texts, pool, flt,
                                    threshold if ranker is None else -1.0)
        results = await self._results(found)
        rerankers = self._rerankers
        if ranker is None or rerankers is None or not results:
            return results
        scores = await rerankers.score(ranker, texts,
                                       [r["content"][0]["text"] for r in results])
        for result, score in zip(results, scores):
            result["score"] = score
        results.sort(key=lambda r: -r["score"])
        return [r for r in results if r["score"] >= threshold][:limit]

    async def _nearest(self, store_ids: list[str], owner: str, texts: list[str], limit: int,
                       flt: Obj | None, threshold: float
                       ) -> list[tuple[float, Obj, str, int]]:
        """The ``limit`` chunks nearest the queries by cosine: (score, file, store, seq)."""
        rows = [await self._live(store_id, owner) for store_id in store_ids]
        found: list[tuple[float, Obj, str, int]] = []
        for row in rows:
            async with self._embedders(row["embedding_model"]) as engine:
                vectors = await engine.embed(await off_loop(_query_ids, engine, texts),
                                             PRIORITY.get())
            scan = await self.index.scan(row["id"])
            allowed = np.array([flt is None or matches(flt, f["attributes"] or {})
                                for f in scan.files], dtype=bool)
            queries = np.asarray(vectors, dtype=np.float32)
            best = await off_loop(scan.top, queries, allowed, limit, threshold)
            found += [(score, scan.files[i], row["id"], seq) for score, i, seq in best]
            await self._store.touch(row["id"], int(time.time()))
        found.sort(key=lambda r: -r[0])
        return found[:limit]

    async def _results(self, found: list[tuple[float, Obj, str, int]]) -> list[Obj]:
        """The chunks as OpenAI's search results, their text read."""
        texts_of: dict[tuple[str, str, int], str] = {}
        for store_id in {r[2] for r in found}:
            keys = [(f["file_id"], seq) for _, f, sid, seq in found if sid == store_id]
            texts_of.update({(store_id, *k): t
                             for k, t in (await self._store.texts(store_id, keys)).items()})
        return [{"file_id": f["file_id"], "filename": f["filename"], "score": score,
                 "attributes": f["attributes"] or {},
                 "content": [{"type": "text", "text": texts_of.get((sid, f["file_id"], seq),
                                                                   "")}]}
                for score, f, sid, seq in found]


def fitted(chunking: tuple[int, int], context: int | None) -> tuple[int, int]:
    """(max_chunk_size_tokens, chunk_overlap_tokens) as the embedding model reads them: a
    chunk at most its ``context`` less ``SPECIALS`` tokens, overlapping by at most half of
    that (as asked when the context is not known)."""
    size, overlap = chunking
    if context is None:
        return size, overlap
    size = max(1, min(size, context - SPECIALS))
    return size, min(overlap, size // 2)


def rerank_pool(limit: int) -> int:
    """How many of the nearest chunks by cosine a ranker re-scores for ``limit`` results:
    twice as many, at least ``RERANK_MIN`` and at most ``RERANK_MAX`` (a cross-encoder reads
    each chunk with the query: the pool is its cost)."""
    return max(limit, min(RERANK_MAX, max(RERANK_MIN, 2 * limit)))


@dataclass
class FileSearch:
    """One response's ``file_search`` tool: what each of the model's calls searches."""

    service: VectorStoresService
    store_ids: list[str]
    owner: str
    limit: int
    filters: Obj | None
    threshold: float
    ranker: str | None          # the model re-scoring the candidates (None: cosine alone)
    keep: bool                  # the client included file_search_call.results

    async def run(self, texts: list[str]) -> list[Obj] | None:
        """The results for the model's queries; None when the search failed (a store
        deleted meanwhile, the embedding model gone), which the model is told."""
        if not texts:
            return []
        try:
            found = await self.service.find(self.store_ids, self.owner, texts, self.limit,
                                            self.filters, self.threshold, self.ranker)
        except PodiumError as exc:
            log.warning("file_search failed: %s", exc.message)
            return None
        return [{"file_id": r["file_id"], "filename": r["filename"], "score": r["score"],
                 "attributes": r["attributes"], "text": r["content"][0]["text"]}
                for r in found]         # the Responses item's shape of a result


def _query_ids(engine: Embedder, texts: list[str]) -> list[list[int]]:
    """A query as the model reads it: its tokens (special tokens as the model adds them),
    cut to the model's context."""
    limit = engine.info.context_length      # type: ignore[attr-defined]
    return [engine.tokenizer.encode(t)[:limit] for t in texts]  # type: ignore[attr-defined]
