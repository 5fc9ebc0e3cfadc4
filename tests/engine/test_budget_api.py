"""Reasoning budgets end to end on the default model (issue 41): a chat template that opens
``<think>`` in its generation prompt (as Qwen3's and DeepSeek-R1's do), the real llama.cpp
engine, and the official SDK streaming: reasoning ends at the budget, the answer follows
within ``max_tokens``, and ``reasoning_tokens`` counts what was streamed as reasoning (with
the closing tag)."""

from __future__ import annotations

from typing import Iterator

import openai
import pytest
from starlette.testclient import TestClient

from podium.engine.llamacpp.engine import LlamaCppEngine
from podium.server.app import create_app
from podium.settings import Settings

SERVED = "m"
THINKING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{% endfor %}<|im_start|>assistant\n<think>\n")


@pytest.fixture(scope="module")
def served(model_path) -> Iterator[tuple[openai.OpenAI, LlamaCppEngine]]:
    engine = LlamaCppEngine(model_path, served_name=SERVED, n_ctx=2048, n_batch=128)
    settings = Settings(reasoning_parser="think", allow_request_chat_template=True,
                        reasoning_budgets="low=12")
    with TestClient(create_app(settings, engine)) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="unused",
                            http_client=http, max_retries=0), engine


@pytest.mark.parametrize("control", [{"reasoning_effort": "low"},
                                     {"extra_body": {"thinking_token_budget": 12}}],
                         ids=["effort-low", "thinking_token_budget"])
def test_reasoning_ends_at_the_budget_and_the_answer_follows(served, control):
    client, engine = served
    kw = dict(control)
    extra = {"chat_template": THINKING, **kw.pop("extra_body", {})}
    stream = client.chat.completions.create(
        model=SERVED, max_tokens=64, temperature=0.0, stream=True,
        stream_options={"include_usage": True}, extra_body=extra,
        messages=[{"role": "user", "content": "What is 17 * 23? Explain at length."}], **kw)
    reasoning, content, usage = "", "", None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
    assert content.strip(), (reasoning, content)            # the model went on to answer
    assert "</think>" not in content
    close = engine.tokenizer.encode("\n</think>\n\n", add_special=False)
    # the usage counts every token of reasoning, its closing tag's too: the budget's 12
    # tokens, then the close the engine wrote
    assert usage.completion_tokens_details.reasoning_tokens == 12 + len(close)
    assert 12 <= len(engine.tokenizer.encode(reasoning, add_special=False)) <= 13
    assert usage.completion_tokens <= 64
