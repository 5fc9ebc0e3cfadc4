"""The embedding engine (LlamaEmbedder) on the real packaged model: what ``embed`` promises
(one normalized vector per input, the same alone or packed with others), its bounds, and its
close."""

from __future__ import annotations

import asyncio
import math

import pytest

from podium.engine.base import EngineRequest, SamplingParams
from podium.engine.llamacpp.embed import LlamaEmbedder
from podium.engine.llamacpp.model_files import EMBED_MODEL, default_model_path
from podium.errors import InvalidRequestError

TEXTS = [f"Sentence {i}: the lighthouse keeper climbed the stairs again." for i in range(40)]


@pytest.fixture(scope="module")
def embedder():
    engine = LlamaEmbedder(default_model_path(EMBED_MODEL), served_name="e", n_threads=2)
    yield engine
    asyncio.run(engine.aclose())


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
