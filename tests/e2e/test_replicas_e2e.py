"""Two real ``podium serve`` replicas (A and B) on the default model, one PostgreSQL database
and one secret key, driven by the openai SDK: a background response on A followed live from
B and cancelled through B; a previous_response_id chain that alternates; a delete on B seen
by A; reasoning sealed by A accepted by B (a tampered seal refused); and a third replica killed with SIGKILL mid-generation, whose responses B fails once
their leases lapse, closing their logs and its followers' streams. Without PostgreSQL these
tests skip, saying so in one line."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, podium_process, podium_serve
from tests.store.conftest import postgres_url

LEASE = 3.0
COUNT = "Count from 1 to 300, one number per line, and nothing else."
THINK = ("Start your reply with the literal text <think> and write your reasoning, then write "
         "</think> and the final answer. What is 2+2?")


@pytest.fixture(scope="module")
def database():
    yield from postgres_url()


def replica_args(database: str) -> tuple[str, ...]:
    # --reasoning-parser think: the default model's answer to THINK is reasoning, which A
    # seals and B must accept (it has no reasoning format of its own)
    return ("--store-url", database, "--secret-key", "shared-by-the-replicas",
            "--response-lease-seconds", str(LEASE), "--ctx-size", "2048",
            "--reasoning-parser", "think", "--log-level", "warning")


CLIENTS: dict[str, openai.OpenAI] = {}


@pytest.fixture(scope="module")
def replicas(database):
    with podium_serve(*replica_args(database)) as a, podium_serve(*replica_args(database)) as b:
        yield a, b
    # closed here: a client left to the garbage collector can drop its pooled socket before
    # it closes it, and that ResourceWarning fails whichever later test is running then
    for client in CLIENTS.values():
        client.close()
    CLIENTS.clear()


def sdk(url: str) -> openai.OpenAI:
    """One client per replica, closed with the replicas."""
    if url not in CLIENTS:
        CLIENTS[url] = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    return CLIENTS[url]


def count_in_background(url: str) -> str:
    return sdk(url).responses.create(model=MODEL, input=COUNT, background=True,
                                     temperature=0, max_output_tokens=900).id


def follow(url: str, rid: str, into: list[tuple[float, dict]]) -> None:
    """Read the response's stream from the start, noting when each event arrived."""
    with httpx.stream("GET", f"{url}/v1/responses/{rid}", params={"stream": "true"},
                      timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                into.append((time.monotonic(), json.loads(line[6:])))


def generated(url: str) -> int:
    return httpx.get(f"{url}/health").json()["engine"]["generated_tokens"]


def wait_status(url: str, rid: str, status: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = httpx.get(f"{url}/v1/responses/{rid}").json()
        if body["status"] == status:
            return body
        assert time.monotonic() < deadline, f"{rid} is {body['status']}, not {status}"
        time.sleep(0.1)


def test_followed_live_on_b_and_cancelled_through_b(replicas):
    a, b = replicas
    rid = count_in_background(a)
    on_a: list[tuple[float, dict]] = []
    on_b: list[tuple[float, dict]] = []
    readers = [threading.Thread(target=follow, args=(url, rid, into))
               for url, into in ((a, on_a), (b, on_b))]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 60
    while sum(e["type"] == "response.output_text.delta" for _, e in on_b) < 40:
        assert time.monotonic() < deadline, "B saw too few deltas"
        time.sleep(0.05)
    cancelled = sdk(b).responses.cancel(rid)          # sent to B; it runs on A
    assert cancelled.status == "cancelled"
    for reader in readers:
        reader.join(30)
    time.sleep(0.5)             # a decode step under way when the cancel came may end
    produced = generated(a)
    time.sleep(0.5)
    assert generated(a) == produced                   # A decodes no more of it
    assert [e for _, e in on_a] == [e for _, e in on_b]
    assert on_b[-1][1]["type"] == "response.failed"
    assert on_b[-1][1]["response"]["status"] == "cancelled"
    # live: each event reached B about when it reached A's own follower
    seen_a = {e["sequence_number"]: t for t, e in on_a}
    lags = sorted(t - seen_a[e["sequence_number"]] for t, e in on_b)
    print(f"B's lag behind A: median {lags[len(lags) // 2] * 1000:.1f} ms, "
          f"p90 {lags[len(lags) * 9 // 10] * 1000:.1f} ms, max {lags[-1] * 1000:.1f} ms")
    assert lags[-1] < 0.1                           # every one within 100 ms


def test_a_chain_alternates_between_replicas_and_a_delete_on_b_is_seen_by_a(replicas):
    a, b = replicas
    first = sdk(a).responses.create(model=MODEL, temperature=0, max_output_tokens=20,
                                    input="My cat is called Tiberius. Just say OK.")
    second = sdk(b).responses.create(model=MODEL, temperature=0, max_output_tokens=20,
                                     previous_response_id=first.id,
                                     input="What is my cat called? One word.")
    assert "Tiberius" in second.output_text
    third = sdk(a).responses.create(model=MODEL, temperature=0, max_output_tokens=20,
                                    previous_response_id=second.id,
                                    input="Spell the name of my cat backwards.")
    items = sdk(b).responses.input_items.list(third.id)
    assert [i.type for i in items.data] == ["message"]
    sdk(b).responses.delete(third.id)
    with pytest.raises(openai.NotFoundError):
        sdk(a).responses.retrieve(third.id)
    assert sdk(a).responses.retrieve(second.id).status == "completed"


def test_encrypted_reasoning_issued_by_a_is_accepted_by_b(replicas):
    a, b = replicas
    first = sdk(a).responses.create(model=MODEL, input=THINK, temperature=0, store=False,
                                    max_output_tokens=80,
                                    include=["reasoning.encrypted_content"])
    (reasoning,) = [item for item in first.output if item.type == "reasoning"]
    assert reasoning.encrypted_content.startswith("podium.v2.")
    sealed = {"type": "reasoning", "id": reasoning.id, "summary": [],
              "encrypted_content": reasoning.encrypted_content}
    replay = [{"role": "user", "content": THINK}, sealed,
              {"role": "user", "content": "And 3+3?"}]
    second = sdk(b).responses.create(model=MODEL, input=replay, temperature=0, store=False,
                                     max_output_tokens=16)
    assert second.status in ("completed", "incomplete")
    tampered = dict(sealed, encrypted_content=reasoning.encrypted_content[:-4] + "AAAA")
    with pytest.raises(openai.BadRequestError, match="encrypted_content"):
        sdk(b).responses.create(model=MODEL, input=[replay[0], tampered, replay[2]],
                                store=False, max_output_tokens=16)


def test_a_killed_replicas_responses_are_failed_by_another(database, replicas):
    _, b = replicas
    with podium_process(*replica_args(database)) as (c, process):
        ids = [count_in_background(c) for _ in range(3)]
        for rid in ids:
            wait_status(b, rid, "in_progress", 60)
        follower: list[tuple[float, dict]] = []
        reader = threading.Thread(target=follow, args=(b, ids[0], follower))
        reader.start()
        deadline = time.monotonic() + 60
        while sum(e["type"] == "response.output_text.delta" for _, e in follower) < 5:
            assert time.monotonic() < deadline, "no deltas from C"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        killed = time.monotonic()
        process.wait(10)
    # within a lease (plus one of B's passes, a third of a lease, and a little slack)
    for rid in ids:
        body = wait_status(b, rid, "failed", LEASE + LEASE / 3 + 2)
        assert "stopped before it finished" in body["error"]["message"]
        assert body["output"] and body["output"][0]["content"][0]["text"]   # what it wrote
    print(f"all three failed {time.monotonic() - killed:.1f} s after the kill")
    for rid in ids:
        log = []
        follow(b, rid, log)
        events = [e for _, e in log]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.failed"
        assert any(e["type"] == "response.output_item.done" for e in events)   # closed
    reader.join(10)
    assert not reader.is_alive()                    # the follower's stream was closed
    assert follower[-1][1]["type"] == "response.failed"
