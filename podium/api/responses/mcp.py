"""Remote MCP servers as Responses tools: the guard, and one session per server per response.

An ``mcp`` tool names a server by URL. A client-supplied URL is a request forgery risk, so
MCP is off until the operator allows URL prefixes (``--mcp-allow``): a URL no prefix allows
is a 400 naming the setting. A prefix allows its scheme, host and port exactly and the paths
under its own (``http://tools:9000/mcp`` allows ``/mcp`` and ``/mcp/x``, not ``/mcpx`` nor
``tools:9000.evil``); the SDK follows no redirect off the endpoint's origin.

A ``Session`` is held by a task of its own (the SDK's anyio cancel scopes must be entered
and left in one task); listings and calls are sent to it from the response's run with a
timeout each, and what a tool returns is cut to ``--mcp-max-output`` characters, marked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from podium.errors import InvalidRequestError

log = logging.getLogger(__name__)

Obj = dict[str, Any]
TRUNCATED = "\n[output truncated by Podium: {kept} of {total} characters]"
IDLE_TIMEOUTS = 10              # a session unused this many --mcp-timeout is closed
TIMEOUT_CODE = -32001           # JSON-RPC "request timed out", as MCP clients report it


@dataclass
class Server:
    """One ``mcp`` tool of the request: a server, which of its tools the model may see, and
    which of their calls need the client's approval."""

    label: str
    url: str
    where: str                              # "tools[2]"
    headers: dict[str, str] = field(default_factory=dict)
    allowed: set[str] | None = None         # None: every tool the server lists
    read_only: bool = False                 # allowed_tools.read_only: annotated tools only
    approval: Any = "always"                # "always" | "never" | {always, never}
    description: str | None = None
    allow: tuple[str, ...] = ()             # the operator's --mcp-allow prefixes

    def allows(self, tool: Obj) -> bool:
        if self.allowed is not None and tool["name"] not in self.allowed:
            return False
        if self.read_only:
            return bool((tool.get("annotations") or {}).get("readOnlyHint"))
        return True

    def needs_approval(self, name: str, read_only: bool = False) -> bool:
        rule = self.approval
        if isinstance(rule, str):
            return rule != "never"
        for key, verdict in (("never", False), ("always", True)):
            names = _filter_names(rule.get(key))
            if names is not None and name in names:
                return verdict
            if (rule.get(key) or {}).get("read_only") and read_only:
                return verdict
        return True         # named in neither: approval, as OpenAI's API asks for it


def _filter_names(value: Any) -> set[str] | None:
    if isinstance(value, dict) and isinstance(value.get("tool_names"), list):
        return set(value["tool_names"])
    return None


def allowed_by(url: str, prefixes: list[str]) -> bool:
    """Whether one of ``prefixes`` allows ``url`` (same origin, path under the prefix's)."""
    try:
        target = urlsplit(url)
        port = target.port
    except ValueError:
        return False
    if target.scheme not in ("http", "https") or not target.hostname or target.username \
            or target.password:
        return False
    for prefix in prefixes:
        try:
            allow = urlsplit(prefix)
            allow_port = allow.port
        except ValueError:
            continue
        if (allow.scheme, allow.hostname, allow_port) != (target.scheme, target.hostname, port):
            continue
        base = allow.path.rstrip("/")
        if not base or target.path == base or target.path.startswith(base + "/"):
            return True
    return False


