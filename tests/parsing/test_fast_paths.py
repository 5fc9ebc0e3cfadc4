"""The per-token fast paths (issue 19) give exactly the events of the full paths.

Reasoning text with nothing held and no ``<``, a tool parser's content with no character that
could begin its markup, and ``OutputParser.text`` (the one-token call) skip the buffer and the
scans. Each is checked delta by delta (not only folded) against the same parser with its fast
paths turned off, on random text cut at random, and on the cases a wrong shortcut would get
wrong: a ``<`` held from one delta to the next, a close tag split after many fast deltas,
a guard's tail waiting in the text state, logprobs waiting for text.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from podium.engine.base import TokenLogprob
from podium.parsing.events import Finish, ReasoningDelta, TextDelta, ToolCallBegin
from podium.parsing.pipeline import OutputParser
from podium.parsing.registry import TOOL_PARSERS
from podium.parsing.tools.base import ToolParser
from tests.parsing.helpers import fold, parser

PIECES = ["<think>", "</think>", "[THINK]", "[/THINK]", "<tool_call>", "</tool_call>", "<", "</",
          "think", ">", "tool_call", "<tool", "_call>", "</think", "[", "]", "/", " ", "\n",
          "\n\n", "\t", "\u00a0", "hello", " world", " a<b", "é", "🫠", "{", "}", '"', "`",
          "```json\n", ",", ":", '{"name": "get_weather", "arguments": {"city": "Paris"}}',
          '{"name": "nope", "arguments": {}}', "get_time", "<function=get_time>", "</function>",
          "<arg_key>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "get_time()",
          "<｜tool▁calls▁begin｜>", "<|tool_calls_section_begin|>", "<|tool_call_begin|>"]
FAMILY = st.sampled_from([*sorted(TOOL_PARSERS), None])
REASONING = st.sampled_from(["think", "mistral", None])
PROMPT = st.sampled_from(["", "<think>\n", "[THINK]"])
TEXT = st.lists(st.sampled_from(PIECES), max_size=30).map("".join)
CUTS = st.lists(st.integers(min_value=0), max_size=40)


def pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def full_paths(p: OutputParser) -> OutputParser:
    """The same parser on its full paths only: the reference the fast paths must match."""
    if p.reasoning is not None:
        p.reasoning._close_start = ""   # in every text: the reasoning fast path never applies
    tools = p._tools
    for t in (tools, getattr(tools, "_primary", None), getattr(tools, "_fallback", None)):
        if isinstance(t, ToolParser):
            t._fast = None
    return p


def per_delta(p: OutputParser, deltas: list[str], one_token: bool) -> list[list]:
    """The events of each delta, then of the finish."""
    out = [p.text(d) if one_token else p.feed([TextDelta(d)]) for d in deltas]
    return out + [p.feed([Finish("stop", 1)])]


@settings(max_examples=400, deadline=None)
@given(FAMILY, REASONING, PROMPT, TEXT, CUTS)
def test_fast_paths_give_the_full_paths_events_delta_by_delta(family, reasoning, prompt, text,
                                                              cuts):
    deltas = pieces(text, cuts)
    expected = per_delta(full_paths(parser(family, reasoning, prompt)), deltas, False)
    assert per_delta(parser(family, reasoning, prompt), deltas, False) == expected
    assert per_delta(parser(family, reasoning, prompt), deltas, True) == expected


@settings(max_examples=300, deadline=None)
@given(FAMILY, REASONING, TEXT, CUTS, st.lists(st.booleans(), max_size=40))
def test_text_is_feed_of_one_text_delta(family, reasoning, text, cuts, with_logprobs):
    """``text(d)`` is ``feed([TextDelta(d)])``, logprobs left waiting by an earlier delta
    included (they go with the first text that follows)."""
    a, b = parser(family, reasoning), parser(family, reasoning)
    for i, d in enumerate(pieces(text, cuts)):
        if i < len(with_logprobs) and with_logprobs[i]:
            lp = [TokenLogprob(i, -0.5, [])]
            assert a.feed([TextDelta(d, lp)]) == b.feed([TextDelta(d, list(lp))])
        else:
            assert a.text(d) == b.feed([TextDelta(d)])
    assert a.feed([Finish("stop", 1)]) == b.feed([Finish("stop", 1)])


def test_a_held_lt_is_not_overtaken_by_the_next_fast_delta():
    p = parser("hermes", "think")
    events = [p.text(d) for d in ["<think>", "x", " <", "b", " c", "</", "think>", "Hi"]]
    assert events == [[], [ReasoningDelta("x")], [ReasoningDelta(" ")], [ReasoningDelta("<b")],
                      [ReasoningDelta(" c")], [], [], [TextDelta("Hi")]]


def test_close_tag_split_after_many_fast_deltas():
    words = [" word"] * 200
    for split in (["</", "think", ">"], ["<", "/", "t", "h", "i", "n", "k", ">"], ["</think>"]):
        p = parser("hermes", "think")
        events = [e for d in ["<think>", *words, *split, "\n\n", "Answer", "."] for e in p.text(d)]
        assert events == [ReasoningDelta(w) for w in words] + [TextDelta("Answer"),
                                                                TextDelta(".")]
        assert p.reasoning.finished


def test_content_fast_path_holds_trailing_blanks_as_before():
    """Blanks at the end of content wait: dropped before a call, kept before more text."""
    p = parser("hermes", None)
    got = [p.text(d) for d in ["Sure", ".\n\n", " Then", "\n", "<tool_call>", "\n"]]
    assert got == [[TextDelta("Sure")], [TextDelta(".")], [TextDelta("\n\n Then")], [], [], []]
    p.text('{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert fold(p.feed([Finish("stop", 1)])).finish == "tool_calls"


def test_a_guard_tail_waiting_in_the_text_state_is_not_skipped():
    """``<tool_`` + a stray ``</tool_call>`` + ``call>`` rejoin into ``<tool_call>`` (dropped
    by the guard): ``call>`` has no ``<`` but must not pass as content."""
    deltas = ["x<tool_", "</tool_call>", "call>", " y"]
    expected = per_delta(full_paths(parser("hermes", None)), deltas, False)
    assert per_delta(parser("hermes", None), deltas, True) == expected
    assert fold(sum(expected, [])).content == "x y"


def test_a_call_after_fast_content_deltas():
    p = parser("hermes", "think")
    deltas = ["<think>", "Check", ".", "</think>", "\n\n", "Let", " me", " look", ".",
              "<tool", "_call", ">\n", '{"name": "get_time", "arguments": {}}', "\n</tool_call>"]
    events = [e for d in deltas for e in p.text(d)] + p.feed([Finish("stop", 1)])
    assert [type(e) for e in events][:6] == [ReasoningDelta, ReasoningDelta, TextDelta,
                                             TextDelta, TextDelta, TextDelta]
    assert isinstance(events[6], ToolCallBegin)
    folded = fold(events)
    assert (folded.content, folded.reasoning, folded.finish) == ("Let me look.", "Check.",
                                                                 "tool_calls")
