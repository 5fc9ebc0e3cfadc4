"""Continuous batching on the real default model: several requests share each decode step.

Each request's tokens must equal the same request run alone (same seed), greedy and sampled,
whatever else shares the batch; aborts leave the others intact; a prompt extending a cached
one reuses it; a full queue answers 429.
"""

import asyncio
import itertools

import pytest

from podium.engine.base import EngineRequest, SamplingParams
from podium.engine.llamacpp.engine import LlamaCppEngine
from podium.errors import RateLimited

_ids = itertools.count()
PROMPTS = ["Write a haiku about the sea.", "List three prime numbers and explain why.",
           "Translate 'good morning' into French and German.",
           "Explain recursion to a child in two sentences. " * 6,   # > one prefill chunk
           "What is 17 times 23?", "Name a famous bridge."]


@pytest.fixture(scope="module")
def engine(model_path):
    eng = LlamaCppEngine(model_path, served_name="m", n_ctx=1024, n_batch=64, max_num_seqs=4,
                         max_queued=3, deterministic=True)
    yield eng
    asyncio.run(eng.aclose())


def request(engine, text, **sampling):
    sampling.setdefault("temperature", 0.0)
    sampling.setdefault("max_tokens", 24)
    ids = engine.tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    return EngineRequest(f"b{next(_ids)}", ids, SamplingParams(**sampling))


def renamed(req):
    return EngineRequest(f"b{next(_ids)}", list(req.prompt_token_ids), req.sampling)


async def tokens(engine, req, abort_after=None):
    out, finish = [], None
    async for o in engine.generate(req):
        out += o.token_ids
        finish = o.finish_reason
        if abort_after is not None and len(out) >= abort_after:
            await engine.abort(req.request_id)
            abort_after = None
    return out, finish


def alone(engine, reqs):
    return [asyncio.run(tokens(engine, renamed(r))) for r in reqs]


async def together(engine, reqs, **kw):
    return await asyncio.gather(*(tokens(engine, r, **kw.get(r.request_id, {})) for r in reqs))


def mixed_requests(engine):
    sampled = dict(temperature=0.9, top_p=0.95, top_k=40)
    return [request(engine, PROMPTS[0]),
            request(engine, PROMPTS[1], seed=7, **sampled),
            request(engine, PROMPTS[2], max_tokens=9),
            request(engine, PROMPTS[3], seed=11, presence_penalty=0.5, **sampled),
            request(engine, PROMPTS[4], logit_bias={15: -100.0}),
            request(engine, PROMPTS[5], seed=3, **sampled)]


def test_concurrent_requests_equal_each_run_alone(engine):
    reqs = mixed_requests(engine)          # six requests, four slots: two wait their turn
    expected = alone(engine, reqs)
    got = asyncio.run(together(engine, [renamed(r) for r in reqs]))
    assert got == expected
    assert all(finish in ("stop", "length") for _, finish in got)
    assert engine.stats["running"] == 0 and engine.stats["waiting"] == 0


def test_long_prompts_crowded_equal_each_run_alone(engine):
    """Prompts past 256 tokens: llama.cpp's flash attention splits a long KV range across
    threads when few rows attend, so a row's numbers depended on the crowd (the second
    request's first token differed) until --deterministic turned flash attention off."""
    reqs = [request(engine, "Explain recursion to a child in two sentences. " * 40
                    + "Now summarize.", max_tokens=32),
            request(engine, "Describe the water cycle with examples. " * 40
                    + "Now list the steps.", max_tokens=32)]
    assert min(len(r.prompt_token_ids) for r in reqs) > 256
    expected = alone(engine, reqs)
    got = asyncio.run(together(engine, [renamed(r) for r in reqs]))
    assert got == expected


def test_an_abort_in_the_middle_of_a_batch_leaves_the_others_intact(engine):
    reqs = mixed_requests(engine)[:4]
    expected = alone(engine, reqs)
    reqs = [renamed(r) for r in reqs]
    got = asyncio.run(together(engine, reqs, **{reqs[1].request_id: {"abort_after": 3}}))
    assert got[1][1] == "abort" and got[1][0][:3] == expected[1][0][:3]
    assert [got[i] for i in (0, 2, 3)] == [expected[i] for i in (0, 2, 3)]


