"""Reasoning budgets kept by the engine (issue 41): the keeper's count on any token stream,
and the llama.cpp engine ending the default model's reasoning at its budget."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podium.engine.base import EngineRequest, ReasoningBudget, SamplingParams
from podium.engine.budget import BudgetKeeper
from podium.engine.llamacpp.engine import LlamaCppEngine
from podium.engine.scripted import within_budget

OPEN, ENDS, CLOSE = (1,), (2,), (9, 2, 9)      # <think>, </think>, "\n</think>\n\n"
_ids = itertools.count()


def run(budget: ReasoningBudget, model: list[int]) -> list[int]:
    """What an engine writes when the model would write ``model`` (a token a step)."""
    return within_budget(model, budget)


def reasoning_before_close(out: list[int], inside: bool) -> int:
    """Tokens of reasoning written before the first forced close."""
    start = 0 if inside else out.index(OPEN[0]) + 1
    return out.index(CLOSE[0], start) - start


@settings(max_examples=200, deadline=None)
@given(budget=st.integers(0, 30), n=st.integers(0, 60), inside=st.booleans())
def test_reasoning_ends_at_the_budget_when_the_model_would_go_on(budget, n, inside):
    model = ([] if inside else [5, *OPEN]) + [7] * n + list(ENDS) + [8, 8]
    out = run(ReasoningBudget(budget, CLOSE, ENDS, OPEN, inside), model)
    if n < budget:
        assert out == model                     # the model ended within its budget
    else:
        assert reasoning_before_close(out, inside) == budget
        assert out[-5:] == [*CLOSE, 8, 8]       # the close, then the model's answer
        assert out.count(ENDS[0]) == 1          # one end of reasoning, the engine's


def test_budget_zero_closes_before_anything_when_the_prompt_opened_reasoning():
    keeper = BudgetKeeper(ReasoningBudget(0, CLOSE, ENDS, OPEN, inside=True))
    assert keeper.forced() == CLOSE[0] and keeper.reached


def test_a_refused_close_is_tried_again_after_the_next_token():
    keeper = BudgetKeeper(ReasoningBudget(2, CLOSE, ENDS, OPEN, inside=True))
    for token in (7, 7):
        keeper.feed(token)
    assert keeper.forced() == CLOSE[0]
    keeper.refused()                            # a grammar would not take it here
    assert keeper.forced() is None
    keeper.feed(7)                              # the model's token, still reasoning
    assert keeper.forced() == CLOSE[0] and keeper.spent == 3
    for token in CLOSE:
        keeper.feed(token)
    assert keeper.forced() is None and not keeper.inside


def test_outside_reasoning_nothing_is_counted():
    keeper = BudgetKeeper(ReasoningBudget(1, CLOSE, ENDS, OPEN))
    for token in (7, 7, 7):
        keeper.feed(token)
    assert keeper.spent == 0 and keeper.forced() is None


# -- the llama.cpp engine on the default model ---------------------------------------------

@pytest.fixture(scope="module")
def engine(model_path):
    built = LlamaCppEngine(model_path, served_name="m", n_ctx=1024, n_batch=64,
                           max_num_seqs=2)
    yield built
    asyncio.run(built.aclose())


@pytest.mark.parametrize("budget", [0, 12])
def test_the_engine_writes_the_close_at_the_budget_and_the_model_answers(engine, budget):
    tok = engine.tokenizer
    encode = lambda text: tuple(tok.encode(text, add_special=False))   # noqa: E731
    reasoning = ReasoningBudget(budget, close=encode("\n</think>\n\n"), ends=encode("</think>"),
                                open=encode("<think>"), inside=True)
    prompt = tok.encode("<|im_start|>user\nWhat is 17 * 23? Think step by step, at length."
                        "<|im_end|>\n<|im_start|>assistant\n<think>\n")
    req = EngineRequest(f"b{next(_ids)}", prompt, SamplingParams(
        max_tokens=48, temperature=0.0, ignore_eos=False, reasoning=reasoning))

    async def collect():
        return [t async for out in engine.generate(req) for t in out.token_ids]
    out = asyncio.run(collect())
    close = list(reasoning.close)
    at = next(i for i in range(len(out)) if out[i:i + len(close)] == close)
    assert at == budget                                # exactly the budget of reasoning
    answer = tok.decode(out[at + len(close):])
    assert answer.strip() and "</think>" not in answer  # the model went on to answer
