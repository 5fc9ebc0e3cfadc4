from hypothesis import given, settings
from hypothesis import strategies as st

from podium.engine.base import EngineOutput, TokenLogprob
from podium.parsing.events import Finish, TextDelta
from podium.text.pipeline import TextPipeline

REPLY = "Answer: 42 🫠 done. END and more text after"


def outputs(ids, sizes, eos=None):
    """Engine outputs carrying ``ids`` in steps of the given sizes (the last ends with eos)."""
    outs, i = [], 0
    for size in sizes:
        if i >= len(ids):
            break
        step = ids[i:i + size]
        i += len(step)
        outs.append(EngineOutput(step, [TokenLogprob(t, -0.5, []) for t in step]))
    if i < len(ids):
        rest = ids[i:]
        outs.append(EngineOutput(rest, [TokenLogprob(t, -0.5, []) for t in rest]))
    last = outs[-1]
    if eos is not None:
        last.token_ids.append(eos)
        last.logprobs.append(TokenLogprob(eos, -0.1, []))
        last.stopped_by_token = True
    last.finish_reason = "stop" if eos is not None else "length"
    return outs


def run(tokenizer, outs, stop=None):
    pipe, events = TextPipeline(tokenizer, stop, want_logprobs=True), []
    for out in outs:
        events += pipe.feed(out)
        if pipe.finished:
            break
    return pipe, events


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=30))
def test_any_step_sizes_give_the_same_text_and_logprobs(tokenizer, sizes):
    ids = tokenizer.encode(REPLY, add_special=False)
    eos = min(tokenizer.eos_token_ids)
    pipe, events = run(tokenizer, outputs(ids, sizes, eos), stop=["END"])
    deltas = [e for e in events if isinstance(e, TextDelta)]
    text = "".join(d.text for d in deltas)
    assert text == "Answer: 42 🫠 done. "
    assert "\ufffd" not in text
    # logprobs travel with their text: exactly the tokens fully released, in order
    released = [lp.token_id for d in deltas for lp in d.logprobs]
    # (" END" straddles the cut: its space is text, but the token belongs to the stop string)
    assert tokenizer.decode(released) == "Answer: 42 🫠 done."
    assert isinstance(events[-1], Finish) and events[-1].reason == "stop"
    assert pipe.finished


def test_eos_counts_as_a_token_but_has_no_text(tokenizer):
    ids = tokenizer.encode("Hi!", add_special=False)
    eos = min(tokenizer.eos_token_ids)
    _, events = run(tokenizer, outputs(ids, [1], eos))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hi!"
    assert events[-1] == Finish("stop", len(ids) + 1)


def test_length_finish_releases_held_text(tokenizer):
    ids = tokenizer.encode("abc EN", add_special=False)
    _, events = run(tokenizer, outputs(ids, [1] * len(ids)), stop=["END"])
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "abc EN"
    assert events[-1] == Finish("length", len(ids))