def test_a_prompt_extending_a_cached_one_reuses_it(engine):
    first = request(engine, PROMPTS[3], max_tokens=8)
    out, _ = asyncio.run(tokens(engine, first))
    follow_up = engine.tokenizer.encode("<|im_end|>\n<|im_start|>user\nShorter please.<|im_end|>\n"
                                        "<|im_start|>assistant\n")
    second = EngineRequest("reuse", first.prompt_token_ids + out + follow_up,
                           SamplingParams(temperature=0.0, max_tokens=12))

    cached, reused = asyncio.run(first_output(engine, second))
    assert cached >= 64 and cached % 64 == 0           # whole prefill chunks were reused
    # the same prompt on an engine with nothing cached gives the same tokens
    fresh = LlamaCppEngine(engine._model.path, served_name="m", n_ctx=1024, n_batch=64,
                           max_num_seqs=1, deterministic=True)
    try:
        cold_cached, cold = asyncio.run(first_output(fresh, renamed(second)))
    finally:
        asyncio.run(fresh.aclose())
    assert cold_cached == 0 and cold == reused


async def first_output(engine, req):
    """The reused-token count (on the first output) and all the tokens."""
    outputs = [o async for o in engine.generate(req)]
    return outputs[0].cached_tokens, [t for o in outputs for t in o.token_ids]


def test_a_full_queue_is_refused_with_429(engine):
    async def scenario():
        slow = [request(engine, p, max_tokens=40) for p in PROMPTS[:4]]
        tasks = [asyncio.create_task(tokens(engine, r)) for r in slow]
        await asyncio.sleep(0.2)                     # the four slots are busy
        queued = [request(engine, p, max_tokens=2) for p in PROMPTS[:3]]
        engine.check_room(len(queued))               # room for three in the queue
        tasks += [asyncio.create_task(tokens(engine, r)) for r in queued]
        await asyncio.sleep(0)
        with pytest.raises(RateLimited) as info:
            engine.check_room(1)
        results = await asyncio.gather(*tasks)
        return info.value, results

    error, results = asyncio.run(scenario())
    assert error.status_code == 429 and error.headers["retry-after"] == "1"
    assert all(finish in ("stop", "length") for _, finish in results)   # nobody was cut off


def test_a_request_that_fails_to_sample_fails_alone(engine, monkeypatch):
    from podium.engine.llamacpp import engine as engine_module
    from podium.errors import EngineError

    class Exploding(engine_module.Sampler):
        def sample(self, ctx, index=-1):
            if self.seed == 666:
                raise RuntimeError("boom")
            return super().sample(ctx, index)

    reqs = mixed_requests(engine)[:3]
    expected = alone(engine, reqs)
    monkeypatch.setattr(engine_module, "Sampler", Exploding)
    bad = request(engine, PROMPTS[4], seed=666, temperature=0.7)

    async def scenario():
        results = await asyncio.gather(*(tokens(engine, renamed(r)) for r in reqs),
                                       tokens(engine, bad), return_exceptions=True)
        return results[:3], results[3]

    good, failed = asyncio.run(scenario())
    assert isinstance(failed, EngineError)
    assert good == expected
    assert engine.stats["running"] == 0


def test_more_streams_than_a_decode_group_all_advance(model_path):
    """Nine streams under ``--deterministic``: each step decodes them in two groups (at most
    7 rows a decode), and both groups advance every step: when the first stream ends, every
    other has made tokens (a group that returned nothing once ended the step after the first,
    and the last two streams waited for the first seven to finish)."""
    eng = LlamaCppEngine(model_path, served_name="m", n_ctx=256, n_batch=64, max_num_seqs=9,
                         deterministic=True)
    try:
        reqs = [request(eng, f"Count from {i} upward.", max_tokens=16, ignore_eos=True)
                for i in range(9)]
        made = {r.request_id: 0 for r in reqs}
        at_first_end: list[dict[str, int]] = []

        async def one(req):
            async for out in eng.generate(req):
                made[req.request_id] += len(out.token_ids)
                if out.finish_reason and not at_first_end:
                    at_first_end.append(dict(made))

        async def crowd():
            await asyncio.wait_for(asyncio.gather(*(one(r) for r in reqs)), 300)

        asyncio.run(crowd())
        assert all(n == 16 for n in made.values())
        assert min(at_first_end[0].values()) >= 3, at_first_end     # (prompts: one a step)
    finally:
        asyncio.run(eng.aclose())
