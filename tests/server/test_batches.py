"""The Batch API (``/v1/batches``) through the official openai SDK, against Podium served over
HTTP (uvicorn in a thread, scripted engine), on SQLite and on PostgreSQL (skipped, one line
each, when none is running). The engine is scripted so the timing of cancels and windows is
the test's; tests/e2e/test_batches_e2e.py runs batches on the real model, across a kill -9
and on two replicas."""

from __future__ import annotations

import array
import base64
import io
import time

import httpx
import openai
import orjson
import pytest
import sqlalchemy as sa

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.settings import Settings
from podium.store.batches import batch_requests, batches
from tests.conftest import SERVED
from tests.server.test_conversations import Served
from tests.server.test_files import db_url  # noqa: F401 - the fixture (sqlite, postgresql)


@pytest.fixture
def serve(tokenizer, db_url):  # noqa: F811
    servers: list[Served] = []

    def build(replies=("Hello there!",), delay=0.0, seqs=None, name=SERVED,
              **settings) -> Served:
        engine = ScriptedEngine(tokenizer, ModelInfo(name, 4096, "", 0), list(replies),
                                delay=delay, max_num_seqs=seqs, max_queued=8)
        settings.setdefault("store_url", db_url)
        settings.setdefault("response_lease_seconds", 3.0)
        served = Served(engine, Settings(**settings))
        servers.append(served)
        return served
    yield build
    for served in servers:
        served.stop()


def chat_line(i: int, **body) -> dict:
    return {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": SERVED, "messages": [{"role": "user", "content": f"q{i}"}],
                     **body}}


def upload(sdk: openai.OpenAI, lines: list, name: str = "in.jsonl") -> str:
    data = b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n"
                    for line in lines)
    return sdk.files.create(file=(name, io.BytesIO(data)), purpose="batch").id


def wait(sdk: openai.OpenAI, batch_id: str, until=("completed", "failed", "expired",
                                                   "cancelled"), seconds: float = 30.0):
    deadline = time.monotonic() + seconds
    while True:
        batch = sdk.batches.retrieve(batch_id)
        if batch.status in until:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.05)


def answered(sdk: openai.OpenAI, batch_id: str, n: int, seconds: float = 20.0) -> None:
    """Wait until ``n`` of the batch's requests are completed."""
    deadline = time.monotonic() + seconds
    while sdk.batches.retrieve(batch_id).request_counts.completed < n:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def lines_of(sdk: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [orjson.loads(line) for line in sdk.files.content(file_id).content.splitlines()]


# -- a batch from start to end ---------------------------------------------------------

def test_chat_batch_completes_with_every_answer_once(serve):
    served = serve()
    sdk = served.client()
    file_id = upload(sdk, [chat_line(i) for i in range(7)])
    made = sdk.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                              completion_window="24h", metadata={"job": "nightly"})
    assert made.id.startswith("batch_") and made.object == "batch"
    assert made.status == "validating" and made.metadata == {"job": "nightly"}
    assert made.expires_at == made.created_at + 86400
    done = wait(sdk, made.id)
    assert done.status == "completed", done.errors
    assert done.request_counts.model_dump() == {"total": 7, "completed": 7, "failed": 0}
    assert done.model == SERVED and done.error_file_id is None
    assert done.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at
    out = lines_of(sdk, done.output_file_id)
    assert [line["custom_id"] for line in out] == [f"r{i}" for i in range(7)]
    for line in out:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["request_id"].startswith("req_")
        body = line["response"]["body"]
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == "Hello there!"
    prompt = sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in out)
    completion = sum(line["response"]["body"]["usage"]["completion_tokens"] for line in out)
    assert (done.usage.input_tokens, done.usage.output_tokens) == (prompt, completion)
    assert done.usage.total_tokens == prompt + completion
    output = sdk.files.retrieve(done.output_file_id)
    assert output.purpose == "batch_output" and output.filename == f"{made.id}_output.jsonl"
    # every request went to the engine below interactive ones
    assert {r.priority for r in served.engine.requests} == {-1}
    assert [b.id for b in sdk.batches.list()] == [made.id]
    metrics = httpx.get(f"http://127.0.0.1:{served.port}/metrics").text
    assert 'podium_batches{status="completed"} 1.0' in metrics
    assert 'podium_batch_requests_total{result="completed"} 7.0' in metrics
    assert "podium_batch_requests_queued 0.0" in metrics


