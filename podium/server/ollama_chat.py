"""Ollama's generation routes: ``POST /api/chat`` and ``POST /api/generate`` (NDJSON streams).

Each is a few lines, like the ``/v1`` routes: the model (waited for, held), the request's
``keep_alive`` for it, the service (api/ollama/chat.py), the answer as JSON or as NDJSON
lines (``sse.NDJSON``). An empty ``messages`` (chat) or ``prompt`` (generate, without a
``suffix``) loads the model, or with ``keep_alive: 0`` unloads it (the operator's act: 403
for a tenant's key, api/ollama/keepalive.py), and answers ``done_reason: "load"`` /
``"unload"``, as Ollama does.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request

from podium.api.ollama import keepalive
from podium.api.ollama.chat import Clock, OllamaService
from podium.protocol.ollama import ChatRequest, GenerateRequest, Generation
from podium.render.ollama import created_at
from podium.server.edge import OLLAMA_ERRORS, held, model_of, models_of, operator, respond
from podium.server.routing import small
from podium.server.sse import NDJSON
from podium.server.watch import unless_gone

_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "The answer (JSON), or its objects one a line (NDJSON)",
          "content": {"application/json": {}, "application/x-ndjson": {}}},
    **OLLAMA_ERRORS,
    403: {"description": "An unload (empty prompt, keep_alive 0) without an admin key",
          "content": {"application/json": {"example": {"error": "Unloading a model is "
                                                                 "the server operator's ..."}}}}}


async def _service(request: Request, req: Generation, clock: Clock) -> OllamaService:
    """The request's model, waited for (the wait is Ollama's ``load_duration``) and held;
    the request's ``keep_alive`` set for it."""
    waiting = time.monotonic()
    served = await model_of(request, req.model)
    clock.waited = time.monotonic() - waiting
    keepalive.apply(models_of(request), req.model, req.keep_alive,
                    tenant=not operator(request))
    return OllamaService(served.engine, served.dialect, served.settings)


async def _load_or_unload(request: Request, req: Generation, chat: bool) -> dict[str, Any]:
    """Nothing to generate: the model loaded (or unloaded, ``keep_alive: 0``)."""
    models, tenant = models_of(request), not operator(request)
    if req.keep_alive == 0:
        await keepalive.unload(models, req.model, held(request), tenant=tenant)
        reason = "unload"
    else:
        await keepalive.load(models, req.model, req.keep_alive, tenant=tenant)
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
