"""Calls of 400 KB (agents write whole files as tool arguments), for every family: cut into
small pieces they fold to what one piece gives, and the work per delta does not grow with the
call. Work is counted, not timed: the longest string a parser keeps between deltas (a value
rescanned or re-copied from its start has to be kept whole), and the memory one delta
allocates late in the call (a ``+=`` accumulator copies everything so far)."""

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


def write_file(content_key="content", written=None):
    value = source() if content_key == "content" else big_object()
    return [("write_file", {"path": PATH, content_key: value if written is None else written})]


# case -> (family, reasoning, writer, the calls as written, the calls expected)
CASES = {
    "hermes": ("hermes", None, formats.hermes, write_file, write_file),
    "hermes_arguments_first": ("hermes", None, formats.hermes_arguments_first, write_file,
                               write_file),
    "hermes_after_long_reasoning": ("hermes", "think", None, write_file, write_file),
    "qwen3_coder": ("qwen3_coder", None, formats.qwen3_coder, write_file, write_file),
    "qwen3_coder_object": ("qwen3_coder", None, formats.qwen3_coder,
                           lambda: write_file("mode", json.dumps(big_object())),
                           lambda: write_file("mode")),
    "glm45": ("glm45", None, formats.glm45, write_file, write_file),
    "glm45_object": ("glm45", None, formats.glm45,
                     lambda: write_file("mode", json.dumps(big_object())),
                     lambda: write_file("mode")),
    "llama3_json": ("llama3_json", None, formats.llama3, write_file, write_file),
    "llama3_json_arguments_first": ("llama3_json", None, formats.llama3_arguments_first,
                                    write_file, write_file),
    "pythonic": ("pythonic", None, formats.pythonic, write_file, write_file),
    "mistral": ("mistral", None, formats.mistral, write_file, write_file),
    "mistral_list": ("mistral", None, formats.mistral_list, write_file, write_file),
    "mistral_list_arguments_first": ("mistral", None, formats.mistral_list_arguments_first,
                                     write_file, write_file),
    "deepseek_v3": ("deepseek_v3", None, formats.deepseek, write_file, write_file),
    "kimi_k2": ("kimi_k2", None, formats.kimi, write_file, write_file),
    "json": ("json", None, formats.fenced, write_file, write_file),
    "json_arguments_first": ("json", None, formats.fenced_arguments_first, write_file,
                             write_file),
}


@functools.cache
def case(name: str) -> tuple[str, str | None, str, list]:
    family, reasoning, writer, written, expected = CASES[name]
    if writer is None:              # the long part is the reasoning; the call is short
        text = f"<think>{source()}</think>\n" + formats.hermes([("get_time", {})])
        return family, reasoning, text, [("get_time", {})]
    return family, reasoning, writer(written()), expected()


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
    family, reasoning, text, calls = case(name)
    whole = fold(run(parser(family, reasoning), [text]))
    assert whole.calls == calls and whole.content == ""
    assert fold(run(parser(family, reasoning), cut(text, [1, 3, 7, 4, 13, 30]))) == whole


@pytest.mark.parametrize("name", sorted(CASES))
def test_work_per_delta_does_not_grow_with_the_call(name):
    family, reasoning, text, _ = case(name)
    p, pieces = parser(family, reasoning), cut(text, [8])
    window = range(len(pieces) - 600, len(pieces) - 100)      # late: 400 KB into the call
    checks = {len(pieces) // 2, window.start}
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
