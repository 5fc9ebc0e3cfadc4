"""Ollama's generation routes: ``POST /api/chat`` and ``POST /api/generate`` (NDJSON streams).

Each is a few lines, like the ``/v1`` routes: the model (waited for, held), the request's
``keep_alive`` for it, the service (api/ollama/chat.py), the answer as JSON or as NDJSON
lines (``sse.NDJSON``). An empty ``messages`` (chat) or ``prompt`` (generate, without a
``suffix``) loads the model, or with ``keep_alive: 0`` unloads it, and answers
``done_reason: "load"`` / ``"unload"``, as Ollama does.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request

from podium.api.ollama import keepalive
from podium.api.ollama.chat import Clock, OllamaService
from podium.protocol.ollama import ChatRequest, GenerateRequest, Generation
from podium.render.ollama import created_at
from podium.server.app import model_of, respond
from podium.server.routing import small
from podium.server.sse import NDJSON
from podium.server.watch import unless_gone

# the statuses every Ollama route may answer, in Ollama's error shape (the OpenAPI document)
OLLAMA_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": {"application/json": {"example": {
        "error": text}}}} for status, text in [
        (400, "Invalid request"), (401, "Missing or wrong API key"),
        (404, 'model "name" not found, try pulling it first'), (413, "Request body too large"),
        (429, "Too many requests (see Retry-After)")]}
_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "The answer (JSON), or its objects one a line (NDJSON)",
          "content": {"application/json": {}, "application/x-ndjson": {}}},
    **OLLAMA_ERRORS}


async def _service(request: Request, req: Generation, clock: Clock) -> OllamaService:
    """The request's model, waited for (the wait is Ollama's ``load_duration``) and held;
    the request's ``keep_alive`` set for it."""
    waiting = time.monotonic()
    served = await model_of(request, req.model)
    clock.waited = time.monotonic() - waiting
    keepalive.apply(request, req.model, req.keep_alive)
    return OllamaService(served.engine, served.dialect, served.settings)


async def _load_or_unload(request: Request, req: Generation, chat: bool) -> dict[str, Any]:
    """Nothing to generate: the model loaded (or unloaded, ``keep_alive: 0``)."""
    if req.keep_alive == 0:
        await keepalive.unload(request, req.model)
        reason = "unload"
    else:
        await keepalive.load(request, req.model, req.keep_alive)
        reason = "load"
    said: dict[str, Any] = ({"message": {"role": "assistant", "content": ""}} if chat
                            else {"response": ""})
    return {"model": req.model, "created_at": created_at(), **said, "done": True,
            "done_reason": reason}


def routes(app: FastAPI) -> None:
    """Adds Ollama's generation routes to the app."""

    @app.post("/api/chat", responses=_ANSWERS)
    async def chat(body: ChatRequest, request: Request):
        """The next message of a chat (Ollama's shape); NDJSON lines unless ``stream: false``."""
        async def create() -> Any:
            if not body.messages:
                return await _load_or_unload(request, body, chat=True)
            clock = Clock.now()
            service = await _service(request, body, clock)
            return await service.chat(body, clock, small=small(request))
        return respond(await unless_gone(request, create()), NDJSON)

    @app.post("/api/generate", responses=_ANSWERS)
    async def generate(body: GenerateRequest, request: Request):
        """A completion of ``prompt`` (Ollama's shape); NDJSON lines unless ``stream: false``."""
        async def create() -> Any:
            if not body.prompt and not body.suffix:
                return await _load_or_unload(request, body, chat=False)
            clock = Clock.now()
            service = await _service(request, body, clock)
            return await service.generate(body, clock, small=small(request))
        return respond(await unless_gone(request, create()), NDJSON)
