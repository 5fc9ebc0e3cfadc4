"""Shared fixtures: the default model's real tokenizer, and apps on the scripted engine."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from starlette.testclient import TestClient

from podium.engine.base import EngineRequest
from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
from podium.engine.llamacpp.model_files import default_model_path
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
from podium.settings import Settings

SERVED = "test-model"


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def tokenizer(model_path: Path) -> LlamaTokenizer:
    return LlamaTokenizer(LlamaModel(model_path, vocab_only=True))


@pytest.fixture(scope="session")
def chat_template(model_path: Path) -> str:
    model = LlamaModel(model_path, vocab_only=True)
    try:
        return model.metadata["tokenizer.chat_template"]
    finally:
        model.close()


@pytest.fixture
def scripted(model_path: Path) -> Callable[..., ScriptedEngine]:
    """Build a scripted engine (the default model's tokenizer and template) replaying replies."""
    def build(replies, **pacing) -> ScriptedEngine:
        return ScriptedEngine.from_gguf(model_path, replies, served_name=SERVED,
                                        context_length=pacing.pop("context_length", 4096),
                                        **pacing)
    return build


@pytest.fixture
def client_for() -> Callable[..., TestClient]:
    """A TestClient on an app serving ``engine`` with the given settings."""
    def build(engine, **settings) -> TestClient:
        return TestClient(create_app(Settings(**settings), engine), raise_server_exceptions=False)
    return build


@pytest.fixture
def client(scripted, client_for) -> TestClient:
    return client_for(scripted(["Hello there, how can I help?"]))


def echo_last_user(request: EngineRequest) -> list[int]:
    """A reply script: repeat the prompt's tokens (handy to check what the engine was sent)."""
    return list(request.prompt_token_ids[-5:])
