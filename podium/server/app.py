"""The FastAPI application: the app factory, and one route table per API (chat and
completions, responses, messages, embeddings and tokens, conversations); the Files, Batch,
Ollama and operator routes have modules of their own. Routes stay a few lines: the shared
edge helpers (podium/server/edge.py) find and hold the model; services do the work."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Callable, Literal

from fastapi import FastAPI, Query, Request
from starlette.middleware.cors import CORSMiddleware
from starlette.types import Receive, Scope, Send

from podium.api.conversations import ConversationsService
from podium.api.responses import ResponsesService
from podium.api.sealing import Sealer, load_key
from podium.catalog import of_engine
from podium.engine.base import Engine
from podium.models import Entry, ModelConfig, Models
from podium.protocol.chat import ChatCompletionRequest
from podium.protocol.completions import CompletionRequest
from podium.protocol.conversations import (ConversationCreateRequest,
                                           ConversationUpdateRequest, ItemsCreateRequest)
from podium.protocol.embeddings import EmbeddingsRequest, RerankRequest
from podium.protocol.messages import CountTokensRequest, MessagesRequest
from podium.protocol.responses import ResponsesRequest
from podium.protocol.tokenize import DetokenizeRequest, TokenizeRequest
from podium.server import (batches, errors, files, ollama_chat, ollama_models, ops, ui,
                           vector_stores)
from podium.server.edge import (ERRORS, EVERY_KIND, HELD, STREAMING, json_response, keeper,
                                model_of, owner_of, respond)
from podium.server.lifecycle import Drain
from podium.server.middleware import (APIKeyMiddleware, BodyLimitMiddleware, LimitMiddleware,
                                     RequestMiddleware)
from podium.server.routing import PodiumRoute, small
from podium.server.served import Loader, estimate
from podium.server.sse import BODY_SEND, AnthropicSSE, ResponsesSSE, SSEResponse
from podium.server.watch import unless_gone
from podium.settings import Settings
from podium.store.conversations import ConversationStore
from podium.store.sql import SQLStore, data_dir
from podium.telemetry import Metrics


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


def create_app(settings: Settings, served: Engine | list[ModelConfig],
               loaded: dict[str, Engine] | None = None,
               make: Callable[[Settings, str, str], Engine] | None = None) -> FastAPI:
    """The app serving ``served``: one loaded engine (a server of one model, named by its
    engine), or the catalog's models (podium/catalog.py) with those ``loaded`` at start by
    name; the others load on their first request (``make``: how an engine is made, by default
    ``served.make_engine``). Models, engines and the store close when the app shuts down.
    ValueError if a ``--model-alias`` names no model, or a pinned model is over the memory
    budget."""
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
    app.state.metrics = metrics = Metrics(lambda: ops.gauges(models, store,
                                                             app.state.batch_store))
    app.state.drain = responses.drain = Drain()
    app.state.store = store
    errors.install(app)
    _chat_routes(app)
    _responses_routes(app)
    _conversation_routes(app)
    files.routes(app)
    batches.routes(app)
    vector_stores.routes(app)
    ollama_chat.routes(app)
    ollama_models.routes(app)
    _messages_routes(app)
    _embedding_routes(app)
    ops.routes(app)
    _middleware(app, settings, metrics)
    ui.install(app, settings.ui)
    return app


def _middleware(app: FastAPI, settings: Settings, metrics: Metrics) -> None:
    # added innermost first: CORS, requests, body limit, keys, limits, app
    app.add_middleware(LimitMiddleware, max_concurrent=settings.max_concurrent_requests,
                       per_minute=settings.rate_limit_per_minute)
    if settings.api_key or settings.admin_key:
        app.add_middleware(APIKeyMiddleware, keys=list(settings.api_key),
                           admin_keys=list(settings.admin_key))
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(RequestMiddleware, metrics=metrics,
                       json_logs=settings.log_format == "json",
                       log_requests=settings.log_requests)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["*"], allow_headers=["*"])


def _chat_routes(app: FastAPI) -> None:
    """Chat Completions and Completions."""
    @app.post("/v1/chat/completions", responses=STREAMING)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        async def create() -> Any:
            served = await model_of(request, body.model)
            return await served.chat.create(body, small=small(request))
        return respond(await unless_gone(request, create()))

    @app.post("/v1/completions", responses=STREAMING)
    async def completions(body: CompletionRequest, request: Request):
        async def create() -> Any:
            served = await model_of(request, body.model)
            return await served.completions.create(body, small=small(request))
        return respond(await unless_gone(request, create()))


def _responses_routes(app: FastAPI) -> None:
    """The Responses API: create, retrieve (or follow), cancel, delete, input items."""
    @app.post("/v1/responses", responses=STREAMING)
    async def create_response(body: ResponsesRequest, request: Request):
        async def create() -> Any:
            served = await model_of(request, body.model)
            return await request.app.state.responses.create(
                body, owner_of(request), served.planner, small=small(request),
                hold=keeper(request))
        return respond(await unless_gone(request, create()), ResponsesSSE)

    @app.get("/v1/responses/{response_id}", responses=STREAMING)
    async def get_response(response_id: str, request: Request, stream: bool = False,
                           starting_after: int = Query(-1, ge=-1)):
        service, who = request.app.state.responses, owner_of(request)
        if stream:
            return SSEResponse(await service.stream_existing(response_id, starting_after,
                                                             who), ResponsesSSE())
        return json_response(await service.retrieve(response_id, who))

    @app.post("/v1/responses/{response_id}/cancel", responses=ERRORS)
    async def cancel_response(response_id: str, request: Request):
        return json_response(await request.app.state.responses.cancel(response_id,
                                                                      owner_of(request)))

    @app.delete("/v1/responses/{response_id}", responses=ERRORS)
    async def delete_response(response_id: str, request: Request):
        return json_response(await request.app.state.responses.delete(response_id,
                                                                      owner_of(request)))

    @app.get("/v1/responses/{response_id}/input_items", responses=ERRORS)
    async def list_input_items(response_id: str, request: Request, after: str | None = None,
                               limit: int = Query(20, ge=1, le=100),
                               order: Literal["asc", "desc"] = "desc"):
        return json_response(await request.app.state.responses.input_items(
            response_id, after, limit, order, owner_of(request)))


def _messages_routes(app: FastAPI) -> None:
    """Anthropic's Messages API and its token count."""
    @app.post("/v1/messages", responses=STREAMING)
    async def messages(body: MessagesRequest, request: Request):
        async def create() -> Any:
            served = await model_of(request, body.model)
            return await served.messages.create(body, owner_of(request), small=small(request))
        return respond(await unless_gone(request, create()), AnthropicSSE)

    @app.post("/v1/messages/count_tokens", responses=ERRORS)
    async def count_tokens(body: CountTokensRequest, request: Request):
        served = await model_of(request, body.model)
        return json_response(await served.messages.count_tokens(body, owner_of(request),
                                                                small=small(request)))


