import pytest

from podium.parsing.registry import (check_names, detect_reasoning_parser, detect_tool_parser)
from tests.conftest import SERVED

SNIPPETS = {
    "hermes": "{{- '<tool_call>\\n{\"name\": ' }}",
    "qwen3_coder": "<tool_call>\n<function={{ name }}>\n<parameter={{ p }}>",
    "glm45": "<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>",
    "kimi_k2": "<|tool_calls_section_begin|>",
    "deepseek_v3": "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}",
    "mistral": "{{ '[TOOL_CALLS]' }}",
    "pythonic": "[func_name1(params_name1=params_value1, params_name2=params_value2...)]",
    "llama3_json": "{{- '<|python_tag|>' }}",
    "json": "{% for m in messages %}{{ m.content }}{% endfor %}",
}


@pytest.mark.parametrize("family, template", SNIPPETS.items())
def test_tool_family_from_template(family, template):
    assert detect_tool_parser(template) == family


def test_default_model_is_hermes_without_reasoning(chat_template):
    assert detect_tool_parser(chat_template) == "hermes"
    assert detect_reasoning_parser(chat_template) == "none"


def test_reasoning_from_template():
    assert detect_reasoning_parser("{{ '<think>\\n' }}") == "think"
    assert detect_reasoning_parser("[THINK]{{ x }}[/THINK]") == "mistral"


def test_override_names_are_checked():
    check_names("hermes", "none")
    with pytest.raises(ValueError, match="unknown tool parser"):
        check_names("bogus", "auto")


def test_overrides_through_settings(tokenizer, client_for, scripted):
    reply = '[TOOL_CALLS]get_time[ARGS]{}'
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    body = {"model": SERVED, "messages": [{"role": "user", "content": "t?"}], "tools": tools}
    as_is = client_for(scripted([reply])).post("/v1/chat/completions", json=body).json()
    assert as_is["choices"][0]["message"]["content"] == reply      # Qwen's template: hermes
    forced = client_for(scripted([reply]), tool_parser="mistral").post(
        "/v1/chat/completions", json=body).json()
    assert forced["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    off = client_for(scripted(['<tool_call>{"name": "get_time", "arguments": {}}</tool_call>']),
                     tool_parser="none").post("/v1/chat/completions", json=body).json()
    assert off["choices"][0]["message"]["content"].startswith("<tool_call>")
