"""The embedding engines on the real packaged model (llama.cpp's LlamaEmbedder on its GGUF;
vLLM's pooling runner on its sentence-transformers folder where vLLM is installed): what
``embed`` promises (one normalized vector per input, sentence-transformers' own, the same
alone or batched with others), its bounds, its priority; the llama.cpp worker's packing and
close."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
from pathlib import Path

import pytest

from podium.engine.base import EngineRequest, SamplingParams
from podium.engine.llamacpp.embed import LlamaEmbedder
from podium.engine.llamacpp.model_files import EMBED_MODEL, cache_dir, default_model_path
from podium.errors import InvalidRequestError

TEXTS = [f"Sentence {i}: the lighthouse keeper climbed the stairs again." for i in range(40)]
REFERENCE = json.loads((Path(__file__).parent.parent / "data" /
                        "all_minilm_l6_v2_reference.json").read_text())["items"]


def _vllm():
    from podium.engine.vllm.engine import VllmEngine

    default_model_path(EMBED_MODEL)                     # unpacks the folder too
    return VllmEngine(cache_dir() / EMBED_MODEL.folder_name, served_name="e", kind="embedding",
                      max_model_len=256, enforce_eager=True,
                      engine_args={"kv_cache_memory_bytes": 64 << 20})


EMBEDDERS = {"llamacpp": lambda: LlamaEmbedder(default_model_path(EMBED_MODEL),
                                               served_name="e", n_threads=2)}
if importlib.util.find_spec("vllm"):
    EMBEDDERS["vllm"] = _vllm


@pytest.fixture(scope="module", params=list(EMBEDDERS))
def any_embedder(request):
    engine = EMBEDDERS[request.param]()
    yield engine
    asyncio.run(engine.aclose())


@pytest.fixture(scope="module")
def embedder():
    engine = EMBEDDERS["llamacpp"]()
    yield engine
    asyncio.run(engine.aclose())


def test_every_embedder_gives_sentence_transformers_vectors(any_embedder):
    async def main():
        batched = await any_embedder.embed([item["token_ids"] for item in REFERENCE])
        alone = await any_embedder.embed([REFERENCE[0]["token_ids"]])
        return batched, alone[0]

    batched, alone = asyncio.run(main())
    for vector, item in zip(batched, REFERENCE):
        assert cosine(vector, item["embedding"]) >= 0.999, item["text"]
        assert abs(math.sqrt(sum(x * x for x in vector)) - 1) < 1e-3
    assert cosine(alone, batched[0]) > 0.9999
    assert any_embedder.dimensions == 384 and any_embedder.kind == "embedding"


def test_every_embedder_bounds_its_inputs_and_refuses_to_generate(any_embedder):
    async def main():
        with pytest.raises(InvalidRequestError) as too_long:
            await any_embedder.embed([[101, 102], [1996] * 300])
        assert too_long.value.param == "input[1]"
    asyncio.run(main())
    with pytest.raises(InvalidRequestError, match="embedding model"):
        any_embedder.check_room(1)


def test_every_embedder_embeds_a_higher_priority_request_before_queued_lower_ones(
        any_embedder):
    """A batch request's 600 inputs queued first (priority -1), an interactive request's
    after them (0): the interactive one is done while the batch one still runs, and each
    input gets the vector it gets without the other request. (Short inputs: the batch
    request's decodes stay quick.)"""
    ids = [any_embedder.tokenizer.encode(f"lighthouse {i}") for i in range(40)]

    async def main():
        alone = await any_embedder.embed(ids)
        low = asyncio.ensure_future(any_embedder.embed(ids * 15, -1))
        await asyncio.sleep(0.2)                # queued, and its first inputs running
        assert not low.done()
        high = await any_embedder.embed(ids[5:8], 0)
        low_done_first = low.done()
        return alone, high, low_done_first, await low

    alone, high, low_done_first, low = asyncio.run(main())
    assert not low_done_first
    assert cosine(alone[0], alone[1]) < 0.9999          # the inputs' vectors differ
    for vector, want in zip(high, alone[5:8]):
        assert cosine(vector, want) > 0.9999
    assert len(low) == 600
    for k, vector in enumerate(low):
        assert cosine(vector, alone[k % len(ids)]) > 0.9999


def test_within_a_priority_requests_take_turns(embedder):
    """Two batch requests and an interactive one after them: the interactive one first;
    then the batch requests share the decodes, one input of each in turn, so the second's
    2 inputs are done long before the first's 120."""
    ids = [embedder.tokenizer.encode(text) for text in TEXTS]
    finished: list[str] = []

    async def run(name: str, inputs: list[list[int]], priority: int) -> None:
        await embedder.embed(inputs, priority)
        finished.append(name)

    async def main():
        first = asyncio.ensure_future(run("first batch", ids * 3, -1))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(run("second batch", ids[:2], -1))
        await asyncio.sleep(0)
        await asyncio.gather(first, second, run("interactive", ids[:2], 0))

    asyncio.run(main())
    assert finished == ["interactive", "second batch", "first batch"]


def test_a_small_request_is_not_starved_by_a_big_one_of_its_priority(embedder):
    """The campaign's case in small: a request of 2,000 inputs queued first, another
    client's 1-input request after it at the same priority. The small one shares the next
    decodes (one input of each request in turn) instead of waiting for all 2,000: counted
    in decodes, not seconds, so a busy machine cannot make it pass or fail."""
    big = [embedder.tokenizer.encode(f"lighthouse keeper number {i}") for i in range(2000)]
    small = [embedder.tokenizer.encode("A victim's one short input.")]

    async def main():
        start = embedder.decodes
        waiting = asyncio.ensure_future(embedder.embed(big))
        while embedder.decodes == start:           # the big request is being embedded
            await asyncio.sleep(0.001)
        queued = embedder.decodes
        [vector] = await embedder.embed(small)
        done = embedder.decodes
        vectors = await waiting
        return queued, done, embedder.decodes, vector, vectors

    queued, done, end, vector, vectors = asyncio.run(main())
    assert end - queued > 40                        # the big request's decodes after it
    assert done - queued <= 3                       # the one in progress, then its own
    assert len(vectors) == 2000 and len(vector) == 384
    alone = asyncio.run(embedder.embed([big[7], small[0]]))
    assert cosine(vectors[7], alone[0]) > 0.9999 and cosine(vector, alone[1]) > 0.9999


def test_a_request_whose_caller_leaves_stops_within_a_decode(embedder):
    """A client gone (the route's task cancelled, as ``unless_gone`` does): the worker
    drops the rest of its inputs when it packs the next decode. Before, ``embed`` marked
    the job failed only when ``job.done`` was not done, but cancelling the task awaiting
    it cancels it, so the whole request was computed for nobody."""
    long = embedder.tokenizer.encode("the lighthouse keeper climbed the stairs " * 8)[:64]
    inputs = [long] * 1000                        # 8 a decode: 125 decodes, seconds of work

    async def main():
        start, embedded = embedder.decodes, embedder.stats["requests"]
        task = asyncio.ensure_future(embedder.embed(inputs))
        while embedder.decodes < start + 2:
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        left = embedder.decodes
        await asyncio.sleep(1.0)                  # several decodes' time
        after = embedder.decodes
        again = await embedder.embed([long])      # and the worker serves the next one
        return task, left, after, embedder.stats["requests"] - embedded, again

    task, left, after, embedded, again = asyncio.run(main())
    assert task.cancelled()
    assert after - left <= 1                      # only the decode in progress finished
    assert embedded < 100                         # of the 1,000 inputs
    assert len(again) == 1 and len(again[0]) == 384


def cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) *
                                                        sum(y * y for y in b))


