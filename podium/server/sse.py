"""Server-sent events (and NDJSON) at the HTTP edge: the one place objects are encoded and
framed.

A renderer (``render.base``) yields plain objects; an ``Encoder`` per wire format turns each
into bytes: ``ChatSSE`` frames ``data:`` events and ends with ``data: [DONE]`` (Chat,
Completions), ``ResponsesSSE`` and ``AnthropicSSE`` frame named events without ``[DONE]``,
``NDJSON`` writes one JSON object a line (Ollama).
A ``Filled`` pair (a per-token chunk: a ``Shape`` and its text) is written from the shape's
template, encoded once per stream: the token's text is the only JSON encoded per token. ``KEEPALIVE`` is an SSE
comment. Once the 200 has been sent no status can change, so a failure mid-stream becomes an
in-band error event in the API's shape, then the end (``[DONE]`` where the API has it). A
client that goes away cancels the stream at once, which closes the iterator and with it the
engine request (abort), instead of waiting for the next write to fail.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncGenerator

import anyio
import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from podium.errors import ModelUnloaded, PodiumError, anthropic_body, error_body, ollama_body
from podium.render.base import HOLE, KEEPALIVE, Shape


class ServerShuttingDown(PodiumError):
    """The server stopped before this stream finished (503, in-band)."""

    status_code = 503
    default_code = "server_shutting_down"

    def __init__(self) -> None:
        super().__init__("The server is shutting down; this response was cut short.")

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
# The server's own ``send``, handed inward in the scope by the app (``app.PodiumApp``): every
# wrapper between it and a response (Starlette's error and exception handlers, CORS, the
# request middleware, the body limit, keys and limits) acts on ``http.response.start`` only,
# so a stream's body messages, once the start has gone through them all, go straight to it.
BODY_SEND = "podium.body_send"
HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
           (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


def frame(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def named_frame(obj: Any) -> bytes:
    """The Responses API's framing: each event's type is also its SSE event name."""
    return b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def error_frame(exc: BaseException) -> bytes:
    if isinstance(exc, PodiumError):
        return frame(exc.to_body())
    return frame(error_body("The server failed while streaming the response.", "server_error"))


def anthropic_error_frame(exc: BaseException) -> bytes:
    return named_frame(anthropic_body(exc)[1])


def error_event_frame(exc: BaseException) -> bytes:
    body = (exc.to_body() if isinstance(exc, PodiumError) else error_body(
        "The server failed while streaming the response.", "server_error"))["error"]
    return named_frame({"type": "error", "message": body["message"], "code": body["code"],
                        "param": body["param"], "sequence_number": 0})


def ndjson_line(obj: Any) -> bytes:
    """Ollama's framing: one JSON object a line."""
    return orjson.dumps(obj) + b"\n"


def ndjson_error(exc: BaseException) -> bytes:
    return ndjson_line(ollama_body(exc)[1])


# A comment: dropped by every SSE parser, yet it restarts the byte-level idle timers
# (httpx's read timeout, undici's bodyTimeout, proxies') that are what Chat clients have.
COMMENT = b": keepalive\n\n"


class Encoder:
    """One stream's encoding: objects to framed bytes, and the error that ends it."""

    done = DONE
    frame = staticmethod(frame)
    error = staticmethod(error_frame)
    headers = HEADERS

    def __init__(self) -> None:
        self._templates: dict[Shape, tuple[bytes, bytes]] = {}

    def encode(self, obj: Any) -> bytes:
        if type(obj) is tuple:                  # Filled, the per-token case, first
            shape, text = obj
            template = self._templates.get(shape)
            if template is None:
                template = self._templates[shape] = self._template(shape)
            return template[0] + orjson.dumps(text) + template[1]
        if obj is KEEPALIVE:
            return COMMENT
        return self.frame(obj)

    def _template(self, shape: Shape) -> tuple[bytes, bytes]:
        """The shape's frame, cut where its hole is."""
        head, hole, tail = self.frame(shape.obj).partition(orjson.dumps(HOLE))
        assert hole, "a shape has one hole"
        return head, tail


