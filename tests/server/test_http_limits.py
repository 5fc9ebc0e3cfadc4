"""Slow and huge requests do not hold the server: the real server (``podium serve``'s uvicorn
configuration, on the scripted engine), spoken to over raw sockets."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from podium.cli import uvicorn_config
from podium.server.app import create_app
from podium.server.lifecycle import Server
from podium.settings import Settings
from tests.conftest import SERVED

CHAT = json.dumps({"model": SERVED, "stream": True,
                   "messages": [{"role": "user", "content": "go"}]}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=["uvloop", "asyncio"])
def serve(request, scripted, tmp_path):
    """``serve(**settings)`` starts the server in a thread, on uvloop and on asyncio's own
    loop (a reply streamed over ~0.6 s), and returns its port."""
    running = []

    def start(**overrides) -> int:
        settings = Settings(port=free_port(), log_level="warning", shutdown_grace=1,
                            store_url=f"sqlite:///{tmp_path / 'limits.db'}", **overrides)
        app = create_app(settings, scripted(["one two three four five six seven eight nine "
                                             "ten eleven twelve"], delay=0.05))
        config = uvicorn_config(settings, app)
        config.loop = request.param
        server = Server(config, app.state.drain, grace=1)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        running.append((server, thread))
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return settings.port

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(10)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def request(path: str = "/health", method: str = "GET", body: bytes = b"",
            headers: bytes = b"") -> bytes:
    length = b"Content-Length: %d\r\n" % len(body) if method == "POST" else b""
    return (b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s%s\r\n%s"
            % (method.encode(), path.encode(), length, headers, body))


def chunked(body: bytes, trailer: bytes = b"") -> bytes:
    """A chat completion request with ``body`` sent chunked (two chunks), then ``trailer``."""
    head = request("/v1/chat/completions", headers=b"Transfer-Encoding: chunked\r\n")
    half = len(body) // 2
    return (head.replace(b"GET", b"POST", 1) + b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n%s\r\n"
            % (half, body[:half], len(body) - half, body[half:], trailer))


def read_response(stream) -> tuple[int, bytes]:
    """One HTTP/1.1 response from ``stream`` (a socket's file): status and body."""
    status = int(stream.readline().split()[1])
    fields = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip()
    if fields.get(b"transfer-encoding") != b"chunked":
        return status, stream.read(int(fields.get(b"content-length", 0)))
    body = b""
    while size := int(stream.readline().split(b";")[0], 16):
        body += stream.read(size)
        stream.readline()
    stream.readline()
    return status, body


def answer_to(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; everything the server says until it closes."""
    with connect(port) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        return received


def seconds_until_closed(sock: socket.socket, drip: bytes = b"", every: float = 0.2,
                         give_up: float = 5.0) -> float:
    """Send ``drip`` one byte every ``every`` seconds (nothing if empty) until the server
    closes the connection; the seconds that took (``give_up`` if it stays open)."""
    start, sent = time.monotonic(), 0
    sock.settimeout(every)
    while time.monotonic() - start < give_up:
        try:
            if drip:
                sock.send(drip[sent % len(drip):][:1])
                sent += 1
            if sock.recv(65536) == b"":
                break
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    return min(time.monotonic() - start, give_up)


# -- huge heads ---------------------------------------------------------------------------

def test_64_mb_of_headers_are_refused_after_about_the_limit(serve):
    port = serve()                                   # the default limit, 64 KiB
    sent, chunk = 0, b"a" * 65536
    with connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            while sent < 64 << 20:
                sock.sendall(chunk)
                sent += len(chunk)
            refused = False
        except (BrokenPipeError, ConnectionResetError):
            refused = True
    # what was sent before the close is what the two kernels buffer, not what was read
    assert refused and sent < 16 << 20


def test_a_head_over_the_limit_gets_431_and_one_under_it_is_served(serve):
    port = serve(max_header_bytes=16384)
    served = answer_to(port, request(headers=b"X-Big: %s\r\nConnection: close\r\n"
                                             % (b"a" * 12_000)))
    assert served.startswith(b"HTTP/1.1 200")
    refused = answer_to(port, request(headers=b"X-Big: %s\r\n" % (b"a" * 20_000)))
    assert refused.startswith(b"HTTP/1.1 431 ")
    assert json.loads(refused.partition(b"\r\n\r\n")[2])["error"]["code"] == (
        "request_header_fields_too_large")


def test_huge_trailers_after_a_chunked_body_are_refused(serve):
    port = serve(max_header_bytes=16384)
    assert answer_to(port, chunked(CHAT, b"X-Trailer: %s\r\n" % (b"a" * (4 << 20)))) == b""


# -- slow heads ---------------------------------------------------------------------------

def test_a_head_trickled_in_is_cut_after_the_header_timeout(serve):
    port = serve(header_timeout=1)
    with connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")
        assert 0.8 <= seconds_until_closed(sock, drip=b"a") < 2.5


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(serve):
    port = serve(header_timeout=1)
    with connect(port) as sock:
        assert 0.8 <= seconds_until_closed(sock) < 2.5


# -- slow bodies --------------------------------------------------------------------------

def test_a_body_trickled_in_is_cut_after_the_body_timeout(serve):
    """Bytes every 0.2 s never leave a one-second gap, but fall behind the minimum pace."""
    port = serve(body_timeout=1)
    with connect(port) as sock:
        sock.sendall(request("/v1/chat/completions", "POST", body=CHAT)[:-len(CHAT)])
        assert 0.8 <= seconds_until_closed(sock, drip=CHAT) < 2.5


def test_a_stalled_body_is_cut_after_the_body_timeout(serve):
    port = serve(body_timeout=1)
    with connect(port) as sock:
        sock.sendall(request("/v1/chat/completions", "POST", body=CHAT)[:-10])
        assert 0.8 <= seconds_until_closed(sock) < 2.5


def test_a_body_sent_slowly_but_steadily_is_served(serve):
    """The body timeout bounds a stall, not the time the whole body takes."""
    port = serve(body_timeout=1)
    body = CHAT[:-1] + b" " * (3000 - len(CHAT)) + b"}"
    with connect(port) as sock:
        sock.sendall(request("/v1/chat/completions", "POST", body=body)[:-len(body)])
        for start in range(0, len(body), 750):          # over 1.2 s, a piece every 0.4 s
            time.sleep(0.4 if start else 0)
            sock.sendall(body[start:start + 750])
        status, answer = read_response(sock.makefile("rb"))
    assert status == 200 and answer.endswith(b"data: [DONE]\n\n")


# -- what must keep working ---------------------------------------------------------------

def test_a_stream_longer_than_the_timeouts_then_keep_alive_and_pipelining(serve):
    port = serve(header_timeout=1, body_timeout=1)
    with connect(port) as sock:
        stream = sock.makefile("rb")
        sock.sendall(request("/v1/chat/completions", "POST", body=CHAT))
        started = time.monotonic()
        status, body = read_response(stream)
        assert status == 200 and body.endswith(b"data: [DONE]\n\n")
        assert b"twelve" in body and time.monotonic() - started > 0.5
        time.sleep(1.5)                        # idle between requests: keep-alive's to judge
        sock.sendall(chunked(CHAT) + request())     # two requests at once, on one connection
        status, body = read_response(stream)
        assert status == 200 and body.endswith(b"data: [DONE]\n\n")
        assert read_response(stream)[0] == 200


def test_an_upgrade_request_is_answered_as_http(serve):
    """curl --http2 asks for h2c: llhttp stops at the upgrade, uvicorn answers in HTTP/1.1."""
    port = serve(header_timeout=1)
    with connect(port) as sock:
        sock.sendall(request(headers=b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                                     b"HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"))
        stream = sock.makefile("rb")
        assert read_response(stream)[0] == 200
        sock.sendall(request())
        assert read_response(stream)[0] == 200
