"""Admission on the real engine: the queue limit holds under a burst, a request that could
never fit is a 400 (not a 429 the SDKs would retry forever), and a request dropped before
it is read is aborted."""

import asyncio
import gc

import httpx
import pytest

from podium.engine.base import EngineRequest, SamplingParams
from podium.engine.llamacpp.engine import LlamaCppEngine
from podium.errors import InvalidRequestError
from podium.server.app import create_app
from podium.settings import Settings

SLOTS, QUEUED = 2, 3


@pytest.fixture(scope="module")
def engine(model_path):
    eng = LlamaCppEngine(model_path, served_name="m", n_ctx=512, n_batch=64,
                         max_num_seqs=SLOTS, max_queued=QUEUED)
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture
def app(engine, tmp_path):
    return create_app(Settings(store_url=f"sqlite:///{tmp_path / 'a.db'}"), engine)


def chat(**extra):
    return {"model": "m", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "Count to twenty."}], **extra}


def test_a_burst_of_streams_never_overfills_the_queue(engine, app):
    """40 streams at once with room for 2 running + 3 queued: the check and the enqueue are
    one step, so the rest are refused with 429 and the engine never holds more than 5
    (``waiting`` counts jobs not yet in a slot, including those about to take a free one)."""
    peak = 0

    async def watch(stop: asyncio.Event) -> None:
        nonlocal peak
        while not stop.is_set():
            running = engine.stats["running"]       # read first: a job moving to a slot
            peak = max(peak, running + engine.stats["waiting"])     # is never counted twice
            await asyncio.sleep(0.001)

    async def scenario():
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(stop))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t",
                                     timeout=120) as client:
            answers = await asyncio.gather(*(
                client.post("/v1/chat/completions", json=chat(stream=True))
                for _ in range(40)))
        stop.set()
        await watcher
        return answers

    answers = asyncio.run(scenario())
    codes = [a.status_code for a in answers]
    assert set(codes) == {200, 429}, codes
    assert codes.count(429) >= 40 - SLOTS - QUEUED - 5      # a few may get in as others end
    assert peak <= SLOTS + QUEUED
    for a in answers:
        if a.status_code == 200:
            assert a.text.rstrip().endswith("data: [DONE]")
    assert engine.stats["waiting"] == 0 and engine.stats["running"] == 0


@pytest.mark.parametrize("url,body", [
    ("/v1/chat/completions", chat(n=SLOTS + QUEUED + 1)),
    ("/v1/completions", {"model": "m", "max_tokens": 4, "n": 3, "prompt": ["a", "b"]}),
])
def test_a_request_that_can_never_fit_is_a_400(app, url, body):
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post(url, json=body)

    r = asyncio.run(scenario())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "n"
    assert "at most 5" in r.json()["error"]["message"]


def test_check_room_names_the_capacity(engine):
    with pytest.raises(InvalidRequestError):
        engine.check_room(SLOTS + QUEUED + 1)
    engine.check_room(SLOTS + QUEUED)            # an idle engine takes a full load


def test_a_generation_dropped_unread_is_aborted(engine):
    """A queued request whose stream is never read (its client left before the response
    began) does not run to max_tokens."""
    ids = engine.tokenizer.encode("Write a long story about a lighthouse.")

    async def scenario():
        before = engine.stats["generated_tokens"]
        generation = engine.generate(EngineRequest(
            "dropped", ids, SamplingParams(temperature=0, max_tokens=400)))
        await asyncio.sleep(0.3)
        del generation
        gc.collect()
        for _ in range(100):
            if engine.stats["running"] == 0 and engine.stats["waiting"] == 0:
                break
            await asyncio.sleep(0.05)
        return engine.stats["generated_tokens"] - before

    produced = asyncio.run(scenario())
    assert engine.stats["running"] == 0
    assert produced < 100
