"""The Batch API (``/v1/files`` + ``/v1/batches``) end to end: real ``podium serve`` processes
on the default model, driven by the official openai SDK. A chat batch with a line the endpoint
refuses, Completions and Responses batches, a cancel mid-run, a ``kill -9`` mid-batch and a
restart on the same SQLite database (every line answered once; another key sees none of it),
and two replicas on one PostgreSQL database sharing one batch's requests (skipped, in one
line, without PostgreSQL). tests/server/test_batches.py covers the rules on a scripted
engine; here the model, the processes and the database are real."""

from __future__ import annotations

import io
import os
import re
import signal
import time
from collections import Counter

import httpx
import openai
import orjson
import pytest
import sqlalchemy as sa

from tests.e2e.conftest import MODEL, podium_process, podium_serve
from tests.store.conftest import postgres_url

LEASE = 3
IN_FLIGHT = 4                   # the session server's batch requests at once (--max-num-seqs)
ENDED = ("completed", "failed", "expired", "cancelled")
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin",
            "Egypt": "Cairo"}
COUNT = "Count from 1 to 200, separated by commas, and nothing else."


def chat_line(custom_id: str, prompt: str, max_tokens: int, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                     "max_tokens": max_tokens, "temperature": 0, **body}}


def counting(n: int, max_tokens: int) -> list[dict]:
    """``n`` lines that each take ``max_tokens`` to answer (counting never stops sooner)."""
    return [chat_line(f"n{i}", COUNT, max_tokens) for i in range(n)]


def upload(sdk: openai.OpenAI, lines: list[dict]) -> str:
    data = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    return sdk.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id


def create(sdk: openai.OpenAI, lines: list[dict], endpoint: str = "/v1/chat/completions"):
    return sdk.batches.create(input_file_id=upload(sdk, lines), endpoint=endpoint,
                              completion_window="24h")


def wait(sdks: list[openai.OpenAI], batch_id: str, seconds: float):
    """The batch once it has ended, polling each client in turn."""
    deadline = time.monotonic() + seconds
    turn = 0
    while True:
        batch = sdks[turn % len(sdks)].batches.retrieve(batch_id)
        if batch.status in ENDED:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status} after {seconds} s"
        turn += 1
        time.sleep(0.1)


def wait_completed(sdk: openai.OpenAI, batch_id: str, at_least: int, seconds: float):
    """The batch once ``at_least`` of its requests are in its output."""
    deadline = time.monotonic() + seconds
    while True:
        batch = sdk.batches.retrieve(batch_id)
        if batch.request_counts.completed >= at_least:
            return batch
        assert batch.status not in ENDED, f"batch ended {batch.status} first"
        assert time.monotonic() < deadline, f"{batch.request_counts} after {seconds} s"
        time.sleep(0.05)


