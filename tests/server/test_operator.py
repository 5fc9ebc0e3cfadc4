"""Who may load and unload models, and how an unload ends the requests it cuts short.

Keys are tenants (their responses, files and batches their own) and share every model, so
loading and unloading is the operator's act: with keys configured it takes an admin key
(``--admin-key``), a tenant's key gets 403 in the API's shape, and a tenant's Ollama
``keep_alive`` never makes a shared model go sooner than its own keep-alive. An unload gives
running requests the shutdown grace; those still running then end with ``model_unloaded``
in their API's own shape: never ``finish_reason: "abort"`` (no API has it), never a silent
cut.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from contextlib import aclosing

import pytest
from starlette.testclient import TestClient

from podium.engine.base import EngineOutput, ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.models import ModelConfig
from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.responses_check import sse_events

TENANT, ADMIN = {"authorization": "Bearer k"}, {"authorization": "Bearer op"}
CHAT = {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}]}
LONG = "word " * 200


class ClosingEngine(ScriptedEngine):
    """Closes as the embedded engine does: every request it is running ends ``abort``."""

    async def aclose(self) -> None:
        for request_id in list(self._places.keys()):
            await self.abort(request_id)


class CutEngine(ScriptedEngine):
    """Ends every request ``abort`` after three outputs: what a request running when its
    model's engine closes reads."""

    def generate(self, request):
        outputs = super().generate(request)

        async def cut():
            async with aclosing(outputs):
                n = 0
                async for out in outputs:
                    n += 1
                    if n > 3:
                        yield EngineOutput([], finish_reason="abort")
                        return
                    yield out
        return cut()


@pytest.fixture
def one(tokenizer, chat_template, tmp_path):
    """``one(engine_class, replies, **settings)``: a TestClient on a server of one model."""
    clients: list[TestClient] = []

    def build(engine_class=ScriptedEngine, replies=("Hello there.",), delay=0.0, **settings):
        engine = engine_class(tokenizer, ModelInfo(SERVED, 4096, chat_template, 0),
                              list(replies), delay=delay)
        settings.setdefault("store_url", f"sqlite:///{tmp_path / 'op.db'}")
        client = TestClient(create_app(Settings(**settings), engine),
                            raise_server_exceptions=False)
        client.__enter__()
        client.engine = engine
        clients.append(client)
        return client
    yield build
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def shared(tokenizer, chat_template, tmp_path):
    """A server of two models loaded on demand (keep-alive 300 s), keys k and op (admin)."""
    def make(settings: Settings, name: str, kind: str = "chat") -> ScriptedEngine:
        return ScriptedEngine(tokenizer, ModelInfo(name, 4096, chat_template, 0), ["Hi."])

    server = Settings(store_url=f"sqlite:///{tmp_path / 'shared.db'}", api_key=["k"],
                      admin_key=["op"])
    configs = [ModelConfig("a", keep_alive=300, source=server),
               ModelConfig("b", keep_alive=300, source=server)]
    client = TestClient(create_app(server, configs, make=make), raise_server_exceptions=False)
    with client:
        yield client


def state(client: TestClient, name: str) -> str:
    return client.app.state.models.entry(name).state


# -- who may load and unload -------------------------------------------------------------

def test_a_tenants_key_may_not_load_or_unload_and_is_told_why(shared):
    for action in ("load", "unload"):
        r = shared.post(f"/v1/models/a/{action}", headers=TENANT)
        assert r.status_code == 403, r.text
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("permission_error", "admin_key_required")
        assert "--admin-key" in error["message"]
    assert state(shared, "a") == "unloaded"
    assert shared.post("/v1/models/a/load", headers=ADMIN).json()["state"] == "loaded"
    assert shared.post("/v1/models/a/unload", headers=TENANT).status_code == 403
    assert state(shared, "a") == "loaded"
    assert shared.post("/v1/models/a/unload", headers=ADMIN).json()["state"] == "unloaded"


def test_without_an_admin_key_nobody_may_and_without_keys_everybody_may(one):
    keyed = one(api_key=["k"])
    assert keyed.post(f"/v1/models/{SERVED}/unload", headers=TENANT).status_code == 403
    assert state(keyed, SERVED) == "loaded"
    local = one()
    assert local.post(f"/v1/models/{SERVED}/unload").json()["state"] == "unloaded"


def test_an_admin_key_is_an_api_key_of_its_own_tenant(one):
    c = one(api_key=["k"], admin_key=["op"])
    assert c.post("/v1/chat/completions", json=CHAT).status_code == 401
    assert c.post("/v1/chat/completions", json=CHAT, headers=ADMIN).status_code == 200
    stored = c.post("/v1/responses", json={"model": SERVED, "input": "Hi"},
                    headers=TENANT).json()
    assert c.get(f"/v1/responses/{stored['id']}", headers=TENANT).status_code == 200
    assert c.get(f"/v1/responses/{stored['id']}", headers=ADMIN).status_code == 404


def test_an_admin_key_alone_turns_keys_on(one):
    c = one(admin_key=["op"])
    assert c.post("/v1/chat/completions", json=CHAT).status_code == 401
    assert c.post(f"/v1/models/{SERVED}/unload", headers=ADMIN).status_code == 200


def test_the_admin_key_setting_reads_like_the_api_key_and_is_never_logged():
    settings = Settings.from_sources(["--admin-key", "x"], {"PODIUM_ADMIN_KEY": "a, b"})
    assert settings.admin_key == ["x"]
    settings = Settings.from_sources([], {"PODIUM_ADMIN_KEY": "a, b"})
    assert settings.admin_key == ["a", "b"]
    assert settings.redacted()["admin_key"] == ["***", "***"]


