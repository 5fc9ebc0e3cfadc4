"""Schemathesis against Podium's own OpenAPI document: no 5xx, documented statuses, and every
error body shaped like its API's (OpenAI's; Anthropic's on /v1/messages; Ollama's on /api/).
Bounded so it fits CI (examples per operation below)."""

import functools
import importlib.util
import os
from pathlib import Path

import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (content_type_conformance,
                                               status_code_conformance)

from podium.api.batch_worker import Worker
from podium.engine.base import ModelInfo
from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
from podium.engine.llamacpp.model_files import default_model_path
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED


@functools.cache
def _app() -> FastAPI:
    """The app, on a store of its own (on the session's default store, its batch worker
    claimed the e2e tests' server's batch requests and failed them, serving no such model).
    Built at import for its OpenAPI document (schemathesis's ``from_fixture`` would build it
    in the test, but fails under pytest 9), and never started there: its lifespan, and its
    batch worker with it, runs from a test's first request to that test's teardown
    (schemathesis's plugin ends it), not for the whole session."""
    model = LlamaModel(default_model_path(), vocab_only=True)
    info = ModelInfo(SERVED, 4096, model.metadata["tokenizer.chat_template"], 0)
    engine = ScriptedEngine(LlamaTokenizer(model), info, ["Sure, here you go."])
    store = Path(os.environ["PODIUM_DATA_DIR"]) / "fuzz.db"    # (tests/conftest.py)
    return create_app(Settings(max_body_bytes=1 << 20, store_url=f"sqlite:///{store}"), engine)


# the document read from the app, not requested from it: a request starts its lifespan
schema = schemathesis.openapi.from_dict(_app().openapi())
schema.app = _app()


def api_shaped_errors(ctx, response, case):
    """OpenAI's error object, Anthropic's on the Messages API's routes, Ollama's on its."""
    if case.method == "HEAD":
        return                          # no body: its status is checked by the others
    if response.status_code >= 400 and response.headers.get("content-type", [""])[0].startswith(
            "application/json"):
        body = response.json()
        if case.path.startswith("/api/"):
            assert set(body) == {"error"} and isinstance(body["error"], str), body
            return
        if case.path.startswith("/v1/messages"):
            assert set(body) == {"type", "error"} and body["type"] == "error", body
            assert {"type", "message"} == set(body["error"]), body
            return
        assert set(body) == {"error"}, body
        assert {"message", "type", "param", "code"} <= set(body["error"]), body


def no_server_errors(ctx, response, case):
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_endpoint_survives_generated_requests(case):
    case.call_and_validate(checks=[no_server_errors, api_shaped_errors,
                                   status_code_conformance, content_type_conformance])


def test_importing_this_module_starts_no_batch_worker(monkeypatch):
    """Collecting the fuzz test starts nothing: an app started at import ran its batch
    worker for the rest of the session, beside every other test."""
    started: list[Worker] = []

    async def start(worker: Worker) -> None:
        started.append(worker)
    monkeypatch.setattr(Worker, "start", start)
    spec = importlib.util.spec_from_file_location("fuzz_again", __file__)
    assert spec is not None and spec.loader is not None
    again = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(again)
    assert started == []
    again._app().state.store.engine.dispose()