def servers(tools: list[Obj] | None, allow: list[str]) -> list[Server]:
    """The request's ``mcp`` tools, checked: allowed URLs, labels, approval rules."""
    found: list[Server] = []
    for i, tool in enumerate(tools or ()):
        if tool.get("type") != "mcp":
            continue
        where = f"tools[{i}]"
        url = tool.get("server_url")
        if tool.get("connector_id") and not url:
            raise InvalidRequestError("MCP connectors are not supported: give a server_url",
                                      param=f"{where}.connector_id")
        if not isinstance(url, str) or not url:
            raise InvalidRequestError("An mcp tool needs a server_url",
                                      param=f"{where}.server_url")
        if not allow:
            raise InvalidRequestError(
                "MCP tools are off on this server: its operator allows MCP servers with "
                "--mcp-allow PREFIX", param=f"{where}.server_url")
        if not allowed_by(url, allow):
            raise InvalidRequestError(
                f"server_url {url!r} is not allowed on this server (its operator allows MCP "
                f"servers with --mcp-allow PREFIX)", param=f"{where}.server_url")
        label = tool.get("server_label")
        if not isinstance(label, str) or not label:
            raise InvalidRequestError("An mcp tool needs a server_label",
                                      param=f"{where}.server_label")
        if any(s.label == label for s in found):
            raise InvalidRequestError(f"Two mcp tools are labelled {label!r}",
                                      param=f"{where}.server_label")
        headers = tool.get("headers") or {}
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise InvalidRequestError("headers must map names to strings",
                                      param=f"{where}.headers")
        headers = dict(headers)
        if tool.get("authorization"):
            headers["Authorization"] = f"Bearer {tool['authorization']}"
        allowed, read_only = tool.get("allowed_tools"), False
        if isinstance(allowed, dict):
            read_only = bool(allowed.get("read_only"))
            allowed = allowed.get("tool_names")
        if allowed is not None and not (isinstance(allowed, list)
                                        and all(isinstance(n, str) for n in allowed)):
            raise InvalidRequestError("allowed_tools must be a list of tool names or "
                                      "{tool_names, read_only}",
                                      param=f"{where}.allowed_tools")
        approval = tool.get("require_approval") or "always"
        if not (approval in ("always", "never") or isinstance(approval, dict)):
            raise InvalidRequestError('require_approval must be "always", "never" or '
                                      '{always, never}', param=f"{where}.require_approval")
        found.append(Server(label, url, where, headers,
                            set(allowed) if allowed is not None else None, read_only,
                            approval, tool.get("server_description"), tuple(allow)))
    return found


class McpError(Exception):
    """A listing or call that did not work: its ``error`` as an item carries it."""

    def __init__(self, message: str, code: int = -32603):
        super().__init__(message)
        self.message = message
        self.code = code


class Session:
    """One server's MCP session for one response, held open by a task of its own."""

    def __init__(self, server: Server, timeout: float):
        self.server = server
        self._timeout = timeout
        self._client: Any = None
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._done = asyncio.Event()
        self._used = time.monotonic()
        self._task = asyncio.create_task(self._hold(), name=f"podium-mcp-{server.label}")

    async def _hold(self) -> None:
        """Connect (streamable HTTP; the older HTTP+SSE transport when that fails), then
        hold the session open until ``close``."""
        import httpx2
        from mcp import Client
        from mcp.client.sse import sse_client
        from mcp.client.streamable_http import streamable_http_client

        def streamable() -> Any:
            return streamable_http_client(self.server.url, http_client=http)

        allow = self.server.allow

        async def inside(request: Any) -> None:
            """Every streamable-HTTP request, a followed redirect's too, stays under an
            allowed prefix. (Over SSE the server names the endpoint messages go to; the SDK
            keeps that on the stream's origin.)"""
            if allow and not allowed_by(str(request.url), list(allow)):
                raise McpError(f"refused a request to {request.url}: outside --mcp-allow")

        def fenced(headers: Any = None, timeout: Any = None, auth: Any = None) -> Any:
            return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth,
                                      event_hooks={"request": [inside]})

        def sse() -> Any:
            return sse_client(self.server.url, headers=self.server.headers,
                              timeout=self._timeout)

        failures: list[str] = []
        try:
            async with fenced(self.server.headers, self._timeout) as http:
                for name, transport in (("streamable HTTP", streamable), ("SSE", sse)):
                    try:
                        async with Client(transport(),
                                          read_timeout_seconds=self._timeout) as client:
                            self._client = client
                            self._ready.set_result(None)
                            await self._idle()
                            return
                    except Exception as exc:  # noqa: BLE001 - the next transport, or the end
                        if self._ready.done():
                            raise
                        failures.append(f"{name}: {_describe(exc)}")
                raise McpError("could not connect (" + "; ".join(failures) + ")")
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the session
            if not self._ready.done():
                self._ready.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            log.info("MCP session %s ended: %s", self.server.label, _describe(exc))

    async def _idle(self) -> None:
        """Until ``close``, or until unused for ``IDLE_TIMEOUTS`` timeouts (a response whose
        run never began cannot leave a session open for ever; a later call reconnects)."""
        idle = IDLE_TIMEOUTS * self._timeout
        while True:
            try:
                await asyncio.wait_for(self._done.wait(), idle)
                return
            except asyncio.TimeoutError:
                if time.monotonic() - self._used >= idle:
                    log.info("MCP session %s closed: unused for %g s", self.server.label, idle)
                    return

    @property
    def ended(self) -> bool:
        return self._task.done()

    async def _connected(self) -> Any:
        self._used = time.monotonic()
        await asyncio.shield(self._ready)
        return self._client

    async def list_tools(self) -> list[Obj]:
        async def listing() -> list[Obj]:
            client = await self._connected()
            tools, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    break
            out = []
            for t in tools:
                item: Obj = {"name": t.name, "input_schema": t.input_schema or {
                    "type": "object", "properties": {}}}
                if t.description:
                    item["description"] = t.description
                if t.annotations is not None:
                    item["annotations"] = t.annotations.model_dump(by_alias=True,   # camelCase
                                                                   exclude_none=True)
                out.append(item)
            return out
        return await self._bounded(listing(), "listing its tools")

    async def call(self, name: str, arguments: Obj) -> tuple[str, bool]:
        """The call's output text and whether the tool said it failed."""
        async def calling() -> tuple[str, bool]:
            client = await self._connected()
            result = await client.call_tool(name, arguments)
            return _text(result.content, result.structured_content), bool(result.is_error)
        return await self._bounded(calling(), f"calling {name!r}")

    async def _bounded(self, work: Any, what: str) -> Any:
        try:
            return await asyncio.wait_for(work, self._timeout)
        except asyncio.TimeoutError:
            raise McpError(f"MCP server {self.server.label!r} timed out {what} "
                           f"(after {self._timeout:g} s)", TIMEOUT_CODE) from None
        except McpError:
            raise
        except Exception as exc:  # noqa: BLE001 - any transport or protocol failure
            raise McpError(f"MCP server {self.server.label!r} failed {what}: "
                           f"{_describe(exc)}", getattr(exc, "code", None) or -32603) from None

    async def close(self) -> None:
        self._done.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 5)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - closing is best effort
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return str(exc) or type(exc).__name__


