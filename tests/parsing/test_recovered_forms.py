"""Almost right, round three (issue 38): markup that still leaked, calls still lost.

- Qwen3-Coder's function block (``<function=NAME><parameter=KEY>``) written under a
  template Podium reads as Hermes (Qwen3-Coder models and some Qwen3 fine-tunes do);
- GLM-4.5 / 4.7 calls whose ``<arg_value>`` open or close tag was left out or is stray;
- an object or array parameter written as a Python literal (Qwen3-Coder, GLM).

Each row is parsed whole and at 1, 2 and 7-character deltas (``parse_all``: all agree, the
invariants hold), and a property cuts each at random points. Rows marked ``# kept`` passed
before issue 38 (the edges of a fix: what it must not change); the others failed. The
policy is docs/parsing.md, "Almost right, round three".
"""

from __future__ import annotations

import logging
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podium.parsing.tools.base import ToolSet
from tests.parsing import formats
from tests.parsing.helpers import fold, parse, parser, run
from tests.parsing.test_malformed import markup_in, mutate, parse_all, strings

W = {"city": "Paris"}
T: tuple[str, dict] = ("get_time", {})
H_T = '{"name": "get_time", "arguments": {}}'
XML_W = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "</function>\n</tool_call>")


def xml(name: str, **params: str) -> str:
    """A Qwen3-Coder function block, without ``<tool_call>`` around it."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<function={name}>\n{body}</function>"


def glm(body: str, name: str = "get_weather") -> str:
    return f"<tool_call>{name}\n{body}</tool_call>"


# class -> [(family, what the model wrote, content, calls)]
CLASSES: dict[str, list[tuple[str, str, str, list]]] = {
    "Qwen3-Coder's function block under Hermes": [
        ("hermes", XML_W, "", [("get_weather", W)]),
        ("hermes", f"Let me check.\n{XML_W}\nDone.", "Let me check.\nDone.",
         [("get_weather", W)]),
        ("hermes", "<tool_call><function=get_weather><parameter=city>Paris</parameter>"
         "<parameter=days>3</parameter></function></tool_call>", "",
         [("get_weather", {"city": "Paris", "days": 3})]),
        ("hermes", f"Sure.\n{xml('get_weather', city='Paris')}", "Sure.", [("get_weather", W)]),
        ("hermes", f"{xml('get_weather', city='Paris')}\n</tool_call>", "",
         [("get_weather", W)]),
        ("hermes", "<function=get_time>\n</function>", "", [T]),
        ("hermes", f"{XML_W}\nSure.<function=get_time>", "\nSure.", [("get_weather", W), T]),
        ("hermes", f"<tool_call>\n{xml('get_time')}\n</tool_call>\n<tool_call>\n"
         f"{XML_W[12:]}\n<tool_call>\n{H_T}\n</tool_call>", "", [T, ("get_weather", W), T]),
        ("hermes", f"<tool_call>\n{xml('write_file', path='a.py', content='x = 1')}\n"
         "</tool_call>", "", [("write_file", {"path": "a.py", "content": "x = 1"})]),
        ("hermes", "<tool_call>\n<function=write_file>\n<parameter=content>\n"
         "end </parameter> here\n</parameter>\n</function>\n</tool_call>", "",
         [("write_file", {"content": "end </parameter> here"})]),
        ("hermes", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>"
         "\n</tool_call>", "", [("get_weather", W)]),
        ("hermes", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "",
         [("get_weather", {"city": "Par"})]),
        ("hermes", f"{XML_W}\n</function>\nDone.", "\nDone.", [("get_weather", W)]),
        ("hermes", '<tool_call>\n<function="get_weather">\n<parameter=city>\nParis\n'
         "</parameter>\n</function>\n</tool_call>", "", [("get_weather", W)]),
        # an undeclared tool: dropped, inside <tool_call> or in the full form without it
        ("hermes", "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n"
         "</function>\n</tool_call>Done.", "Done.", []),
        ("hermes", f"{xml('rm_rf', path='/')}\nDone.", "\nDone.", []),
        # prose that mentions the tag is content, as written
        # kept
        ("hermes", "Use <function=NAME> tags, with <parameter=KEY> inside.",
         "Use <function=NAME> tags, with <parameter=KEY> inside.", []),
        # kept
        ("hermes", "Write <function=get_weather> then the parameters.",
         "Write <function=get_weather> then the parameters.", []),
        # kept
        ("hermes", "<function=" + "x" * 300 + ">", "<function=" + "x" * 300 + ">", []),
        # the Qwen3-Coder family's own: a tag with no ">" for 200 characters is prose (the
        # tag goes); it looped forever before, fed 200 characters or more at once
        ("qwen3_coder", "Sure. <function=" + "x" * 300, "Sure. " + "x" * 300, []),
        ("qwen3_coder", "<tool_call>\n<function=" + "x" * 300, "x" * 300, []),
    ],
    "GLM: an <arg_value> tag left out or stray": [
        ("glm45", glm("<arg_key>city</arg_key>Paris</arg_value>\n"), "", [("get_weather", W)]),
        # GLM-4.7, no newlines (vllm-project/vllm#49248)
        ("glm45", "<tool_call>get_weather<arg_key>city</arg_key>Paris</arg_value></tool_call>",
         "", [("get_weather", W)]),
        ("glm45", glm("<arg_key>city</arg_key>\nParis</arg_value>\n<arg_key>days</arg_key>\n"
                      "<arg_value>2</arg_value>\n"), "",
         [("get_weather", {"city": "Paris", "days": 2})]),
        ("glm45", glm("<arg_key>city</arg_key>Paris\n<arg_key>days</arg_key>2</arg_value>\n"), "",
         [("get_weather", {"city": "Paris", "days": 2})]),
        ("glm45", glm("<arg_key>city</arg_key>Paris\n"), "", [("get_weather", W)]),
        ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>Par", "",
         [("get_weather", {"city": "Par"})]),
        ("glm45", glm("<arg_key>city</arg_key>\n</arg_value>Paris</arg_value>\n"), "",
         [("get_weather", W)]),
        ("glm45", "<tool_call>get_weather</arg_value>\n<arg_key>city</arg_key>\n"
         "<arg_value>Paris</arg_value>\n</tool_call>", "", [("get_weather", W)]),
        ("glm45", "Sure.<tool_call>get_weather</arg_key><arg_key>city</arg_key>Paris"
         "</arg_value></tool_call>Done.", "Sure.Done.", [("get_weather", W)]),
        # kept
        ("glm45", "<tool_call>rm_rf<arg_key>path</arg_key>/</arg_value></tool_call>Done.",
         "Done.", []),
        # kept
        ("glm45", glm("<arg_key>city</arg_key><arg_value>Paris\n"), "", [("get_weather", W)]),
        # kept
        ("glm45", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</tool_call>",
         "", [("get_weather", W)]),
        # kept
        ("glm45", glm("<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</arg_value>\n"),
         "", [("get_weather", W)]),
        # a value with no key before it: whose? dropped (it was sent under the key "")
        ("glm45", "<tool_call>get_weather<arg_value>Paris</arg_value></tool_call>", "",
         [("get_weather", {})]),
    ],
    "a Python literal for an object or array value": [
        ("qwen3_coder", xml("write_file", mode="{'a': 1, 'b': True}"), "",
         [("write_file", {"mode": {"a": 1, "b": True}})]),
        ("qwen3_coder", xml("plot", points="[1, 'x', None]"), "",
         [("plot", {"points": [1, "x", None]})]),
        ("qwen3_coder", xml("plot", points="(1, 2.5)"), "", [("plot", {"points": [1, 2.5]})]),
        ("qwen3_coder", xml("plot", style="{'color': 'red', 'dash': (1, 2)}"), "",
         [("plot", {"style": {"color": "red", "dash": [1, 2]}})]),
        ("qwen3_coder", xml("plot", opts="{'log': False}"), "",
         [("plot", {"opts": {"log": False}})]),
        ("qwen3_coder", xml("write_file", mode="\"{'a': 1}\""), "",
         [("write_file", {"mode": {"a": 1}})]),
        ("glm45", glm("<arg_key>mode</arg_key><arg_value>{'a': [1, None]}</arg_value>",
                      "write_file"), "", [("write_file", {"mode": {"a": [1, None]}})]),
        ("glm45", glm("<arg_key>points</arg_key>\n<arg_value>['a', True]</arg_value>\n", "plot"),
         "", [("plot", {"points": ["a", True]})]),
        ("hermes", "<tool_call>\n" + xml("write_file", mode="{'a': None}") + "\n</tool_call>",
         "", [("write_file", {"mode": {"a": None}})]),
        # what JSON has no value for, and code, stays text
        # kept
        ("qwen3_coder", xml("plot", points="{1, 2}"), "", [("plot", {"points": "{1, 2}"})]),
        # kept
        ("qwen3_coder", xml("write_file", mode="{1: 2}"), "", [("write_file", {"mode": "{1: 2}"})]),
        # kept
        ("qwen3_coder", xml("plot", points="[1e999, 'x']"), "",
         [("plot", {"points": "[1e999, 'x']"})]),
        # kept
        ("qwen3_coder", xml("plot", points="[__import__('os')]"), "",
         [("plot", {"points": "[__import__('os')]"})]),
        # a string parameter keeps its text; JSON stays JSON
        # kept
        ("qwen3_coder", xml("write_file", content="{'a': 1}"), "",
         [("write_file", {"content": "{'a': 1}"})]),
        # kept
        ("qwen3_coder", xml("write_file", mode='{"a": 1}'), "",
         [("write_file", {"mode": {"a": 1}})]),
    ],
}


@pytest.mark.parametrize("family, text, content, calls", [
    pytest.param(*case, id=f"{kind[:24]}-{case[0]}-{i}")
    for kind, cases in CLASSES.items() for i, case in enumerate(cases)])
def test_recovered_form(family, text, content, calls):
    out = _parse_in_time(family, text)
    assert (out.content, out.calls) == (content, calls)
    assert out.finish == ("tool_calls" if calls else "stop")


def _parse_in_time(family: str, text: str, seconds: float = 60):
    """``parse_all``, or a failure if it never returns (the old parser looped forever on a
    long ``<function=`` with no ``>``)."""
    result: list = []
    worker = threading.Thread(target=lambda: result.append(parse_all(family, text)),
                              daemon=True)
    worker.start()
    worker.join(seconds)
    assert result, "the parser did not return"
    return result[0]


ALL = [case for cases in CLASSES.values() for case in cases]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(ALL), st.lists(st.integers(min_value=0), max_size=12))
def test_any_cut_gives_what_one_piece_gives(case, cuts):
    family, text, content, calls = case
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    out = fold(run(parser(family), pieces))
    assert (out.content, out.calls) == (content, calls)


# the mutation property of test_malformed.py, for Qwen3-Coder's form under Hermes: valid
# calls, a delimiter dropped, doubled or swapped, a stray character put in, a cut

QWEN_DELIMITERS = ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
                   "</parameter>", ">", "\n"]
VALUE = st.text(alphabet=st.sampled_from(list("ab é1.-")), min_size=1, max_size=6)
ARGS = st.dictionaries(st.sampled_from(["city", "path", "content"]), VALUE, max_size=2)
CALLS = st.lists(st.tuples(st.sampled_from(["get_weather", "get_time", "write_file", "rm_rf"]),
                           ARGS), min_size=1, max_size=2)
MUTATION = st.tuples(st.sampled_from(["drop", "double", "swap", "insert", "cut"]),
                     st.integers(min_value=0), st.sampled_from(list("\"'{}[]<>")))


@settings(max_examples=500, deadline=None)
@given(CALLS, st.booleans(), st.booleans(), st.lists(MUTATION, max_size=2))
def test_mutated_function_blocks_under_hermes(calls, block, prose, mutations):
    calls = [(n, {k: v.strip() or "x" for k, v in a.items()}) for n, a in calls]
    text = formats.qwen3_coder(calls)
    if not block:
        text = text.replace("<tool_call>\n", "").replace("</tool_call>\n", "")
    if prose:
        text = "Sure. " + text + " Done."
    for kind, at, char in mutations:
        text = _mutate(text, (kind, at, char))
    # any chunking, no <tool_call> in content; in values, Qwen3-Coder's rule (a tag stays in
    # a value unless the format would read it as structure)
    out = parse_all("hermes", text, values=False)
    for _, arguments in out.calls:
        for value in strings(arguments):
            assert markup_in("qwen3_coder", value) is None, arguments
    if not mutations:                       # as written: the declared calls, nothing else
        assert out.calls == [(n, a) for n, a in calls if n != "rm_rf"]
        assert out.content.split() == (["Sure.", "Done."] if prose else [])


def _mutate(text: str, mutation: tuple[str, int, str]) -> str:
    import tests.parsing.test_malformed as malformed
    saved = malformed.DELIMITERS.get("hermes")
    malformed.DELIMITERS["hermes"] = QWEN_DELIMITERS
    try:
        return mutate(text, "hermes", mutation)
    finally:
        malformed.DELIMITERS["hermes"] = saved      # type: ignore[assignment]


def test_python_literals_are_bounded():
    """Literals only, of a bounded size, and only what JSON holds."""
    from podium.parsing.tools.base import PY_LITERAL_LIMIT, python_container
    assert python_container("{'a': (1, None), 'b': [True]}", "object") == \
        {"a": [1, None], "b": [True]}
    assert python_container("[1, 'x']", ["array", "null"]) == [1, "x"]
    assert python_container("[1, 'x']", "object") is None          # not what the schema says
    assert python_container("{'a': 1}", "string") is None
    big = "[" + "1, " * (PY_LITERAL_LIMIT // 3) + "1]"
    assert len(big) > PY_LITERAL_LIMIT and python_container(big, "array") is None
    assert python_container("[" * 1000 + "]" * 1000, "array") is None     # too deep: refused
    for text in ("{1, 2}", "[b'x']", "[1j]", "[1e999]", "{(1, 2): 3}", "{1: 2}",
                 "[print(1)]", "[x]", "(1, 2) + (3,)"):
        assert python_container(text, "array") is None and \
            python_container(text, "object") is None, text


def test_schema_types_without_a_type():
    from podium.parsing.tools.base import schema_type
    assert schema_type({"properties": {}}) == "object"
    assert schema_type({"items": {}}) == "array"
    assert schema_type({"anyOf": [{"type": "object"}, {"type": "null"}]}) == ["object", "null"]
    assert schema_type({"oneOf": [{"type": ["array", "null"]}, {}]}) == ["array", "null"]
    assert schema_type({"anyOf": "oops"}) is None and schema_type({}) is None
    tools = ToolSet({"f": {"properties": {"a": True, "b": {"items": {}}}}, "g": True})  # type: ignore[dict-item]
    assert tools.param_type("f", "a") is None and tools.param_type("f", "b") == "array"
    assert tools.param_type("g", "a") is None


def test_recoveries_are_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="podium.parsing"):
        parse("Sure. " + xml("get_time"), tool_family="hermes")
        parse(glm("<arg_key>city</arg_key>Paris</arg_value>"), tool_family="glm45")
        parse(glm("<arg_value>Paris</arg_value>"), tool_family="glm45")
    said = " | ".join(r.getMessage() for r in caplog.records)
    assert "<function= without <tool_call>" in said
    assert "<arg_value> left out" in said and "<arg_value> without a key" in said