# -- Ollama's keep_alive from a tenant ----------------------------------------------------

def test_a_tenants_explicit_ollama_unload_is_refused_in_ollamas_shape(shared):
    unload = {"model": "a", "prompt": "", "keep_alive": 0}
    assert shared.post("/api/generate", json={"model": "a", "prompt": ""},
                       headers=TENANT).json()["done_reason"] == "load"   # a load: any request's
    r = shared.post("/api/generate", json=unload, headers=TENANT)
    assert r.status_code == 403 and set(r.json()) == {"error"}
    assert "admin key" in r.json()["error"]
    assert state(shared, "a") == "loaded"
    assert shared.post("/api/generate", json=unload, headers=ADMIN).json()[
        "done_reason"] == "unload"
    assert state(shared, "a") == "unloaded"


@pytest.mark.parametrize("keep_alive", [0, "1ms"])
def test_a_tenants_keep_alive_never_unloads_a_shared_model_sooner(shared, keep_alive):
    body = {"model": "a", "messages": [{"role": "user", "content": "Hi"}], "stream": False,
            "keep_alive": keep_alive}
    assert shared.post("/api/chat", json=body, headers=TENANT).status_code == 200
    time.sleep(0.2)
    assert state(shared, "a") == "loaded"
    expires = shared.get("/api/ps", headers=TENANT).json()["models"][0]["expires_at"]
    assert expires > time.strftime("%Y-%m-%dT%H:%M", time.gmtime(time.time() + 240))
    assert shared.post("/api/chat", json=body, headers=ADMIN).status_code == 200
    deadline = time.monotonic() + 5
    while state(shared, "a") != "unloaded":            # the operator's word counts
        assert time.monotonic() < deadline
        time.sleep(0.02)


# -- an unload never cuts a request silently ----------------------------------------------

def _no_abort(text: str) -> None:
    assert "abort" not in text, text


@pytest.mark.parametrize("keys", [{}, {"api_key": ["k"], "admin_key": ["op"]}])
def test_an_unload_past_the_grace_ends_a_running_stream_with_an_error(one, keys):
    """The finding: a tenant's stream cut by an unload ended ``finish_reason: "abort"``
    with no error. Now the operator's unload, the grace over, ends it in-band."""
    c = one(ClosingEngine, [LONG], delay=0.02, shutdown_grace=0, **keys)
    got: list = []
    stream = threading.Thread(target=lambda: got.append(c.post(
        "/v1/chat/completions", json={**CHAT, "stream": True}, headers=TENANT)))
    stream.start()
    deadline = time.monotonic() + 10
    while not c.engine.stats["generated_tokens"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert c.post(f"/v1/models/{SERVED}/unload", headers=ADMIN).json()["state"] == "unloaded"
    stream.join(10)
    body = got[0].text
    _no_abort(body)
    frames = [f for f in body.split("\n\n") if f.strip()]
    assert frames[-1] == "data: [DONE]"
    error = json.loads(frames[-2][len("data: "):])["error"]
    assert error["code"] == "model_unloaded" and SERVED in error["message"]
    assert "word" in body                               # it had begun


def _events(body: str) -> list[dict]:
    return [json.loads(f[len("data: "):]) for f in body.split("\n\n")
            if f.startswith("data: {")]


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"model": SERVED, "prompt": "Hi"})])
def test_chat_and_completions_streams_end_with_an_error_then_done(one, path, body, caplog):
    c = one(CutEngine, [LONG])
    with caplog.at_level(logging.INFO, logger="podium.server.sse"):
        text = c.post(path, json={**body, "stream": True}).text
    _no_abort(text)
    # the operator's act is a line in the log, not a failure's traceback
    assert [r.exc_info for r in caplog.records if r.name == "podium.server.sse"] == [None]
    assert text.endswith("data: [DONE]\n\n")
    events = _events(text)
    assert events[-1]["error"]["code"] == "model_unloaded"
    assert all(c["finish_reason"] is None for e in events[:-1] for c in e["choices"])


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"model": SERVED, "prompt": "Hi"})])
def test_a_non_stream_answer_cut_short_is_a_503(one, path, body):
    r = one(CutEngine, [LONG]).post(path, json=body)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "model_unloaded"


def test_a_messages_stream_ends_with_anthropics_error_event(one):
    c = one(CutEngine, [LONG])
    body = {"model": SERVED, "max_tokens": 100, "messages": [{"role": "user", "content": "Hi"}]}
    text = c.post("/v1/messages", json={**body, "stream": True}).text
    _no_abort(text)
    events = sse_events(text)
    assert events[-1]["type"] == "error" and "unloaded" in events[-1]["error"]["message"]
    assert not any(e["type"] == "message_stop" for e in events)
    r = c.post("/v1/messages", json=body)
    assert r.status_code == 503 and r.json()["type"] == "error"


def test_a_responses_stream_fails_with_the_error(one):
    c = one(CutEngine, [LONG])
    text = c.post("/v1/responses", json={"model": SERVED, "input": "Hi", "stream": True}).text
    _no_abort(text)
    last = sse_events(text)[-1]
    assert last["type"] == "response.failed"
    assert last["response"]["error"]["code"] == "model_unloaded"


def test_an_ollama_stream_ends_with_an_error_line(one):
    c = one(CutEngine, [LONG])
    body = {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}]}
    r = c.post("/api/chat", json=body)
    _no_abort(r.text)
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert set(lines[-1]) == {"error"} and "unloaded" in lines[-1]["error"]
    assert not any(line.get("done") for line in lines)
    r = c.post("/api/chat", json={**body, "stream": False})
    assert r.status_code == 503 and set(r.json()) == {"error"}
