"""Speculative decoding in the llama.cpp engine on the real default model (issue 42): drafts
from a prediction and from n-grams are verified inside the decode step, and the answer is the
one given without them (``--no-deterministic``, where drafting runs)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from podium.engine.base import EngineRequest, ReasoningBudget, SamplingParams
from podium.engine.draft import StepCosts
from podium.engine.llamacpp.engine import LlamaCppEngine
from podium.grammar.build import schema_grammar

_ids = itertools.count()
CODE = "".join(f"def step_{i}(total, x):\n    total = total + x * {i}\n    return total\n\n"
               for i in range(6))
EDIT = ("Rename the variable `total` to `acc` in this file. Answer with the whole file only."
        f"\n\n```python\n{CODE}```")


@pytest.fixture(scope="module")
def engines(model_path):
    """One engine that drafts (n-grams and predictions) and one that never does."""
    kw = dict(served_name="m", n_ctx=1024, n_batch=64, max_num_seqs=4, deterministic=False)
    drafting = LlamaCppEngine(model_path, speculative="ngram", **kw)
    plain = LlamaCppEngine(model_path, speculative="off", **kw)
    plain._drafting = False         # not even a forced token or a prediction: the reference
    # decodes measured as cheap whatever their rows: every draft pays, so the verify shapes
    # are the same at every run (on real costs they follow the timings; whether a draft
    # pays on this machine's costs is StepCosts' own test, tests/engine/test_draft.py)
    drafting._costs = cheap = StepCosts(64)
    for rows in range(1, 65):
        cheap.note(rows, 0.01 * (1 + 0.01 * rows))
    yield drafting, plain
    for eng in (drafting, plain):
        asyncio.run(eng.aclose())


def request(engine, text, **sampling):
    sampling.setdefault("temperature", 0.0)
    sampling.setdefault("max_tokens", 64)
    prediction = sampling.pop("prediction", None)
    logprobs = sampling.pop("logprobs", None)
    if isinstance(prediction, str):
        prediction = tuple(engine.tokenizer.encode(prediction, add_special=False))
    ids = engine.tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    return EngineRequest(f"d{next(_ids)}", ids, SamplingParams(prediction=prediction, **sampling),
                         logprobs=logprobs)


async def outputs(engine, req, abort_after=None):
    outs = []
    async for o in engine.generate(req):
        outs.append(o)
        if abort_after is not None and len(outs) >= abort_after:
            await engine.abort(req.request_id)
            abort_after = None
    return outs


def tokens(outs):
    return [t for o in outs for t in o.token_ids]


def run(engine, text, **sampling):
    return asyncio.run(outputs(engine, request(engine, text, **sampling)))


def test_a_prediction_of_the_answer_is_accepted_and_changes_nothing(engines):
    drafting, plain = engines
    before = dict(drafting.stats)
    alone = run(plain, EDIT, max_tokens=120)
    answer = drafting.tokenizer.decode(tokens(alone))
    got = run(drafting, EDIT, max_tokens=120, prediction=answer)
    assert tokens(got) == tokens(alone)
    assert all(len(o.token_ids) == 1 for o in got)          # one output a token, as always
    accepted = sum(o.accepted_prediction for o in got)
    assert accepted > len(tokens(alone)) // 2
    assert sum(o.rejected_prediction for o in got) <= 2
    assert drafting.stats["accepted_prediction"] - before["accepted_prediction"] == accepted
    assert drafting.stats["running"] == 0


def test_a_wrong_prediction_is_rejected_and_leaves_the_cache_as_without_it(engines):
    drafting, plain = engines
    alone = tokens(run(plain, EDIT, max_tokens=60))
    wrong = "class Unrelated:\n    pass\n" * 20
    got = run(drafting, EDIT, max_tokens=60, prediction=wrong)
    assert tokens(got) == alone
    assert sum(o.accepted_prediction for o in got) <= 3
    # the same prompt again reuses the slot's cache, rejected drafts and all removed
    again = run(drafting, EDIT, max_tokens=60)
    assert again[0].cached_tokens > 0 and tokens(again) == alone


def test_a_seeded_sampled_answer_is_the_same_with_drafts(engines):
    drafting, plain = engines
    kw = dict(temperature=1.0, seed=1234, top_p=0.95, max_tokens=60)
    alone = tokens(run(plain, EDIT, **kw))
    answer = drafting.tokenizer.decode(alone)
    got = run(drafting, EDIT, prediction=answer, **kw)
    assert tokens(got) == alone and sum(o.accepted_prediction for o in got) > 0


def test_ngram_drafts_copy_from_the_prompt_and_change_nothing(engines):
    drafting, plain = engines
    before = drafting.stats["accepted_ngram"]
    text = "Repeat this file exactly:\n\n" + CODE
    assert tokens(run(drafting, text, max_tokens=80)) == tokens(run(plain, text, max_tokens=80))
    assert drafting.stats["accepted_ngram"] > before


def test_constrained_output_verifies_drafts_against_the_grammar(engines):
    drafting, plain = engines
    grammar = schema_grammar({"type": "object", "properties": {
        "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "tags"], "additionalProperties": False}, "response_format")
    text = 'Describe a cat as JSON: {"name": ..., "tags": [...]}'
    alone = tokens(run(plain, text, grammar=grammar, max_tokens=60))
    answer = drafting.tokenizer.decode(alone)
    # the prediction is the answer with a tail the grammar refuses: drafts stop there
    got = run(drafting, text, grammar=grammar, max_tokens=60, prediction=answer + "} trailing")
    assert tokens(got) == alone
    assert sum(o.accepted_prediction for o in got) > 0


def test_logprobs_with_drafts_are_the_tokens_own(engines):
    drafting, plain = engines
    alone = run(plain, EDIT, max_tokens=30, logprobs=2)
    answer = drafting.tokenizer.decode(tokens(alone))
    got = run(drafting, EDIT, max_tokens=30, logprobs=2, prediction=answer)
    assert tokens(got) == tokens(alone) and sum(o.accepted_prediction for o in got) > 0
    for a, b in zip(alone, got):
        (la,), (lb,) = a.logprobs, b.logprobs
        assert la.token_id == lb.token_id
        assert abs(la.logprob - lb.logprob) < 0.05          # a verify row's numbers
        assert [t for t, _ in la.top][:1] == [t for t, _ in lb.top][:1]


def test_a_reasoning_budgets_close_is_written_as_drafts(engines):
    drafting, plain = engines
    tok = drafting.tokenizer
    close = tuple(tok.encode("\n</think>\n\n", add_special=False))
    budget = ReasoningBudget(0, close, tuple(tok.encode("</think>", add_special=False)),
                             inside=True)
    alone = tokens(run(plain, "Say hi.", reasoning=budget, max_tokens=12))
    got = tokens(run(drafting, "Say hi.", reasoning=budget, max_tokens=12))
    assert got == alone and tuple(got[:len(close)]) == close


def test_max_tokens_and_stops_end_a_verify_at_the_same_token(engines):
    drafting, plain = engines
    alone = tokens(run(plain, EDIT, max_tokens=200))
    answer = drafting.tokenizer.decode(alone)
    for n in (1, 2, 7, 13):
        got = run(drafting, EDIT, max_tokens=n, prediction=answer)
        assert tokens(got) == alone[:n] and got[-1].finish_reason == "length"
    stop = alone[9]
    got = run(drafting, EDIT, max_tokens=200, prediction=answer, stop_token_ids=frozenset({stop}))
    assert tokens(got) == alone[:alone.index(stop) + 1] and got[-1].finish_reason == "stop"


def test_an_abort_stops_a_drafting_request_within_a_step(engines):
    drafting, _ = engines
    req = request(drafting, EDIT, max_tokens=300, prediction=CODE.replace("total", "acc"))
    outs = asyncio.run(outputs(drafting, req, abort_after=5))
    assert outs[-1].finish_reason == "abort" and len(tokens(outs)) < 60
    assert drafting.stats["running"] == 0


def test_four_streams_with_drafts_run_together(engines):
    """Four at once, two of them with predictions of their answers: the drafts verify in the
    shared decode, every stream runs to its end. Their tokens are not held to the same crowd
    without drafts: with --no-deterministic the rows a step holds change a row's numbers
    (repacked weights), and drafts add rows; in runs here one of the four (the limerick,
    or a predicted stream) changed in a late token (docs/architecture.md)."""
    drafting, plain = engines
    texts = [EDIT, "Repeat this file exactly:\n\n" + CODE, "Name three rivers.",
             "Write a limerick about a cat."]

    async def together(engine, predictions):
        reqs = [request(engine, t, max_tokens=40, prediction=p)
                for t, p in zip(texts, predictions)]
        return await asyncio.gather(*(outputs(engine, r) for r in reqs))
    plain_outs = asyncio.run(together(plain, [None] * 4))
    want = [tokens(o) for o in plain_outs]
    predictions = [drafting.tokenizer.decode(w) for w in want[:2]] + [None, None]
    got = asyncio.run(together(drafting, predictions))
    assert all(sum(o.accepted_prediction for o in outs) > 10 for outs in got[:2])
    assert [outs[-1].finish_reason for outs in got] == [o[-1].finish_reason for o in plain_outs]
    assert all(len(o.token_ids) == 1 for outs in got for o in outs)
    same = sum(tokens(g) == w for g, w in zip(got, want))
    assert same >= 2, f"{same} of 4 answered as without drafts"
    assert drafting.stats["running"] == 0


def test_a_deterministic_engine_never_drafts(model_path):
    eng = LlamaCppEngine(model_path, served_name="m", n_ctx=512, n_batch=64, max_num_seqs=1,
                         deterministic=True)
    try:
        assert eng.capabilities.drafts is False
        out = asyncio.run(outputs(eng, request(eng, "Say hi.", max_tokens=8,
                                               prediction="Hi! How can I help?")))
        assert sum(o.accepted_prediction + o.rejected_prediction for o in out) == 0
        assert eng.stats["drafted_prediction"] == eng.stats["drafted_ngram"] == 0
    finally:
        asyncio.run(eng.aclose())
