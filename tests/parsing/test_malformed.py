"""Malformed tool calls, family by family: recovered or dropped, never markup in content.

The policy is docs/parsing.md, "Malformed model output". Each row is what a model wrote
(almost a call) and what Podium makes of it, checked at several chunkings (one piece, 1, 2
and 7 characters): the streamed result must be the same at every chunking, and it must keep
the invariants every result keeps (no family markup in content, no delimiter inside an
argument value, arguments a JSON object, no exception).
"""

from __future__ import annotations

import logging
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.parsing import formats
from tests.parsing.helpers import Folded, cut, fold, parser, run

SIZES = [None, [1], [2], [7]]

# Strings a family uses as structure: none of them may reach content or an argument value
# (unless the model wrote one inside a value on purpose, which these cases never do).
MARKUP = {
    "hermes": ["<tool_call>", "</tool_call>"],
    "qwen3_coder": ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
                    "</parameter>"],
    "glm45": ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
              "</arg_value>"],
    "llama3_json": ["<|python_tag|>", "<|python_start|>", "<|python_end|>", "<function=",
                    "</function>"],
    "pythonic": ["<|python_tag|>", "<|python_start|>", "<|python_end|>", "<function=",
                 "</function>"],
    "mistral": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
    "deepseek_v3": ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                    "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"],
    "kimi_k2": ["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"],
    "json": ["```"],
}


