"""Pure ASGI middleware: request ids and the access log, API keys, limits.

Order, outermost first: CORS, requests (id, metrics, log line), body limit, API keys,
request limits (concurrency and per-key rate), then the app.

``APIKeyMiddleware`` resolves the request's key once and hands its identifier (``owner_id``)
inward as ``scope["state"]["owner"]``: the rate limit counts by it and stored responses
belong to it, however the client spells the header. Whether the key is an operator's
(``--admin-key``) goes inward too, as ``scope["state"]["admin"]``: only an operator loads and
unloads models by hand (``server.edge.operator``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Sequence
from logging import INFO

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from podium import telemetry
from podium.errors import (AuthenticationError, Overloaded, PayloadTooLarge, PodiumError,
                           RateLimited)
from podium.server.errors import shaped

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
GENERATING = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
              "/v1/embeddings", "/v1/rerank", "/rerank", "/v2/rerank",
              "/api/chat", "/api/generate", "/api/embed", "/api/embeddings")
# Ollama's model routes, labelled by their own paths in metrics
OLLAMA_MODEL_PATHS = ("/api/tags", "/api/show", "/api/ps", "/api/version", "/api/pull")
# routes that read their body as it streams, under a limit of their own (not the JSON one)
UPLOADS = frozenset({"/v1/files"})
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


async def _send_error(scope: Scope, send: Send, exc: PodiumError) -> None:
    """The error in the shape of the API the path belongs to (OpenAI's, Anthropic's,
    Ollama's)."""
    telemetry.note_error(exc.code or exc.error_type)
    headers = [(b"content-type", b"application/json")]
    if isinstance(exc, AuthenticationError):
        headers.append((b"www-authenticate", b"Bearer"))
    for name, value in (exc.headers or {}).items():
        headers.append((name.encode(), value.encode()))
    status, body = shaped(scope["path"], exc)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(body)})


def endpoint_of(path: str) -> str:
    """A low-cardinality label for a path (ids replaced by placeholders)."""
    if path.startswith("/v1/responses/"):
        rest = path[len("/v1/responses/"):].split("/")
        return "/v1/responses/{id}" + ("/" + rest[1] if len(rest) > 1 else "")
    if path.startswith("/v1/files/"):
        return "/v1/files/{id}" + ("/content" if path.endswith("/content") else "")
    if path.startswith("/v1/models/"):
        action = path.rsplit("/", 1)[1]
        return "/v1/models/{id}" + (f"/{action}" if action in ("load", "unload") else "")
    return path if path in (*GENERATING, "/v1/messages/count_tokens", "/v1/models",
                            "/tokenize", "/detokenize", "/v1/files", *OLLAMA_MODEL_PATHS,
                            *OPEN_PATHS) else "other"


class RequestMiddleware:
    """Every response gets an ``x-request-id`` (the client's, or a new one); every request
    ends as one log line and a few metrics."""

    def __init__(self, app: ASGIApp, metrics: telemetry.Metrics, json_logs: bool,
                 log_requests: bool):
        self.app = app
        self._metrics, self._json, self._capture = metrics, json_logs, log_requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _REQUEST_ID.match(given) else "req_" + secrets.token_hex(12)
        record = telemetry.RequestRecord(rid, endpoint_of(scope["path"]), self._metrics,
                                         self._capture)
        token = telemetry.CURRENT.set(record)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", rid.encode()),
                                                  (b"request-id", rid.encode())]}
            await send(message)

        async def capture(message_source=receive) -> Message:
            message = await message_source()
            if message["type"] == "http.request" and len(record.body) < 1 << 20:
                record.body += message.get("body", b"")
            return message

        try:
            await self.app(scope, capture if self._capture else receive, send_with_id)
        finally:
            telemetry.CURRENT.reset(token)
            if not record.status and record.error_type is None:
                # an unhandled exception: answered (500) by the outermost handler, outside
                # this record, so counted here
                record.error_type = "server_error"
                self._metrics.errors.labels("server_error").inc()
            self._metrics.requests.labels(record.endpoint, str(record.status or 500)).inc()
            if record.endpoint not in OPEN_PATHS and telemetry.access_log.isEnabledFor(INFO):
                telemetry.access_log.info(record.line(self._json))  # made only to be logged


