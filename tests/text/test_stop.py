from hypothesis import given, settings
from hypothesis import strategies as st

from podium.text.stop import StopMatcher

ALPHABET = st.sampled_from(list("ab\n<>x"))
TEXT = st.text(alphabet=ALPHABET, max_size=40)
STOPS = st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=5), min_size=1, max_size=4)


def expected(text: str, stops: list[str]) -> tuple[str, bool]:
    """Generation stops when the first stop string is complete: cut before that one."""
    for end in range(len(text) + 1):
        done = [end - len(s) for s in stops if text[:end].endswith(s)]
        if done:
            return text[:min(done)], True
    return text, False


def splits(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=500, deadline=None)
@given(TEXT, STOPS, st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_gives_the_one_piece_result(text, stops, cuts):
    want, want_stopped = expected(text, stops)
    matcher, released = StopMatcher(stops), ""
    for piece in splits(text, cuts):
        released += matcher.feed(piece)
        # never releases text past the cut, not even a partial stop string
        assert want.startswith(released)
    if not matcher.stopped:
        released += matcher.flush()
    assert released == want
    assert matcher.stopped == want_stopped


def test_partial_stop_is_held_then_released_when_it_diverges():
    matcher = StopMatcher(["</end>"])
    assert matcher.feed("hello </e") == "hello "
    assert matcher.feed("nd") == ""
    assert matcher.feed("x") == "</endx"
    assert not matcher.stopped


def test_stop_across_pieces_cuts_exactly_before_it():
    matcher = StopMatcher(["STOP", "\n\n"])
    out = matcher.feed("one S") + matcher.feed("TO") + matcher.feed("P two")
    assert out == "one "
    assert matcher.stopped
    assert matcher.feed("more") == ""


def test_the_stop_completed_first_wins():
    matcher = StopMatcher(["world", "lo"])
    assert matcher.feed("hello world") == "hel"
    # "x" completes before "<x<" does, although "<x<" starts earlier
    assert StopMatcher(["x", "<x<"]).feed("<<x<") == "<<"


def test_no_stops_passes_everything_through():
    matcher = StopMatcher([])
    assert matcher.feed("abc") == "abc"
    assert matcher.flush() == ""