def test_packed_with_others_each_vector_is_its_own(embedder):
    ids = [embedder.tokenizer.encode(t) for t in TEXTS]

    async def main():
        alone = [(await embedder.embed([one]))[0] for one in ids[:3]]
        before = embedder.decodes
        together = await asyncio.gather(*(embedder.embed([one]) for one in ids))
        return alone, together, embedder.decodes - before

    alone, together, decodes = asyncio.run(main())
    assert decodes < len(ids) / 4                 # 40 requests, shared decodes
    for a, [b] in zip(alone, together):
        assert cosine(a, b) > 0.9999
    for [vector] in together:
        assert len(vector) == 384 and abs(math.sqrt(sum(x * x for x in vector)) - 1) < 1e-4
    assert cosine(together[0][0], together[1][0]) < 0.9999      # different texts differ


def test_bounds_and_refusals(embedder):
    async def main():
        with pytest.raises(InvalidRequestError, match="1 to 256") as too_long:
            await embedder.embed([[101, 102], [7] * 257])
        assert too_long.value.param == "input[1]"
        with pytest.raises(InvalidRequestError):
            await embedder.embed([[]])
        with pytest.raises(InvalidRequestError, match="embedding model"):
            embedder.generate(EngineRequest("x", [1, 2], SamplingParams()))
    asyncio.run(main())


def test_close_fails_what_waits_and_a_second_close_is_harmless():
    engine = LlamaEmbedder(default_model_path(EMBED_MODEL), served_name="e", n_threads=2)

    async def main():
        waiting = asyncio.ensure_future(engine.embed([[101, 2023, 102]] * 500))
        await asyncio.sleep(0)
        await engine.aclose()
        await engine.aclose()
        try:
            await asyncio.wait_for(waiting, 10)         # done, or told: never left hanging
        except RuntimeError as exc:
            assert "unloaded" in str(exc)
        with pytest.raises(RuntimeError, match="unloaded"):     # and nothing after waits
            await asyncio.wait_for(engine.embed([[101, 102]]), 5)
    asyncio.run(main())