def test_completions_and_responses_lines(serve):
    served = serve()
    sdk = served.client()
    lines = [{"custom_id": "c", "method": "POST", "url": "/v1/completions",
              "body": {"model": SERVED, "prompt": "Say hi", "max_tokens": 8}}]
    done = wait(sdk, sdk.batches.create(input_file_id=upload(sdk, lines),
                                        endpoint="/v1/completions",
                                        completion_window="24h").id)
    (line,) = lines_of(sdk, done.output_file_id)
    assert line["response"]["body"]["object"] == "text_completion"
    lines = [{"custom_id": "r", "method": "POST", "url": "/v1/responses",
              "body": {"model": SERVED, "input": "Say hi"}}]
    done = wait(sdk, sdk.batches.create(input_file_id=upload(sdk, lines),
                                        endpoint="/v1/responses",
                                        completion_window="24h").id)
    (line,) = lines_of(sdk, done.output_file_id)
    body = line["response"]["body"]
    assert body["object"] == "response" and body["status"] == "completed"
    assert done.usage.input_tokens == body["usage"]["input_tokens"] > 0
    # stored, as the same request sent to /v1/responses is, for the batch's key
    assert sdk.responses.retrieve(body["id"]).output_text == "Hello there!"


def test_a_rejected_body_is_a_line_of_the_error_file_and_the_batch_goes_on(serve):
    served = serve()
    sdk = served.client()
    lines = [chat_line(0), chat_line(1, temperature=7), chat_line(2, stream=True),
             chat_line(3, messages=[]), chat_line(4)]
    done = wait(sdk, sdk.batches.create(input_file_id=upload(sdk, lines),
                                        endpoint="/v1/chat/completions",
                                        completion_window="24h").id)
    assert done.status == "completed"
    assert done.request_counts.model_dump() == {"total": 5, "completed": 2, "failed": 3}
    assert [line["custom_id"] for line in lines_of(sdk, done.output_file_id)] == ["r0", "r4"]
    errors = {line["custom_id"]: line for line in lines_of(sdk, done.error_file_id)}
    assert sorted(errors) == ["r1", "r2", "r3"]
    for line in errors.values():
        assert line["response"]["status_code"] == 400 and line["error"] is None
        assert line["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert errors["r1"]["response"]["body"]["error"]["param"] == "temperature"
    assert errors["r2"]["response"]["body"]["error"]["param"] == "stream"


# -- the input file's format -------------------------------------------------------------

@pytest.mark.parametrize("line, code, param", [
    (b"{not json", "invalid_json_line", None),
    (b'["a list"]', "invalid_json_line", None),
    (orjson.dumps({**chat_line(1), "custom_id": None}), "missing_custom_id", "custom_id"),
    (orjson.dumps({**chat_line(1), "custom_id": "r0"}), "duplicate_custom_id", "custom_id"),
    (orjson.dumps({**chat_line(1), "method": "GET"}), "invalid_method", "method"),
    (orjson.dumps({**chat_line(1), "url": "/v1/embeddings"}), "invalid_url", "url"),
    (orjson.dumps({**chat_line(1), "body": "text"}), "invalid_body", "body"),
    (orjson.dumps(chat_line(1, model="another")), "mismatched_model", "body.model"),
    (orjson.dumps({**chat_line(1), "body": {"messages": []}}), "missing_model", "body.model"),
])
def test_a_line_that_breaks_the_format_fails_the_batch(serve, line, code, param):
    served = serve()
    sdk = served.client()
    file_id = upload(sdk, [chat_line(0), line, chat_line(2)])
    done = wait(sdk, sdk.batches.create(input_file_id=file_id,
                                        endpoint="/v1/chat/completions",
                                        completion_window="24h").id)
    assert done.status == "failed" and done.failed_at is not None
    (error,) = done.errors.data
    assert (error.code, error.line, error.param) == (code, 2, param)
    assert done.output_file_id is None and done.request_counts.total == 0
    assert not served.engine.requests                   # nothing ran
    with served.app.state.store.engine.connect() as db:   # nothing of it is kept
        assert not db.execute(sa.select(batch_requests)).first()


def test_every_format_error_is_listed_by_line(serve):
    served = serve()
    sdk = served.client()
    lines = [chat_line(0), b"nope", chat_line(2, model="x"), chat_line(0), b"", chat_line(5)]
    done = wait(sdk, sdk.batches.create(input_file_id=upload(sdk, lines),
                                        endpoint="/v1/chat/completions",
                                        completion_window="24h").id)
    assert [(e.line, e.code) for e in done.errors.data] == [
        (2, "invalid_json_line"), (3, "mismatched_model"), (4, "duplicate_custom_id")]


def test_replicas_serving_different_models_each_run_their_own(serve):
    """Two replicas on one database, one serving alpha (and, by alias, 'claude-*'), the other
    beta: each runs only its own models' batches, none fails with model_not_found, and a
    batch for a model neither serves waits, then expires with its window (not failed)."""
    a = serve(replies=["From A."], name="alpha", model_alias=("claude-*=alpha",))
    b = serve(replies=["From B."], name="beta")
    sdk = a.client()

    def create(model: str) -> str:
        lines = [chat_line(i, model=model) for i in range(3)]
        return sdk.batches.create(input_file_id=upload(sdk, lines),
                                  endpoint="/v1/chat/completions",
                                  completion_window="24h").id
    made = {model: create(model) for model in ("alpha", "beta", "claude-haiku-4-5", "gamma")}
    for model, reply in (("alpha", "From A."), ("beta", "From B."),
                         ("claude-haiku-4-5", "From A.")):
        done = wait(sdk, made[model])
        assert done.status == "completed", (model, done.status, done.errors)
        assert done.request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}
        assert done.model == model and done.error_file_id is None
        bodies = [line["response"]["body"] for line in lines_of(sdk, done.output_file_id)]
        assert {(x["model"], x["choices"][0]["message"]["content"]) for x in bodies} == {
            (model, reply)}
    assert (len(a.engine.requests), len(b.engine.requests)) == (6, 3)
    time.sleep(2.5)                 # both workers look again (once a second): gamma waits
    waiting = sdk.batches.retrieve(made["gamma"])
    assert waiting.status == "in_progress" and waiting.errors is None
    assert waiting.request_counts.model_dump() == {"total": 3, "completed": 0, "failed": 0}
    with a.app.state.store.engine.begin() as db:
        states = db.execute(sa.select(batch_requests.c.state).where(
            batch_requests.c.batch_id == made["gamma"])).scalars().all()
        assert states == ["queued"] * 3
        db.execute(sa.update(batches).where(batches.c.id == made["gamma"]).values(
            expires_at=int(time.time()) - 1))       # a day later
    done = wait(sdk, made["gamma"])
    assert done.status == "expired" and done.expired_at is not None and done.failed_at is None
    assert done.request_counts.model_dump() == {"total": 3, "completed": 0, "failed": 3}
    assert done.output_file_id is None
    errors = lines_of(sdk, done.error_file_id)
    assert sorted(x["custom_id"] for x in errors) == ["r0", "r1", "r2"]
    assert {x["error"]["code"] for x in errors} == {"batch_expired"}
    assert (len(a.engine.requests), len(b.engine.requests)) == (6, 3)   # gamma never ran


