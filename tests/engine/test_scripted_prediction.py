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
    # the first token finds the prediction; then drafts of 4, then 6 (the most a verify
    # takes here) while they are accepted whole, to where the prediction ends
    outputs = run(scripted([REPLY]), REPLY)
    assert figures(outputs) == [(1, 4, 0), (6, 6, 0), (13, 6, 0)]
    assert len(outputs) == len(REPLY) + 1


def test_an_edit_rejects_the_rest_of_its_draft_and_drafting_resumes_after_it(scripted):
    # the draft at 6 meets the edit at 10: 4 accepted, 2 rejected, 150 written; the
    # prediction is found again two tokens on (111, 112), and drafted from there
    outputs = run(scripted([EDITED]), REPLY)
    assert figures(outputs) == [(1, 4, 0), (6, 4, 2), (13, 5, 0), (19, 1, 0)]


def test_an_unrelated_prediction_is_never_drafted(scripted):
    # the output never meets it: no draft is made, none rejected
    assert figures(run(scripted([REPLY]), UNRELATED)) == []


def test_drafts_leave_room_for_the_steps_own_token_within_max_tokens(scripted):
    outputs = run(scripted([REPLY]), REPLY, max_tokens=7)
    assert figures(outputs) == [(1, 4, 0)]         # then no room: token 6 is the last
    assert [t for o in outputs for t in o.token_ids] == REPLY[:7]
    assert outputs[-1].finish_reason == "length"


def test_a_stop_token_ends_the_accepted_run_and_the_rest_of_the_draft_is_rejected(scripted):
    outputs = run(scripted([REPLY]), REPLY, stop_token_ids=frozenset({103}))
    assert figures(outputs) == [(1, 3, 1)]          # 101 102 103 of 101-104
    assert outputs[-1].token_ids == [103] and outputs[-1].finish_reason == "stop"


def test_several_tokens_a_step_carry_the_verifies_that_began_in_them(scripted):
    outputs = run(scripted([REPLY], tokens_per_step=3), REPLY)
    # verifies begin at tokens 1, 6 and 13: in the steps of tokens 0-2, 6-8, 12-14
    assert figures(outputs) == [(0, 4, 0), (2, 6, 0), (4, 6, 0)]
