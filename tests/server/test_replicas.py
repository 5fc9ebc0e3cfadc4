"""Two app instances (replicas) on one PostgreSQL database with one secret key, each on a
scripted engine: what one replica issues or runs, the other can use, follow and cancel.
(The real thing, two ``podium serve`` processes on the default model and one of them killed,
is tests/e2e/test_replicas_e2e.py.)"""

from __future__ import annotations

import threading
import time

import pytest
from starlette.testclient import TestClient

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.responses_check import sse_events
from tests.server.test_responses import THINK, URL, ask, stop, wait_for
from tests.store.conftest import postgres_url

LONG = " ".join(f"word{i}" for i in range(400))


@pytest.fixture
def pg_url():
    yield from postgres_url()


@pytest.fixture
def replica(tokenizer, pg_url):
    """``replica(replies, **settings)``: an app with its lifespan running on the shared
    database (secret key "shared", leases of 6 s unless given: renewed every 2 s)."""
    clients: list[TestClient] = []

    def build(replies, secret_key="shared", delay=0.0, **settings):
        engine = ScriptedEngine(tokenizer, ModelInfo(SERVED, 4096, THINK, 0), replies,
                                delay=delay)
        settings.setdefault("response_lease_seconds", 6.0)
        client = TestClient(create_app(Settings(store_url=pg_url, secret_key=secret_key,
                                                **settings), engine),
                            raise_server_exceptions=False)
        client.__enter__()
        client.engine = engine
        clients.append(client)
        return client
    yield build
    for client in clients:
        if not getattr(client, "stopped", False):
            client.__exit__(None, None, None)


def test_encrypted_reasoning_issued_by_one_replica_is_accepted_by_another(replica):
    a, b = replica(["<think>secret plan</think>Done."]), replica(["Next."])
    other_key = replica(["Next."], secret_key="another")
    body = a.post(URL, json=ask(include=["reasoning.encrypted_content"])).json()
    reasoning = body["output"][0]
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"]
    replay = [{"role": "user", "content": "hi"}, dict(reasoning, content=None),
              {"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "Done."}]},
              {"role": "user", "content": "and?"}]
    answer = b.post(URL, json={"model": SERVED, "input": replay})
    assert answer.status_code == 200, answer.text
    prompt = b.engine.tokenizer.decode(b.engine.requests[-1].prompt_token_ids)
    assert "<think>secret plan</think>Done." in prompt
    refused = other_key.post(URL, json={"model": SERVED, "input": replay})
    assert refused.status_code == 400 and "encrypted_content" in refused.json()["error"]["message"]


def test_a_cancel_sent_to_another_replica_stops_the_response_where_it_runs(replica):
    a, b = replica([LONG], delay=0.02), replica(["unused"])
    rid = a.post(URL, json=ask(background=True)).json()["id"]
    wait_for(b, rid, "in_progress")
    time.sleep(0.3)                                     # a few tokens in
    started = time.monotonic()
    cancelled = b.post(f"{URL}/{rid}/cancel")
    took = time.monotonic() - started
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert took < 1.5, took                     # heard at once, not at A's next renewal
    assert a.engine.stats["running"] == 0               # its generation on A ended
    produced = a.engine.stats["generated_tokens"]
    time.sleep(0.2)
    assert a.engine.stats["generated_tokens"] == produced
    events = sse_events(b.get(f"{URL}/{rid}?stream=true").text)
    assert events[-1]["type"] == "response.failed"       # the terminal event of a cancel
    assert events[-1]["response"]["status"] == "cancelled"
    again = b.post(f"{URL}/{rid}/cancel")               # finished: nothing left to cancel
    assert again.status_code == 400


def test_a_follower_on_another_replica_sees_each_write_at_once(replica):
    a, b = replica([LONG[:600]], delay=0.01), replica(["unused"])
    rid = a.post(URL, json=ask(background=True)).json()["id"]
    arrivals: dict[str, dict[int, float]] = {"a": {}, "b": {}}

    def follow(name: str, client: TestClient) -> None:
        with client.stream("GET", f"{URL}/{rid}?stream=true") as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    seq = int(line.split('"sequence_number":')[1].split(",")[0].split("}")[0])
                    arrivals[name][seq] = time.monotonic()

    threads = [threading.Thread(target=follow, args=(n, c)) for n, c in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert arrivals["a"].keys() == arrivals["b"].keys() and len(arrivals["a"]) > 20
    lags = sorted(arrivals["b"][s] - arrivals["a"][s] for s in arrivals["a"])
    assert lags[len(lags) * 9 // 10] < 0.1, lags[-5:]   # a poll would lag 0.25 s at times


def test_a_stopped_replicas_running_responses_are_failed_by_another(replica):
    a, b = replica([LONG], delay=0.02), replica(["unused"], response_lease_seconds=0.6)
    ids = [a.post(URL, json=ask(background=True)).json()["id"] for _ in range(2)]
    for rid in ids:
        wait_for(b, rid, "in_progress")
    stop(a)                                 # it gives its leases up: B fails them
    for rid in ids:
        body = wait_for(b, rid, "failed", timeout=5)
        assert "stopped" in body["error"]["message"]
        events = sse_events(b.get(f"{URL}/{rid}?stream=true").text)
        assert events[-1]["type"] == "response.failed"
