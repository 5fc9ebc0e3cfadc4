"""Calls of 400 KB (agents write whole files as tool arguments) and 400 KB blank runs, for
every family: cut into small pieces they fold to what one piece gives, and the work per delta
does not grow with them. Work is counted, not timed: the longest string a parser keeps between
deltas (text rescanned or re-copied from its start has to be kept whole), and the memory one
delta allocates late in the stream (a ``+=`` accumulator copies everything so far)."""

import functools
import json
import statistics
import tracemalloc

import pytest

from podium.parsing.events import TextDelta
from tests.parsing import formats
from tests.parsing.helpers import cut, fold, parser, run

SIZE = 400 * 1024
LINE = ('    s = "a \\"quoted\\" path\\\\n" + \'<tool_call>\' + "</parameter>" + x  # é 🫠 {i}\n'
        '\tif {{"k": [1, 2]}}: return s[{i}:]\n')
PATH = "src/big_module.py"


@functools.cache
def source() -> str:
    """Source-like text with quotes, backslashes, tabs, non-ASCII and tags a value may hold."""
    lines, total, i = [], 0, 0
    while total < SIZE:
        lines.append(LINE.format(i=i))
        total += len(lines[-1])
        i += 1
    return "".join(lines)


@functools.cache
def big_object() -> dict:
    return {"lines": source().splitlines()}


def one_call(family: str, writer, key: str = "content"):
    """A write_file call whose ``key`` holds 400 KB: source text, or (``mode``) an object;
    XML families write the object as JSON text, their schemas type it back."""
    value = source() if key == "content" else big_object()
    written = json.dumps(value) if key != "content" and writer in XML_WRITERS else value
    text = writer([("write_file", {"path": PATH, key: written})])
    return family, None, text, [("write_file", {"path": PATH, key: value})], ""


def long_reasoning():
    text = f"<think>{source()}</think>\n" + formats.hermes([("get_time", {})])
    return "hermes", "think", text, [("get_time", {})], ""


# Blank runs (a model looping on newlines) where parsers wait to see what follows: at the
# start of the answer, inside and between calls, after them. {ws} marks a run.
W = '{"city": "x"}'
BLANK_RUNS = {
    "hermes": '{ws}<tool_call>{"name": "get_weather", "arguments": ' + W + '}{ws}</tool_call>'
              '{ws}Done.',
    "qwen3_coder": "{ws}<tool_call>\n<function=get_weather>{ws}<parameter=city>\nx\n"
                   "</parameter>{ws}</function>{ws}</tool_call>Done.",
    "glm45": "{ws}<tool_call>get_weather\n<arg_key>city</arg_key>{ws}<arg_value>x</arg_value>"
             "{ws}</tool_call>Done.",
    "mistral": "{ws}[TOOL_CALLS]get_weather[ARGS]" + W + "{ws}[TOOL_CALLS]get_weather[ARGS]"
               + W + "{ws}Done.",
    "deepseek_v3": "{ws}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" + W
                   + "{ws}<｜tool▁call▁end｜>{ws}<｜tool▁calls▁end｜>Done.",
    "kimi_k2": "{ws}<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               "<|tool_call_argument_begin|>" + W + "{ws}<|tool_call_end|>{ws}"
               "<|tool_calls_section_end|>Done.",
    "llama3_json": '{ws}{"name": "get_weather", "parameters": ' + W + '}{ws};{ws}'
                   '{"name": "get_weather", "parameters": ' + W + '}{ws}Done.',
    "pythonic": '{ws}[get_weather(city="x"),{ws}get_weather(city="x")]{ws}Done.',
    "json": '{ws}```json\n[{"name": "get_weather", "arguments": ' + W + '},{ws}'
            '{"name": "get_weather", "arguments": ' + W + '}{ws}]{ws}```{ws}Done.',
}


