"""Ollama's model routes: ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, ``HEAD /``,
``/api/embed`` and ``/api/embeddings``; the model-file routes answer that Podium serves the
models it is configured with."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import PlainTextResponse, Response

from podium import __version__
from podium.api.ollama import embed as ollama_embed
from podium.api.ollama import keepalive
from podium.api.ollama.models import Described, describe, listed, running, shown
from podium.errors import ModelNotFound, PodiumError
from podium.models import Entry, Models
from podium.protocol.ollama_models import (EmbeddingsRequest, EmbedRequest, PullRequest,
                                           ShowRequest)
from podium.server.edge import OLLAMA_ERRORS, json_response, model_of, models_of, operator
from podium.server.routing import small
from podium.server.watch import unless_gone


class ModelFilesUnmanaged(PodiumError):
    """A route that manages model files (pull, push, create, copy, delete, blobs).

    403: the request is understood and refused, and no retry or other body changes that
    on this server: not 400 (nothing in it is malformed), not 404 (the route exists, and
    Ollama's clients read a 404 from pull or show as "pull it first"), not 501 or any 5xx
    (nothing failed: a 5xx is logged as the server's error and some clients retry it)."""

    status_code = 403
    error_type = "invalid_request_error"
    default_code = "model_files_unmanaged"


HOW = ("Podium serves the models it is configured with and does not {what} model files; "
       "to serve another, add it with --model NAME=PATH_OR_REPO (repeatable), put its file "
       "in --models-dir, or add a [[models]] table to the config file, then restart")


def _entry(models: Models, name: str) -> Entry:
    try:
        return models.entry(name)
    except ModelNotFound as exc:
        exc.model = name            # Ollama's words: 'model "x" not found ...'
        raise


async def _describe(entry: Entry) -> Described:
    return await asyncio.to_thread(describe, entry.config)


def routes(app: FastAPI) -> None:
    """Adds Ollama's model and embedding routes to the app."""

    @app.get("/", response_class=PlainTextResponse)
    async def running_probe():
        """Ollama's liveness probe: clients (and their apps) check this text is there."""
        return PlainTextResponse("Ollama is running")

    @app.get("/api/version")
    async def version():
        return json_response({"version": __version__})

    @app.get("/api/tags")
    async def tags(request: Request):
        """Every model this server serves, loaded or not, described from its files."""
        entries = request.app.state.models.entries()
        described = await asyncio.gather(*(_describe(e) for e in entries))
        return json_response({"models": [listed(e, d) for e, d in zip(entries, described)]})

    # HEAD as Ollama answers it (clients probe with it): the GET's route, outside the OpenAPI
    # schema (one route of two methods would give two operations one id)
    for path, endpoint in (("/", running_probe), ("/api/version", version),
                           ("/api/tags", tags)):
        app.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)

    @app.post("/api/show", responses=OLLAMA_ERRORS)
    async def show(body: ShowRequest, request: Request):
        """One model's details, template, parameters, model_info and capabilities."""
        entry = _entry(request.app.state.models, body.model)
        about = await _describe(entry)
        return json_response(await asyncio.to_thread(
            shown, entry, about, body.model, request.headers.get("user-agent", "")))

    @app.get("/api/ps")
    async def ps(request: Request):
        """The loaded models, the longest to stay first (as Ollama orders them)."""
        models: Models = request.app.state.models
        loaded = [e for e in models.entries() if e.state == "loaded"]
        described = await asyncio.gather(*(_describe(e) for e in loaded))
        out = [running(models, e, d) for e, d in zip(loaded, described) if e.state == "loaded"]
        out.sort(key=lambda m: m["expires_at"], reverse=True)
        return json_response({"models": out})

    @app.post("/api/embed", responses=OLLAMA_ERRORS)
    async def embed(body: EmbedRequest, request: Request):
        """Ollama's embeddings: a vector per input, with its counters."""
        started = time.monotonic()

        async def create() -> Any:
            served = await model_of(request, body.model, "embedding")
            keepalive.apply(models_of(request), body.model, body.keep_alive,
                            tenant=not operator(request))
            return await ollama_embed.embed(served, body, started=started,
                                            loaded=time.monotonic(), small=small(request))
        return json_response(await unless_gone(request, create()))

    @app.post("/api/embeddings", responses=OLLAMA_ERRORS)
    async def embeddings(body: EmbeddingsRequest, request: Request):
        """The older embeddings route: one prompt's vector."""
        async def create() -> Any:
            served = await model_of(request, body.model, "embedding")
            keepalive.apply(models_of(request), body.model, body.keep_alive,
                            tenant=not operator(request))
            return await ollama_embed.embedding(served, body, small=small(request))
        return json_response(await unless_gone(request, create()))

    _model_file_routes(app)


_REFUSALS: dict[int | str, dict[str, Any]] = {**OLLAMA_ERRORS, 403: {
    "description": "Podium does not manage model files", "content": {"application/json": {
        "example": {"error": "Podium serves the models it is configured with ..."}}}}}


def _model_file_routes(app: FastAPI) -> None:
    @app.post("/api/pull", responses=_REFUSALS)
    async def pull(body: PullRequest, request: Request):
        """A model this server serves is there already: success, as Ollama answers a pull
        of a model it has (scripts pull before they use one). Any other: refused, saying
        how to serve it."""
        entry = _entry_or_none(request.app.state.models, body.model)
        if entry is None:
            raise ModelFilesUnmanaged(HOW.format(what="pull") + f" ('{body.model}' is not "
                                      f"one of them)", param="model")
        done = orjson.dumps({"status": "success"})
        if body.stream:
            return Response(done + b"\n", media_type="application/x-ndjson")
        return Response(done, media_type="application/json")

    refusals = {("POST", "/api/push"): "push", ("POST", "/api/create"): "create",
                ("POST", "/api/copy"): "copy", ("DELETE", "/api/delete"): "delete",
                ("POST", "/api/blobs/{digest}"): "upload",
                ("HEAD", "/api/blobs/{digest}"): "keep"}
    for (method, path), what in refusals.items():
        app.add_api_route(path, _refuse(what, "{digest}" in path), methods=[method],
                          responses=_REFUSALS)


def _entry_or_none(models: Models, name: str) -> Entry | None:
    try:
        return models.entry(name)
    except ModelNotFound:
        return None


def _refuse(what: str, blob: bool = False):
    async def refuse() -> Response:
        raise ModelFilesUnmanaged(HOW.format(what=what))

    async def refuse_blob(digest: str) -> Response:
        raise ModelFilesUnmanaged(HOW.format(what=what))
    chosen = refuse_blob if blob else refuse
    chosen.__name__ = f"refuse_{what}"
    return chosen
