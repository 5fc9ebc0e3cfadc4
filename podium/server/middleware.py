"""Pure ASGI middleware: API keys and the request body limit."""

from __future__ import annotations

import hmac

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from podium.errors import AuthenticationError, PayloadTooLarge, PodiumError

OPEN_PATHS = frozenset({"/health"})


async def _send_error(send: Send, exc: PodiumError) -> None:
    headers = [(b"content-type", b"application/json")]
    if isinstance(exc, AuthenticationError):
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(exc.to_body())})


class APIKeyMiddleware:
    """Requires ``Authorization: Bearer <key>`` matching one of ``keys`` (constant time)."""

    def __init__(self, app: ASGIApp, keys: list[str]):
        self.app = app
        self._keys = [k.encode() for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        ok = False
        for key in self._keys:   # no early exit: every key is compared
            ok |= hmac.compare_digest(token.strip(), key)
        if scheme.lower() != b"bearer" or not ok:
            message = ("Incorrect API key provided." if header else
                       "Missing API key: send it as 'Authorization: Bearer <key>'.")
            return await _send_error(send, AuthenticationError(message))
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuses bodies over ``limit`` bytes with 413, whether announced or sent chunked."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self._limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = PayloadTooLarge(f"The request body is larger than {self._limit} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:      # the server holds the client to its announced length
            if length.isdigit() and int(length) > self._limit:
                return await _send_error(send, too_large)
            return await self.app(scope, receive, send)
        # Chunked: read (and count) the body here, then replay it to the app.
        received, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if size > self._limit:
                return await _send_error(send, too_large)
            received.append(message)
            if not message.get("more_body"):
                break
        pending = iter(received)

        async def replay() -> Message:
            return next(pending, None) or await receive()

        await self.app(scope, replay, send)
