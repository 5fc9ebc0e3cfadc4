"""The scripted engine's Predicted Outputs: the real draft logic (engine/draft.py) run over the
script, so that the API above it sees the figures a drafting engine reports, while the
tokens stay the script's."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from podium.engine.base import EngineOutput, EngineRequest, SamplingParams

REPLY = list(range(100, 120))                   # 20 tokens, then the script's end of turn
EDITED = REPLY[:10] + [150] + REPLY[11:]        # one token changed: the edit
UNRELATED = [7, 8, 9]

_ids = itertools.count()


def run(engine, prediction: list[int] | None, **sampling) -> list[EngineOutput]:
    request = EngineRequest(f"p-{next(_ids)}", [1, 2, 3], SamplingParams(
        prediction=tuple(prediction) if prediction else None, **{"max_tokens": 100,
                                                                  **sampling}))

    async def outputs() -> list[EngineOutput]:
        return [out async for out in engine.generate(request)]
    return asyncio.run(outputs())


def figures(outputs: list[EngineOutput]) -> list[tuple[int, int, int]]:
    """(output index, accepted, rejected) of each output that carries any."""
    return [(i, o.accepted_prediction, o.rejected_prediction) for i, o in enumerate(outputs)
            if o.accepted_prediction or o.rejected_prediction]


def shape(outputs: list[EngineOutput]) -> list[tuple]:
    return [(o.token_ids, o.finish_reason, o.stopped_by_token) for o in outputs]


@pytest.mark.parametrize("step", [1, 3])
@pytest.mark.parametrize("max_tokens", [100, 7])
@pytest.mark.parametrize("prediction", [REPLY, EDITED, UNRELATED])
def test_a_prediction_never_changes_the_outputs(scripted, step, max_tokens, prediction):
    engine = scripted([REPLY], tokens_per_step=step)
    plain = run(engine, None, max_tokens=max_tokens)
    assert shape(run(engine, prediction, max_tokens=max_tokens)) == shape(plain)
    assert figures(plain) == []


def test_an_exact_prediction_is_accepted_in_drafts_that_grow(scripted):
    # drafts of 4, then 6 (the most a verify takes here) while they are accepted whole; the
    # last stops where the prediction does (the end of turn is the step's own token)
    outputs = run(scripted([REPLY]), REPLY)
    assert figures(outputs) == [(0, 4, 0), (5, 6, 0), (12, 6, 0), (19, 1, 0)]
    assert len(outputs) == len(REPLY) + 1


def test_an_edit_rejects_the_rest_of_its_draft_and_drafting_resumes_after_it(scripted):
    # the draft at 5 meets the edit at 10: 5 accepted, 1 rejected, 150 written; the
    # prediction is found again two tokens on (111, 112), and drafted from there
    outputs = run(scripted([EDITED]), REPLY)
    assert figures(outputs) == [(0, 4, 0), (5, 5, 1), (13, 6, 0)]


def test_an_unrelated_prediction_is_rejected_and_not_drafted_again(scripted):
    assert figures(run(scripted([REPLY]), UNRELATED)) == [(0, 0, 3)]


def test_drafts_leave_room_for_the_steps_own_token_within_max_tokens(scripted):
    outputs = run(scripted([REPLY]), REPLY, max_tokens=7)
    assert figures(outputs) == [(0, 4, 0), (5, 1, 0)]
    assert [t for o in outputs for t in o.token_ids] == REPLY[:7]
    assert outputs[-1].finish_reason == "length"


def test_a_stop_token_ends_the_accepted_run_and_the_rest_of_the_draft_is_rejected(scripted):
    outputs = run(scripted([REPLY]), REPLY, stop_token_ids=frozenset({105}))
    assert figures(outputs) == [(0, 4, 0), (5, 1, 5)]
    assert outputs[-1].token_ids == [105] and outputs[-1].finish_reason == "stop"


def test_several_tokens_a_step_carry_the_verifies_that_began_in_them(scripted):
    outputs = run(scripted([REPLY], tokens_per_step=3), REPLY)
    # verifies begin at tokens 0, 5, 12 and 19: in the steps of tokens 0-2, 3-5, 12-14, 18-20
    assert figures(outputs) == [(0, 4, 0), (1, 6, 0), (4, 6, 0), (6, 1, 0)]
