"""A Python literal's quoted string ends at a raw line break, as a JSON string does.

Python's own rule: a ``'...'`` or ``"..."`` literal (not triple-quoted) cannot hold a raw
newline. In Python-literal mode (``PyJson``) one used to become an escape, so a string left
unclosed swallowed the rest of the output, ``</tool_call>`` and the prose after it, into an
argument key (found by hypothesis in test_malformed's mutated calls).
"""

from __future__ import annotations

import pytest

from podium.parsing.scan import JsonPrefix
from tests.parsing.test_malformed import parse_all

# hypothesis' failing case, as it printed it
HYPOTHESIS_CASE = (
    '"Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "111", "path": '
    '"111111"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": '
    '{\'"city": "111", "content": "11111\\u00e9"}}\n</tool_call>\n Done.')


def test_unclosed_python_string_does_not_swallow_the_end_of_the_call():
    out = parse_all("hermes", HYPOTHESIS_CASE)     # no markup in content or an argument
    assert out.content == '"Sure.\n Done.'
    assert out.calls == [("get_weather", {"city": "111", "path": "111111"}),
                         ("get_weather", {'"city": "111", "content": "11111é"}}': None})]


def test_python_and_json_strings_end_alike_at_a_raw_newline():
    py = ('Sure. <tool_call>\n{"name": "get_weather", "arguments": {\'city": "x"}}\n'
          '</tool_call>\n Done.')
    js = py.replace("{'city\": \"x\"}}", '{"city\\": \\"x\\"}}')
    assert js != py
    assert parse_all("hermes", py) == parse_all("hermes", js)


@pytest.mark.parametrize("text", ["{'a\nb': 1}", "{'k': 'a\nb'}", "{'k': \"a\nb\"}",
                                  "{'k': 'a\r\nb'}", "{'k': 'a\rb'}"])
def test_scanner_breaks_a_python_string_at_a_raw_line_break(text):
    cut = min(i for i in (text.find("\n"), text.find("\r")) if i >= 0)
    whole = JsonPrefix()
    assert whole.feed(text) == cut
    assert whole.broken and whole.out is not None and "\n" not in whole.out
    by_char, taken = JsonPrefix(), 0                # fed a character at a time: the same
    for c in text:
        taken += by_char.feed(c)
    assert taken == cut and by_char.broken


def test_scanner_still_escapes_a_raw_tab_in_a_python_string():
    p = JsonPrefix()
    assert p.feed("{'k': 'a\tb'}") == 12 and p.done and not p.broken
    assert p.out == '{"k": "a\\tb"}'
