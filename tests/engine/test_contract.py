"""The engine contract: every engine held to what ``podium.engine.base.Engine`` promises, within
the ``Capabilities`` it declares. Tests branch on capabilities, never on the engine's kind;
another engine is one more entry in ``ENGINES``."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import itertools
import time
from pathlib import Path
from typing import Callable

import pytest

from podium.engine.base import (ENGINE_STATS, Engine, EngineOutput, EngineRequest, Generation,
                                SamplingParams)
from podium.engine.llamacpp.engine import LlamaCppEngine
from podium.engine.scripted import ScriptedEngine
from podium.errors import InvalidRequestError, RateLimited

SLOTS, QUEUED = 2, 2            # every engine runs 2 requests at once and queues 2 more
STORY = " ".join(f"Chapter {i}: the lighthouse keeper climbed the stairs again." for i in range(15))

ENGINES: dict[str, Callable[[Path], Engine]] = {
    "scripted": lambda path: ScriptedEngine.from_gguf(
        path, lambda _request: STORY, served_name="m", context_length=1024,
        max_num_seqs=SLOTS, max_queued=QUEUED),
    "llamacpp": lambda path: LlamaCppEngine(
        path, served_name="m", n_ctx=1024, n_batch=64, n_threads=1,
        max_num_seqs=SLOTS, max_queued=QUEUED),
}
if importlib.util.find_spec("vllm"):            # where vLLM is installed
    from podium.engine.vllm.engine import VllmEngine
    ENGINES["vllm"] = lambda path: VllmEngine.from_gguf(
        path, served_name="m", max_model_len=1024, enforce_eager=True, max_num_seqs=SLOTS,
        max_queued=QUEUED, engine_args={"kv_cache_memory_bytes": 1 << 30})

_ids = itertools.count()


@pytest.fixture(scope="module", params=list(ENGINES))
def engine(request, model_path):
    built = ENGINES[request.param](model_path)
    yield built
    asyncio.run(built.aclose())


def request(engine: Engine, text: str, **sampling) -> EngineRequest:
    logprobs = sampling.pop("logprobs", None)
    prompt_logprobs = sampling.pop("prompt_logprobs", None)
    sampling.setdefault("temperature", 0.0)
    prompt = engine.tokenizer.encode(
        f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    return EngineRequest(f"contract-{next(_ids)}", prompt, SamplingParams(**sampling),
                         logprobs, prompt_logprobs)


async def collect(outputs: Generation) -> list[EngineOutput]:
    return [out async for out in outputs]


def run(engine: Engine, req: EngineRequest) -> list[EngineOutput]:
    async def outputs() -> list[EngineOutput]:
        return await asyncio.wait_for(collect(engine.generate(req)), 120)
    return asyncio.run(outputs())


def tokens(outputs: list[EngineOutput]) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


async def until_idle(engine: Engine, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while engine.stats["running"] or engine.stats["waiting"]:
        assert time.monotonic() < deadline, dict(engine.stats)
        await asyncio.sleep(0.01)


def long_request(engine: Engine) -> EngineRequest:
    return request(engine, "Write a very long story about a lighthouse.", max_tokens=300)


# -- streaming and finishing ------------------------------------------------------------------

def test_a_stream_ends_with_exactly_one_finish_reason(engine):
    outs = run(engine, request(engine, "Count from 1 to 5.", max_tokens=300))
    assert [o.finish_reason for o in outs[:-1]] == [None] * (len(outs) - 1)
    assert outs[-1].finish_reason == "stop" and outs[-1].stopped_by_token
    ids = tokens(outs)
    assert ids and all(0 <= t < engine.tokenizer.vocab_size for t in ids)
    assert ids[-1] in engine.tokenizer.eos_token_ids
    assert not any(o.stopped_by_token for o in outs[:-1])
    assert engine.stats["running"] == 0 and engine.stats["waiting"] == 0


def test_a_stop_token_ends_the_stream_with_stop(engine):
    free = tokens(run(engine, request(engine, "Count from 1 to 5.", max_tokens=40)))
    stop_at = free[3]
    outs = run(engine, request(engine, "Count from 1 to 5.", max_tokens=40,
                               stop_token_ids=frozenset({stop_at})))
    assert tokens(outs) == free[:free.index(stop_at) + 1]
    assert outs[-1].finish_reason == "stop" and outs[-1].stopped_by_token


@pytest.mark.parametrize("max_tokens", [0, 1, 5])
def test_max_tokens_is_exact_and_ends_with_length(engine, max_tokens):
    outs = run(engine, request(engine, "Write a very long story.", max_tokens=max_tokens))
    assert len(tokens(outs)) == max_tokens
    assert outs[-1].finish_reason == "length" and not outs[-1].stopped_by_token


# -- sampling -----------------------------------------------------------------------------

def test_the_same_seed_gives_the_same_tokens(engine):
    def sample(seed: int) -> list[int]:
        return tokens(run(engine, request(engine, "Name some fruits.", max_tokens=16,
                                          temperature=1.0, top_p=0.95, top_k=40, seed=seed)))

    first = sample(1234)
    assert sample(1234) == first
    others = [sample(seed) for seed in (1, 2, 3)]
    if engine.capabilities.sampling:
        assert any(o != first for o in others)
    else:
        assert all(o == first for o in others)          # fixed tokens, whatever the seed


def test_a_grammar_constrains_the_output_or_is_declared_ignored(engine):
    grammar = 'start: ("yes" | "no") "."\n'   # llguidance's Lark, as podium.grammar makes
    kw = dict(max_tokens=8, temperature=1.0, seed=7)
    text = "Is the sky blue?"
    outs = run(engine, request(engine, text, grammar=grammar, **kw))
    if engine.capabilities.grammar:
        answer = engine.tokenizer.decode([t for t in tokens(outs)
                                          if t not in engine.tokenizer.eos_token_ids])
        assert answer in ("yes.", "no."), answer
        assert outs[-1].finish_reason == "stop"
    else:
        assert tokens(outs) == tokens(run(engine, request(engine, text, **kw)))


# the same schemas and a forced call on every engine: a keyword GBNF left unenforced
# (``patternProperties``, ``minimum`` on a number), and a call in the model's own markup
PATTERNED = {"type": "object", "patternProperties": {"^t_[a-z]+$": {"type": "number",
                                                                     "minimum": 100.5}},
             "additionalProperties": False, "minProperties": 1, "maxProperties": 2}
CALL_TOOLS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"], "additionalProperties": False}}


@pytest.mark.parametrize("case", ["schema", "call"])
def test_the_same_constraint_holds_on_every_engine(engine, case):
    import json

    import jsonschema

    from podium.grammar import schema_grammar, tool_call_grammar
    if case == "schema":
        grammar = schema_grammar(PATTERNED, "response_format.json_schema.schema")
        text = "Give temperatures as JSON."
    else:
        grammar = tool_call_grammar(CALL_TOOLS, "hermes", False,
                                    engine.tokenizer.grammar_specials)
        text = "What is the weather in Oslo?"
    engine.check_grammar(grammar)
    outs = run(engine, request(engine, text, grammar=grammar, max_tokens=64,
                               temperature=1.0, seed=11))
    if not engine.capabilities.grammar:
        return
    answer = engine.tokenizer.decode([t for t in tokens(outs)
                                      if t not in engine.tokenizer.eos_token_ids])
    assert outs[-1].finish_reason == "stop", answer
    if case == "schema":
        jsonschema.validate(json.loads(answer), PATTERNED)
    else:
        head, body, tail = answer.split("\n")
        assert (head, tail) == ("<tool_call>", "</tool_call>"), answer
        call = json.loads(body)
        assert call["name"] == "get_weather"
        jsonschema.validate(call["arguments"], CALL_TOOLS["get_weather"])


# -- log-probabilities ------------------------------------------------------------------------

def test_logprobs_give_the_chosen_token_and_k_alternatives(engine):
    k = 3
    outs = run(engine, request(engine, "Say hi.", max_tokens=6, logprobs=k))
    for out in outs:
        assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
        for token, lp in zip(out.token_ids, out.logprobs):
            assert lp.token_id == token and lp.logprob <= 0
            values = [v for _, v in lp.top]
            assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
            if engine.capabilities.logprobs:
                assert len(lp.top) == k
                assert lp.top[0][0] == token            # greedy picks the most likely token
                assert lp.logprob == pytest.approx(lp.top[0][1])
            else:
                assert lp.logprob == 0.0 and lp.top == [(token, 0.0)]


def test_no_logprobs_unless_asked(engine):
    assert all(o.logprobs is None and o.prompt_logprobs is None
               for o in run(engine, request(engine, "Say hi.", max_tokens=3)))


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_prompt_logprobs_come_once_for_every_prompt_token_after_the_first(engine, max_tokens):
    req = request(engine, "Hello there, lighthouse keeper.", max_tokens=max_tokens,
                  prompt_logprobs=2)
    outs = run(engine, req)
    scores = outs[0].prompt_logprobs
    assert scores is not None and len(scores) == len(req.prompt_token_ids)
    assert scores[0] is None
    assert [s.token_id for s in scores[1:] if s is not None] == req.prompt_token_ids[1:]
    for s in scores[1:]:
        assert s is not None and s.logprob <= 0
        assert len(s.top) == 2 if engine.capabilities.logprobs else len(s.top) <= 2
    assert all(o.prompt_logprobs is None for o in outs[1:])
    assert len(tokens(outs)) <= max_tokens and outs[-1].finish_reason is not None


# -- the prefix cache -------------------------------------------------------------------------

def test_a_repeated_prompt_reports_cached_tokens(engine):
    text = "Summarize this. " + " ".join(f"Fact {i}: lighthouses guide ships at night."
                                         for i in range(12))
    first = run(engine, request(engine, text, max_tokens=3))
    second_req = request(engine, text, max_tokens=3)
    second = run(engine, second_req)
    assert all(o.cached_tokens == 0 for o in first[1:] + second[1:])   # the first output only
    if engine.capabilities.prefix_cache:
        assert 0 < second[0].cached_tokens < len(second_req.prompt_token_ids)
    else:
        assert first[0].cached_tokens == second[0].cached_tokens == 0


# -- aborts -----------------------------------------------------------------------------------

def test_abort_mid_stream_ends_the_request_with_abort(engine):
    async def scenario():
        req = long_request(engine)
        seen = []
        async for out in engine.generate(req):
            seen.append(out)
            if len(seen) == 3:
                await engine.abort(req.request_id)
        await until_idle(engine)
        return seen

    seen = asyncio.run(scenario())
    assert seen[-1].finish_reason == "abort" and len(seen) <= 6
    assert [o.finish_reason for o in seen[:-1]] == [None] * (len(seen) - 1)


def test_closing_the_stream_aborts_the_request(engine):
    async def scenario():
        outputs = engine.generate(long_request(engine))
        await outputs.__anext__()
        await outputs.aclose()
        await until_idle(engine)
        before = engine.stats["generated_tokens"]
        await asyncio.sleep(0.3)
        return engine.stats["generated_tokens"] - before

    assert asyncio.run(scenario()) == 0


def test_a_stream_dropped_unread_is_aborted(engine):
    async def scenario():
        before = engine.stats["generated_tokens"]
        outputs = engine.generate(long_request(engine))
        assert engine.stats["running"] + engine.stats["waiting"] >= 1     # queued at once
        await asyncio.sleep(0.05)
        del outputs
        gc.collect()
        await until_idle(engine)
        return engine.stats["generated_tokens"] - before

    assert asyncio.run(scenario()) < 100


def test_a_request_aborted_while_queued_ends_with_abort(engine):
    """Both slots busy, a third request waits; aborting it ends its stream at once, with no
    tokens (its reader is not left waiting for a turn that never comes)."""
    async def scenario():
        running = [engine.generate(long_request(engine)) for _ in range(SLOTS)]
        for outputs in running:
            await outputs.__anext__()
        queued = long_request(engine)
        outputs = engine.generate(queued)
        await engine.abort(queued.request_id)
        seen = await asyncio.wait_for(collect(outputs), 30)
        for other in running:
            await other.aclose()
        await until_idle(engine)
        return seen

    seen = asyncio.run(scenario())
    assert tokens(seen) == [] and seen[-1].finish_reason == "abort"


# -- admission --------------------------------------------------------------------------------

def test_check_room_refuses_what_never_fits_and_what_does_not_fit_now(engine):
    async def scenario():
        with pytest.raises(InvalidRequestError) as never:
            engine.check_room(SLOTS + QUEUED + 1)
        engine.check_room(SLOTS + QUEUED)                # an idle engine takes a full load
        streams = [engine.generate(long_request(engine)) for _ in range(SLOTS + QUEUED)]
        with pytest.raises(RateLimited) as busy:         # queued at once: no await needed
            engine.check_room(1)
        for outputs in streams:
            await outputs.aclose()
        await until_idle(engine)
        engine.check_room(SLOTS + QUEUED)
        return never.value, busy.value

    never, busy = asyncio.run(scenario())
    assert never.status_code == 400 and never.param == "n"
    assert busy.status_code == 429 and busy.headers == {"retry-after": "1"}


def test_a_full_load_runs_to_the_end(engine):
    """As many requests as the engine holds, all read together: each one runs to its end."""
    async def scenario():
        reqs = [request(engine, f"Count from 1 to {i + 3}.", max_tokens=6)
                for i in range(SLOTS + QUEUED)]
        engine.check_room(len(reqs))
        return await asyncio.wait_for(
            asyncio.gather(*(collect(engine.generate(r)) for r in reqs)), 120)

    for outs in asyncio.run(scenario()):
        assert outs[-1].finish_reason in ("stop", "length") and tokens(outs)
    assert engine.stats["running"] == 0 and engine.stats["waiting"] == 0


# -- priority ---------------------------------------------------------------------------------

def test_a_higher_priority_request_goes_before_queued_lower_ones(engine):
    """Every sequence busy with low-priority work and more of it queued: a high-priority
    request queued after it starts before the queued low-priority request; an engine that
    preempts starts it at once (the running work makes at most a step or two meanwhile),
    and the work it preempted still answers exactly as it does alone (an engine that does
    not starts it when the first sequence frees)."""
    def low(i: int) -> EngineRequest:
        req = request(engine, f"Count from 1 to {40 + i}, one number a line.", max_tokens=24,
                      ignore_eos=True)
        req.priority = -1
        return req

    lows = [low(i) for i in range(SLOTS + 1)]
    alone = [tokens(run(engine, low(i))) for i in range(SLOTS + 1)]
    high = request(engine, "Name a colour.", max_tokens=4)

    async def scenario():
        seen: dict[str, list[int]] = {}
        started: list[str] = []
        marks: dict[str, int] = {}

        async def read(req: EngineRequest, outputs: Generation,
                       outs: list[EngineOutput]) -> list[EngineOutput]:
            async for out in outputs:
                if not outs:
                    started.append(req.request_id)
                    if req is high:         # the running work's tokens at its start
                        marks["at_start"] = sum(len(seen[r.request_id]) for r in lows[:SLOTS])
                outs.append(out)
                seen[req.request_id] += out.token_ids
            return outs

        running = [engine.generate(req) for req in lows[:SLOTS]]
        firsts = [[await outputs.__anext__()] for outputs in running]     # both running
        for req, outs in zip(lows, firsts):
            started.append(req.request_id)
            seen[req.request_id] = list(outs[0].token_ids)
        seen[lows[SLOTS].request_id], seen[high.request_id] = [], []
        marks["queued"] = sum(len(seen[r.request_id]) for r in lows[:SLOTS])
        engine.check_room(2)
        queued, urgent = engine.generate(lows[SLOTS]), engine.generate(high)
        tasks = [read(req, outputs, outs) for req, outputs, outs in zip(lows, running, firsts)]
        tasks += [read(lows[SLOTS], queued, []), read(high, urgent, [])]
        outs = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        await until_idle(engine)
        return outs, started, marks

    outs, started, marks = asyncio.run(scenario())
    assert started.index(high.request_id) < started.index(lows[SLOTS].request_id)
    assert outs[-1][-1].finish_reason in ("stop", "length") and tokens(outs[-1])
    for i, req in enumerate(lows):
        assert outs[i][-1].finish_reason == "length" and len(tokens(outs[i])) == 24, i
    if engine.capabilities.preemption:
        assert marks["at_start"] - marks["queued"] <= 3 * SLOTS, marks
        assert [tokens(o) for o in outs[:-1]] == alone


# -- stats ------------------------------------------------------------------------------------

def test_stats_name_the_contract_figures_and_count_a_request(engine):
    assert set(ENGINE_STATS) <= set(engine.stats)
    before = dict(engine.stats)
    outs = run(engine, request(engine, "Write a very long story.", max_tokens=5))
    after = engine.stats
    assert after["requests"] == before["requests"] + 1
    assert after["generated_tokens"] == before["generated_tokens"] + len(tokens(outs)) == \
        before["generated_tokens"] + 5
    assert after["running"] == 0 and after["waiting"] == 0
    assert 0 <= after["kv_tokens"] <= after["kv_capacity"]
    if engine.capabilities.prefix_cache:
        assert after["kv_tokens"] > 0


@pytest.fixture
def engine_kind(request) -> str:
    return request.node.callspec.params["engine"]


def test_loaded_off_the_loop_then_unloaded_answers_as_the_first(engine, engine_kind,
                                                                 model_path):
    """Load and unload, as a server of several models does them: a second engine of the same
    model, made in a worker thread while a loop runs, answers as the first; its close frees
    it and a second close is harmless."""
    expected = tokens(run(engine, request(engine, "Name a colour.", max_tokens=6)))

    async def cycle() -> list[int]:
        second = await asyncio.to_thread(ENGINES[engine_kind], model_path)
        try:
            got = await asyncio.wait_for(collect(second.generate(
                request(second, "Name a colour.", max_tokens=6))), 120)
        finally:
            await second.aclose()
        await second.aclose()
        return tokens(got)

    assert asyncio.run(cycle()) == expected
