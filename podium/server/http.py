"""Limits on how a client sends a request: the size of its head, the time the head may take,
and the pauses in its body.

uvicorn (0.54) sets none of these. ``HttpToolsProtocol`` (``uvicorn.protocols.http.
httptools_impl``, what ``http="auto"`` picks when httptools is installed) feeds every byte to
llhttp, which has no limit on a request head, while httptools and uvicorn join the header
values and the URL piece by piece (``bytes +=``): 64 MB of headers are read, joined, and
answered 200. Its only timer is keep-alive, armed after a response (``on_response_complete``)
and cancelled by any byte received, so a connection that opens and sends nothing, or trickles
a head or a body a byte at a time, is held for as long as the client likes. (The h11 protocol
caps a head at ``h11_max_incomplete_event_size``, 16 KiB, but has no read timeouts either.)

``guarded_http(limits)`` is the protocol class Podium gives ``uvicorn.Config(http=...)``. It
stands between the transport and uvicorn's httptools protocol: each chunk received goes first
through a parser of its own (llhttp again, through httptools, with only the callbacks that
mark where heads, bodies and messages begin and end), then on, unchanged, to uvicorn's
protocol. It

- refuses more than ``max_header_bytes`` of non-body bytes in a row (a head; or the framing
  and trailers of a chunked body): 431 and close when no request has started on the
  connection yet, else close; uvicorn's protocol never sees the excess. The parser is fed
  just enough to tell whether the limit is passed, so it holds to the byte (to within
  ``SLICE`` for a head that arrives in one read behind the end of a body).
- closes a connection whose request head is not complete ``header_timeout`` seconds after
  the connection opened, or after the first byte following the previous request;
- closes a connection whose request body stalls: no byte for ``body_timeout`` seconds, or
  fallen ``body_timeout`` seconds behind a pace of ``body_min_rate`` bytes a second (a gap
  timeout alone lets a body trickle in a byte a second for ever). Time spent with reading
  paused by uvicorn, because the app is not asking for the body yet or a pipelined request
  waits, does not count.

Responses go from uvicorn's protocol straight to the transport: the guard sees only what the
client sends, so streaming a response costs nothing extra.

What this relies on: ``uvicorn.Config(http=<asyncio.Protocol class>)`` (its documented
type), with uvicorn's keywords for each connection's protocol passed through untouched to
``HttpToolsProtocol``, the class behind ``http="httptools"``, which is used only through the
``asyncio.Protocol`` methods; httptools' ``HttpRequestParser`` (``feed_data``,
``set_dangerous_leniencies``, the ``on_*`` callbacks, ``HttpParserError``,
``HttpParserUpgrade``); asyncio transports (``is_reading``, ``get_protocol``,
``write_eof``). Both parsers are the same llhttp with the leniency uvicorn sets
(``lenient_data_after_close``), so they agree on where each message ends; if the guard's
parser ever rejects bytes, the connection is closed whatever uvicorn's made of them.
``tests/server/test_http_limits.py`` runs the real server, on uvloop and asyncio, through
all of it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from podium.errors import error_body

log = logging.getLogger(__name__)

SLICE = 16384       # most bytes parsed between two checks of the head size
LINGER = 1.0        # seconds a refused client gets to read its 431 before the close

_IDLE, _HEAD, _BODY = "idle", "head", "body"


@dataclass(frozen=True)
class HTTPLimits:
    """What a client may do while sending a request (0 turns a limit off)."""

    max_header_bytes: int = 64 * 1024
    header_timeout: float = 30.0
    body_timeout: float = 30.0
    body_min_rate: int = 1024


def guarded_http(limits: HTTPLimits) -> type[asyncio.Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` that holds clients to ``limits``."""
    return type("GuardedHTTP", (GuardedHTTP,), {"limits": limits})


def _too_large(limit: int) -> bytes:
    body = orjson.dumps(error_body(
        f"The request head (request line and headers) is larger than {limit} bytes",
        "invalid_request_error", None, "request_header_fields_too_large"))
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (len(body), body))


