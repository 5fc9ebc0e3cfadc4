"""Request bodies parsed strictly, and big ones off the event loop.

FastAPI parses JSON bodies with ``Request.json()`` (the standard library's ``json``), which
accepts lone UTF-16 surrogates (``"\\ud800"``): strings Python holds but cannot encode,
so they fail later, deep inside the server, as 500s. ``PodiumRoute`` (FastAPI's documented
custom-route hook) gives every route a request whose ``json()`` uses orjson, which refuses
them (and anything else that is not valid UTF-8 JSON) as invalid JSON: a 400 at the edge.
Bodies over ``OFF_LOOP_BYTES`` are parsed on a worker thread, so a body of several
megabytes does not hold up other clients. The body's size is kept for the request
(``generation.BODY_BYTES``): a small request is prepared on the loop, a big one off it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from podium.generation import BODY_BYTES

OFF_LOOP_BYTES = 256 * 1024


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            BODY_BYTES.set(len(body))
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
