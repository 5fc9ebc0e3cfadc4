"""Remote MCP servers as Responses tools: the guard, and one session per server per response.

An ``mcp`` tool names a server by URL. A client-supplied URL is a request forgery risk, so
MCP is off until the operator allows URL prefixes (``--mcp-allow``): a URL no prefix allows
is a 400 naming the setting. A prefix allows its scheme, host and port exactly and the paths
under its own (``http://tools:9000/mcp`` allows ``/mcp`` and ``/mcp/x``, not ``/mcpx`` nor
``tools:9000.evil``); a path with dot segments or percent-encoded dots, slashes or backslashes
is refused outright (a server would resolve it to a path outside the prefix). The fence is
applied by the HTTP transport every session uses (``_Guard``), so it holds for every request
of either MCP transport, redirects and the SSE messages endpoint included. Headers that route
or frame a request (``Host``, ``Content-Length`` ...) are refused from the client.

A hostile but allowed server is bounded too: at most ``--mcp-max-bytes`` per response body
or SSE message, counted as bytes arrive (before the SDK parses them); at most
``--mcp-max-pages`` pages and ``--mcp-max-tools`` tools a listing; a tool with a name or an
input schema Podium cannot use is left out with a warning; what a call returns is cut to
``--mcp-max-output`` characters, then to ``--mcp-max-output-tokens`` tokens, the cut marked.
A request names at most ``--mcp-max-servers`` servers, and the process holds at most
``--mcp-max-sessions`` sessions at once.

A ``Session`` is held by a task of its own (the SDK's anyio cancel scopes must be entered
and left in one task); listings and calls are sent to it from the response's run with a
timeout each.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable
from urllib.parse import urlsplit

import httpx2

from podium.errors import InvalidRequestError
from podium.generation import off_loop
from podium.grammar import check_schema
from podium.protocol.chat import TOOL_NAME_PATTERN

log = logging.getLogger(__name__)

Obj = dict[str, Any]
TRUNCATED = "\n[output truncated by Podium: {kept} of {total} characters]"
TRUNCATED_TOKENS = "\n[output truncated by Podium: {kept} of {total} tokens]"
IDLE_TIMEOUTS = 10              # a session unused this many --mcp-timeout is closed
TIMEOUT_CODE = -32001           # JSON-RPC "request timed out", as MCP clients report it
# Headers that decide where a request goes or how its body is framed are Podium's (httpx's)
# to set: a client's Host picks the backend behind a virtual host, its Content-Length or
# Transfer-Encoding desynchronises the body, and the MCP ones belong to Podium's session.
ROUTING_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
    "trailer", "upgrade", "expect", "proxy-authorization", "proxy-authenticate",
    "proxy-connection", "forwarded", "x-forwarded-for", "x-forwarded-host",
    "x-forwarded-proto", "x-forwarded-port", "x-forwarded-prefix", "x-real-ip",
    "x-original-url", "x-rewrite-url", "x-http-method-override", "mcp-session-id",
    "mcp-protocol-version", "last-event-id"})
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[^\r\n\x00]*")
# what a server would decode or resolve into another path: %2e (.), %2f (/), %5c (\\), %25 (%)
_ENCODED = re.compile(r"%(2e|2f|5c|25)", re.IGNORECASE)
_TOOL_NAME = re.compile(TOOL_NAME_PATTERN)
MAX_TOOL_NAME = 128             # as translate's: the model sees MCP tools by their own names


@dataclass
class Limits:
    """The operator's bounds on MCP work (``--mcp-*``), and the process's session slots."""

    timeout: float = 30.0
    max_output: int = 32768             # characters of a call's output
    max_output_tokens: int = 0          # tokens of it (0: no limit)
    max_bytes: int = 256 * 1024         # of one response body or SSE message
    max_tools: int = 128
    max_pages: int = 8
    max_sessions: int = 64
    slots: asyncio.Semaphore | None = None      # made on first use, in the serving loop

    @classmethod
    def from_settings(cls, settings: Any, context_length: int = 0) -> "Limits":
        tokens = settings.mcp_max_output_tokens
        if tokens > 0 and context_length > 0:   # one output must leave room for the rest
            tokens = min(tokens, max(1, context_length // 4))
        return cls(settings.mcp_timeout, settings.mcp_max_output, tokens,
                   settings.mcp_max_bytes, settings.mcp_max_tools, settings.mcp_max_pages,
                   settings.mcp_max_sessions)

    def semaphore(self) -> asyncio.Semaphore:
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.max_sessions)
        return self.slots


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
            or target.password or _tricky(target.path):
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


def _tricky(path: str) -> bool:
    """Whether a URL path could mean another path to the server that resolves it: dot
    segments (``..;`` as Tomcat reads it too), encoded dots, slashes, backslashes or
    percent signs, backslashes."""
    if "\\" in path or _ENCODED.search(path):
        return True
    return any(segment.split(";", 1)[0] in (".", "..") for segment in path.split("/"))


def _path(url: str) -> str:
    try:
        return urlsplit(url).path
    except ValueError:
        return ""           # not a URL: the allow list refuses it, with its own message


def servers(tools: list[Obj] | None, allow: list[str], max_servers: int = 0) -> list[Server]:
    """The request's ``mcp`` tools, checked: how many, allowed URLs, headers, labels,
    approval rules."""
    found: list[Server] = []
    for i, tool in enumerate(tools or ()):
        if tool.get("type") != "mcp":
            continue
        where = f"tools[{i}]"
        if max_servers and len(found) >= max_servers:
            raise InvalidRequestError(
                f"A request may name at most {max_servers} mcp tools (MCP servers; the "
                f"operator's --mcp-max-servers)", param=where)
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
        if _tricky(_path(url)):
            raise InvalidRequestError(
                "server_url may not hold dot segments ('.', '..'), backslashes or "
                "percent-encoded dots, slashes, backslashes or '%'", param=f"{where}.server_url")
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
        headers = _headers(tool.get("headers"), f"{where}.headers")
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


def _headers(headers: Any, where: str) -> dict[str, str]:
    headers = headers or {}
    if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise InvalidRequestError("headers must map names to strings", param=where)
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name) or not _HEADER_VALUE.fullmatch(value):
            raise InvalidRequestError(f"Header {name!r}: not a valid HTTP header name and "
                                      f"value", param=f"{where}.{name}")
        if name.lower() in ROUTING_HEADERS:
            raise InvalidRequestError(
                f"Header {name!r} is Podium's to set (it routes or frames the request): "
                f"leave it out", param=f"{where}.{name}")
    return dict(headers)


class McpError(Exception):
    """A listing or call that did not work: its ``error`` as an item carries it."""

    def __init__(self, message: str, code: int = -32603):
        super().__init__(message)
        self.message = message
        self.code = code


class TooLarge(httpx2.StreamError):
    """A response body or SSE message past ``--mcp-max-bytes`` (a StreamError: the SDK turns
    it into the request's error rather than a crash)."""


class _Guard(httpx2.AsyncBaseTransport):
    """The HTTP transport under every request a session makes, whichever MCP transport, SSE
    endpoint or redirect made it: the request stays under ``--mcp-allow``, and the response
    is counted as it arrives, at most ``limit`` bytes a body or SSE message."""

    def __init__(self, allow: tuple[str, ...], limit: int,
                 breach: Callable[[McpError], McpError]):
        self._inner = httpx2.AsyncHTTPTransport(verify=_tls())
        self._allow = list(allow)
        self._limit = limit
        self._breach = breach

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not allowed_by(str(request.url), self._allow):
            # what is outside the fence is neither reached nor described (the error names
            # no path, and no status of one: it cannot be used to probe the origin)
            log.warning("MCP: refused a request to %s: outside --mcp-allow", request.url)
            raise self._breach(McpError("refused a request outside --mcp-allow (a redirect "
                                        "or an SSE endpoint the server named)"))
        response = await self._inner.handle_async_request(request)
        sse = response.headers.get("content-type", "").lower().startswith("text/event-stream")
        length = response.headers.get("content-length", "")
        if not sse and length.isdigit() and int(length) > self._limit:
            await response.aclose()
            raise self._too_large()
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _Counted(response.stream, self._limit, sse, self._too_large)
        return response

    def _too_large(self) -> TooLarge:
        message = f"sent more than --mcp-max-bytes ({self._limit} bytes) in one message"
        self._breach(McpError(message))
        return TooLarge(message)

    async def aclose(self) -> None:
        await self._inner.aclose()


def warm() -> None:
    """What the first session would otherwise do on the event loop, done once at start-up
    (on a worker thread): import the SDK's client (about a second) and make the TLS context."""
    import mcp.client.sse  # noqa: F401
    import mcp.client.streamable_http  # noqa: F401
    from mcp import Client  # noqa: F401

    _tls()


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every session: making one loads the CA bundle, about 50 ms of
    the event loop's time, which a burst of sessions would pay once each."""
    return httpx2.create_ssl_context()


_EOL = re.compile(rb"\r\n|\r|\n")


class _Counted(httpx2.AsyncByteStream):
    """A response body that fails once it passes ``limit`` bytes: the whole body, or for an
    event stream each event (the bytes since the last blank line)."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, sse: bool,
                 too_large: Callable[[], TooLarge]):
        self._inner, self._limit, self._sse, self._too_large = inner, limit, sse, too_large
        self._size = 0
        self._line = 0              # bytes of the current line (SSE)
        self._cr = False            # the last chunk ended in CR: a LF next ends that line

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            if self._sse:
                self._events(chunk)
            else:
                self._size += len(chunk)
            if self._size > self._limit:
                raise self._too_large()
            yield chunk

    def _events(self, chunk: bytes) -> None:
        start = 1 if self._cr and chunk.startswith(b"\n") else 0
        for end in _EOL.finditer(chunk, start):
            if self._line + end.start() - start == 0:
                self._size = 0              # a blank line: the event ended
            else:
                self._size += end.end() - start
                if self._size > self._limit:
                    return
            self._line, start = 0, end.end()
        self._line += len(chunk) - start
        self._size += len(chunk) - start
        self._cr = chunk.endswith(b"\r")

    async def aclose(self) -> None:
        await self._inner.aclose()


class Session:
    """One server's MCP session for one response, held open by a task of its own."""

    def __init__(self, server: Server, limits: Limits):
        self.server = server
        self._limits = limits
        self._timeout = limits.timeout
        self._client: Any = None
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # whoever waited may be gone (cancelled): the outcome is read here, never logged
        # as "Future exception was never retrieved"
        self._ready.add_done_callback(_retrieve)
        self._done = asyncio.Event()
        self._breached: McpError | None = None      # by the current listing or call
        self._broken = asyncio.Event()
        self._used = time.monotonic()
        self._queued = True                         # waiting for a session slot
        self._task = asyncio.create_task(self._hold(), name=f"podium-mcp-{server.label}")

    def _breach(self, error: McpError) -> McpError:
        if self._breached is None:
            self._breached = error
            self._broken.set()
        return error

    async def _hold(self) -> None:
        """Take a session slot, connect (streamable HTTP; the older HTTP+SSE transport when
        that fails), then hold the session open until ``close``."""
        slots = self._limits.semaphore()
        try:
            if not await _acquire(slots, self._timeout):
                raise McpError(self._no_slot())
            self._queued = False
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the session
            self._fail(exc)
            if not isinstance(exc, Exception):
                raise
            return
        try:
            await self._connect()
        finally:
            slots.release()

    def _no_slot(self) -> str:
        return (f"this server has --mcp-max-sessions ({self._limits.max_sessions}) MCP "
                f"sessions open; none freed within {self._timeout:g} s")

    async def _connect(self) -> None:
        from mcp import Client
        from mcp.client.sse import sse_client
        from mcp.client.streamable_http import streamable_http_client

        limits, server = self._limits, self.server

        def guarded(headers: Any = None, timeout: Any = None, auth: Any = None) -> Any:
            return httpx2.AsyncClient(
                headers=headers, timeout=timeout, auth=auth,
                transport=_Guard(server.allow, limits.max_bytes, self._breach))

        def streamable() -> Any:
            return streamable_http_client(server.url, http_client=http,
                                          max_sse_event_size=limits.max_bytes)

        def sse() -> Any:
            return sse_client(server.url, headers=server.headers, timeout=self._timeout,
                              httpx_client_factory=guarded)

        failures: list[str] = []
        try:
            async with guarded(server.headers, self._timeout) as http:
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
            self._fail(exc)
            if not isinstance(exc, Exception):
                raise
            log.info("MCP session %s ended: %s", server.label, _describe(exc))

    def _fail(self, exc: BaseException) -> None:
        if self._ready.done():
            return
        if isinstance(exc, asyncio.CancelledError):
            self._ready.cancel()
        else:
            self._ready.set_exception(exc)

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
        try:
            await asyncio.shield(self._ready)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._ready.cancelled() and task is not None and not task.cancelling():
                raise McpError("the session closed while connecting") from None
            raise
        return self._client

    async def list_tools(self) -> list[Obj]:
        """The tools the server lists that the request allows and the model can use: at
        most ``max_pages`` pages and ``max_tools`` tools, each page converted and checked
        off the event loop."""
        async def listing() -> list[Obj]:
            client = await self._connected()
            tools: list[Obj] = []
            cursor = None
            for _ in range(self._limits.max_pages):
                page = await client.list_tools(cursor=cursor)
                tools += await off_loop(_allowed_items, self.server, page.tools)
                if len(tools) > self._limits.max_tools:
                    raise McpError(f"lists more than --mcp-max-tools "
                                   f"({self._limits.max_tools}) tools: name the ones the "
                                   f"model needs in allowed_tools")
                cursor = page.next_cursor
                if not cursor:
                    return await off_loop(usable, tools, self.server.label)
            raise McpError(f"lists its tools in more than --mcp-max-pages "
                           f"({self._limits.max_pages}) pages")
        return await self._bounded(listing(), "listing its tools")

    async def call(self, name: str, arguments: Obj) -> tuple[str, bool]:
        """The call's output text and whether the tool said it failed."""
        async def calling() -> tuple[str, bool]:
            client = await self._connected()
            result = await client.call_tool(name, arguments)
            text = await off_loop(_text, result.content,
                                  result.structured_content)      # many parts: a worker's join
            return text, bool(result.is_error)
        return await self._bounded(calling(), f"calling {name!r}")

    async def _bounded(self, work: Any, what: str) -> Any:
        """``work`` within the timeout, failed at once by a breach of ``--mcp-max-bytes``
        or of the fence (the SDK may swallow the transport's error into a timeout)."""
        self._breached = None
        self._broken.clear()
        task = asyncio.ensure_future(work)
        broken = asyncio.ensure_future(self._broken.wait())
        try:
            await asyncio.wait((task, broken), timeout=self._timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            if self._breached is not None:
                raise McpError(f"MCP server {self.server.label!r} failed {what}: "
                               f"{self._breached.message}")
            if not task.done():
                why = (self._no_slot() if self._queued
                       else f"timed out {what} (after {self._timeout:g} s)")
                raise McpError(f"MCP server {self.server.label!r}: {why}", TIMEOUT_CODE)
            return task.result()
        except McpError:
            raise
        except Exception as exc:  # noqa: BLE001 - any transport or protocol failure
            raise McpError(f"MCP server {self.server.label!r} failed {what}: "
                           f"{_describe(exc)}", getattr(exc, "code", None) or -32603) from None
        finally:
            for pending in (task, broken):
                pending.cancel()
            await asyncio.gather(task, broken, return_exceptions=True)

    async def close(self) -> None:
        self._done.set()
        if not self._ready.done():          # still connecting: nothing to close politely
            self._task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 5)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - closing is best effort
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


async def _acquire(slots: asyncio.Semaphore, timeout: float) -> bool:
    """One of ``slots`` within ``timeout``; never one lost to a timeout or a cancel that
    races the grant (``asyncio.wait_for`` on 3.11 can lose one so)."""
    waiter = asyncio.ensure_future(slots.acquire())
    try:
        await asyncio.wait((waiter,), timeout=timeout)
    except BaseException:
        if waiter.done() and not waiter.cancelled():
            slots.release()
        waiter.cancel()             # a waiter cancelled before its grant gives it back
        raise
    if not waiter.done():
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    return waiter.done() and not waiter.cancelled()


def _allowed_items(server: Server, tools: list[Any]) -> list[Obj]:
    """A page of the SDK's tools as listing items, those the request allows."""
    out = []
    for t in tools:
        item: Obj = {"name": t.name, "input_schema": t.input_schema or {
            "type": "object", "properties": {}}}
        if t.description:
            item["description"] = t.description
        if t.annotations is not None:
            item["annotations"] = t.annotations.model_dump(by_alias=True,     # camelCase
                                                           exclude_none=True)
        if server.allows(item):
            out.append(item)
    return out


def usable(tools: list[Obj], label: str) -> list[Obj]:
    """``tools`` without those the model cannot be offered, each left out with a warning:
    a name outside chat's rule, a second tool of one name, an input schema that is not an
    object or that Podium's grammar checks refuse (a server is not the client: one bad
    tool costs that tool, not the request)."""
    kept, names = [], set()
    for tool in tools:
        name, schema = tool.get("name"), tool.get("input_schema")
        reason = None
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name) \
                or len(name) > MAX_TOOL_NAME:
            reason = "its name is not one a model can call (letters, digits, '_', '-', '.')"
        elif name in names:
            reason = "a second tool of that name"
        elif not isinstance(schema, dict):
            reason = "its input_schema is not a JSON schema object"
        else:
            try:
                check_schema(schema, "input_schema")
            except InvalidRequestError as exc:
                reason = f"its input_schema: {exc.message}"
        if reason is not None:
            log.warning("MCP server %s: tool %.80r left out: %s", label, name, reason)
            continue
        names.add(name)
        kept.append(tool)
    return kept


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