def lines_of(sdk: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [orjson.loads(line) for line in sdk.files.content(file_id).content.splitlines()]


def ids(lines: list[dict]) -> Counter:
    return Counter(line["custom_id"] for line in lines)


def answered(url: str) -> int:
    """This replica's ``podium_batch_requests_total{result="completed"}`` (0 before its
    first): the results it wrote to batches' output files."""
    text = httpx.get(f"{url}/metrics").text
    found = re.search(r'^podium_batch_requests_total\{result="completed"\} (\S+)$', text, re.M)
    return 0 if found is None else int(float(found.group(1)))


def generated(url: str) -> int:
    return httpx.get(f"{url}/health").json()["engine"]["generated_tokens"]


def settle(url: str, seconds: float) -> int:
    """The server's tokens generated, once unchanged for a second (within ``seconds``)."""
    deadline = time.monotonic() + seconds
    before = generated(url)
    while True:
        time.sleep(1.0)
        now = generated(url)
        if now == before:
            return now
        assert time.monotonic() < deadline, f"still decoding after {seconds} s"
        before = now


def assert_answers(out: list[dict]) -> None:
    """Each output line a 200 chat.completion with text, under a request id of its own."""
    for line in out:
        assert line["error"] is None and line["response"]["status_code"] == 200, line
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == MODEL
        assert body["choices"][0]["message"]["content"].strip(), line
    assert len({line["response"]["body"]["id"] for line in out}) == len(out)


# -- on the session's server -------------------------------------------------------------

def test_chat_batch_answers_each_line_once_and_a_refused_line_is_an_error_line(client):
    lines = [chat_line(country, f"What is the capital of {country}? Answer with the city "
                       "name only.", 12) for country in CAPITALS]
    lines.append(chat_line("hot", "Say hi.", 8, temperature=7))
    began = time.monotonic()
    made = create(client, lines)
    assert made.status == "validating" and made.endpoint == "/v1/chat/completions"
    done = wait([client], made.id, 300)
    print(f"\n6-line chat batch: {done.status} in {time.monotonic() - began:.1f} s")
    assert done.status == "completed", done.errors
    assert done.request_counts.model_dump() == {"total": 6, "completed": 5, "failed": 1}
    assert done.model == MODEL
    assert done.in_progress_at <= done.finalizing_at <= done.completed_at
    out = lines_of(client, done.output_file_id)
    assert ids(out) == Counter(list(CAPITALS))
    assert_answers(out)
    for line in out:            # each answer is its own line's
        content = line["response"]["body"]["choices"][0]["message"]["content"]
        assert CAPITALS[line["custom_id"]] in content, line
    (error,) = lines_of(client, done.error_file_id)
    assert error["custom_id"] == "hot" and error["error"] is None
    assert error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["param"] == "temperature"
    usages = [line["response"]["body"]["usage"] for line in out]
    assert done.usage.input_tokens == sum(u["prompt_tokens"] for u in usages) > 0
    assert done.usage.output_tokens == sum(u["completion_tokens"] for u in usages) > 0
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert made.id in [b.id for b in client.batches.list()]


def test_completions_and_responses_batches(client):
    began = time.monotonic()
    completions = create(client, [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0}}
        for i, prompt in enumerate(["def add(a, b):\n", "The sky is"])], "/v1/completions")
    responses = create(client, [
        {"custom_id": "r0", "method": "POST", "url": "/v1/responses",
         "body": {"model": MODEL, "input": "What is 2+3? Answer with the number only.",
                  "max_output_tokens": 8, "temperature": 0}}], "/v1/responses")
    done = wait([client], completions.id, 300)
    assert done.status == "completed" and done.request_counts.completed == 2
    out = lines_of(client, done.output_file_id)
    assert ids(out) == Counter(["c0", "c1"])
    for line in out:
        body = line["response"]["body"]
        assert body["object"] == "text_completion" and body["choices"][0]["text"].strip()
    done = wait([client], responses.id, 300)
    print(f"\ncompletions and responses batches done in {time.monotonic() - began:.1f} s")
    assert done.status == "completed" and done.error_file_id is None
    (line,) = lines_of(client, done.output_file_id)
    body = line["response"]["body"]
    assert body["object"] == "response" and body["status"] == "completed"
    assert "5" in body["output"][0]["content"][0]["text"]
    assert done.usage.input_tokens == body["usage"]["input_tokens"] > 0
    assert done.usage.output_tokens == body["usage"]["output_tokens"] > 0
    # stored for the batch's owner, as the same request sent to /v1/responses is
    assert client.responses.retrieve(body["id"]).output_text == \
        body["output"][0]["content"][0]["text"]