def test_an_empty_file_fails_the_batch(serve):
    served = serve()
    sdk = served.client()
    file_id = sdk.files.create(file=("e.jsonl", io.BytesIO(b"\n\n")), purpose="batch").id
    done = wait(sdk, sdk.batches.create(input_file_id=file_id,
                                        endpoint="/v1/chat/completions",
                                        completion_window="24h").id)
    assert done.status == "failed" and done.errors.data[0].code == "empty_file"


def test_a_line_over_the_body_limit_fails_the_batch_without_being_held(serve):
    served = serve(max_body_bytes=4096)
    sdk = served.client()
    big = chat_line(1, messages=[{"role": "user", "content": "x" * 10_000}])
    done = wait(sdk, sdk.batches.create(input_file_id=upload(sdk, [chat_line(0), big]),
                                        endpoint="/v1/chat/completions",
                                        completion_window="24h").id)
    assert [(e.code, e.line) for e in done.errors.data] == [("line_too_long", 2)]


# -- create's own checks ------------------------------------------------------------------

def test_create_refuses_what_it_can_check_at_once(serve):
    served = serve()
    sdk = served.client()
    file_id = upload(sdk, [chat_line(0)])
    cases = [
        (dict(endpoint="/v1/messages"), "endpoint"),
        (dict(completion_window="1h"), "completion_window"),
        (dict(input_file_id="file-missing"), "input_file_id"),
        (dict(metadata={f"k{i}": "v" for i in range(17)}), "metadata"),
    ]
    for change, param in cases:
        args = {**dict(input_file_id=file_id, endpoint="/v1/chat/completions",
                       completion_window="24h"), **change}
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.batches.create(**args)
        assert caught.value.body["param"] == param
    other = sdk.files.create(file=("n.txt", io.BytesIO(b"notes")), purpose="user_data").id
    with pytest.raises(openai.BadRequestError, match="purpose 'batch'"):
        sdk.batches.create(input_file_id=other, endpoint="/v1/chat/completions",
                           completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        sdk.batches.retrieve("batch_nope")


def test_one_key_never_sees_another_keys_batch_or_its_files(serve):
    served = serve(api_key=["key-a", "key-b"])
    a, b = served.client("key-a"), served.client("key-b")
    file_id = upload(a, [chat_line(0)])
    with pytest.raises(openai.BadRequestError):         # b cannot use a's file
        b.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                         completion_window="24h")
    made = a.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                            completion_window="24h")
    done = wait(a, made.id)
    with pytest.raises(openai.NotFoundError):
        b.batches.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        b.batches.cancel(made.id)
    with pytest.raises(openai.NotFoundError):
        b.files.content(done.output_file_id)
    assert b.batches.list().data == []
    assert [x.id for x in a.batches.list()] == [made.id]