class GuardedHTTP(asyncio.Protocol):
    """uvicorn's httptools protocol behind the checks of ``limits`` (see the module
    docstring). The ``on_*`` methods are the guard parser's callbacks."""

    limits = HTTPLimits()

    def __init__(self, **uvicorn_kwargs: Any) -> None:
        self._inner = HttpToolsProtocol(**uvicorn_kwargs)
        self._loop = asyncio.get_running_loop()
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self._transport: asyncio.Transport
        self._phase = _IDLE
        self._framing = True        # the bytes arriving now are not body payload
        self._run = 0               # non-body bytes in a row
        self._body_bytes = 0        # body bytes in the slice being parsed
        self._headed = False        # a request head has completed on this connection
        self._discard: int | None = None    # after a 431: bytes still read before closing
        self._timer: asyncio.TimerHandle | None = None
        self._timing: str | None = None     # _HEAD or _BODY: what the timer waits for
        self._seconds = self._deadline = 0.0
        self._paced = 0.0                   # when the body falls behind body_min_rate

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport             # type: ignore[assignment]
        self._inner.connection_made(transport)  # type: ignore[arg-type]
        self._start_timer(_HEAD)

    def data_received(self, data: bytes) -> None:
        if self._discard is not None:
            self._discard -= len(data)
            if self._discard < 0:
                self._transport.close()
            return
        if self._parser is None:
            return self._inner.data_received(data)
        if self._phase is _IDLE and self._timing is None:
            self._start_timer(_HEAD)
        try:
            within = self._parse(data)
        except httptools.HttpParserUpgrade:
            return self._upgrade(data)
        except httptools.HttpParserError:
            return self._invalid(data)
        if not within:
            return self._refuse()
        self._inner.data_received(data)
        if self._phase is _BODY:
            self._body_moved(len(data))

    def eof_received(self) -> bool | None:
        self._inner.eof_received()
        return None             # uvicorn's protocols never keep a half-closed transport open

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    # -- the guard parser ------------------------------------------------------------------

    def _parse(self, data: bytes) -> bool:
        """Feed ``data`` to the guard's parser; False once more than ``max_header_bytes``
        non-body bytes have come in a row."""
        assert self._parser is not None
        view, limit, start = memoryview(data), self.limits.max_header_bytes, 0
        while start < len(view):
            size = min(SLICE, limit - self._run + 1) if limit and self._framing else SLICE
            piece = view[start:start + size]
            start += size
            self._body_bytes = 0
            self._parser.feed_data(piece)
            if self._framing:
                self._run += len(piece) - self._body_bytes
                if limit and self._run > limit:
                    return False
        return True

    def on_message_begin(self) -> None:
        self._phase, self._run = _HEAD, 0
        if self._timing is not _HEAD:
            self._start_timer(_HEAD)

    def on_headers_complete(self) -> None:
        self._phase, self._framing, self._run, self._headed = _BODY, False, 0, True
        self._stop_timer()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        self._framing, self._run = False, 0

    def on_chunk_header(self) -> None:
        self._framing = True

    on_chunk_complete = on_chunk_header

    def on_message_complete(self) -> None:
        self._phase, self._framing = _IDLE, True
        self._stop_timer()

    # -- outcomes --------------------------------------------------------------------------

    def _refuse(self) -> None:
        """Past ``max_header_bytes``: answer 431 if no request has started (else a response
        may own the connection), then close, letting the client read the answer first."""
        limit = self.limits.max_header_bytes
        log.info("closing a connection from %s: over %d bytes of request head", self._peer(),
                 limit)
        self._forget()
        if self._headed:
            return self._transport.close()
        self._transport.write(_too_large(limit))
        if self._transport.can_write_eof():
            self._transport.write_eof()
        self._discard = limit
        self._loop.call_later(LINGER, self._transport.close)

    def _upgrade(self, data: bytes) -> None:
        """An Upgrade request: uvicorn's protocol either hands the connection to its
        WebSocket protocol (no longer HTTP: stop guarding) or carries on as HTTP."""
        self._inner.data_received(data)
        if self._transport.get_protocol() is not self:
            self._forget()

    def _invalid(self, data: bytes) -> None:
        """Bytes llhttp rejects: uvicorn's protocol (the same llhttp) answers 400 and closes."""
        self._forget()
        self._inner.data_received(data)
        if not self._transport.is_closing():
            self._transport.close()

    def _forget(self) -> None:
        self._parser = None
        self._stop_timer()

    def _peer(self) -> str:
        peer = self._transport.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"

    # -- the timer -------------------------------------------------------------------------

    def _start_timer(self, what: str) -> None:
        self._stop_timer()
        seconds = self.limits.header_timeout if what is _HEAD else self.limits.body_timeout
        if seconds:
            self._timing, self._seconds = what, seconds
            self._deadline = self._paced = self._loop.time() + seconds
            self._timer = self._loop.call_at(self._deadline, self._expire)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timing = None

    def _body_moved(self, size: int) -> None:
        """``size`` more bytes of body: the timer now waits ``body_timeout`` from now, or until
        the body falls that far behind ``body_min_rate`` (it reads ``_deadline`` when it
        fires; a deadline never moves earlier)."""
        if self._timing is not _BODY:
            return self._start_timer(_BODY)
        rate = self.limits.body_min_rate
        self._paced = self._paced + size / rate if rate else math.inf
        self._deadline = min(self._loop.time() + self._seconds, self._paced)

    def _expire(self) -> None:
        self._timer = None
        transport, now = self._transport, self._loop.time()
        if transport.is_closing():
            return
        if not transport.is_reading():         # uvicorn is holding the client back
            self._deadline = now + self._seconds
            self._paced = max(self._paced, self._deadline)
        if now < self._deadline:
            self._timer = self._loop.call_at(self._deadline, self._expire)
            return
        waited = ("no complete request head" if self._timing is _HEAD else
                  "the request body stalled")
        log.info("closing a connection from %s: %s for %g s", self._peer(), waited,
                 self._seconds)
        self._timing = None
        transport.close()
