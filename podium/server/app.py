"""The FastAPI application: routes stay a few lines; services do the work."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncGenerator, AsyncIterator, Literal

import orjson
from fastapi import FastAPI, Query, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from podium.api.chat import ChatService
from podium.api.conversations import ConversationsService
from podium.api.messages import MessagesService
from podium.dialect import select as select_dialect
from podium.api.completions import CompletionService
from podium.api.responses import ResponsesService
from podium.api.sealing import Sealer, load_key
from podium.engine.base import Engine
from podium.errors import ModelNotFound, error_body
from podium.generation import serves
from podium.protocol.chat import ChatCompletionRequest
from podium.protocol.completions import CompletionRequest
from podium.protocol.conversations import (ConversationCreateRequest,
                                           ConversationUpdateRequest, ItemsCreateRequest)
from podium.protocol.messages import CountTokensRequest, MessagesRequest
from podium.protocol.responses import ResponsesRequest
from podium.server import errors
from podium.server.lifecycle import Drain
from podium.server.middleware import (APIKeyMiddleware, BodyLimitMiddleware, LimitMiddleware,
                                     RequestMiddleware)
from podium.server.routing import PodiumRoute, small
from podium.server.sse import (BODY_SEND, AnthropicSSE, ChatSSE, Encoder, ResponsesSSE,
                               SSEResponse)
from podium.server.watch import unless_gone
from podium.settings import Settings
from podium.store.base import NO_OWNER
from podium.store.conversations import ConversationStore
from podium.store.sql import SQLStore, data_dir
from podium.telemetry import Metrics

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


def _gauges(engine: Engine, store: SQLStore) -> dict[str, float]:
    stats = engine.stats
    return {"running_sequences": stats.get("running", 0),
            "queued_sequences": stats.get("waiting", 0),
            "kv_cache_usage_ratio": stats["kv_tokens"] / max(1, stats["kv_capacity"]),
            "stored_responses": store.count()}


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
        await super().__call__(scope, receive, send)


def create_app(settings: Settings, engine: Engine) -> FastAPI:
    """The app serving ``engine``; the engine and the store close when the app shuts down.
    ValueError if a ``--model-alias`` names another model than the engine serves."""
    settings.check_aliases(engine.info.served_name)
    store = SQLStore(settings.store_url)
    dialect = select_dialect(engine, settings)
    chat = ChatService(engine, dialect, settings)
    sealer = Sealer(load_key(settings.secret_key, data_dir()), settings.max_seal_bytes)
    conversations = ConversationsService(ConversationStore(store.engine), settings, sealer)
    responses = ResponsesService(engine, dialect, store, settings, sealer, conversations)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await responses.startup()
        await conversations.startup()
        try:
            yield
        finally:
            await responses.shutdown()
            await engine.aclose()
            await store.aclose()

    app = PodiumApp(title="Podium", version="0.1.0", lifespan=lifespan,
                  summary="An OpenAI-compatible API server for open-weight models")
    app.router.route_class = PodiumRoute
    app.state.engine = engine
    app.state.settings = settings
    app.state.dialect = dialect
    app.state.chat = chat
    app.state.completions = CompletionService(engine, settings)
    app.state.messages = MessagesService(engine, dialect, settings, sealer)
    app.state.responses = responses
    app.state.conversations = conversations
    app.state.metrics = metrics = Metrics(lambda: _gauges(engine, store))
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


def _model_card(engine: Engine) -> dict[str, Any]:
    return {"id": engine.info.served_name, "object": "model", "created": engine.info.created,
            "owned_by": "podium", "max_model_len": engine.info.context_length}


def _owner(request: Request) -> str:
    """Who the request's stored responses belong to: its API key's id (set by
    APIKeyMiddleware), or the one owner of a server without keys."""
    return getattr(request.state, "owner", NO_OWNER)


def _routes(app: FastAPI) -> None:
    @app.post("/v1/chat/completions", responses=_STREAMING)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return respond(await unless_gone(request, request.app.state.chat.create(
            body, small=small(request))))

    @app.post("/v1/completions", responses=_STREAMING)
    async def completions(body: CompletionRequest, request: Request):
        return respond(await unless_gone(request, request.app.state.completions.create(
            body, small=small(request))))

    @app.post("/v1/responses", responses=_STREAMING)
    async def create_response(body: ResponsesRequest, request: Request):
        return respond(await unless_gone(request, request.app.state.responses.create(
            body, _owner(request), small=small(request))), ResponsesSSE)

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

    @app.post("/v1/messages", responses=_STREAMING)
    async def messages(body: MessagesRequest, request: Request):
        return respond(await unless_gone(request, request.app.state.messages.create(
            body, _owner(request), small=small(request))), AnthropicSSE)

    @app.post("/v1/messages/count_tokens", responses=_ERRORS)
    async def count_tokens(body: CountTokensRequest, request: Request):
        return json_response(await request.app.state.messages.count_tokens(
            body, _owner(request), small=small(request)))

    @app.get("/v1/models")
    async def list_models(request: Request):
        return json_response({"object": "list", "data": [_model_card(request.app.state.engine)]})

    @app.get("/v1/models/{model_id:path}", responses=_ERRORS)
    async def get_model(model_id: str, request: Request):
        engine = request.app.state.engine
        if not serves(model_id, engine, request.app.state.settings):
            raise ModelNotFound(f"The model '{model_id}' does not exist", param="model")
        return json_response({**_model_card(engine), "id": model_id})  # an alias: as asked

    @app.get("/health")
    async def health(request: Request):
        """Alive (the process answers), with the engine's counters."""
        return json_response({"status": "ok", "engine": dict(request.app.state.engine.stats)})

    @app.get("/ready", responses={503: {"description": "Not ready"}})
    async def ready(request: Request):
        """Ready: the model is loaded and the store takes a write (a small probe)."""
        try:
            await request.app.state.store.ping()
        except Exception as exc:  # noqa: BLE001 - any store failure means not ready
            return json_response_status({"status": "not ready", "store": str(exc)}, 503)
        return json_response({"status": "ready", "model": request.app.state.engine.info.served_name})

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
