"""The FastAPI application: routes stay a few lines; services do the work."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Literal

import orjson
from fastapi import FastAPI, Query, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from podium.api.conversations import ConversationsService
from podium.api.responses import ResponsesService
from podium.api.sealing import Sealer, load_key
from podium.catalog import of_engine
from podium.engine.base import Engine
from podium.errors import InvalidRequestError, ModelNotFound, error_body
from podium.models import Entry, ModelConfig, Models
from podium.protocol.chat import ChatCompletionRequest
from podium.protocol.completions import CompletionRequest
from podium.protocol.embeddings import EmbeddingsRequest, RerankRequest
from podium.protocol.conversations import (ConversationCreateRequest,
                                           ConversationUpdateRequest, ItemsCreateRequest)
from podium.protocol.messages import CountTokensRequest, MessagesRequest
from podium.protocol.responses import ResponsesRequest
from podium.protocol.tokenize import DetokenizeRequest, TokenizeRequest
from podium.server import errors
from podium.server.lifecycle import Drain
from podium.server.middleware import (APIKeyMiddleware, BodyLimitMiddleware, LimitMiddleware,
                                     RequestMiddleware)
from podium.server.routing import PodiumRoute, small
from podium.server.served import Loader, Served, estimate
from podium.server.sse import (BODY_SEND, AnthropicSSE, Encoder, ChatSSE, ResponsesSSE,
                               SSEResponse)
from podium.server.watch import unless_gone
from podium.settings import Settings
from podium.store.base import NO_OWNER
from podium.store.conversations import ConversationStore
from podium.store.sql import SQLStore, data_dir
from podium.store.batches import STATUSES as BATCH_STATUSES, BatchStore
from podium.telemetry import Labelled, Metrics

_ERRORS: dict[int | str, dict[str, Any]] = {status: {"description": text, "content": {"application/json": {"example": error_body(
    text, "invalid_request_error")}}} for status, text in [
    (400, "Invalid request"), (401, "Missing or wrong API key"), (404, "Unknown model"),
    (413, "Request body too large"), (429, "Too many requests (see Retry-After)")]}
# generating endpoints answer with JSON, or with server-sent events when streaming
_STREAMING: dict[int | str, dict[str, Any]] = {**_ERRORS, 200: {"description": "The answer (JSON), or its events (SSE)",
                               "content": {"application/json": {}, "text/event-stream": {}}}}


def json_response(obj: Any) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


def json_response_status(obj: Any, status: int) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def _gauges(models: Models, store: SQLStore, batches: BatchStore) -> dict[str, Any]:
    """Per model (labelled), read at scrape time: its engine's load, its loads; batches by
    status and their requests queued (on every replica: the database's)."""
    by: dict[str, dict[str, float]] = {name: {} for name in (
        "running_sequences", "queued_sequences", "kv_cache_usage_ratio", "model_loaded",
        "model_active_requests", "model_loads_total", "model_unloads_total",
        "model_load_seconds_total")}
    for entry in models.entries():
        stats = entry.engine.engine.stats if entry.state == "loaded" else {}
        for name, value in (
                ("running_sequences", stats.get("running", 0)),
                ("queued_sequences", stats.get("waiting", 0)),
                ("kv_cache_usage_ratio", stats.get("kv_tokens", 0)
                 / max(1, stats.get("kv_capacity", 1))),
                ("model_loaded", float(entry.state == "loaded")),
                ("model_active_requests", entry.active), ("model_loads_total", entry.loads),
                ("model_unloads_total", entry.unloads),
                ("model_load_seconds_total", entry.load_seconds)):
            by[name][entry.name] = value
    by_status, queued = batches.figures()
    return {**by, "stored_responses": store.count(),
            "batches": Labelled("status", {s: by_status.get(s, 0) for s in BATCH_STATUSES}),
            "batch_requests_queued": queued}


def respond(result: dict | AsyncGenerator[Any, None], encoder: type[Encoder] = ChatSSE
            ) -> Response | SSEResponse:
    """The answer as JSON, or its stream encoded for the API's wire (``encoder``)."""
    if isinstance(result, dict):
        return json_response(result)
    return SSEResponse(result, encoder())


class PodiumApp(FastAPI):
    """FastAPI, handing the server's own ``send`` inward in the scope (``sse.BODY_SEND``):
    the wrappers between it and a response (Starlette's error and exception handlers, CORS,
    the request middleware, the body limit, keys and limits) act on ``http.response.start``
    only, so a stream's body messages, once the start has gone the whole way, go straight
    to the server: one call per event instead of one per wrapper."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[BODY_SEND] = send
        held: list[Entry] = []
        scope[HELD] = held
        try:
            await super().__call__(scope, receive, send)
        finally:        # the response is over, its stream's last byte sent: let go
            for entry in held:
                self.state.models.release(entry)


_KINDS = {"chat": "a chat model", "embedding": "an embedding model", "rerank": "a reranker"}
_ROUTES = {"chat": "text generation (chat, completions, responses, messages; Ollama's "
                   "/api/chat and /api/generate)",
           "embedding": "embeddings (/v1/embeddings, Ollama's /api/embed), /v1/rerank and "
                        "/tokenize",
           "rerank": "/v1/rerank and /tokenize"}
EVERY_KIND = tuple(_KINDS)      # routes every model serves (/tokenize, /detokenize)
HELD = "podium.held"    # the scope's list of models a request holds (released at its end)


def check_kind(entry: Entry, name: str, kind: str | tuple[str, ...]) -> None:
    """400 if the model ``name`` names is of another kind than ``kind`` (one, or those a
    route takes): an embedding model asked to chat."""
    kinds = (kind,) if isinstance(kind, str) else kind
    if entry.config.kind != "auto" and entry.config.kind not in kinds:
        raise InvalidRequestError(
            f"'{name}' is {_KINDS[entry.config.kind]}: it serves {_ROUTES[entry.config.kind]}",
            param="model")


async def model_of(request: Request, name: str, kind: str | tuple[str, ...] = "chat"
                   ) -> Served:
    """The model the request names, loaded (waiting for it), held until the response ends:
    a model serving a request is never unloaded. 404 for a name no model answers to; 400
    for a model of another kind than the route's (``kind``: one, or those it takes; an
    embedding model asked to chat)."""
    models: Models = request.app.state.models
    try:
        entry = models.entry(name)
    except ModelNotFound as exc:
        exc.model = name            # Ollama's routes say it in Ollama's words
        raise
    check_kind(entry, name, kind)
    entry = await models.acquire(name)
    request.scope[HELD].append(entry)
    return entry.engine


def create_app(settings: Settings, served: Engine | list[ModelConfig],
               loaded: dict[str, Engine] | None = None,
               make: Callable[[Settings, str, str], Engine] | None = None) -> FastAPI:
    """The app serving ``served``: one loaded engine (a server of one model, named by its
    engine), or the catalog's models (podium/catalog.py) with those ``loaded`` at start by
    name; the others load on their first request (``make``: how an engine is made, by default
    ``served.make_engine``). Models, engines and the store close when the app shuts down. ValueError if a ``--model-alias`` names no model, or a pinned model
    is over the memory budget."""
    if isinstance(served, list):
        configs, engines = served, dict(loaded or {})
    else:
        configs, engines = of_engine(settings, served.info.served_name,
                                     getattr(served, "kind", "chat")), {
            served.info.served_name: served}
    store = SQLStore(settings.store_url)
    sealer = Sealer(load_key(settings.secret_key, data_dir()), settings.max_seal_bytes)
    conversations = ConversationsService(ConversationStore(store.engine), settings, sealer)
    responses = ResponsesService(store, settings, sealer, conversations)
    loader = Loader(store, sealer, conversations, make)
    models = Models(configs, loader.load, max_loaded=settings.max_loaded_models,
                    budget=settings.budget_bytes(), load_timeout=settings.load_timeout,
                    grace=settings.shutdown_grace,
                    estimate=lambda config: asyncio.to_thread(estimate, config))
    for config in configs:
        if config.name in engines:
            models.adopt(config.name, loader.serve(config, engines.pop(config.name)))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await responses.startup()
        await conversations.startup()
        await models.start()
        await app.state.batch_worker.start()
        try:
            yield
        finally:
            await app.state.batch_worker.stop()
            await responses.shutdown()
            await models.aclose()
            await store.aclose()

    app = PodiumApp(title="Podium", version="0.1.0", lifespan=lifespan,
                  summary="An OpenAI-compatible API server for open-weight models")
    app.router.route_class = PodiumRoute
    app.state.settings = settings
    app.state.models = models
    app.state.responses = responses
    app.state.conversations = conversations
    app.state.metrics = metrics = Metrics(lambda: _gauges(models, store,
                                                          app.state.batch_store))
    app.state.drain = responses.drain = Drain()
    app.state.store = store
    errors.install(app)
    _routes(app)
    # added innermost first: CORS, requests, body limit, keys, limits, app
    app.add_middleware(LimitMiddleware, max_concurrent=settings.max_concurrent_requests,
                       per_minute=settings.rate_limit_per_minute)
    if settings.api_key:
        app.add_middleware(APIKeyMiddleware, keys=list(settings.api_key))
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(RequestMiddleware, metrics=metrics,
                       json_logs=settings.log_format == "json",
                       log_requests=settings.log_requests)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["*"], allow_headers=["*"])
    return app


_STARTED = int(time.time())


def _model_card(entry: Entry, asked: str | None = None) -> dict[str, Any]:
    """OpenAI's model object (``asked``: the name or alias the client used) plus what
    Podium knows of it: state, kind, memory, and why its last load failed."""
    served: Served | None = entry.engine if entry.state == "loaded" else None
    card = {"id": asked or entry.name, "object": "model",
            "created": served.engine.info.created if served else _STARTED,
            "owned_by": "podium", "state": entry.state, "kind": entry.config.kind,
            "memory_estimate": entry.config.estimate or None,
            "resident_memory": served.resident if served else None}
    if served is not None:
        card["max_model_len"] = served.engine.info.context_length
    if entry.config.kind in ("embedding", "rerank"):
        # how /v1/rerank scores: an embedding model by its vectors' cosine similarity, a
        # reranker by its own head
        card["rerank"] = "cosine" if entry.config.kind == "embedding" else "model"
    if entry.config.aliases:
        card["aliases"] = list(entry.config.aliases)
    if entry.error is not None:
        card["error"] = entry.error
    return card


def _stats(entry: Entry) -> dict[str, Any]:
    out: dict[str, Any] = {"state": entry.state, "active_requests": entry.active,
                           "loads": entry.loads, "unloads": entry.unloads,
                           "load_seconds": round(entry.load_seconds, 3)}
    if entry.state == "loaded":
        out["engine"] = dict(entry.engine.engine.stats)
    if entry.error is not None:
        out["error"] = entry.error
    return out


def _keeper(request: Request) -> Callable[[], Callable[[], None]]:
    """What keeps the request's model (``model_of``'s) loaded past the request's end (a
    background response): call it for a release."""
    models: Models = request.app.state.models
    entry = request.scope[HELD][-1]
    return lambda: models.hold(entry)


def _owner(request: Request) -> str:
    """Who the request's stored responses belong to: its API key's id (set by
    APIKeyMiddleware), or the one owner of a server without keys."""
    return getattr(request.state, "owner", NO_OWNER)


def _routes(app: FastAPI) -> None:
    @app.post("/v1/chat/completions", responses=_STREAMING)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        async def create() -> Any:
            served = await model_of(request, body.model)
            return await served.chat.create(body, small=small(request))
        return respond(await unless_gone(request, create()))

    @app.post("/v1/completions", responses=_STREAMING)
    async def completions(body: CompletionRequest, request: Request):
        async def create() -> Any:
            served = await model_of(request, body.model)
            return await served.completions.create(body, small=small(request))
        return respond(await unless_gone(request, create()))

    @app.post("/v1/responses", responses=_STREAMING)
    async def create_response(body: ResponsesRequest, request: Request):
        async def create() -> Any:
            served = await model_of(request, body.model)
            return await request.app.state.responses.create(
                body, _owner(request), served.planner, small=small(request),
                hold=_keeper(request))
        return respond(await unless_gone(request, create()), ResponsesSSE)

    @app.get("/v1/responses/{response_id}", responses=_STREAMING)
    async def get_response(response_id: str, request: Request, stream: bool = False,
                           starting_after: int = Query(-1, ge=-1)):
        service, owner = request.app.state.responses, _owner(request)
        if stream:
            return SSEResponse(await service.stream_existing(response_id, starting_after,
                                                             owner), ResponsesSSE())
        return json_response(await service.retrieve(response_id, owner))

    @app.post("/v1/responses/{response_id}/cancel", responses=_ERRORS)
    async def cancel_response(response_id: str, request: Request):
        return json_response(await request.app.state.responses.cancel(response_id,
                                                                      _owner(request)))

    @app.delete("/v1/responses/{response_id}", responses=_ERRORS)
    async def delete_response(response_id: str, request: Request):
        return json_response(await request.app.state.responses.delete(response_id,
                                                                      _owner(request)))

    @app.get("/v1/responses/{response_id}/input_items", responses=_ERRORS)
    async def list_input_items(response_id: str, request: Request, after: str | None = None,
                               limit: int = Query(20, ge=1, le=100),
                               order: Literal["asc", "desc"] = "desc"):
        return json_response(await request.app.state.responses.input_items(
            response_id, after, limit, order, _owner(request)))

    _conversation_routes(app)
    # the Files API and Ollama's (/api/*): their own modules, using this one's helpers
    from podium.server import batches, files, ollama_chat, ollama_models
    files.routes(app)
    batches.routes(app)
    ollama_chat.routes(app)
    ollama_models.routes(app)

    @app.post("/v1/messages", responses=_STREAMING)
    async def messages(body: MessagesRequest, request: Request):
        async def create() -> Any:
            served = await model_of(request, body.model)
            return await served.messages.create(body, _owner(request), small=small(request))
        return respond(await unless_gone(request, create()), AnthropicSSE)

    @app.post("/v1/messages/count_tokens", responses=_ERRORS)
    async def count_tokens(body: CountTokensRequest, request: Request):
        served = await model_of(request, body.model)
        return json_response(await served.messages.count_tokens(body, _owner(request),
                                                                small=small(request)))

    @app.post("/v1/embeddings", responses=_ERRORS)
    async def embeddings(body: EmbeddingsRequest, request: Request):
        """OpenAI's embeddings: one vector per input, floats or base64."""
        async def create() -> Any:
            served = await model_of(request, body.model, "embedding")
            return await served.embeddings.create(body, small=small(request))
        return json_response(await unless_gone(request, create()))

    async def rerank(body: RerankRequest, request: Request):
        """The documents by relevance to the query (Cohere's / Jina's shape)."""
        async def create() -> Any:
            served = await model_of(request, body.model, ("rerank", "embedding"))
            return await served.embeddings.rerank(body, small=small(request))
        return json_response(await unless_gone(request, create()))

    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        app.post(path, responses=_ERRORS)(rerank)

    @app.post("/tokenize", responses=_ERRORS)
    async def tokenize(body: TokenizeRequest, request: Request):
        """The tokens of a ``prompt``, or of ``messages`` rendered as a chat request would
        be (vLLM's shape): ``tokens``, ``count``, ``max_model_len``. Every kind of model:
        a chunker measures text in its embedding model's tokens."""
        served = await model_of(request, body.model, EVERY_KIND)
        return json_response(await served.tokens.tokenize(body, small=small(request)))

    @app.post("/detokenize", responses=_ERRORS)
    async def detokenize(body: DetokenizeRequest, request: Request):
        served = await model_of(request, body.model, EVERY_KIND)
        return json_response(await served.tokens.detokenize(body, small=small(request)))

    @app.get("/v1/models")
    async def list_models(request: Request):
        """Every model this server serves, loaded or not."""
        return json_response({"object": "list", "data": [
            _model_card(e) for e in request.app.state.models.entries()]})

    @app.post("/v1/models/{model_id:path}/load", responses=_ERRORS)
    async def load_model(model_id: str, request: Request):
        """Load the model now (waiting for it); its card. It stays loaded for its
        keep-alive, like one a request loaded."""
        models: Models = request.app.state.models
        await unless_gone(request, models.load(model_id))
        return json_response(_model_card(models.entry(model_id), model_id))

    @app.post("/v1/models/{model_id:path}/unload", responses=_ERRORS)
    async def unload_model(model_id: str, request: Request):
        """Unload the model: its new requests wait for a new load; its running ones get
        the shutdown grace to finish; then its memory is freed. Its card."""
        models: Models = request.app.state.models
        await models.unload(model_id)
        return json_response(_model_card(models.entry(model_id), model_id))

    @app.get("/v1/models/{model_id:path}", responses=_ERRORS)
    async def get_model(model_id: str, request: Request):
        # an alias: answered as asked
        return json_response(_model_card(request.app.state.models.entry(model_id), model_id))

    @app.get("/health")
    async def health(request: Request):
        """Alive (the process answers), with each model's state and counters (a server of
        one model: its engine's counters as ``engine`` too)."""
        entries = request.app.state.models.entries()
        body: dict[str, Any] = {"status": "ok",
                                "models": {e.name: _stats(e) for e in entries}}
        if len(entries) == 1 and entries[0].state == "loaded":
            body["engine"] = dict(entries[0].engine.engine.stats)
        return json_response(body)

    @app.get("/ready", responses={503: {"description": "Not ready"}})
    async def ready(request: Request):
        """Ready: the models loaded at start are loaded, and the store takes a write (a
        small probe). Models loaded on demand do not count."""
        try:
            await request.app.state.store.ping()
        except Exception as exc:  # noqa: BLE001 - any store failure means not ready
            return json_response_status({"status": "not ready", "store": str(exc)}, 503)
        entries = request.app.state.models.entries()
        return json_response({"status": "ready", "models": [
            e.name for e in entries if e.state == "loaded"]})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request):
        body = await asyncio.to_thread(generate_latest, request.app.state.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)


