"""The server process: a stop signal drains running streams; a stop from another thread works.

``Server`` overrides one method of uvicorn's, ``handle_exit``; the first test sends a real
SIGTERM, so it fails if uvicorn stops routing its stop signals through that method.
"""

import json
import os
import signal
import socket
import sqlite3
import threading
import time

import httpx
import pytest
import uvicorn

from podium.server.app import create_app
from podium.server.lifecycle import Server
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.waiting import wait_for

LONG = " ".join(["word"] * 400)         # paced at 20 ms a token: about 8 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def make_server(scripted, tmp_path):
    def make() -> tuple[Server, str]:
        app = create_app(Settings(store_url=f"sqlite:///{tmp_path / 'life.db'}"),
                         scripted([LONG], delay=0.02))
        port = free_port()
        server = Server(uvicorn.Config(app, port=port, log_level="warning"),
                        app.state.drain, grace=1)
        return server, f"http://127.0.0.1:{port}"
    return make


@pytest.fixture
def quiet_sigterm():
    """uvicorn re-raises a captured SIGTERM once it has shut down: let it land here, not in
    the default handler, which would end the test run."""
    received = []
    old = signal.signal(signal.SIGTERM, lambda sig, frame: received.append(sig))
    yield received
    signal.signal(signal.SIGTERM, old)


def stream_lines(url: str, lines: list[str], first: threading.Event) -> None:
    body = {"model": SERVED, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line:
                lines.append(line)
                first.set()


def test_sigterm_ends_running_streams_in_band_after_the_grace_period(make_server,
                                                                     quiet_sigterm):
    """uvicorn calls ``handle_exit`` for SIGTERM (only in the main thread, so the server runs
    here); it begins the drain, and a stream still running a second later ends with an
    in-band error and ``[DONE]`` instead of a dropped connection."""
    server, url = make_server()
    lines: list[str] = []
    first, stopped = threading.Event(), []

    def client() -> None:
        assert wait_for(lambda: server.started, 20)
        reader = threading.Thread(target=stream_lines, args=(url, lines, first))
        reader.start()
        assert first.wait(10)
        stopped.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)
        reader.join(15)
        if reader.is_alive():                   # never hang the test run
            server.force_exit = server.should_exit = True

    helper = threading.Thread(target=client)
    helper.start()
    server.run()
    ended = time.monotonic()
    helper.join(20)

    assert server._drain.fired
    assert 0.9 <= ended - stopped[0] < 5
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][len("data: "):])["error"]
    assert error["code"] == "server_shutting_down"
    assert quiet_sigterm == [signal.SIGTERM]


def test_stop_from_another_thread(make_server):
    server, url = make_server()
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_for(lambda: server.started, 20)
    assert httpx.get(f"{url}/health").status_code == 200
    started = time.monotonic()
    server.should_exit = True
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - started < 3
    assert not server._drain.started       # no signal, no drain: nothing was running


def test_stored_responses_cut_at_shutdown_are_stored_as_their_clients_were_told(
        make_server, quiet_sigterm, tmp_path):
    """A stored response the grace period ends is told to its client as
    ``server_shutting_down`` (the stream's last event; a 503 when not streamed): it is
    stored so, ``failed`` with that error, its open message ``incomplete``, and its event
    log ends with the same response."""
    server, url = make_server()
    body = {"model": SERVED, "input": "go", "store": True}
    streamed: list[dict] = []
    answered: dict = {}
    first = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/responses", json={**body, "stream": True},
                          timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    streamed.append(json.loads(line[len("data: "):]))
                    if streamed[-1]["type"] == "response.output_text.delta":
                        first.set()

    def wait() -> None:
        r = httpx.post(f"{url}/v1/responses", json=body, timeout=30)
        answered.update(status=r.status_code, body=r.json())

    def client() -> None:
        assert wait_for(lambda: server.started, 20)
        threads = [threading.Thread(target=stream), threading.Thread(target=wait)]
        for thread in threads:
            thread.start()
        assert first.wait(10)
        os.kill(os.getpid(), signal.SIGTERM)
        for thread in threads:
            thread.join(15)
        if any(thread.is_alive() for thread in threads):
            server.force_exit = server.should_exit = True

    helper = threading.Thread(target=client)
    helper.start()
    server.run()
    helper.join(20)

    assert streamed[-1]["type"] == "error" and streamed[-1]["code"] == "server_shutting_down"
    assert answered["status"] == 503
    assert answered["body"]["error"]["code"] == "server_shutting_down"
    with sqlite3.connect(tmp_path / "life.db") as db:
        stored = {rid: json.loads(row)
                  for rid, row in db.execute("SELECT id, body FROM podium_responses")}
        logged = [json.loads(row) for (row,) in db.execute(
            "SELECT body FROM podium_events WHERE response_id = ? ORDER BY seq",
            (streamed[0]["response"]["id"],))]
    assert len(stored) == 2
    for response in stored.values():
        assert response["status"] == "failed", response
        assert response["error"]["code"] == "server_shutting_down"
        assert [item["status"] for item in response["output"]] == ["incomplete"]
        assert response["output"][0]["content"][0]["text"]     # what was made is kept
    last = logged[-1]
    assert last["type"] == "response.failed"
    assert last["response"] == stored[streamed[0]["response"]["id"]]
