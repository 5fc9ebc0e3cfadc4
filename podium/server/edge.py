"""What every API's routes share between an HTTP request and a service.

- ``model_of(request, name, kind)``: the model a request names, loaded and held until its
  response ends (the scope's ``HELD`` list, released by ``app.PodiumApp``); ``check_kind``
  (an embedding model asked to chat is a 400); ``keeper``: the hold a background response
  takes past its request.
- ``owner_of(request)``: the tenant a request's stored objects belong to; ``operator`` /
  ``require_operator``: whether it may load and unload models, which every tenant shares.
- ``json_response``, ``json_response_status``, ``respond``: the answer, as JSON or as an
  encoded stream.
- ``ERRORS``, ``STREAMING``, ``OPERATOR``, ``OLLAMA_ERRORS``: the statuses the routes
  document in the OpenAPI schema.

The route modules (app.py, ops.py, files.py, batches.py, ollama_chat.py, ollama_models.py)
import these and never one another's helpers; this module imports no route module, and
nothing below the edge (protocol, api) imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncGenerator, Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response

from podium.errors import InvalidRequestError, ModelNotFound, PermissionDenied, error_body
from podium.models import Entry, Models
from podium.server.sse import ChatSSE, Encoder, SSEResponse
from podium.settings import Settings
from podium.store.base import NO_OWNER

if TYPE_CHECKING:
    from podium.server.served import Served

HELD = "podium.held"    # the scope's list of models a request holds (released at its end)

ERRORS: dict[int | str, dict[str, Any]] = {status: {"description": text, "content": {
    "application/json": {"example": error_body(text, "invalid_request_error")}}}
    for status, text in [
        (400, "Invalid request"), (401, "Missing or wrong API key"), (404, "Unknown model"),
        (413, "Request body too large"), (429, "Too many requests (see Retry-After)")]}
# generating endpoints answer with JSON, or with server-sent events when streaming
STREAMING: dict[int | str, dict[str, Any]] = {**ERRORS, 200: {
    "description": "The answer (JSON), or its events (SSE)",
    "content": {"application/json": {}, "text/event-stream": {}}}}
# the operator's routes (loading and unloading models): a tenant's key is refused
OPERATOR: dict[int | str, dict[str, Any]] = {**ERRORS, 403: {
    "description": "Not an admin key (--admin-key)", "content": {"application/json": {
        "example": error_body("Loading and unloading models is the server operator's ...",
                              "permission_error", None, "admin_key_required")}}}}
# the statuses every Ollama route may answer, in Ollama's error shape
OLLAMA_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": {"application/json": {"example": {
        "error": text}}}} for status, text in [
        (400, "Invalid request"), (401, "Missing or wrong API key"),
        (404, 'model "name" not found, try pulling it first'), (413, "Request body too large"),
        (429, "Too many requests (see Retry-After)")]}


def json_response(obj: Any) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


def json_response_status(obj: Any, status: int) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def respond(result: dict | AsyncGenerator[Any, None], encoder: type[Encoder] = ChatSSE
            ) -> Response | SSEResponse:
    """The answer as JSON, or its stream encoded for the API's wire (``encoder``)."""
    if isinstance(result, dict):
        return json_response(result)
    return SSEResponse(result, encoder())


_KINDS = {"chat": "a chat model", "embedding": "an embedding model", "rerank": "a reranker"}
_ROUTES = {"chat": "text generation (chat, completions, responses, messages; Ollama's "
                   "/api/chat and /api/generate)",
           "embedding": "embeddings (/v1/embeddings, Ollama's /api/embed), /v1/rerank and "
                        "/tokenize",
           "rerank": "/v1/rerank and /tokenize"}
EVERY_KIND = tuple(_KINDS)      # routes every model serves (/tokenize, /detokenize)


def check_kind(entry: Entry, name: str, kind: str | tuple[str, ...]) -> None:
    """400 if the model ``name`` names is of another kind than ``kind`` (one, or those a
    route takes): an embedding model asked to chat."""
    kinds = (kind,) if isinstance(kind, str) else kind
    if entry.config.kind != "auto" and entry.config.kind not in kinds:
        raise InvalidRequestError(
            f"'{name}' is {_KINDS[entry.config.kind]}: it serves {_ROUTES[entry.config.kind]}",
            param="model")


def models_of(request: Request) -> Models:
    return request.app.state.models


async def model_of(request: Request, name: str, kind: str | tuple[str, ...] = "chat"
                   ) -> Served:
    """The model the request names, loaded (waiting for it), held until the response ends:
    a model serving a request is never unloaded. 404 for a name no model answers to; 400
    for a model of another kind than the route's (``kind``: one, or those it takes; an
    embedding model asked to chat)."""
    models = models_of(request)
    try:
        entry = models.entry(name)
    except ModelNotFound as exc:
        exc.model = name            # Ollama's routes say it in Ollama's words
        raise
    check_kind(entry, name, kind)
    entry = await models.acquire(name)
    request.scope[HELD].append(entry)
    return entry.engine


def held(request: Request) -> list[Entry]:
    """The models the request holds (``model_of``'s), released when its response ends."""
    return request.scope.get(HELD, [])


def keeper(request: Request) -> Callable[[], Callable[[], None]]:
    """What keeps the request's model (``model_of``'s) loaded past the request's end (a
    background response): call it for a release."""
    models = models_of(request)
    entry = request.scope[HELD][-1]
    return lambda: models.hold(entry)


def owner_of(request: Request) -> str:
    """Who the request's stored objects belong to: its API key's id (set by
    APIKeyMiddleware), or the one owner of a server without keys."""
    return getattr(request.state, "owner", NO_OWNER)


def operator(request: Request) -> bool:
    """Whether the request may act as the server's operator (load and unload models by
    hand, for every key's requests at once): with keys configured, only a request with an
    admin key (``--admin-key``; APIKeyMiddleware says which); without any, every request
    (a local server: its user is its operator)."""
    settings: Settings = request.app.state.settings
    if not (settings.api_key or settings.admin_key):
        return True
    return bool(getattr(request.state, "admin", False))


def require_operator(request: Request) -> None:
    """403 ``admin_key_required`` unless the request is the operator's."""
    if not operator(request):
        raise PermissionDenied(
            "Loading and unloading models is the server operator's: it takes an admin key "
            "(--admin-key), and this request's key is not one")
