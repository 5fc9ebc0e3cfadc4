"""The web UI: ``GET /`` from a browser (the page) and ``/ui/...`` (its scripts, styles and
fonts), static files shipped in the package (podium/ui/), compressed, under a strict
Content-Security-Policy. ``/`` asked without HTML in ``Accept`` is Ollama's liveness probe,
answered by its route as before.

The page is a client of the API like any other: it sends the key typed into it as a Bearer
token, so it reaches nothing that key cannot. Its files are public (a key cannot be asked
for before the page that asks for it is loaded), so they are answered ahead of the key and
limit middleware (``install`` wraps the app outermost); every other path goes on untouched.
The policy lets the page run only its own files: no inline script, no ``eval``, no remote
images, fonts or connections, no framing; model output is sanitized by the page as well
(podium/ui/js/render.js), and the policy stops what a sanitizer might miss.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.middleware.gzip import GZipMiddleware
from starlette.responses import PlainTextResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
          "font-src 'self'; connect-src 'self'; manifest-src 'self'; base-uri 'none'; "
          "form-action 'none'; frame-ancestors 'none'")
HEADERS = [(b"content-security-policy", POLICY.encode()),
           (b"x-content-type-options", b"nosniff"),
           (b"referrer-policy", b"no-referrer"),
           (b"x-frame-options", b"DENY"),
           # revalidated on every load (a 304 by the ETag): an upgraded server's page is new
           (b"cache-control", b"no-cache")]
PREFIX = "/ui/"


class UIMiddleware:
    """Answers the page's requests (``_ours``) from the package's files; the rest goes to
    ``app``."""

    def __init__(self, app: ASGIApp):
        self.app = app
        self._files = GZipMiddleware(StaticFiles(packages=[("podium", "ui")]),
                                     minimum_size=1024)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _ours(scope):
            return await self.app(scope, receive, send)
        path = scope["path"]
        inner = "/index.html" if path == "/" else "/" + path[len(PREFIX):]

        async def with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *HEADERS]}
            await send(message)

        try:
            await self._files({**scope, "path": inner, "root_path": ""}, receive, with_policy)
        except HTTPException as exc:    # no such file (raised before anything is sent)
            await PlainTextResponse(exc.detail, exc.status_code)(scope, receive, with_policy)


def _ours(scope: Scope) -> bool:
    """``GET``/``HEAD`` of ``/ui/...``, and of ``/`` from a browser (it asks for HTML):
    Ollama's clients probe ``/`` for its text "Ollama is running", which stays theirs."""
    if scope["method"] not in ("GET", "HEAD"):
        return False
    if scope["path"] != "/":
        return scope["path"].startswith(PREFIX)
    accept = dict(scope["headers"]).get(b"accept", b"")
    return b"text/html" in accept


def install(app: FastAPI, enabled: bool) -> None:
    """Serve the UI ahead of every other middleware (added last: outermost), if enabled."""
    if enabled:
        app.add_middleware(UIMiddleware)
