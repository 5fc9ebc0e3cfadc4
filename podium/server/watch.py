"""Non-streamed answers that stop when nobody is waiting for them.

A streamed answer watches its connection (``podium.server.sse``); a non-streamed one is a
single await that can run for minutes. ``unless_gone`` runs that await beside a watch on the
connection and on the server's shutdown: a client that goes away cancels the work at once
(closing the engine requests it holds), and so does the end of the shutdown grace period,
which then answers 503 ``server_shutting_down``.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

from starlette.requests import Request

from podium.errors import PodiumError
from podium.server.sse import ServerShuttingDown, being_cancelled, until_disconnect

T = TypeVar("T")


class ClientDisconnected(PodiumError):
    """The client closed the connection before the answer was ready (499, never sent)."""

    status_code = 499
    error_type = "invalid_request_error"
    default_code = "client_disconnected"


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, unless the client leaves first (``ClientDisconnected``) or the
    shutdown grace period ends first (``ServerShuttingDown``); either cancels ``work``."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnect(request.receive))
    # the watch ends the work from a callback, as sse.SSEResponse's does: the work alone is
    # awaited, not the pair (asyncio.wait and gather: ~10 us more a request)
    gone.add_done_callback(lambda _: task.cancel())
    drain = getattr(request.app.state, "drain", None)
    stopped = False

    def stop() -> None:
        nonlocal stopped
        stopped = True
        task.cancel()

    unwatch = drain.watch(stop) if drain is not None else None
    try:
        return await task       # (cancelling this task cancels the work, and waits for it)
    except asyncio.CancelledError:
        if not task.cancelled() or being_cancelled():
            raise
        if stopped:
            raise ServerShuttingDown() from None
        raise ClientDisconnected("The client closed the connection; the request was "
                                 "stopped") from None
    finally:
        gone.cancel()
        if unwatch is not None:
            unwatch()
        if gone.done() and not gone.cancelled():
            gone.exception()        # retrieved: a watch that failed ended the work as a leave
