import json
from datetime import datetime

import pytest

from podium.errors import InvalidRequestError
from podium.text.template import ChatTemplate


def test_qwen_template_renders_conversation_with_generation_prompt(chat_template):
    out = ChatTemplate(chat_template).render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\n")


def test_qwen_template_renders_tools_and_tool_history(chat_template):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter <heute>",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21C"},
    ]
    out = ChatTemplate(chat_template).render(messages, tools=tools)
    # tojson as Hugging Face does it: no HTML escaping, non-ASCII kept
    assert json.dumps(tools[0], ensure_ascii=False) in out
    assert '{"name": "get_weather", "arguments": {"city": "Zürich"}}' in out
    assert "<tool_response>\n21C\n</tool_response>" in out
    assert out.endswith("<|im_start|>assistant\n")


def test_no_generation_prompt_when_not_asked(chat_template):
    out = ChatTemplate(chat_template).render([{"role": "user", "content": "Hi"}],
                                             add_generation_prompt=False)
    assert not out.endswith("<|im_start|>assistant\n")


def test_hf_helpers_and_kwargs():
    template = ChatTemplate(
        "{{ bos_token }}{{ strftime_now('%Y') }}|{{ flag }}|{{ {'a': '<b>'} | tojson }}"
        "{% generation %}G{% endgeneration %}", bos_token="<s>")
    assert template.render([], extra={"flag": "on"}) == f"<s>{datetime.now().year}|on|{{\"a\": \"<b>\"}}G"


def test_raise_exception_becomes_a_400():
    template = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}")
    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        template.render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("attack", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{% set x = messages.append(1) %}{{ x }}",
])
def test_sandbox_blocks_python_internals(attack):
    with pytest.raises(InvalidRequestError):
        ChatTemplate(attack).render([{"role": "user", "content": "x"}])


def test_message_content_is_data_not_template(chat_template):
    out = ChatTemplate(chat_template).render([{"role": "user", "content": "{{ 7*7 }}"}])
    assert "{{ 7*7 }}" in out and "49" not in out


def test_broken_template_is_a_400():
    with pytest.raises(InvalidRequestError, match="Invalid chat template"):
        ChatTemplate("{% for %}")
