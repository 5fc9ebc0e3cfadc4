"""A cancelled background response's log, replayed: exactly the numbers its live stream gave,
each event one the openai SDK parses, keep-alives included.

The store is made slow on purpose: the batch that opens the message is held in its write
(every event is flushed at once), and the cancel lands while it is held. Cut there, a run
once left numbers its log never held (the events stamped after the one being written, and a
batch whose write the cancel abandoned, committed after the terminal event), and its
keep-alives were ``keepalive`` events no SDK type knows.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from podium.api.responses import log as event_log
from podium.server.app import create_app
from podium.server.lifecycle import Server
from podium.settings import Settings
from podium.store.sql import SQLStore
from tests.conftest import SERVED
from tests.server.responses_check import check_stream, sse_events

EVENT = TypeAdapter(ResponseStreamEvent)
HOLD = 1.0              # seconds the held batch waits before it is written


@pytest.fixture
def held(monkeypatch):
    """The store's appends, the first batch that opens a message held ``HOLD`` s (its
    thread asleep before it writes): ``entered`` is set when it is."""
    entered = threading.Event()
    append = SQLStore._append

    def slow_append(self, response_id, batch):
        if not entered.is_set() and any(
                e["type"] == "response.output_item.added" and e["item"]["type"] == "message"
                for e in batch):
            entered.set()
            time.sleep(HOLD)
        return append(self, response_id, batch)

    monkeypatch.setattr(SQLStore, "_append", slow_append)
    monkeypatch.setattr(event_log, "FLUSH_SECONDS", 0.0)     # every event a write of its own
    return entered


@pytest.fixture
def served(scripted, tmp_path):
    """Podium over HTTP (uvicorn in a thread) on a scripted engine slow to its first token,
    keep-alives every 0.1 s."""
    engine = scripted(["word " * 200], delay=0.02)
    engine.start_gate = lambda: asyncio.sleep(0.5)
    app = create_app(Settings(store_url=f"sqlite:///{tmp_path / 'replay.db'}",
                              stream_keepalive_seconds=0.1), engine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Server(uvicorn.Config(app, port=port, log_level="warning"), app.state.drain, grace=1)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)


def read_stream(response: httpx.Response, into: list[dict]) -> None:
    for line in response.iter_lines():
        if line.startswith("data: "):
            into.append(json.loads(line[6:]))


def test_a_cancelled_background_response_replays_what_its_stream_gave(served, held):
    live: list[dict] = []

    def follow() -> None:
        body = {"model": SERVED, "input": "Count.", "background": True, "stream": True}
        with httpx.stream("POST", f"{served}/responses", json=body, timeout=30) as r:
            read_stream(r, live)

    follower = threading.Thread(target=follow)
    follower.start()
    assert held.wait(15), "the message was never opened"
    rid = live[0]["response"]["id"] if live else None
    deadline = time.monotonic() + 5
    while rid is None:          # the follower reads the log: created is there by now
        assert time.monotonic() < deadline
        time.sleep(0.01)
        rid = live[0]["response"]["id"] if live else None
    cancelled = httpx.post(f"{served}/responses/{rid}/cancel", timeout=30).json()
    assert cancelled["status"] == "cancelled"
    replay = sse_events(httpx.get(f"{served}/responses/{rid}", params={"stream": "true"},
                                  timeout=30).text)
    follower.join(timeout=30)

    numbers = [e["sequence_number"] for e in replay]
    assert numbers == list(range(len(replay))), numbers
    assert replay == live                       # what the live stream gave, no more
    for event in replay:                        # each one of OpenAI's published types
        EVENT.validate_python(event)
    final = check_stream(replay)
    assert final["status"] == "cancelled"
    kinds = [e["type"] for e in replay]
    assert kinds.count("response.in_progress") >= 3     # the opening one, and keep-alives
    assert "response.content_part.added" in kinds      # stamped after the held batch

    after = 4
    rest = sse_events(httpx.get(f"{served}/responses/{rid}", timeout=30,
                                params={"stream": "true", "starting_after": after}).text)
    assert rest == replay[after + 1:]
    sdk = openai.OpenAI(base_url=served, api_key="x", max_retries=0)
    parsed = list(sdk.responses.retrieve(rid, stream=True))
    assert [(e.type, e.sequence_number) for e in parsed] == [
        (e["type"], e["sequence_number"]) for e in replay]
    sdk.close()
