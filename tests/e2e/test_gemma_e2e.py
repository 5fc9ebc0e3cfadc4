"""A second real chat model: Gemma 3 270M (its file carries no chat template, so the server
is given Gemma's turn format with ``--chat-template-file``)."""

from __future__ import annotations

from pathlib import Path

import openai

from podium.engine.llamacpp.model_files import GEMMA_MODEL, default_model_path
from tests.e2e.conftest import podium_serve

TEMPLATE = Path(__file__).parent.parent / "data" / "gemma3.jinja"


def test_gemma_serves_chat_with_a_template_file():
    path = default_model_path(GEMMA_MODEL)
    with podium_serve("--model", str(path), "--chat-template-file", str(TEMPLATE),
                      "--ctx-size", "2048", "--log-level", "warning") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        [model] = [m.id for m in client.models.list()]
        r = client.chat.completions.create(
            model=model, max_tokens=8, temperature=0,
            messages=[{"role": "user", "content": "Name a colour."}])
        assert r.choices[0].message.content and r.usage.completion_tokens > 0
        client.close()
    # the prompt was Gemma's turn format, its markers Gemma's own special tokens (ChatML's
    # would have been many ordinary tokens each)
    from llama_cpp import Llama

    vocab = Llama(str(path), vocab_only=True, verbose=False)
    expected = vocab.tokenize(b"<bos><start_of_turn>user\nName a colour.<end_of_turn>\n"
                              b"<start_of_turn>model\n", add_bos=False, special=True)
    assert r.usage.prompt_tokens == len(expected)