def _include(request: Request) -> list[str]:
    """``include`` as the SDKs send it (``include[]=a&include[]=b``) or plainly repeated."""
    return request.query_params.getlist("include[]") + request.query_params.getlist("include")


def _conversation_routes(app: FastAPI) -> None:
    @app.post("/v1/conversations", responses=_ERRORS)
    async def create_conversation(body: ConversationCreateRequest, request: Request):
        return json_response(await request.app.state.conversations.create(body,
                                                                           _owner(request)))

    @app.get("/v1/conversations/{conversation_id}", responses=_ERRORS)
    async def get_conversation(conversation_id: str, request: Request):
        return json_response(await request.app.state.conversations.retrieve(
            conversation_id, _owner(request)))

    @app.post("/v1/conversations/{conversation_id}", responses=_ERRORS)
    async def update_conversation(conversation_id: str, body: ConversationUpdateRequest,
                                  request: Request):
        return json_response(await request.app.state.conversations.update(
            conversation_id, body, _owner(request)))

    @app.delete("/v1/conversations/{conversation_id}", responses=_ERRORS)
    async def delete_conversation(conversation_id: str, request: Request):
        return json_response(await request.app.state.conversations.delete(
            conversation_id, _owner(request)))

    @app.post("/v1/conversations/{conversation_id}/items", responses=_ERRORS)
    async def create_items(conversation_id: str, body: ItemsCreateRequest, request: Request):
        return json_response(await request.app.state.conversations.add_items(
            conversation_id, body, _include(request), _owner(request)))

    @app.get("/v1/conversations/{conversation_id}/items", responses=_ERRORS)
    async def list_items(conversation_id: str, request: Request, after: str | None = None,
                         limit: int = Query(20, ge=1, le=100),
                         order: Literal["asc", "desc"] = "desc"):
        return json_response(await request.app.state.conversations.list_items(
            conversation_id, after=after, limit=limit, order=order,
            include=_include(request), owner=_owner(request)))

    @app.get("/v1/conversations/{conversation_id}/items/{item_id}", responses=_ERRORS)
    async def get_item(conversation_id: str, item_id: str, request: Request):
        return json_response(await request.app.state.conversations.get_item(
            conversation_id, item_id, _include(request), _owner(request)))

    @app.delete("/v1/conversations/{conversation_id}/items/{item_id}", responses=_ERRORS)
    async def delete_item(conversation_id: str, item_id: str, request: Request):
        return json_response(await request.app.state.conversations.delete_item(
            conversation_id, item_id, _owner(request)))
