"""Grammars judged on the default model: llguidance matchers over its real vocabulary (does a
text belong to a grammar?), and an in-process server on the real llama.cpp engine, driven by
the openai SDK, for what the model actually writes under a constraint."""

from __future__ import annotations

import json
from typing import Any, Iterator

import jsonschema
import openai
import pytest
from starlette.testclient import TestClient

from podium.engine.llamacpp.constraint import Grammars
from podium.engine.llamacpp.engine import LlamaCppEngine
from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
from podium.server.app import create_app
from podium.settings import Settings

SERVED = "m"


class Matchers:
    """Whether a text is in a grammar, read token by token as the model would write it."""

    def __init__(self, model: LlamaModel):
        self.tokenizer = LlamaTokenizer(model)
        self.grammars = Grammars(model.vocab, self.tokenizer.vocab_size,
                                 self.tokenizer.eos_token_ids)

    def accepts(self, grammar: str, text: str) -> bool:
        matcher = self.grammars.matcher(grammar)
        ids = self.tokenizer.encode(text, add_special=False)
        return (matcher.consume_tokens(ids) and matcher.is_accepting()
                and not matcher.is_error())

    def accepts_json(self, grammar: str, value: Any,
                     indents: tuple[int | None, ...] = (None, 2)) -> bool:
        """Both as compact JSON and indented, as models write it."""
        return all(self.accepts(grammar, json.dumps(value, ensure_ascii=False, indent=indent))
                   for indent in indents)


@pytest.fixture(scope="session")
def matchers(model_path) -> Iterator[Matchers]:
    model = LlamaModel(model_path, vocab_only=True)
    yield Matchers(model)
    model.close()


@pytest.fixture(scope="session")
def real(model_path) -> Iterator[openai.OpenAI]:
    """The openai SDK on Podium's app serving the default model with the real engine (the
    app's shutdown closes it)."""
    engine = LlamaCppEngine(model_path, served_name=SERVED, n_ctx=2048, n_batch=128)
    with TestClient(create_app(Settings(), engine)) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="unused",
                            http_client=http, max_retries=0)


def generate(client: openai.OpenAI, schema: dict, prompt: str, stream: bool,
             max_tokens: int = 160) -> Any:
    """What the model writes under ``response_format`` ``schema`` (temperature 0), parsed
    and validated with ``jsonschema``: it must end by itself (``stop``), not be cut off."""
    kw: dict[str, Any] = dict(
        model=SERVED, messages=[{"role": "user", "content": prompt}], temperature=0,
        max_tokens=max_tokens,
        response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": schema}})
    if stream:
        text, finish = "", None
        for chunk in client.chat.completions.create(stream=True, **kw):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        text, finish = choice.message.content or "", choice.finish_reason
    assert finish == "stop", (finish, text)
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value
