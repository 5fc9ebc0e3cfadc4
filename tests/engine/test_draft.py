"""Draft sources and the draft-length rule (podium/engine/draft.py), without a model."""

from hypothesis import given, settings, strategies as st

from podium.engine.draft import (MAX_DRAFT, MISSES, NGRAM, PREDICTION, ROW_PRIOR, Drafts,
                                 NGrams, Prediction, StepCosts, expected_tokens)


def follow(prediction, output):
    p = Prediction(prediction)
    for token in output:
        p.feed(token)
    return p


def test_a_prediction_followed_token_for_token_drafts_what_comes_next():
    assert follow([1, 2, 3, 4, 5, 6], []).draft(3) == []      # not before the output starts
    p = follow([1, 2, 3, 4, 5, 6], [1, 2])
    assert p.draft(3) == [3, 4, 5]
    assert p.draft(10) == [3, 4, 5, 6]


def test_an_answer_opening_with_a_fence_finds_the_prediction_after_two_tokens():
    fence, lang = 90, 91
    p = follow([1, 2, 3, 4, 5, 6], [fence])
    assert p.draft(3) == []
    for token in (lang, 1):
        p.feed(token)
        assert p.draft(3) == []
    p.feed(2)
    assert p.draft(3) == [3, 4, 5]


def test_after_an_edit_the_prediction_is_found_again_from_the_last_two_tokens():
    # prediction: a b OLD c d e f; output: a b NEW NEW2 c d -> goes on with e f
    p = follow([10, 11, 90, 12, 13, 14, 15], [10, 11, 70, 71])
    assert p.ahead is None and p.draft(4) == []         # off the prediction: no draft
    p.feed(12)
    assert p.draft(4) == []                             # one token is not enough to align
    p.feed(13)
    assert p.draft(4) == [14, 15]


def test_realigning_prefers_the_place_at_or_after_where_the_output_left():
    # the run 5 6 occurs twice; the output left the prediction after the first
    p = follow([5, 6, 1, 2, 5, 6, 3, 4], [5, 6, 1, 9])
    p.feed(5)
    p.feed(6)
    assert p.draft(2) == [3, 4]


def test_an_output_that_deletes_a_line_skips_ahead_in_the_prediction():
    p = follow([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 5, 6])
    assert p.draft(2) == [7, 8]


def test_ngrams_draft_what_followed_the_last_trigram_before():
    ng = NGrams([1, 2, 3, 4, 5, 9, 1, 2, 3])
    assert ng.draft(3) == [4, 5, 9]
    ng.feed(7)                  # 2 3 7: never seen; nor 3 7
    assert ng.draft(3) == []


def test_ngrams_fall_back_to_the_last_bigram_and_take_the_latest_match():
    ng = NGrams([8, 5, 6, 1, 4, 5, 6, 2, 0, 5, 6])
    assert ng.draft(1) == [2]           # 5 6 last followed by 2 (0 5 6: no trigram match)


def test_drafts_prefer_the_prediction_and_fall_back_to_ngrams():
    d = Drafts([1, 2, 3, 4, 1, 2], prediction=[7, 8, 9, 10])
    d.feed(7)
    assert d.ready() == PREDICTION and d.propose(2) == [8, 9] and d.source == PREDICTION
    d.feed(5)                           # away from the prediction, and 2 5 unseen
    d.feed(5)
    assert d.ready() == "" and d.propose(2) == []
    d2 = Drafts([1, 2, 3, 4, 1, 2])
    assert d2.ready() == NGRAM and d2.propose(2) == [3, 4] and d2.source == NGRAM


def test_draft_length_grows_on_whole_acceptance_and_falls_to_what_was_kept():
    d = Drafts(list(range(40)) * 2)
    first = d.length
    d.propose(MAX_DRAFT)
    d.verified(first, first)
    assert d.length == min(MAX_DRAFT, first * 2)
    d.propose(MAX_DRAFT)
    d.verified(d.length, 1)
    assert d.length == 2


