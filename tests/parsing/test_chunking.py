"""Property: however the output is cut into pieces, the folded events are the same, and they
are what the model wrote (for every family, with reasoning, text and several calls mixed)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.parsing.formats import FAMILIES, mistral_list, pythonic
from tests.parsing.helpers import Folded, fold, parser, run

NAMES = ["get_weather", "get_time", "write_file"]
TEXT = st.text(alphabet=st.sampled_from(list("ab <>{}[]\"'\\/:,\n") + ["é", "🫠"]), max_size=12)
SAFE_TEXT = st.text(alphabet=st.sampled_from(list("abc xyz.!?") + ["é", "🫠"]),
                    min_size=1, max_size=12).filter(lambda t: t.strip() == t)
ARGS = st.dictionaries(st.sampled_from(["city", "path", "content"]), TEXT, max_size=3)
CALLS = st.lists(st.tuples(st.sampled_from(NAMES), ARGS), min_size=0, max_size=3)


FAMILY_CASES = st.sampled_from(sorted(FAMILIES)) | st.just("mistral_list")


def pieces(text, cuts):
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


@settings(max_examples=300, deadline=None)
@given(FAMILY_CASES, st.booleans(), SAFE_TEXT, SAFE_TEXT, CALLS,
       st.lists(st.integers(min_value=0), max_size=25))
def test_any_chunking_folds_to_what_the_model_wrote(family, think, thought, prose, calls, cuts):
    writer, prose_first = FAMILIES.get(family, (mistral_list, True))
    if family == "mistral_list":
        family = "mistral"
        if not calls:
            return
    if family in ("qwen3_coder", "glm45"):     # XML values: text as written, no edge spaces
        calls = [(n, {k: v.strip() or "x" for k, v in a.items()}) for n, a in calls]
    text = (f"<think>{thought}</think>\n" if think else "")
    text += (prose if prose_first or not calls else "") + (writer(calls) if calls else "")
    whole = fold(run(parser(family, "think"), [text]))
    split = fold(run(parser(family, "think"), pieces(text, cuts)))
    assert split == whole
    expected_content = prose if (prose_first or not calls) else ""
    assert whole == Folded(expected_content, thought if think else "",
                           [(n, a) for n, a in calls],
                           "tool_calls" if calls else "stop")


BLANKS = st.text(alphabet=st.sampled_from(" \n\t"), min_size=1, max_size=30)
BLANK_FAMILIES = {**{f: w for f, (w, _) in FAMILIES.items()}, "pythonic": pythonic}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(BLANK_FAMILIES)), st.booleans(), CALLS,
       st.lists(st.tuples(st.integers(min_value=0), BLANKS), max_size=6),
       st.lists(st.integers(min_value=0), max_size=25))
def test_blank_runs_anywhere_fold_the_same_however_cut(family, think, calls, blanks, cuts):
    """Blanks where a parser waits to see what follows (before, between and after calls,
    inside markup): whatever they make of the text, any cut gives what one piece gives."""
    text = BLANK_FAMILIES[family](calls) + "Done."
    for at, run_of_blanks in blanks:
        i = at % (len(text) + 1)
        text = text[:i] + run_of_blanks + text[i:]
    reasoning = "think" if think else None
    whole = fold(run(parser(family, reasoning), [text]))
    assert fold(run(parser(family, reasoning), pieces(text, cuts))) == whole
