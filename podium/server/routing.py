"""Request bodies parsed strictly, and big ones off the event loop.

FastAPI parses JSON bodies with ``Request.json()`` (the standard library's ``json``), which
accepts lone UTF-16 surrogates (``"\\ud800"``): strings Python holds but cannot encode,
so they fail later, deep inside the server, as 500s. ``PodiumRoute`` (FastAPI's documented
custom-route hook) gives every route a request whose ``json()`` uses orjson, which refuses
them (and anything else that is not valid UTF-8 JSON) as invalid JSON: a 400 at the edge.
Bodies over ``OFF_LOOP_BYTES`` are parsed on a worker thread, so a body of several
megabytes does not hold up other clients. The body's size is kept on the request
(``request.state.body_bytes``), and the route tells its service whether it is ``small``: a
small request is prepared on the loop, a big one off it (``generation.off_loop``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

OFF_LOOP_BYTES = 256 * 1024
# Preparing a request of up to this many body bytes takes at most about 2 ms (rendering and
# tokenizing some 2,500 tokens, ~0.9 us a token): it is done at once on the event loop.
# Handing it to a worker thread costs several times the work itself (thread wake-ups and
# the two threads taking the GIL from each other: measured, issue 19), and the loop would
# wait as long for the GIL meanwhile.
INLINE_BODY_BYTES = 8 * 1024


def small(request: Request) -> bool:
    """Whether the request's JSON body (parsed by ``StrictJSONRequest``) is at most
    ``INLINE_BODY_BYTES``: cheaper to prepare on the event loop than on a worker."""
    size = getattr(request.state, "body_bytes", None)
    return size is not None and size <= INLINE_BODY_BYTES


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            self.state.body_bytes = len(body)
            # orjson.JSONDecodeError is a json.JSONDecodeError: FastAPI reports it as a 400
            if len(body) > OFF_LOOP_BYTES:
                self._json = await asyncio.to_thread(orjson.loads, body)
            else:
                self._json = orjson.loads(body)
        return self._json


class PodiumRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_json(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_json