def test_a_failing_sequence_pauses_drafting_longer_each_time():
    d = Drafts([1, 2, 3, 1, 2, 3, 1, 2])
    pauses = []
    for _ in range(3):
        for _ in range(MISSES):
            assert d.propose(4)
            d.verified(3, 0)
        steps = 0
        while not d.propose(4):
            steps += 1
        pauses.append(steps)
        d.verified(3, 0)    # the draft after the pause fails too
        for _ in range(MISSES - 1):
            d.propose(4)
            d.verified(3, 0)
        while not d.propose(4):
            pass
        d.verified(3, 3)    # ... then one succeeds: the next failures start over
    assert pauses[0] >= 2 and all(p == pauses[0] for p in pauses)


def test_the_acceptance_rate_follows_recent_outcomes():
    d = Drafts([1, 2, 3, 1, 2], prediction=[3, 1, 2, 4])
    d.feed(3)
    start = d.rate(PREDICTION)
    d.propose(3)
    d.verified(3, 3)
    assert d.rate(PREDICTION) > start
    for _ in range(6):
        d.propose(3)
        d.verified(3, 0)
    assert d.rate(PREDICTION) < 0.3


@given(st.floats(0.0, 1.0), st.integers(0, 16))
def test_expected_tokens_is_between_one_and_the_draft_plus_one(rate, k):
    e = expected_tokens(rate, k)
    assert 1.0 - 1e-9 <= e <= k + 1 + 1e-9


def test_step_costs_say_drafting_pays_only_with_enough_acceptance():
    costs = StepCosts(32)
    for rows, ms in ((1, 25.0), (2, 45.0), (4, 68.0), (8, 110.0), (16, 180.0)):
        costs.note(rows, ms / 1000)
    assert costs.best_length(1, 15, 0.3) == 0           # mostly wrong drafts: none
    assert costs.cost(12) == 145.0 / 1000                # between 8 and 16: on the line
    assert costs.best_length(1, 15, 0.99) >= 7          # a good prediction: long drafts
    # four sequences already share the step: a draft must carry more to pay
    assert costs.best_length(4, 12, 0.8) < costs.best_length(1, 12, 0.8)


def test_step_costs_estimate_unmeasured_rows_from_fewer():
    costs = StepCosts(8)
    assert costs.cost(3) == 1.0 + 2 * ROW_PRIOR        # nothing measured: in one-row steps
    costs.note(1, 0.02)
    assert abs(costs.cost(3) - 0.02 * (1 + 2 * ROW_PRIOR)) < 1e-12
    costs.note(3, 0.05)
    assert costs.cost(3) == 0.05
    costs.note(3, 0.06)                         # a moving average, not the last
    assert 0.05 < costs.cost(3) < 0.06


@settings(max_examples=200)
@given(st.lists(st.integers(0, 5), max_size=40), st.lists(st.integers(0, 5), max_size=40),
       st.lists(st.integers(0, 5), min_size=1, max_size=60))
def test_a_draft_is_always_a_run_of_the_prediction_or_the_context(prompt, prediction, output):
    d = Drafts(prompt, prediction=prediction or None)
    context = list(prompt)
    for token in output:
        draft = d.propose(4)
        if draft:
            pool = prediction if d.source == PREDICTION else context
            assert any(pool[i:i + len(draft)] == draft for i in range(len(pool)))
        d.feed(token)
        context.append(token)


def test_a_draft_that_nearly_pays_is_tried_now_and_then():
    costs = StepCosts(32)
    for rows, ms in ((1, 25.0), (2, 45.0)):
        costs.note(rows, ms / 1000)
    lengths = [costs.best_length(1, 1, 0.7) for _ in range(64)]   # 1.7 tokens for 1.8 steps
    assert 1 <= lengths.count(1) <= 64 // 8 and set(lengths) <= {0, 1}
    assert all(costs.best_length(1, 1, 0.1) == 0 for _ in range(64))    # far from paying