class LimitMiddleware:
    """At most ``max_concurrent`` generating requests at once, and ``per_minute`` requests
    per API key (the key ``APIKeyMiddleware`` resolved; per client address without keys);
    past either, 429 with Retry-After."""

    def __init__(self, app: ASGIApp, max_concurrent: int, per_minute: int):
        self.app = app
        self._max, self._per_minute = max_concurrent, per_minute
        self._active = 0
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        if self._per_minute and not self._take(self._client(scope)):
            return await _send_error(scope, send, RateLimited(
                f"Rate limit of {self._per_minute} requests per minute reached",
                retry_after=max(1, int(60 / self._per_minute))))
        generating = scope["method"] == "POST" and scope["path"] in GENERATING
        if not generating or not self._max:
            return await self.app(scope, receive, send)
        if self._active >= self._max:
            return await _send_error(scope, send, Overloaded(
                f"The server is at its limit of {self._max} concurrent requests"))
        self._active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._active -= 1

    def _client(self, scope: Scope) -> str:
        owner = scope.get("state", {}).get("owner")
        if owner is not None:
            return "key:" + owner
        client = scope.get("client")
        return "addr:" + (client[0] if client else "?")

    def _take(self, who: str) -> bool:
        """A token bucket per client: ``per_minute`` tokens, refilled continuously."""
        now = time.monotonic()
        tokens, stamp = self._buckets.pop(who, (float(self._per_minute), now))
        tokens = min(self._per_minute, tokens + (now - stamp) * self._per_minute / 60)
        allowed = tokens >= 1
        self._buckets[who] = (tokens - 1 if allowed else tokens, now)
        while len(self._buckets) > 10_000:           # bounded: forget the least recent
            self._buckets.popitem(last=False)
        return allowed


def owner_id(key: bytes) -> str:
    """What stands for an API key wherever it is kept or counted: a SHA-256 prefix (128
    bits), the same on every replica and across restarts; the key itself is never stored."""
    return "key_" + hashlib.sha256(b"podium-owner:" + key).hexdigest()[:32]


class APIKeyMiddleware:
    """Requires ``Authorization: Bearer <key>`` (or Anthropic's ``x-api-key: <key>``) matching
    one of ``keys`` or ``admin_keys`` (constant time); passes the key's ``owner_id`` inward as
    ``scope["state"]["owner"]``, and whether it is an admin key as ``scope["state"]["admin"]``.
    An admin key is a tenant like any other (its own ``owner_id``) that may also act as the
    operator."""

    def __init__(self, app: ASGIApp, keys: Sequence[str], admin_keys: Sequence[str] = ()):
        self.app = app
        self._keys = [(k.encode(), owner_id(k.encode()), False) for k in keys] + [
            (k.encode(), owner_id(k.encode()), True) for k in admin_keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        header = headers.get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        if not header and b"x-api-key" in headers:      # Anthropic's clients send this
            scheme, token, header = b"bearer", headers[b"x-api-key"], headers[b"x-api-key"]
        token, owner, admin = token.strip(), None, False
        for key, key_owner, key_admin in self._keys:    # no early exit: every key compared
            if hmac.compare_digest(token, key):
                owner, admin = key_owner, admin or key_admin
        if scheme.lower() != b"bearer" or owner is None:
            message = ("Incorrect API key provided." if header else
                       "Missing API key: send it as 'Authorization: Bearer <key>' (or "
                       "'x-api-key: <key>').")
            return await _send_error(scope, send, AuthenticationError(message))
        state = scope.setdefault("state", {})
        state["owner"], state["admin"] = owner, admin
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuses bodies over ``limit`` bytes with 413, whether announced or sent chunked;
    uploads (``UPLOADS``) pass untouched: their routes count their bodies as they read."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self._limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UPLOADS:
            return await self.app(scope, receive, send)
        too_large = PayloadTooLarge(f"The request body is larger than {self._limit} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:      # the server holds the client to its announced length
            if length.isdigit() and int(length) > self._limit:
                return await _send_error(scope, send, too_large)
            return await self.app(scope, receive, send)
        # Chunked: read (and count) the body here, then replay it to the app.
        received, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if size > self._limit:
                return await _send_error(scope, send, too_large)
            received.append(message)
            if not message.get("more_body"):
                break
        pending = iter(received)

        async def replay() -> Message:
            return next(pending, None) or await receive()

        await self.app(scope, replay, send)
