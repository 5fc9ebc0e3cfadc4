"""The FastAPI application: routes stay a few lines; services do the work."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

import orjson
from fastapi import FastAPI, Request
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from podium.api.chat import ChatService
from podium.api.completions import CompletionService
from podium.engine.base import Engine
from podium.errors import ModelNotFound, error_body
from podium.protocol.chat import ChatCompletionRequest
from podium.protocol.completions import CompletionRequest
from podium.server import errors
from podium.server.middleware import APIKeyMiddleware, BodyLimitMiddleware
from podium.server.sse import SSEResponse
from podium.settings import Settings

_ERRORS = {status: {"description": text, "content": {"application/json": {"example": error_body(
    text, "invalid_request_error")}}} for status, text in [
    (400, "Invalid request"), (401, "Missing or wrong API key"), (404, "Unknown model"),
    (413, "Request body too large")]}


def json_response(obj: Any) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


def respond(result: dict | AsyncIterator[dict]) -> Response | SSEResponse:
    return json_response(result) if isinstance(result, dict) else SSEResponse(result)


def create_app(settings: Settings, engine: Engine) -> FastAPI:
    """The app serving ``engine``; the engine is closed when the app shuts down."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await engine.aclose()

    app = FastAPI(title="Podium", version="0.1.0", lifespan=lifespan,
                  summary="An OpenAI-compatible API server for open-weight models")
    app.state.engine = engine
    app.state.chat = ChatService(engine, settings)
    app.state.completions = CompletionService(engine, settings)
    errors.install(app)
    _routes(app)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    if settings.api_key:
        app.add_middleware(APIKeyMiddleware, keys=list(settings.api_key))
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["*"], allow_headers=["*"])
    return app


def _model_card(engine: Engine) -> dict[str, Any]:
    return {"id": engine.info.served_name, "object": "model", "created": engine.info.created,
            "owned_by": "podium", "max_model_len": engine.info.context_length}


def _routes(app: FastAPI) -> None:
    @app.post("/v1/chat/completions", responses=_ERRORS)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return respond(await request.app.state.chat.create(body))

    @app.post("/v1/completions", responses=_ERRORS)
    async def completions(body: CompletionRequest, request: Request):
        return respond(await request.app.state.completions.create(body))

    @app.get("/v1/models")
    async def list_models(request: Request):
        return json_response({"object": "list", "data": [_model_card(request.app.state.engine)]})

    @app.get("/v1/models/{model_id:path}", responses=_ERRORS)
    async def get_model(model_id: str, request: Request):
        engine = request.app.state.engine
        if model_id != engine.info.served_name:
            raise ModelNotFound(f"The model '{model_id}' does not exist", param="model")
        return json_response(_model_card(engine))

    @app.get("/health")
    async def health(request: Request):
        return json_response({"status": "ok", "engine": dict(request.app.state.engine.stats)})