def strings(value):
    """Every string inside a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


# Qwen3-Coder values are raw text, and agents write files that hold its tags: a tag stays in
# a value unless the format would read it as structure (the next tag, or the end, after it)
_GAP = r"[\s\"'}\])]*"         # blanks and stray quotes or braces
QWEN_STRUCTURE = re.compile(
    rf"</parameter>{_GAP}(<parameter=|</function>|</tool_call>|</parameter>|$)|"
    rf"</function>{_GAP}(</tool_call>|<tool_call>|</function>|</parameter>|$)|"
    rf"</tool_call>{_GAP}(<tool_call>|</tool_call>|$)|\n<parameter=")


def markup_in(family: str, text: str) -> str | None:
    if family == "json":        # a JSON string may hold fences (agents write markdown)
        return None
    if family == "glm45":       # a value may hold <tool_call> (code that writes one)
        return next((m for m in MARKUP[family] if m in text and m != "<tool_call>"), None)
    if family == "qwen3_coder":
        m = QWEN_STRUCTURE.search(text)
        return m.group() if m else None
    return next((mark for mark in MARKUP[family] if mark in text), None)


def check_invariants(family: str, out: Folded, values: bool = True) -> None:
    # a fence is markdown, not markup, unless it held calls (then it is the calls' markup)
    marks = MARKUP[family] if family != "json" or out.calls else []
    for mark in marks:
        assert mark not in out.content, f"{mark!r} in content {out.content!r}"
    for name, arguments in out.calls:
        assert name in formats_names(), name
        assert isinstance(arguments, dict), arguments      # fold() already json.loads them
        for text in strings(arguments) if values else ():
            mark = markup_in(family, text)
            assert mark is None, f"{mark!r} inside an argument: {arguments!r}"


def formats_names():
    from tests.parsing.helpers import SCHEMAS
    return SCHEMAS


def parse_all(family: str, text: str, values: bool = True, **kw) -> Folded:
    """Parse at every chunking; all must agree and keep the invariants (``values``: no
    markup in argument values either)."""
    whole = fold(run(parser(family, **kw), [text]))
    check_invariants(family, whole, values)
    for sizes in SIZES[1:]:
        assert fold(run(parser(family, **kw), cut(text, sizes))) == whole, sizes
    return whole


W = {"city": "Paris"}
H_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
T_CALL = '{"name": "get_time", "arguments": {}}'

# family -> [(what the model wrote, content, calls)]
CASES: dict[str, list[tuple[str, str, list]]] = {
    "hermes": [
        # the rows
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}"}'
         '\n</tool_call>', "", [("get_weather", {"city": "Paris", "unit": "c"})]),
        ("<tool_call>\nget_time\n</tool_call>", "", [("get_time", {})]),
        ('<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/"}}\n</tool_call>', "", []),
        (f"<tool_call>\n<tool_call>\n{H_CALL}\n</tool_call>", "", [("get_weather", W)]),
        (f"<tool_call>\n{H_CALL}\n</tool_call>\n</tool_call>", "", [("get_weather", W)]),
        # more
        (f"Sure.<tool_call>\n{H_CALL}\n</tool_call></tool_call>\nDone.", "Sure.\nDone.",
         [("get_weather", W)]),
        ('Sure.<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>\nDone.',
         "Sure.\nDone.", []),
        (f"<tool_call>\n{H_CALL}", "", [("get_weather", W)]),
        (f"<tool_call>{H_CALL}<tool_call>{T_CALL}</tool_call>", "",
         [("get_weather", W), ("get_time", {})]),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>', "",
         [("get_weather", W)]),
        ("<tool_call>\nrm_rf\n</tool_call>", "", []),
        ('<tool_call>\n{"city": "Paris"}\n</tool_call>', "", []),
        ('<tool_call>{"arguments": {"a": "</tool_call>"}, "name": "rm_rf"}</tool_call>Ok.',
         "Ok.", []),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"} oops</tool_call>'
         "Done.", "Done.", [("get_weather", W)]),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": }}\n</tool_call>', "",
         [("get_weather", {"city": None})]),
        ('<tool_call>get_weather\n{"city": "Paris"}\n</tool_call>', "", [("get_weather", W)]),
        # a string left unclosed: </tool_call> then the end (or the next call) ends the call
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris}}</tool_call>\n',
         "", [("get_weather", {"city": "Paris}}"})]),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris</tool_call>\n'
         f"<tool_call>{T_CALL}</tool_call>", "", [("get_weather", W), ("get_time", {})]),
        ("<tool_call>get_time</tool_call><tool_call>get_time", "",
         [("get_time", {}), ("get_time", {})]),
        ("Done.</tool_call>", "Done.", []),
        ("Write <tool_call> tags around calls.", "Write  tags around calls.", []),
        ("<tool_call>not json at all</tool_call>", "not json at all", []),
        ('<tool_call>{"nam', "", []),
        ("Hi.<tool_call>", "Hi.", []),
        # fenced JSON, then the family's own markup
        (f"```json\n{T_CALL}\n```\n<tool_call>{H_CALL}</tool_call>", "",
         [("get_time", {}), ("get_weather", W)]),
    ],
    "json": [
        ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}\n```', "",
         [("get_weather", W)]),
        (f"{H_CALL}\n```", "", [("get_weather", W)]),
        (f'```json\n{T_CALL}"\n```', "", [("get_time", {})]),
        (f'```json\n[{H_CALL}, {{"name": "rm_rf", "arguments": {{}}}}, {T_CALL}]\n```', "",
         [("get_weather", W), ("get_time", {})]),
        (f"```json\n{H_CALL}\n```\n```\nDone.", "\nDone.", [("get_weather", W)]),
        # an object that names a second tool: it broke there
        ('```json\n[{"name": "get_time", "arguments": {}, "name": "write_file", '
         '"arguments": {}}]\n```', "", [("get_time", {})]),
        # markup-free JSON that names no declared tool is an answer, not a call
        ('```json\n{"name": "Bob", "age": 3}\n```', '```json\n{"name": "Bob", "age": 3}\n```',
         []),
    ],
    "qwen3_coder": [
        # the row
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n"
         "</tool_call>", "", [("get_weather", W)]),
        # more
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n3\n"
         "</parameter>\n</function>\n</tool_call>", "",
         [("get_weather", {"city": "Paris", "days": 3})]),
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n\n<parameter=days>\n3\n"
         "</parameter>\n</function>\n</tool_call>", "",
         [("get_weather", {"city": "Paris\n", "days": 3})]),
        ("Sure.\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
         "</tool_call>", "Sure.", [("get_weather", W)]),
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "</parameter>\n</function>\n</tool_call>", "", [("get_weather", W)]),
        ("<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n"
         "</tool_call>\nDone.", "\nDone.", []),
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n", "",
         [("get_weather", W)]),
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>", "",
         [("get_weather", W)]),
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</tool_call>", "",
         [("get_weather", W)]),
        ("<tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>", "",
         [("get_time", {})]),
        ("<tool_call>\n<function=get_time>\n</function>\n</tool_call>\n</tool_call>", "",
         [("get_time", {})]),
        ('<tool_call>\n<function="get_weather">\n<parameter="city">\nParis\n</parameter>\n'
         "</function>\n</tool_call>", "", [("get_weather", W)]),
        ("<tool_call>\n<function=write_file>\n<parameter=content>\nend </function> here\n"
         "</parameter>\n</function>\n</tool_call>", "",
         [("write_file", {"content": "end </function> here"})]),
        ("<tool_call> is a tag.", " is a tag.", []),
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
         "</function>\n</tool_call>\n</function>", "", [("get_weather", W)]),
    ],
    "glm45": [
        ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris\n</tool_call>", "",
         [("get_weather", W)]),
        ("<tool_call>get_weather\n<arg_key>city<arg_value>Paris</arg_value>\n</tool_call>", "",
         [("get_weather", W)]),
        ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>"
         "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>", "",
         [("get_weather", {"city": "Paris", "days": 2})]),
        ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris\n"
         "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>", "",
         [("get_weather", {"city": "Paris", "days": 2})]),
        ("<tool_call>rm_rf\n<arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>"
         "Done.", "Done.", []),
        ("<tool_call><tool_call>get_time\n</tool_call>", "", [("get_time", {})]),
        ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par", "",
         [("get_weather", {"city": "Par"})]),
        ("<tool_call>get_time\n</tool_call></tool_call>", "", [("get_time", {})]),
        ("Done.</arg_value>", "Done.", []),
        ('<tool_call>"get_time"\n</tool_call>', "", [("get_time", {})]),
    ],
    "llama3_json": [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}}"', "", [("get_weather", W)]),
        ('{"name": "get_weather", "parameters": {"city": "Paris"}', "", [("get_weather", W)]),
        ('<|python_tag|>{"name": "rm_rf", "parameters": {}}', "", []),
        ('{"name": "get_time", "parameters": {}};; {"name": "get_time", "parameters": {}}', "",
         [("get_time", {}), ("get_time", {})]),
        ('{"name": "get_time", "parameters": {}}; <|python_tag|>{"name": "get_time", '
         '"parameters": {}}', "", [("get_time", {}), ("get_time", {})]),
        ('{"name": "get_time", "parameters": {}}; {"name": "rm_rf", "parameters": {}}', "",
         [("get_time", {})]),
        ("Hi <|python_tag|>there", "Hi there", []),
        # markup-free JSON that names no declared tool is an answer
        ('{"name": "rm_rf", "parameters": {}}', '{"name": "rm_rf", "parameters": {}}', []),
    ],
    "pythonic": [
        ('[get_weather(city="Paris")', "", [("get_weather", W)]),
        ('[get_weather(city="Paris"', "", [("get_weather", W)]),
        ('[rm_rf(path="/")]', "", []),
        ("[1, 2, 3] is a list.", "[1, 2, 3] is a list.", []),
        ('[get_weather(city="Paris"), rm_rf()]', "", [("get_weather", W)]),
        ("<|python_tag|>[get_time()] Done.", " Done.", [("get_time", {})]),
    ],
    "mistral": [
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}"}', "", [("get_weather", W)]),
        ('[TOOL_CALLS]get_weather{"city": "Paris"}', "", [("get_weather", W)]),
        ('[TOOL_CALLS][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [("get_weather", W)]),
        ('[TOOL_CALLS]get_weather[ARGS][ARGS]{"city": "Paris"}', "", [("get_weather", W)]),
        ('[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}', "", []),
        ("[TOOL_CALLS]rm_rf[ARGS]{}[TOOL_CALLS]get_time[ARGS]{}", "", [("get_time", {})]),
        ("[TOOL_CALLS]get_time", "", [("get_time", {})]),
        ("Use [TOOL_CALLS] to call.", "Use  to call.", []),
        ('[TOOL_CALLS][{"name": "rm_rf", "arguments": {}}, {"name": "get_time", '
         '"arguments": {}}]', "", [("get_time", {})]),
        ('[TOOL_CALLS][{"name": "get_time", "arguments": {}}', "", [("get_time", {})]),
    ],
    "deepseek_v3": [
        ('<｜tool▁calls▁begin｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>'
         '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "", [("get_weather", W)]),
        ('Sure.<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
         '<｜tool▁calls▁end｜>', "Sure.", [("get_weather", W)]),
        ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}',
         "", [("get_weather", W)]),
        ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}"'
         '<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "", [("get_weather", W)]),
        ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>rm_rf<｜tool▁sep｜>{"path": "/"}'
         '<｜tool▁call▁end｜><｜tool▁calls▁end｜>Done.', "Done.", []),
        ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
         '<｜tool▁call▁end｜><｜tool▁call▁end｜><｜tool▁calls▁end｜>', "", [("get_weather", W)]),
        ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
         '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "", [("get_weather", W)]),
        ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather{"city": "Paris"}'
         '<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "", [("get_weather", W)]),
        ("Done.<｜tool▁calls▁end｜>", "Done.", []),
    ],
    "kimi_k2": [
        ('<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
         '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>', "", [("get_weather", W)]),
        ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0'
         '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>', "", [("get_weather", W)]),
        ('<|tool_calls_section_begin|><|tool_call_begin|>functions.rm_rf:0'
         '<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>', "", []),
        ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0'
         '<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>'
         '<|tool_calls_section_end|>', "", [("get_time", {})]),
        ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_ti", "", []),
        ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0", "",
         [("get_time", {})]),
    ],
}


@pytest.mark.parametrize("family, text, content, calls", [
    (family, *case) for family, cases in CASES.items() for case in cases])
def test_malformed_output(family, text, content, calls):
    wrote_markup = any(mark in t for _, a in calls for t in strings(a) for mark in MARKUP[family])
    out = parse_all(family, text, values=not wrote_markup)
    assert (out.content, out.calls) == (content, calls)
    assert out.finish == ("tool_calls" if calls else "stop")


def test_a_dropped_call_is_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="podium.parsing"):
        parse_all("hermes", '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>')
    assert any("rm_rf" in r.getMessage() and "not a declared tool" in r.getMessage()
               for r in caplog.records)


def test_a_recovered_call_is_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="podium.parsing"):
        parse_all("hermes", f"<tool_call>\n{H_CALL}\n</tool_call>\n</tool_call>")
    assert any("</tool_call>" in r.getMessage() for r in caplog.records)


# -- the property: mutate valid calls, keep the invariants ---------------------------------

WRITERS = {
    "hermes": formats.hermes, "qwen3_coder": formats.qwen3_coder, "glm45": formats.glm45,
    "llama3_json": formats.llama3, "pythonic": formats.pythonic, "mistral": formats.mistral,
    "deepseek_v3": formats.deepseek, "kimi_k2": formats.kimi, "json": formats.fenced,
}
# the delimiters a mutation drops, doubles or swaps (a family's markup and its JSON's)
DELIMITERS = {family: [*marks, "{", "}", '"', "\n"] for family, marks in MARKUP.items()}
DELIMITERS["pythonic"] = ["[", "]", "(", ")", '"', "'", ",", "="]
DELIMITERS["llama3_json"] += [";"]
DELIMITERS["json"] += ["[", "]", ","]
PROSE_FIRST = {"llama3_json": False, "pythonic": False, "json": False}

VALUE = st.text(alphabet=st.sampled_from(list("ab é1.-")), min_size=1, max_size=6)
ARGS = st.dictionaries(st.sampled_from(["city", "path", "content"]), VALUE, max_size=2)
CALLS = st.lists(st.tuples(st.sampled_from(["get_weather", "get_time", "write_file"]), ARGS),
                 min_size=1, max_size=2)
MUTATION = st.tuples(st.sampled_from(["drop", "double", "swap", "insert", "cut"]),
                     st.integers(min_value=0), st.sampled_from(list("\"'{}[]")))


def mutate(text: str, family: str, mutation: tuple[str, int, str]) -> str:
    kind, at, char = mutation
    if kind == "insert":
        i = at % (len(text) + 1)
        return text[:i] + char + text[i:]
    if kind == "cut":
        return text[:at % (len(text) + 1)]
    found = sorted((i, d) for d in DELIMITERS[family] for i in _positions(text, d))
    if not found:
        return text
    k = at % len(found)
    i, d = found[k]
    if kind == "drop":
        return text[:i] + text[i + len(d):]
    if kind == "double":
        return text[:i] + d + text[i:]
    later = [(j, e) for j, e in found[k + 1:] if j >= i + len(d)]      # swap with the next
    if not later:
        return text
    j, e = later[0]
    return text[:i] + e + text[i + len(d):j] + d + text[j + len(e):]


def _positions(text: str, needle: str):
    i = text.find(needle)
    while i >= 0:
        yield i
        i = text.find(needle, i + 1)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(WRITERS)), CALLS, st.booleans(),
       st.lists(MUTATION, min_size=1, max_size=2))
def test_mutated_calls_keep_the_invariants(family, calls, prose, mutations):
    if family in ("qwen3_coder", "glm45"):        # XML values: raw text, no edge blanks
        calls = [(n, {k: v.strip() or "x" for k, v in a.items()}) for n, a in calls]
    text = WRITERS[family](calls)
    if prose and PROSE_FIRST.get(family, True):
        text = "Sure. " + text + " Done."
    for mutation in mutations:
        text = mutate(text, family, mutation)
    parse_all(family, text)


@pytest.mark.parametrize("family, pieces", [
    # a later object that is no call, after a call whose name came in pieces
    ("llama3_json", ['{"na', 'me": "get_weathe', 'r", "parameters": {}}; {"name": "\t \tget_we'
                     'ather", "para', 'meters"', ': ', '{}}Done.']),
])
def test_cut_like_this_folds_as_one_piece(family, pieces):
    whole = parse_all(family, "".join(pieces))
    assert fold(run(parser(family), pieces)) == whole
