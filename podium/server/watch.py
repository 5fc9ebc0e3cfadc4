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
from podium.server.sse import ServerShuttingDown, until_disconnect

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
    drain = getattr(request.app.state, "drain", None)
    stopped = False

    def stop() -> None:
        nonlocal stopped
        stopped = True
        task.cancel()

    unwatch = drain.watch(stop) if drain is not None else None
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if unwatch is not None:
            unwatch()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if stopped and task.cancelled():
        raise ServerShuttingDown()
    if task.cancelled():
        raise ClientDisconnected("The client closed the connection; the request was stopped")
    return task.result()
