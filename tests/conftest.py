"""Shared fixtures: the default model's real tokenizer, and apps on the scripted engine."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import pytest
from starlette.testclient import TestClient

from podium.engine.base import EngineRequest, ModelInfo
from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
from podium.engine.llamacpp.model_files import default_model_path
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
from podium.settings import Settings

SERVED = "test-model"


_OLD_DATA_DIR = os.environ.get("PODIUM_DATA_DIR")


def pytest_configure(config: pytest.Config) -> None:
    """Stored responses and keys go to a throwaway directory, never the user's: set before
    any test module is imported (tests/server/test_fuzz.py builds its app at import)."""
    os.environ["PODIUM_DATA_DIR"] = tempfile.mkdtemp(prefix="podium-data-")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ["PODIUM_DATA_DIR"], ignore_errors=True)
    if _OLD_DATA_DIR is None:
        os.environ.pop("PODIUM_DATA_DIR", None)
    else:
        os.environ["PODIUM_DATA_DIR"] = _OLD_DATA_DIR


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def tokenizer(model_path: Path) -> LlamaTokenizer:
    return LlamaTokenizer(LlamaModel(model_path, vocab_only=True))


@pytest.fixture(scope="session")
def chat_template(model_path: Path) -> str:
    return LlamaModel(model_path, vocab_only=True).metadata["tokenizer.chat_template"]


@pytest.fixture
def scripted(tokenizer, chat_template) -> Callable[..., ScriptedEngine]:
    """Build a scripted engine (the default model's tokenizer and template) replaying replies."""
    def build(replies, context_length: int = 4096, **pacing) -> ScriptedEngine:
        info = ModelInfo(SERVED, context_length, chat_template, created=0)
        return ScriptedEngine(tokenizer, info, replies, **pacing)
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