def cap_tokens(text: str, limit: int, tokenizer: Any) -> str:
    """``text`` cut to ``limit`` of the model's tokens, the cut marked: what the model's
    context pays for (characters are a first, cheap bound only)."""
    if limit <= 0 or tokenizer is None:
        return text
    ids = tokenizer.encode(text, add_special=False)
    if len(ids) <= limit:
        return text
    return tokenizer.decode(ids[:limit]) + TRUNCATED_TOKENS.format(kept=limit, total=len(ids))


class Sessions:
    """The sessions of one response, opened when first needed and closed together."""

    def __init__(self, servers: list[Server], limits: Limits, tokenizer: Any = None):
        self.servers = {s.label: s for s in servers}
        self.limits = limits
        self._tokenizer = tokenizer         # the engine's: outputs are capped in its tokens
        self._open: dict[str, Session] = {}

    def session(self, label: str) -> Session:
        if label not in self._open or self._open[label].ended:
            self._open[label] = Session(self.servers[label], self.limits)
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
        text = await off_loop(self._capped, text)
        if failed:
            return None, {"type": "mcp_tool_execution_error",
                          "content": [{"type": "text", "text": text}]}
        return text, None

    def _capped(self, text: str) -> str:
        text = cap(text, self.limits.max_output)
        return cap_tokens(text, self.limits.max_output_tokens, self._tokenizer)

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