def blank_runs(family: str, reasoning: str | None = None):
    template = BLANK_RUNS[family]
    text = template.replace("{ws}", "\n \t" * (SIZE // 3 // template.count("{ws}")))
    calls = [("get_weather", {"city": "x"})] * template.count("get_weather")
    return family, reasoning, text, calls, "Done."


XML_WRITERS = (formats.qwen3_coder, formats.glm45)
P = functools.partial
CASES = {
    "hermes": P(one_call, "hermes", formats.hermes),
    "hermes_arguments_first": P(one_call, "hermes", formats.hermes_arguments_first),
    "hermes_after_long_reasoning": long_reasoning,
    "qwen3_coder": P(one_call, "qwen3_coder", formats.qwen3_coder),
    "qwen3_coder_object": P(one_call, "qwen3_coder", formats.qwen3_coder, "mode"),
    "glm45": P(one_call, "glm45", formats.glm45),
    "glm45_object": P(one_call, "glm45", formats.glm45, "mode"),
    "llama3_json": P(one_call, "llama3_json", formats.llama3),
    "llama3_json_arguments_first": P(one_call, "llama3_json", formats.llama3_arguments_first),
    "pythonic": P(one_call, "pythonic", formats.pythonic),
    "mistral": P(one_call, "mistral", formats.mistral),
    "mistral_list": P(one_call, "mistral", formats.mistral_list),
    "mistral_list_arguments_first": P(one_call, "mistral", formats.mistral_list_arguments_first),
    "deepseek_v3": P(one_call, "deepseek_v3", formats.deepseek),
    "kimi_k2": P(one_call, "kimi_k2", formats.kimi),
    "json": P(one_call, "json", formats.fenced),
    "json_arguments_first": P(one_call, "json", formats.fenced_arguments_first),
    **{f"blank_runs_{family}": P(blank_runs, family) for family in BLANK_RUNS},
    "blank_runs_before_reasoning": P(blank_runs, "hermes", "think"),
}


@functools.cache
def case(name: str) -> tuple[str, str | None, str, list, str]:
    """(family, reasoning parser, text, calls, content without its edge blanks)"""
    return CASES[name]()


def longest_text_held(obj) -> int:
    """The longest string reachable from ``obj`` through Podium objects, lists and dicts."""
    longest, seen, todo = 0, set(), [obj]
    while todo:
        o = todo.pop()
        if isinstance(o, str):
            longest = max(longest, len(o))
        elif id(o) in seen:
            continue
        elif isinstance(o, (list, tuple, set)):
            todo.extend(o)
        elif isinstance(o, dict):
            todo.extend(o.keys())
            todo.extend(o.values())
        elif type(o).__module__.startswith("podium."):
            todo.extend(getattr(o, "__dict__", {}).values())
            todo.extend(getattr(o, s, None) for c in type(o).__mro__
                        for s in getattr(c, "__slots__", ()))
        seen.add(id(o))
    return longest


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_long_call_cut_small_folds_as_one_piece(name):
    family, reasoning, text, calls, content = case(name)
    whole = fold(run(parser(family, reasoning), [text]))
    assert whole.calls == calls and whole.content.strip() == content
    assert fold(run(parser(family, reasoning), cut(text, [1, 3, 7, 4, 13, 30]))) == whole


@pytest.mark.parametrize("name", sorted(CASES))
def test_work_per_delta_does_not_grow_with_the_call(name):
    family, reasoning, text, _, _ = case(name)
    p, pieces = parser(family, reasoning), cut(text, [8])
    window = range(len(pieces) - 600, len(pieces) - 100)      # late: 400 KB in
    checks = {len(pieces) * k // 8 for k in range(1, 8)} | {window.start}
    longest, allocated = 0, []
    for i, piece in enumerate(pieces):
        if i in window:
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            p.feed([TextDelta(piece)])
            allocated.append(tracemalloc.get_traced_memory()[1] - base)
            tracemalloc.stop()
        else:
            p.feed([TextDelta(piece)])
        if i in checks:
            longest = max(longest, longest_text_held(p))
    assert longest <= 64, "a parser keeps a string that grows with the call"
    assert statistics.median(allocated) < 4096, "a delta allocates in proportion to the call"