# -- cancel, expiry ------------------------------------------------------------------------

def test_cancel_mid_run_ends_cancelled_with_the_partial_output(serve):
    served = serve(replies=["word " * 40], delay=0.01, batch_max_in_flight=2)
    sdk = served.client()
    made = sdk.batches.create(input_file_id=upload(sdk, [chat_line(i) for i in range(12)]),
                              endpoint="/v1/chat/completions", completion_window="24h")
    answered(sdk, made.id, 2)
    cancelling = sdk.batches.cancel(made.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    done = wait(sdk, made.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    counts = done.request_counts
    assert counts.total == 12 and 2 <= counts.completed < 12
    assert counts.completed + counts.failed == 12
    out = lines_of(sdk, done.output_file_id)
    errors = lines_of(sdk, done.error_file_id)
    assert len(out) == counts.completed
    assert sorted(x["custom_id"] for x in out + errors) == sorted(f"r{i}" for i in range(12))
    assert {x["error"]["code"] for x in errors} == {"batch_cancelled"}
    assert all(x["response"] is None for x in errors)
    # the running ones stopped: nothing still decoding, nothing started since
    assert served.engine.stats["running"] == 0
    started = len(served.engine.requests)
    time.sleep(0.3)
    assert len(served.engine.requests) == started
    assert sdk.batches.cancel(made.id).status == "cancelled"     # again: as it is
    finished = wait(sdk, sdk.batches.create(input_file_id=upload(sdk, [chat_line(0)]),
                                            endpoint="/v1/chat/completions",
                                            completion_window="24h").id)
    with pytest.raises(openai.BadRequestError, match="completed"):
        sdk.batches.cancel(finished.id)


def test_a_batch_past_its_window_expires_with_the_partial_output(serve):
    served = serve(replies=["word " * 40], delay=0.01, batch_max_in_flight=1)
    sdk = served.client()
    made = sdk.batches.create(input_file_id=upload(sdk, [chat_line(i) for i in range(10)]),
                              endpoint="/v1/chat/completions", completion_window="24h")
    answered(sdk, made.id, 1)
    with served.app.state.store.engine.begin() as db:      # a day later
        db.execute(sa.update(batches).where(batches.c.id == made.id).values(
            expires_at=int(time.time()) - 1))
    done = wait(sdk, made.id)
    assert done.status == "expired" and done.expired_at is not None
    out, errors = lines_of(sdk, done.output_file_id), lines_of(sdk, done.error_file_id)
    assert len(out) == done.request_counts.completed >= 1
    assert len(out) + len(errors) == 10
    assert {x["error"]["code"] for x in errors} == {"batch_expired"}


def test_batch_work_waits_behind_interactive_requests(serve):
    """With every sequence held by batch requests, an interactive request takes one at
    once (the scripted engine preempts as llama.cpp does)."""
    served = serve(replies=["word " * 200], delay=0.01, seqs=2, batch_max_in_flight=2)
    sdk = served.client()
    made = sdk.batches.create(input_file_id=upload(sdk, [chat_line(i) for i in range(4)]),
                              endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 20
    while served.engine.stats["running"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    began = time.monotonic()
    stream = sdk.chat.completions.create(model=SERVED, stream=True, max_tokens=3,
                                         messages=[{"role": "user", "content": "now"}])
    next(iter(stream))
    first = time.monotonic() - began
    stream.close()
    assert first < 1.0, first       # a batch request takes 200 steps of 10 ms: 2 s
    sdk.batches.cancel(made.id)
    wait(sdk, made.id)


# -- embeddings: a real embedding model ------------------------------------------------------

def vector(embedding):
    """An embedding as floats, whether it came as a list or as base64 float32."""
    if isinstance(embedding, list):
        return embedding
    return array.array("f", base64.b64decode(embedding)).tolist()


def test_embeddings_lines_answer_as_the_route_does(tmp_path):
    from starlette.testclient import TestClient

    from podium.engine.llamacpp.embed import LlamaEmbedder
    from podium.engine.llamacpp.model_files import EMBED_MODEL, default_model_path
    from podium.server.app import create_app

    engine = LlamaEmbedder(default_model_path(EMBED_MODEL), served_name="minilm", n_threads=2)
    app = create_app(Settings(store_url=f"sqlite:///{tmp_path / 'e.db'}"), engine)
    with TestClient(app, raise_server_exceptions=False) as http:
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                            max_retries=0)
        bodies = [{"model": "minilm", "input": ["a red apple", "the stock market"]},
                  {"model": "minilm", "input": "a red apple", "encoding_format": "base64"},
                  {"model": "minilm", "input": "x", "dimensions": 7}]
        lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": b}
                 for i, b in enumerate(bodies)]
        done = wait(sdk, sdk.batches.create(input_file_id=upload(sdk, lines),
                                            endpoint="/v1/embeddings",
                                            completion_window="24h").id)
        assert done.status == "completed"
        assert done.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
        out = {line["custom_id"]: line["response"]["body"]
               for line in lines_of(sdk, done.output_file_id)}
        for i in (0, 1):            # the same body sent to the route answers the same vectors
            direct = http.post("/v1/embeddings", json=bodies[i]).json()
            # up to float rounding: the worker runs lines side by side, and an embedding
            # computed in another batch of sequences (or alone, without flash attention)
            # differs in its last bits
            got, want = ([vector(d["embedding"]) for d in body["data"]]
                         for body in (out[f"e{i}"], direct))
            assert len(got) == len(want) and all(
                g == pytest.approx(w, abs=1e-3) and sum(a * b for a, b in zip(g, w)) > 0.99999
                for g, w in zip(got, want))
        assert isinstance(out["e1"]["data"][0]["embedding"], str)    # base64 kept as asked
        assert done.usage.input_tokens == sum(out[k]["usage"]["prompt_tokens"] for k in out)
        (error,) = lines_of(sdk, done.error_file_id)
        assert error["custom_id"] == "e2" and error["response"]["status_code"] == 400
        assert error["response"]["body"]["error"]["param"] == "dimensions"
        # a chat batch for an embedding model fails before anything runs
        chat = {**chat_line(0), "body": {"model": "minilm", "messages": []}}
        failed = wait(sdk, sdk.batches.create(input_file_id=upload(sdk, [chat]),
                                              endpoint="/v1/chat/completions",
                                              completion_window="24h").id)
        assert failed.status == "failed"
        assert failed.errors.data[0].code == "invalid_model"
        assert "embedding model" in failed.errors.data[0].message
        sdk.close()


def test_a_stopped_replica_gives_its_requests_back_and_another_finishes_them(serve):
    a = serve(replies=["word " * 30], delay=0.01, batch_max_in_flight=2)
    sdk_a = a.client()
    made = sdk_a.batches.create(input_file_id=upload(sdk_a, [chat_line(i) for i in range(8)]),
                                endpoint="/v1/chat/completions", completion_window="24h")
    answered(sdk_a, made.id, 1)
    a.stop()                        # graceful: its running requests go back to the queue
    b = serve(replies=["word " * 30], delay=0.001)
    sdk_b = b.client()
    began = time.monotonic()
    done = wait(sdk_b, made.id)
    assert time.monotonic() - began < 2.5   # not after the lease (3 s): given back at once
    assert done.request_counts.model_dump() == {"total": 8, "completed": 8, "failed": 0}
    ids = [line["custom_id"] for line in lines_of(sdk_b, done.output_file_id)]
    assert ids == [f"r{i}" for i in range(8)]


def test_an_answer_written_while_the_worker_looks_at_its_leases_is_counted(tmp_path,
                                                                            monkeypatch):
    """A request's answer commits on a worker thread; until its task resumes, the worker's
    lease renewal sees the row no longer running under it. The task must not be stopped
    then: the answer is in the batch's counts and must reach the metric too."""
    import asyncio

    from podium.api.batch_worker import Outcome, Worker
    from podium.store.batches import BatchStore, Usage
    from podium.store.files import FileStore, StoredFile, new_id
    from podium.store.sql import SQLStore

    finish = BatchStore._finish_request

    def late(self, *args):
        done = finish(self, *args)
        time.sleep(1.5)             # the thread hands the commit back late (a busy machine)
        return done
    monkeypatch.setattr(BatchStore, "_finish_request", late)

    async def go() -> tuple[int, int]:
        engine = SQLStore(f"sqlite:///{tmp_path / 'w.db'}").engine
        store, files = BatchStore(engine), FileStore(engine)
        counted: list[bool] = []

        async def execute(endpoint, body, owner):
            return Outcome(200, {"ok": True}, Usage(1, 0, 1, 0))
        worker = Worker(store, files, execute=execute, check_model=lambda m, e: None,
                        in_flight=4, lease_seconds=3.0, max_line_bytes=1 << 20,
                        on_result=counted.append)
        data = b"".join(orjson.dumps(chat_line(i)) + b"\n" for i in range(3))
        file_id = new_id()
        await files.finish(file_id, "o", 0, data, StoredFile(
            file_id, "batch", "in.jsonl", len(data), int(time.time()), None))
        now = int(time.time())
        await store.create(dict(id="batch_w", owner="o", status="validating",
                                endpoint="/v1/chat/completions", input_file_id=file_id,
                                completion_window="24h", created_at=now,
                                expires_at=now + 86400))
        await worker.start()
        try:
            for _ in range(300):
                row = await store.get("batch_w", None)
                if row["status"] == "completed":
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(2)      # every task resumed
        finally:
            await worker.stop()
        return row["completed"], len(counted)

    assert asyncio.run(go()) == (3, 3)
