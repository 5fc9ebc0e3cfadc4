"""Anthropic's Messages API on the real server and model, driven by the ``anthropic`` SDK."""

from __future__ import annotations

import anthropic
import pytest

from tests.e2e.conftest import MODEL

TOOLS = [{"name": f"Tool{i}", "description": f"Does task number {i}",
          "input_schema": {"$schema": "http://json-schema.org/draft-07/schema#",
                           "type": "object", "properties": {"arg": {"type": "string"}},
                           "required": ["arg"]},
          **({"cache_control": {"type": "ephemeral"}} if i == 19 else {})}
         for i in range(20)]                            # at most 4 breakpoints in a request


def prompt_tokens(usage) -> int:
    """Anthropic splits the prompt three ways: read from the cache, written to it, the rest."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


@pytest.fixture(scope="module")
def sdk(server_url):
    client = anthropic.Anthropic(base_url=server_url, api_key="unused", max_retries=0)
    yield client
    client.close()


def claude_code_turn(cch: str) -> dict:
    return {
        "model": MODEL, "max_tokens": 16,
        "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197; "
                                     f"cc_entrypoint=sdk-cli; cch={cch};"},
            {"type": "text", "text": "You are a coding assistant in a terminal.",
             "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Run the tests."}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_01", "name": "Tool1",
                 "input": {"arg": "pytest"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "is_error": True,
                 "content": "pytest: command not found"}]},
            {"role": "system", "content": "Answer in one short sentence."},
            {"role": "user", "content": "What went wrong?"}],
        "tools": TOOLS, "thinking": {"type": "adaptive"}, "metadata": {"user_id": "u1"}}


def test_a_claude_code_turn_streams_and_its_repeat_reads_the_cache(sdk):
    with sdk.messages.stream(**claude_code_turn("11111")) as stream:
        kinds = [event.type for event in stream]
        first = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert first.content and first.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert first.usage.output_tokens > 0
    # the billing header's value changes with every request: it must not spoil the cache
    second = sdk.messages.create(**claude_code_turn("22222"))
    assert second.usage.cache_read_input_tokens > 0
    total = prompt_tokens(first.usage)
    assert prompt_tokens(second.usage) == total
    assert second.usage.cache_read_input_tokens > total // 2


def test_forced_tool_use_on_the_real_model(sdk):
    message = sdk.messages.create(
        model=MODEL, max_tokens=64, tools=TOOLS[:3], tool_choice={"type": "tool", "name": "Tool2"},
        messages=[{"role": "user", "content": "Do task 2 with arg 'now'."}])
    assert message.stop_reason == "tool_use"
    call = message.content[-1]
    assert call.type == "tool_use" and call.name == "Tool2" and isinstance(call.input["arg"], str)
    count = sdk.messages.count_tokens(model=MODEL, tools=TOOLS[:3], messages=[
        {"role": "user", "content": "Do task 2 with arg 'now'."}])
    assert count.input_tokens == prompt_tokens(message.usage)
