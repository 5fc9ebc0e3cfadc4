"""The one place where exceptions become error responses: OpenAI's shape, Anthropic's on
the Messages API's routes (``/v1/messages...``), or Ollama's (``{"error": "..."}``) on its
routes (``/api/...``), request validation included (400, never FastAPI's 422)."""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from podium import telemetry
from podium.errors import (PodiumError, anthropic_body, anthropic_error, error_body,
                           ollama_body)

log = logging.getLogger(__name__)


ANTHROPIC_PATHS = "/v1/messages"


def anthropic(path: str) -> bool:
    """The route answers in Anthropic's shapes."""
    return path == ANTHROPIC_PATHS or path.startswith(ANTHROPIC_PATHS + "/")


OLLAMA_PATHS = "/api/"


def ollama(path: str) -> bool:
    """The route answers in Ollama's shapes."""
    return path.startswith(OLLAMA_PATHS)


def shaped(path: str, exc: PodiumError) -> tuple[int, dict[str, Any]]:
    """The status and error body of ``exc`` in the shape of the API ``path`` belongs to."""
    if anthropic(path):
        return anthropic_body(exc)
    if ollama(path):
        return ollama_body(exc)
    return exc.status_code, exc.to_body()


def error_response(status: int, body: dict, headers: dict[str, str] | None = None,
                   request: Request | None = None) -> Response:
    """``body`` is OpenAI's error object; on an Anthropic route it is answered in Anthropic's
    shape (and status: 529 when the engine is overloaded), on an Ollama route in Ollama's."""
    telemetry.note_error(body["error"].get("code") or body["error"]["type"])
    if request is not None and anthropic(request.url.path):
        status, body = anthropic_error(status, body["error"]["message"])
    elif request is not None and ollama(request.url.path):
        body = {"error": body["error"]["message"]}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json",
                    headers=headers)


_TYPE_TAG = re.compile(r"^(str|int|float|bool|dict|list|none|[a-z-]+\[.*\])$")


def _location(loc: tuple) -> str:
    """('body', 'messages', 0, 'content') -> 'messages[0].content'; ('query', 'limit') ->
    'limit'.

    Union members appear in pydantic's locations as type names ('str', 'list[str]'); they
    say nothing to a client and are dropped.
    """
    out = ""
    parts = loc[1:] if loc and loc[0] in ("body", "query", "path") else loc
    for part in (p for p in parts if not (isinstance(p, str) and _TYPE_TAG.match(p))):
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


async def on_podium_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, PodiumError)     # registered for PodiumError
    if exc.status_code >= 500:
        log.error("request failed: %s", exc.message)
    path = request.url.path
    if anthropic(path) or ollama(path):
        telemetry.note_error(exc.code or exc.error_type)
        status, body = shaped(path, exc)
        return Response(orjson.dumps(body), status_code=status, media_type="application/json",
                        headers=exc.headers)
    return error_response(exc.status_code, exc.to_body(), headers=exc.headers)


def validation_body(errors: Any) -> dict[str, Any]:
    """OpenAI's 400 body for pydantic's ``errors()`` of a request body: the first five
    problems, each at the caller's parameter (``messages[0].content``), the first's as
    ``param``."""
    errors = list(errors)
    first: dict[str, Any] = dict(errors[0]) if errors else {"loc": (), "msg": "Invalid request"}
    param: str | None = _location(tuple(first.get("loc", ())))
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        message, param = f"The request body is not valid JSON: {detail}", None
    else:
        message = "; ".join(f"{_location(tuple(e.get('loc', ()))) or 'body'}: {e.get('msg')}"
                            for e in errors[:5])
    return error_body(message, "invalid_request_error", param or None)


async def on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return error_response(400, validation_body(exc.errors()), request=request)


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    message = exc.detail if isinstance(exc.detail, str) else "Request failed"
    if exc.status_code == 404:
        message = "Not found: no such route"
    return error_response(exc.status_code, error_body(message, kind, None, None),
                          headers=getattr(exc, "headers", None), request=request)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, error_body("The server had an error while processing your "
                                          "request.", "server_error"), request=request)


def install(app: FastAPI) -> None:
    app.add_exception_handler(PodiumError, on_podium_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