class ChatSSE(Encoder):
    """Chat Completions and Completions: ``data:`` events, ``data: [DONE]`` last."""


class ResponsesSSE(Encoder):
    """The Responses API: each event named by its type; an ``error`` event; no ``[DONE]``."""

    done = b""
    frame = staticmethod(named_frame)
    error = staticmethod(error_event_frame)


class AnthropicSSE(ResponsesSSE):
    """Anthropic Messages: named events; the error in Anthropic's shape."""

    error = staticmethod(anthropic_error_frame)


class NDJSON(Encoder):
    """Ollama: newline-delimited JSON, one object a line, nothing after the last; an error
    after the first byte is a line ``{"error": "..."}``. Ollama's renderers send no
    ``KEEPALIVE`` (NDJSON has no comment every client would drop)."""

    done = b""
    frame = staticmethod(ndjson_line)
    error = staticmethod(ndjson_error)
    headers = [(b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]


class SSEResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncGenerator[Any, None], encoder: Encoder):
        self._events = events
        self._encoder = encoder
        self.status_code = 200
        self.background = None
        self.raw_headers = list(encoder.headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.raw_headers})
            await self._serve(scope, receive, scope.get(BODY_SEND, send))
        finally:
            # a stream ended before it began still holds its queued engine requests
            with anyio.CancelScope(shield=True):
                await self._events.aclose()

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The stream runs in a task of its own, beside one waiting for the client to leave;
        a client gone, the end of the shutdown grace period, or this request's own task
        cancelled, cancels the stream once: its clean-up (the engine request's abort) then
        runs to its end however often it awaits.

        Plain asyncio tasks and a callback, not an anyio task group: its cancel scopes
        cancelled the clean-up again at each of its awaits, and cost about 40 us more a
        request (bench/frontend.py inproc, 256-token streams: 0.15-0.5 us a token; issue 39)."""
        drain = getattr(getattr(scope.get("app"), "state", None), "drain", None)
        stream = asyncio.ensure_future(self._stream(send))
        stopped = False

        def stop() -> None:
            nonlocal stopped
            stopped = True
            stream.cancel()

        gone = asyncio.ensure_future(until_disconnect(receive))
        gone.add_done_callback(lambda _: stream.cancel())
        unwatch = drain.watch(stop) if drain is not None else None
        try:
            await stream        # (cancelling this task cancels the stream, and waits for it)
        except asyncio.CancelledError:
            if not stream.cancelled() or being_cancelled():
                raise
        finally:
            if unwatch is not None:
                unwatch()
            gone.cancel()
        if gone.done() and not gone.cancelled():
            gone.result()               # what failed while waiting for the client, if any
        if stopped and stream.cancelled():         # the server is stopping: say so
            await self._end(send, ServerShuttingDown())

    async def _stream(self, send: Send) -> None:
        events, encode = self._events, self._encoder.encode
        try:
            async for obj in events:
                await send({"type": "http.response.body", "body": encode(obj),
                            "more_body": True})
        except Exception as exc:  # noqa: BLE001 - after the 200, errors travel in-band
            if isinstance(exc, ModelUnloaded):      # an operator's act, not a fault
                log.info("stream ended: %s", exc.message)
            elif not isinstance(exc, PodiumError) or exc.status_code >= 500:
                log.exception("stream failed")
            await self._end(send, exc)
            return
        finally:
            await events.aclose()
        await send({"type": "http.response.body", "body": self._encoder.done,
                    "more_body": False})

    async def _end(self, send: Send, exc: BaseException) -> None:
        await send({"type": "http.response.body", "body": self._encoder.error(exc),
                    "more_body": True})
        await send({"type": "http.response.body", "body": self._encoder.done,
                    "more_body": False})


def being_cancelled() -> int:
    """Whether this task is being cancelled (by its caller), not only what it awaits."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


async def until_disconnect(receive: Receive) -> None:
    """Return when the client has gone (the request body has been read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass
