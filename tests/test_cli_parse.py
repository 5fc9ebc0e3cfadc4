"""``podium parse`` on issue 26's classes: it shows what Podium makes of each, and a lone
surrogate in arguments never crashes it (the real CLI, in a subprocess: its stdout is a
strict UTF-8 stream, which is where a surrogate used to fail)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from podium.cli_parse import _print


def podium_parse(*args: str, text: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "podium", "parse", *args], input=text,
                          capture_output=True, text=True, encoding="utf-8", timeout=60)


# one output per class: (family, what the model wrote, content, calls)
SHOWN = [
    ("mistral", '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}', "",
     [{"name": "get_weather", "arguments": {"city": "Paris"}}]),
    ("deepseek_v3", 'Hi.<｜tool calls begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}'
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>", "Hi.",
     [{"name": "get_time", "arguments": {}}]),
    ("hermes", '```json\n<tool_call>\n{"name": "get_time", "arguments": {"a": True,}}\n'
     "</tool_call>\n```<|im_end|>", "", [{"name": "get_time", "arguments": {"a": True}}]),
    ("hermes", "<tool_call>{'name': 'get_time', 'arguments': \"{'a': None}\"}</tool_call>", "",
     [{"name": "get_time", "arguments": {"a": None}}]),
    ("llama3_json", '<function=get_time>{"a": "x\\u00', "",
     [{"name": "get_time", "arguments": {"a": "x"}}]),
    ("pythonic", "<|python_start|>[get_time() get_time(a=1)]<|python_end|>", "",
     [{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {"a": 1}}]),
]


@pytest.mark.parametrize("family, text, content, calls", SHOWN)
def test_parse_shows_each_class(family, text, content, calls):
    r = podium_parse("--tool-parser", family, "--json", "--chunk", "3", text=text)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    out = json.loads(r.stdout)
    assert (out["content"], out["tool_calls"]) == (content, calls)
    if family != "mistral":                      # [CALL_ID] is the format, not a repair
        assert out["warnings"]                   # each recovery says what it did


@pytest.mark.parametrize("args", [(), ("--json",)])
@pytest.mark.parametrize("family, text", [
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": "\\ud83c"}}</tool_call>'),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"a": "x\\udf0d"}'),
    ("pythonic", "[f(a='\\ud83c')]"),
])
def test_parse_never_crashes_on_a_lone_surrogate(family, text, args):
    r = podium_parse("--tool-parser", family, *args, text=text)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "\ufffd" in r.stdout or "\\ufffd" in r.stdout


def test_the_report_writes_a_surrogate_it_is_given_as_its_escape(capsys, monkeypatch):
    """What reaches the report with one anyway (a Harmony call's arguments) is escaped."""
    class Strict:
        encoding = "utf-8"
        written: list[str] = []

        def write(self, text: str) -> None:
            self.written.append(text.encode("utf-8").decode("utf-8"))

        def flush(self) -> None:
            pass
    out = Strict()
    monkeypatch.setattr(sys, "stdout", out)
    _print('{"a": "\ud83c"}')
    assert "".join(out.written) == '{"a": "\\ud83c"}\n'
