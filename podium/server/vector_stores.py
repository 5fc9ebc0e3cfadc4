"""The Vector Stores API's routes (``/v1/vector_stores``), a few lines each; the service
(``api/vector_stores.py``) does the work and this replica's ``Ingestor``
(``api/vector_ingest.py``) embeds attached files, started and stopped with the app.

A store's embedding model is found, loaded and held as a route's model is (``Models``), for
as long as a search or a file's ingestion uses it; so is the model a search re-scores with
(``Rerankers``), which scores as ``/v1/rerank`` does."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Any, AsyncIterator, Literal

from fastapi import FastAPI, Query, Request

from podium.api.vector_ingest import Ingestor
from podium.api.vector_stores import VectorStoresService
from podium.engine.base import Embedder
from podium.errors import InvalidRequestError, ModelNotFound
from podium.models import Entry, Models
from podium.protocol.embeddings import RerankRequest
from podium.protocol.vector_stores import (AUTO_RANKERS, NO_RANKER, FileBatchCreate,
                                           FileCreate, FileUpdate, SearchRequest,
                                           VectorStoreCreate, VectorStoreUpdate)
from podium.server.edge import ERRORS, check_kind, json_response, owner_of
from podium.server.served import detect_kind
from podium.settings import Settings
from podium.store.vector_stores import VectorStoreStore

log = logging.getLogger(__name__)
Status = Literal["in_progress", "completed", "failed", "cancelled"]
Order = Literal["asc", "desc"]
RANK_KINDS = ("rerank", "embedding")        # what /v1/rerank takes


async def kind_of(entry: Entry) -> str:
    """What a model is for: its configured kind, or read from its files once (as its load
    does); ``auto`` still when its files cannot be read."""
    if entry.config.kind == "auto":
        try:
            entry.config.kind = await asyncio.to_thread(detect_kind, entry.config)
        except Exception as exc:  # noqa: BLE001 - any unreadable file: not known yet
            log.debug("model %s: kind unknown (%s)", entry.config.name, exc)
    return entry.config.kind


class Embedders:
    """The server's embedding models for vector stores: one by name, held while used; the
    default (``--vector-store-embedding-model``, else the one embedding model served)."""

    def __init__(self, models: Models, settings: Settings):
        self._models, self._settings = models, settings

    @contextlib.asynccontextmanager
    async def __call__(self, name: str) -> AsyncIterator[Embedder]:
        models = self._models
        try:
            entry = models.entry(name)
        except ModelNotFound:
            raise InvalidRequestError(f"No embedding model {name!r} is served here",
                                      param="embedding_model") from None
        check_kind(entry, name, "embedding")
        entry = await models.acquire(name)
        try:
            engine = entry.engine.engine
            if getattr(engine, "kind", None) != "embedding":
                raise InvalidRequestError(f"{name!r} is not an embedding model",
                                          param="embedding_model")
            yield engine
        finally:
            models.release(entry)

    async def default(self) -> str:
        if self._settings.vector_store_embedding_model:
            return self._settings.vector_store_embedding_model
        found = [entry.config.name for entry in self._models.entries()
                 if await kind_of(entry) == "embedding"]
        if len(found) != 1:
            raise InvalidRequestError(
                "Name the store's embedding_model: this server serves "
                + ("no embedding model (serve one beside the chat model: --model "
                   "minilm=all-minilm-l6-v2)" if not found else
                   f"several ({', '.join(found)}); or set --vector-store-embedding-model"),
                param="embedding_model")
        return found[0]


class Rerankers:
    """The served models a search re-scores its nearest chunks with (``ranking_options.
    ranker``): those ``/v1/rerank`` takes, scored by the model's own rerank code
    (``EmbeddingService.rerank``): a reranker by its head, an embedding model by the cosine
    similarity of its own vectors. OpenAI's ``auto`` is the first reranker the server
    serves (in ``--model`` order), or cosine alone when it serves none."""

    def __init__(self, models: Models):
        self._models = models
        self._default: str | None = None
        self._looked = False                    # for the default, once: models are fixed

    async def pick(self, asked: str | None, param: str) -> str | None:
        if asked == NO_RANKER:
            return None
        if asked is None:
            return await self.default()
        try:
            entry = self._models.entry(asked)
        except ModelNotFound:
            raise InvalidRequestError(
                f"No model {asked!r} is served here to rank with: the ranker is "
                f"{NO_RANKER!r}, {' or '.join(map(repr, AUTO_RANKERS))} (the server's "
                "reranker, if it serves one), or a served reranker or embedding model",
                param=param) from None
        await kind_of(entry)
        try:
            check_kind(entry, asked, RANK_KINDS)
        except InvalidRequestError as exc:
            exc.param = param
            raise
        return asked

    async def default(self) -> str | None:
        if not self._looked:
            kinds = [(entry.config.name, await kind_of(entry))
                     for entry in self._models.entries()]
            self._default = next((name for name, kind in kinds if kind == "rerank"), None)
            self._looked = True
        return self._default

    async def score(self, model: str, queries: list[str], documents: list[str]
                    ) -> list[float]:
        """Chunks longer than the model reads are cut (``truncate_prompt_tokens``)."""
        best = [-math.inf] * len(documents)
        entry = await self._models.acquire(model)
        try:
            for query in queries:
                page = await entry.engine.embeddings.rerank(RerankRequest.model_validate(dict(
                    model=model, query=query, documents=documents, truncate_prompt_tokens=-1)))
                for result in page["results"]:
                    i = result["index"]
                    best[i] = max(best[i], result["relevance_score"])
        finally:
            self._models.release(entry)
        return best


def routes(app: FastAPI) -> None:
    """Adds the Vector Stores API's routes, its service and this replica's ingestor to the
    app (the ingestor runs while the app's lifespan does)."""
    settings: Settings = app.state.settings
    store = VectorStoreStore(app.state.store.engine)
    embedders = Embedders(app.state.models, settings)
    ingestor = Ingestor(store, app.state.file_store, embedders,
                        settings.response_lease_seconds)
    service = VectorStoresService(store, app.state.file_store, embedders, embedders.default,
                                  ingestor.poke, Rerankers(app.state.models))
    app.state.vector_stores = service
    app.state.vector_ingestor = ingestor
    app.state.responses.file_search = service
    _lifespan(app, ingestor)
    _store_routes(app)
    _file_routes(app)
    _batch_routes(app)


def _lifespan(app: FastAPI, ingestor: Ingestor) -> None:
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with inner(a) as state:
            await ingestor.start()
            try:
                yield state
            finally:
                await ingestor.stop()
    app.router.lifespan_context = lifespan


def _vs(request: Request) -> VectorStoresService:
    return request.app.state.vector_stores


def _store_routes(app: FastAPI) -> None:
    @app.post("/v1/vector_stores", responses=ERRORS)
    async def create_vector_store(body: VectorStoreCreate, request: Request):
        return json_response(await _vs(request).create(body, owner_of(request)))

    @app.get("/v1/vector_stores", responses=ERRORS)
    async def list_vector_stores(request: Request, after: str | None = None,
                                 before: str | None = None,
                                 limit: int = Query(20, ge=1, le=100), order: Order = "desc"):
        return json_response(await _vs(request).page(owner_of(request), after=after,
                                                     before=before, limit=limit, order=order))

    @app.get("/v1/vector_stores/{store_id}", responses=ERRORS)
    async def retrieve_vector_store(store_id: str, request: Request):
        return json_response(await _vs(request).retrieve(store_id, owner_of(request)))

    @app.post("/v1/vector_stores/{store_id}", responses=ERRORS)
    async def update_vector_store(store_id: str, body: VectorStoreUpdate, request: Request):
        return json_response(await _vs(request).update(store_id, body, owner_of(request)))

    @app.delete("/v1/vector_stores/{store_id}", responses=ERRORS)
    async def delete_vector_store(store_id: str, request: Request):
        return json_response(await _vs(request).delete(store_id, owner_of(request)))

    @app.post("/v1/vector_stores/{store_id}/search", responses=ERRORS)
    async def search_vector_store(store_id: str, body: SearchRequest, request: Request):
        """The store's chunks nearest the query (cosine), filtered by file attributes."""
        return json_response(await _vs(request).search(store_id, body, owner_of(request)))


def _file_routes(app: FastAPI) -> None:
    @app.post("/v1/vector_stores/{store_id}/files", responses=ERRORS)
    async def create_vector_store_file(store_id: str, body: FileCreate, request: Request):
        return json_response(await _vs(request).add_file(store_id, body, owner_of(request)))

    @app.get("/v1/vector_stores/{store_id}/files", responses=ERRORS)
    async def list_vector_store_files(store_id: str, request: Request,
                                      after: str | None = None, before: str | None = None,
                                      limit: int = Query(20, ge=1, le=100),
                                      order: Order = "desc", filter: Status | None = None):
        return json_response(await _vs(request).list_files(
            store_id, owner_of(request), status=filter, after=after, before=before,
            limit=limit, order=order))

    @app.get("/v1/vector_stores/{store_id}/files/{file_id}", responses=ERRORS)
    async def retrieve_vector_store_file(store_id: str, file_id: str, request: Request):
        return json_response(await _vs(request).retrieve_file(store_id, file_id,
                                                              owner_of(request)))

    @app.post("/v1/vector_stores/{store_id}/files/{file_id}", responses=ERRORS)
    async def update_vector_store_file(store_id: str, file_id: str, body: FileUpdate,
                                       request: Request):
        return json_response(await _vs(request).update_file(store_id, file_id, body,
                                                            owner_of(request)))

    @app.delete("/v1/vector_stores/{store_id}/files/{file_id}", responses=ERRORS)
    async def delete_vector_store_file(store_id: str, file_id: str, request: Request):
        return json_response(await _vs(request).delete_file(store_id, file_id,
                                                            owner_of(request)))

    @app.get("/v1/vector_stores/{store_id}/files/{file_id}/content", responses=ERRORS)
    async def vector_store_file_content(store_id: str, file_id: str, request: Request):
        return json_response(await _vs(request).content(store_id, file_id, owner_of(request)))


def _batch_routes(app: FastAPI) -> None:
    @app.post("/v1/vector_stores/{store_id}/file_batches", responses=ERRORS)
    async def create_file_batch(store_id: str, body: FileBatchCreate, request: Request):
        return json_response(await _vs(request).create_batch(store_id, body,
                                                             owner_of(request)))

    @app.get("/v1/vector_stores/{store_id}/file_batches/{batch_id}", responses=ERRORS)
    async def retrieve_file_batch(store_id: str, batch_id: str, request: Request):
        return json_response(await _vs(request).retrieve_batch(store_id, batch_id,
                                                               owner_of(request)))

    @app.post("/v1/vector_stores/{store_id}/file_batches/{batch_id}/cancel", responses=ERRORS)
    async def cancel_file_batch(store_id: str, batch_id: str, request: Request):
        return json_response(await _vs(request).cancel_batch(store_id, batch_id,
                                                             owner_of(request)))

    @app.get("/v1/vector_stores/{store_id}/file_batches/{batch_id}/files", responses=ERRORS)
    async def list_file_batch_files(store_id: str, batch_id: str, request: Request,
                                    after: str | None = None, before: str | None = None,
                                    limit: int = Query(20, ge=1, le=100),
                                    order: Order = "desc", filter: Status | None = None):
        return json_response(await _vs(request).batch_files(
            store_id, batch_id, owner_of(request), status=filter, after=after,
            before=before, limit=limit, order=order))
