"""The call-argument fast paths (issue 19) give exactly the events of the full paths.

A call object's arguments object is checked once, with the open call's own validator (not
again in ``call_args``); Hermes feeds a token of it straight to that validator when the token
has no ``<``; the JSON fallback wrapper steps aside once the family parser is in charge. Each
is checked delta by delta against the same parser with them turned off, on call objects cut
at random (mutated, broken, doubled keys, escapes, numbers cut short) and on the cases a
wrong shortcut would get wrong: the object closing at the end of a delta, the JSON breaking
inside a delta, a number cut by a bad character, a second arguments object, a dropped call,
``</tool_call>`` inside a string.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from podium.parsing.events import Finish, TextDelta, ToolCallArgsDelta, ToolCallEnd
from podium.parsing.pipeline import OutputParser
from podium.parsing.registry import TOOL_PARSERS
from podium.parsing.tools.base import ToolParser
from podium.parsing.tools.fallback import WithJsonFallback
from tests.parsing.helpers import fold, parser


def full_paths(p: OutputParser) -> OutputParser:
    """The same parser without the argument fast paths: the reference."""
    tools = p._tools
    for t in (tools, getattr(tools, "_primary", None), getattr(tools, "_fallback", None)):
        if isinstance(t, ToolParser):
            t.LANE_STATE = ""                   # type: ignore[misc]
            t._args_lane = lambda: None         # type: ignore[method-assign]
    if isinstance(tools, WithJsonFallback):
        tools._settle = lambda: setattr(tools, "_active", tools._primary)  # type: ignore
    return p


def per_delta(p: OutputParser, deltas: list[str], one_token: bool = True) -> list[list]:
    out = [p.text(d) if one_token else p.feed([TextDelta(d)]) for d in deltas]
    return out + [p.feed([Finish("stop", 1)])]


def same(family: str | None, deltas: list[str], reasoning: str | None = None,
         max_calls: int | None = None) -> list[list]:
    expected = per_delta(full_paths(parser(family, reasoning, max_calls=max_calls)), deltas)
    assert per_delta(parser(family, reasoning, max_calls=max_calls), deltas) == expected
    assert per_delta(parser(family, reasoning, max_calls=max_calls), deltas, False) == expected
    return expected


def args_of(events: list[list]) -> list[str]:
    return [e.arguments for es in events for e in es if isinstance(e, ToolCallEnd)]


ARG_PIECES = ['"', '": ', '", "', ", ", "{", "}", "[", "]", "Paris", " city", "\\", '\\"',
              "\\n", "\\u00e9", "\\u1", "12", "-0.5", "e3", "tru", "e", "null", "x", "\x01",
              "\n", " ", "<", "</tool_call>", "<tool_call>", "é🫠", ":", ","]
HEADS = ['{"name": "get_weather", "arguments": ', '{"name": "get_weather", "parameters": ',
         '{"arguments": ', '{"name": "nope", "arguments": ', '{"name": "get_time", "arguments": ']
WRAPS = {"hermes": ("<tool_call>\n", "\n</tool_call>"), "json": ("```json\n", "\n```"),
         "mistral": ("[TOOL_CALLS]", ""), "llama3_json": ("", ""),
         "deepseek_v3": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>", "")}
CALL = st.tuples(st.sampled_from(HEADS), st.just("{"),
                 st.lists(st.sampled_from(ARG_PIECES), max_size=25).map("".join),
                 st.sampled_from(["}}", "}", "", '"}}', "}, \"parameters\": {}}", "}]", "}}}"]))


AFTER = st.sampled_from(["", "", " Then more.", "\n", '"', "}", ", ", ' "x": 1}'])


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([*WRAPS, *sorted(TOOL_PARSERS)]),
       st.lists(st.tuples(CALL, st.booleans(), AFTER), min_size=1, max_size=3),
       st.lists(st.integers(min_value=0), max_size=40), st.sampled_from([None, 1]),
       st.sampled_from([None, "think"]))
def test_argument_fast_paths_give_the_full_paths_events(family, calls, cuts, max_calls,
                                                        reasoning):
    head, tail = WRAPS.get(family, ("<tool_call>", "</tool_call>"))
    text = "Hi.\n" if family == "hermes" else ""
    if reasoning:
        text = "<think>hm</think>" + text
    text += "".join(head + "".join(call) + (tail if closed else "") + after
                    for call, closed, after in calls)
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    same(family, [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a], reasoning, max_calls)


def test_workload_call_token_by_token():
    deltas = ["Sure.", "<tool_call>", "\n", '{"', "name", '":', ' "', "get", "_weather", '",',
              ' "', "arguments", '":', ' {"', "city", '":', ' "', "Paris", '"}}\n', "</tool_call>"]
    events = same("hermes", deltas)
    assert events[14] == [ToolCallArgsDelta(0, "city")]
    assert args_of(events) == ['{"city": "Paris"}']


def test_the_object_closing_at_the_end_of_a_delta():
    deltas = ["<tool_call>", '{"name": "get_weather", "arguments": {"city": "P', 'aris"}', "}",
              "\n</tool_call>", " Done."]
    events = same("hermes", deltas)
    assert args_of(events) == ['{"city": "Paris"}']
    assert fold(sum(events, [])).content == " Done."


def test_text_after_a_call_closed_by_its_own_brace():
    deltas = ["<tool_call>", '{"name": "get_weather", "arguments": {"a": "b', '"}', "}",
              " Then more."]
    events = same("hermes", deltas)
    assert fold(sum(events, [])).content == " Then more."


def test_json_breaking_inside_a_delta_keeps_the_valid_part():
    for bad in ['x"}}', '\x01"}}', '"x}}', '"}x}']:
        deltas = ["<tool_call>", '{"name": "get_weather", "arguments": {"city": "Pa', "ri",
                  bad, "\n</tool_call>", "after"]
        events = same("hermes", deltas)
        assert json.loads(args_of(events)[0])


def test_a_number_cut_by_a_bad_character():
    for tail in ["1", "12", "-", "1.", "1e", "tr"]:
        deltas = ["<tool_call>", '{"name": "get_weather", "arguments": {"n": ', tail, "x",
                  "}}", "</tool_call>"]
        events = same("hermes", deltas)
        assert json.loads(args_of(events)[0])


def test_a_second_arguments_object_and_a_dropped_call():
    deltas = ["<tool_call>", '{"name": "get_weather", "arguments": {"a": 1', "}, ",
              '"parameters": {"b": ', "2}}", "</tool_call>", "<tool_call>",
              '{"name": "get_time", "arguments": {"c"', ': "d"}}', "</tool_call>"]
    events = same("hermes", deltas)
    assert args_of(events)[0] == '{"a": 1}'
    events = same("hermes", deltas, max_calls=1)
    assert len(args_of(events)) == 1


def test_close_tag_inside_a_string():
    for rest in [["x", '"}}', "</tool_call>"], ["<tool_call>", '{"name": "get_time"}']]:
        deltas = ["<tool_call>", '{"name": "get_weather", "arguments": {"city": "a',
                  "</tool_call>", *rest]
        same("hermes", deltas)


def test_fallback_steps_aside_once_the_family_parser_is_in_charge():
    p = parser("hermes")
    tools = p._tools
    assert isinstance(tools, WithJsonFallback)
    p.text("Sure")
    assert tools.feed == tools._primary.feed
    p = parser("hermes")                        # the fallback gave up: the same
    p._tools.feed("{x")
    assert p._tools.feed == p._tools._primary.feed
    p = parser("json")                          # the fallback read calls, then handed over
    p.text('{"name": "get_time", "arguments": {}}')
    assert p._tools._active is p._tools._fallback
    p.text("\nok")
    assert p._tools.feed == p._tools._primary.feed
    assert fold(p.feed([Finish("stop", 1)])).finish == "tool_calls"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(['a', 'é', '🫠', ' ', '\\', 'u', '0', '5', 'f', 'n',
                                        '\x01', '\n', '\x7f', '/', '\t']), max_size=12))
def test_plain_strings_read_as_json_reads_them(body):
    """Keys and names skip the JSON decoder when plain: the same value, the same refusals."""
    from podium.parsing.tools.jsoncall import _string
    text = json.dumps(body, ensure_ascii=False) if "\\" not in body else '"' + body + '"'
    for t in (text, '"' + body.replace('"', "") + '"'):
        try:
            expected = json.loads(t)
        except ValueError:
            expected = ValueError
        try:
            got = _string(t)
        except ValueError:
            got = ValueError
        assert got == expected


def test_escaped_names_and_keys_open_calls():
    for head in ['{"name": "get\\u005fweather", "arguments": ',
                 '{"n\\u0061me": "get_weather", "argu\\u006dents": ']:
        deltas = ["<tool_call>", head, '{"city": "P', 'aris"}}', "</tool_call>"]
        assert args_of(same("hermes", deltas)) == ['{"city": "Paris"}']
    deltas = ["<tool_call>", '{"name": "get_weather\x01", "arguments": {}}', "</tool_call>"]
    assert args_of(same("hermes", deltas)) == []


def test_argument_tokens_take_the_fast_path():
    """Hermes and the JSON fallback: a token inside the arguments never reaches the step."""
    for family, head in [("hermes", "<tool_call>\n"), ("json", "```json\n")]:
        p = parser(family)
        p.text(head + '{"name": "get_weather", "arguments": {"city": "P')
        tools = p._tools
        reader = tools._primary if family == "hermes" else tools._fallback
        steps = []
        reader._step = lambda buf, step=reader._step: steps.append(buf) or step(buf)
        got = [p.text(d) for d in ["ar", "is", '", ', '"unit', '": "c"']]
        assert steps == []
        # a structural comma waits for the key after it (a closer there would drop it)
        assert got == [[ToolCallArgsDelta(0, d)] for d in ["ar", "is", '"', ', "unit', '": "c"']]
        p.text("}}")
        assert steps == ["}}"]


def _by_char(p, text: str) -> int:
    """``p.feed(text)`` made of one feed per character: how much of ``text`` it took, the
    closers that dropped a comma at their place in ``text``."""
    closers, p.closers = p.closers, []
    try:
        for i, c in enumerate(text):
            took = p.feed(c)
            closers += [i] * len(p.closers)
            p.closers = []
            if not took:
                return i
            if p.done:
                return i + 1
        return len(text)
    finally:
        p.closers = closers


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(['{', '}', '[', ']', '"', ':', ',', ' ', '\n', 'a', 'é', '\\',
                                 'u', '0', 'n', 'true', '1', '-', '.', 'e', '\x01', '": ',
                                 '", "', ' {"', '"}', 'null']), max_size=30).map("".join),
       st.lists(st.integers(min_value=1, max_value=8), max_size=30), st.booleans())
def test_json_prefix_reads_any_chunking_as_one_character_at_a_time(text, sizes, braced):
    """The validator's one pass (strings skipped in one search, blanks, quotes and colons
    taken inline) ends where a character-by-character reading ends, in the same state."""
    from podium.parsing.scan import JsonPrefix
    text = "{" + text if braced else text
    fast, ref = JsonPrefix(), JsonPrefix()
    i = 0
    for size in [*sizes, len(text)]:
        piece, i = text[i:i + size], i + size
        assert fast.feed(piece) == _by_char(ref, piece)
        # (``attention`` also flags an escape cut by a feed's end: each character's feed)
        assert ({k: v for k, v in vars(fast).items() if k != "attention"}
                == {k: v for k, v in vars(ref).items() if k != "attention"})
        assert fast.completion() == ref.completion()