def _text(content: list[Any], structured: Any) -> str:
    texts = [c.text for c in content if getattr(c, "type", None) == "text"]
    if texts:
        return "\n".join(texts)
    if structured is not None:
        return json.dumps(structured, ensure_ascii=False)
    return json.dumps([c.model_dump(exclude_none=True) for c in content], ensure_ascii=False)


def cap(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut marked (a marked cut is never longer
    than the limit allows plus its mark)."""
    if limit <= 0 or len(text) <= limit:
        return text
    return text[:limit] + TRUNCATED.format(kept=limit, total=len(text))


class Sessions:
    """The sessions of one response, opened when first needed and closed together."""

    def __init__(self, servers: list[Server], timeout: float, max_output: int):
        self.servers = {s.label: s for s in servers}
        self._timeout = timeout
        self.max_output = max_output
        self._open: dict[str, Session] = {}

    def session(self, label: str) -> Session:
        if label not in self._open or self._open[label].ended:
            self._open[label] = Session(self.servers[label], self._timeout)
        return self._open[label]

    async def call(self, label: str, name: str, arguments: str) -> tuple[str | None, Obj | None]:
        """(output, None), or (None, the mcp_call's error object)."""
        try:
            args = json.loads(arguments or "{}")
        except ValueError as exc:
            return None, {"type": "mcp_protocol_error", "code": -32602,
                          "message": f"The arguments are not JSON: {exc}"}
        if not isinstance(args, dict):
            return None, {"type": "mcp_protocol_error", "code": -32602,
                          "message": "The arguments must be a JSON object"}
        try:
            text, failed = await self.session(label).call(name, args)
        except McpError as exc:
            return None, {"type": "mcp_protocol_error", "code": exc.code,
                          "message": exc.message}
        text = cap(text, self.max_output)
        if failed:
            return None, {"type": "mcp_tool_execution_error",
                          "content": [{"type": "text", "text": text}]}
        return text, None

    async def close(self) -> None:
        sessions, self._open = list(self._open.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


def error_text(error: Obj) -> str:
    """What the model reads of a failed call."""
    if error.get("type") == "mcp_tool_execution_error":
        parts = error.get("content") or []
        text = "\n".join(p.get("text", "") for p in parts if isinstance(p, dict))
        return f"Error: {text or 'the tool failed'}"
    return f"Error: {error.get('message') or 'the call failed'}"