def test_cancel_mid_run_keeps_the_finished_answers(client, server_url):
    made = create(client, counting(12, 32))
    began = time.monotonic()
    first = wait_completed(client, made.id, 1, 300)
    print(f"\nfirst of 12 answered after {time.monotonic() - began:.1f} s "
          f"({first.request_counts.completed} by then)")
    cancelling = client.batches.cancel(made.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    done = wait([client], made.id, 30)
    print(f"cancelled {time.monotonic() - began:.1f} s after it began")
    assert done.status == "cancelled" and done.cancelled_at is not None
    counts = done.request_counts
    assert counts.total == 12 and 1 <= counts.completed < 12
    assert counts.completed + counts.failed == 12
    out, errors = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    assert len(out) == counts.completed and len(errors) == counts.failed
    assert_answers(out)
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert all(line["response"] is None for line in errors)
    assert ids(out + errors) == Counter(f"n{i}" for i in range(12))      # each once
    # the stopped requests decode no more: past the step under way when they stopped (a
    # step is a token for each; had they run on, each had most of its 32 tokens to go)
    produced = generated(server_url)
    settled = settle(server_url, 10)
    print(f"{settled - produced} tokens decoded after it was cancelled")
    assert settled - produced <= 2 * IN_FLIGHT


# -- kill -9 and a restart, on SQLite ---------------------------------------------------------

def test_a_batch_survives_kill_9_and_is_answered_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    args = ("--store-url", url, "--response-lease-seconds", str(LEASE), "--ctx-size", "2048",
            "--api-key", "key-a", "--api-key", "key-b", "--log-level", "warning")
    lines = counting(10, 24)
    with podium_process(*args) as (first, process):
        with openai.OpenAI(base_url=f"{first}/v1", api_key="key-a", max_retries=0) as a:
            made = create(a, lines)
            began = time.monotonic()
            wait_completed(a, made.id, 1, 300)
        os.kill(process.pid, signal.SIGKILL)
        killed = time.monotonic()
        process.wait(10)
    engine = sa.create_engine(url)      # as the kill left it
    try:
        with engine.connect() as db:
            before = db.execute(sa.text("SELECT completed FROM podium_batches WHERE id = :id"),
                                {"id": made.id}).scalar_one()
    finally:
        engine.dispose()
    print(f"\nkilled {killed - began:.1f} s into the batch, {before} of 10 answered")
    assert 1 <= before < 10
    with podium_serve(*args) as second, \
            openai.OpenAI(base_url=f"{second}/v1", api_key="key-a", max_retries=0) as a, \
            openai.OpenAI(base_url=f"{second}/v1", api_key="key-b", max_retries=0) as b:
        done = wait([a], made.id, 300)
        print(f"completed {time.monotonic() - killed:.1f} s after the kill (restart included)")
        assert done.status == "completed", done.errors
        assert done.request_counts.model_dump() == {"total": 10, "completed": 10, "failed": 0}
        out = lines_of(a, done.output_file_id)
        assert ids(out) == Counter(line["custom_id"] for line in lines)  # none twice or lost
        assert_answers(out)
        assert done.error_file_id is None
        assert answered(second) == 10 - before     # the restarted server wrote the rest
        # another key sees none of it
        for call in (lambda: b.batches.retrieve(made.id), lambda: b.batches.cancel(made.id),
                     lambda: b.files.content(done.output_file_id),
                     lambda: b.files.retrieve(done.input_file_id)):
            with pytest.raises(openai.NotFoundError):
                call()
        assert b.batches.list().data == []
        assert [x.id for x in a.batches.list()] == [made.id]


# -- two replicas on PostgreSQL ------------------------------------------------------------

@pytest.fixture
def database():
    yield from postgres_url()


def test_two_replicas_share_one_batch(database):
    # --threads 1: two engines with a thread per core each, on two cores, took 4x as long
    args = ("--store-url", database, "--secret-key", "shared-by-the-replicas",
            "--response-lease-seconds", str(LEASE), "--batch-max-in-flight", "2",
            "--threads", "1", "--ctx-size", "2048", "--log-level", "warning")
    lines = [chat_line(f"q{i}", f"Write the number {i} in words, nothing else.", 16)
             for i in range(16)]
    with podium_serve(*args) as a_url, podium_serve(*args) as b_url, \
            openai.OpenAI(base_url=f"{a_url}/v1", api_key="unused", max_retries=0) as a, \
            openai.OpenAI(base_url=f"{b_url}/v1", api_key="unused", max_retries=0) as b:
        began = time.monotonic()
        made = create(a, lines)
        done = wait([a, b], made.id, 300)
        print(f"\n16 lines on two replicas: {done.status} in {time.monotonic() - began:.1f} s")
        assert done.status == "completed", done.errors
        assert done.request_counts.model_dump() == {"total": 16, "completed": 16, "failed": 0}
        out = lines_of(b, done.output_file_id)
        assert ids(out) == Counter(line["custom_id"] for line in lines)
        assert_answers(out)
        # a replica counts a result just after writing it: give a late count a moment
        deadline = time.monotonic() + 2
        on = answered(a_url), answered(b_url)
        while sum(on) < done.request_counts.total and time.monotonic() < deadline:
            time.sleep(0.1)
            on = answered(a_url), answered(b_url)
        print(f"replica A answered {on[0]}, B {on[1]}")
        assert on[0] > 0 and on[1] > 0              # both ran some of it
        assert sum(on) == done.request_counts.total  # each result counted where written