def _embedding_routes(app: FastAPI) -> None:
    """Embeddings, rerank, and /tokenize and /detokenize (every kind of model)."""
    @app.post("/v1/embeddings", responses=ERRORS)
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
        app.post(path, responses=ERRORS)(rerank)

    @app.post("/tokenize", responses=ERRORS)
    async def tokenize(body: TokenizeRequest, request: Request):
        """The tokens of a ``prompt``, or of ``messages`` rendered as a chat request would
        be (vLLM's shape): ``tokens``, ``count``, ``max_model_len``. Every kind of model:
        a chunker measures text in its embedding model's tokens."""
        served = await model_of(request, body.model, EVERY_KIND)
        return json_response(await served.tokens.tokenize(body, small=small(request)))

    @app.post("/detokenize", responses=ERRORS)
    async def detokenize(body: DetokenizeRequest, request: Request):
        served = await model_of(request, body.model, EVERY_KIND)
        return json_response(await served.tokens.detokenize(body, small=small(request)))


def _include(request: Request) -> list[str]:
    """``include`` as the SDKs send it (``include[]=a&include[]=b``) or plainly repeated."""
    return request.query_params.getlist("include[]") + request.query_params.getlist("include")


def _conversation_routes(app: FastAPI) -> None:
    @app.post("/v1/conversations", responses=ERRORS)
    async def create_conversation(body: ConversationCreateRequest, request: Request):
        return json_response(await request.app.state.conversations.create(body,
                                                                           owner_of(request)))

    @app.get("/v1/conversations", responses=ERRORS)
    async def list_conversations(request: Request, after: str | None = None,
                                 limit: int = Query(20, ge=1, le=100),
                                 order: Literal["asc", "desc"] = "desc"):
        return json_response(await request.app.state.conversations.list_conversations(
            after=after, limit=limit, order=order, owner=owner_of(request)))

    @app.get("/v1/conversations/{conversation_id}", responses=ERRORS)
    async def get_conversation(conversation_id: str, request: Request):
        return json_response(await request.app.state.conversations.retrieve(
            conversation_id, owner_of(request)))

    @app.post("/v1/conversations/{conversation_id}", responses=ERRORS)
    async def update_conversation(conversation_id: str, body: ConversationUpdateRequest,
                                  request: Request):
        return json_response(await request.app.state.conversations.update(
            conversation_id, body, owner_of(request)))

    @app.delete("/v1/conversations/{conversation_id}", responses=ERRORS)
    async def delete_conversation(conversation_id: str, request: Request):
        return json_response(await request.app.state.conversations.delete(
            conversation_id, owner_of(request)))

    @app.post("/v1/conversations/{conversation_id}/items", responses=ERRORS)
    async def create_items(conversation_id: str, body: ItemsCreateRequest, request: Request):
        return json_response(await request.app.state.conversations.add_items(
            conversation_id, body, _include(request), owner_of(request)))

    @app.get("/v1/conversations/{conversation_id}/items", responses=ERRORS)
    async def list_items(conversation_id: str, request: Request, after: str | None = None,
                         limit: int = Query(20, ge=1, le=100),
                         order: Literal["asc", "desc"] = "desc"):
        return json_response(await request.app.state.conversations.list_items(
            conversation_id, after=after, limit=limit, order=order,
            include=_include(request), owner=owner_of(request)))

    @app.get("/v1/conversations/{conversation_id}/items/{item_id}", responses=ERRORS)
    async def get_item(conversation_id: str, item_id: str, request: Request):
        return json_response(await request.app.state.conversations.get_item(
            conversation_id, item_id, _include(request), owner_of(request)))

    @app.delete("/v1/conversations/{conversation_id}/items/{item_id}", responses=ERRORS)
    async def delete_item(conversation_id: str, item_id: str, request: Request):
        return json_response(await request.app.state.conversations.delete_item(
            conversation_id, item_id, owner_of(request)))
