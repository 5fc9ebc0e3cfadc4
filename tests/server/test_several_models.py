"""Several models behind one app: routing by name and alias, on-demand loads, a budget that
never evicts a busy model, failed loads, unloads, a stored response across models.

The engines are scripted (each load a short sleep in the loader's thread); the real models
are in tests/e2e/test_models_e2e.py."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from starlette.testclient import TestClient

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.models import ModelConfig
from podium.server.app import create_app
from podium.settings import Settings

THINK = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
OTHER = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}[assistant] {% endif %}")


class Farm:
    """Makes scripted engines for the app's loader: counts loads, can be told to fail,
    each load takes ``load_seconds``."""

    def __init__(self, tokenizer, replies=("Hello from {name}.",), load_seconds=0.2):
        self.tokenizer, self.replies, self.load_seconds = tokenizer, replies, load_seconds
        self.made: list[ScriptedEngine] = []
        self.closed: list[str] = []
        self.fail: str | None = None
        self.delay = 0.0

    def __call__(self, settings: Settings, name: str, kind: str = "chat") -> ScriptedEngine:
        time.sleep(self.load_seconds)
        if self.fail:
            raise RuntimeError(self.fail)
        engine = ScriptedEngine(self.tokenizer, ModelInfo(name, 4096, THINK, 0),
                                [r.format(name=name) for r in self.replies], delay=self.delay)
        farm = self

        async def aclose() -> None:
            farm.closed.append(name)
        engine.aclose = aclose          # type: ignore[method-assign]
        self.made.append(engine)
        return engine


@pytest.fixture
def several(tokenizer, tmp_path):
    clients: list[TestClient] = []

    def build(farm: Farm, configs: list[ModelConfig] | None = None, **settings):
        settings.setdefault("store_url", f"sqlite:///{tmp_path / 'm.db'}")
        server = Settings(**settings)
        for config in configs or ():
            config.source = config.source or server
        app = create_app(server, configs or [ModelConfig("a", source=server),
                                             ModelConfig("b", source=server)], make=farm)
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client
    yield build
    for client in clients:
        client.__exit__(None, None, None)


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], **extra}


def state(client: TestClient) -> dict[str, str]:
    return {m["id"]: m["state"] for m in client.get("/v1/models").json()["data"]}


def test_each_api_reaches_the_model_it_names(several, tokenizer):
    farm = Farm(tokenizer)
    c = several(farm, [ModelConfig("a", aliases=("gpt-*",)), ModelConfig("b")])
    assert state(c) == {"a": "unloaded", "b": "unloaded"}          # none loaded at start
    r = c.post("/v1/chat/completions", json=chat("gpt-4o"))
    assert r.json()["model"] == "gpt-4o"                            # echoed as asked
    assert r.json()["choices"][0]["message"]["content"] == "Hello from a."
    assert state(c) == {"a": "loaded", "b": "unloaded"}
    answers = {
        "completions": c.post("/v1/completions", json={"model": "b", "prompt": "x"}
                              ).json()["choices"][0]["text"],
        "responses": c.post("/v1/responses", json={"model": "b", "input": "x"}
                            ).json()["output"][0]["content"][0]["text"],
        "messages": c.post("/v1/messages", json={"model": "b", "max_tokens": 20, "messages": [
            {"role": "user", "content": "x"}]}).json()["content"][0]["text"],
    }
    assert set(answers.values()) == {"Hello from b."}
    assert c.post("/v1/messages/count_tokens", json={"model": "gpt-x", "messages": [
        {"role": "user", "content": "x"}]}).json()["input_tokens"] > 0
    missing = c.post("/v1/chat/completions", json=chat("c"))
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert "'a', 'b'" in missing.json()["error"]["message"]
    assert len(farm.made) == 2                                      # one load each
    card = c.get("/v1/models/gpt-4.1").json()
    assert card["id"] == "gpt-4.1" and card["state"] == "loaded" and card["kind"] == "chat"


def test_requests_arriving_during_a_load_wait_for_that_one_load(several, tokenizer):
    farm = Farm(tokenizer, load_seconds=1.0)
    c = several(farm)
    bodies = [("/v1/chat/completions", chat("a")),
              ("/v1/chat/completions", chat("a", stream=True)),
              ("/v1/completions", {"model": "a", "prompt": "x"}),
              ("/v1/responses", {"model": "a", "input": "x", "stream": True}),
              ("/v1/messages", {"model": "a", "max_tokens": 9, "messages": [
                  {"role": "user", "content": "x"}]})] * 2
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: c.post(b[0], json=b[1]), bodies[:8]))
    assert [r.status_code for r in answers] == [200] * 8
    assert all("Hello from a." in r.text or "Hello" in r.text for r in answers)
    assert len(farm.made) == 1
    assert c.get("/health").json()["models"]["a"]["loads"] == 1


def test_a_failed_load_is_reported_and_the_next_request_tries_again(several, tokenizer):
    farm = Farm(tokenizer, load_seconds=0)
    c = several(farm)
    farm.fail = "out of cheese"
    r = c.post("/v1/chat/completions", json=chat("a"))
    assert r.status_code == 503
    error = r.json()["error"]
    assert error["code"] == "model_load_failed"
    assert "'a'" in error["message"] and "out of cheese" in error["message"]
    [card] = [m for m in c.get("/v1/models").json()["data"] if m["id"] == "a"]
    assert card["state"] == "failed" and "out of cheese" in card["error"]
    anthropic = c.post("/v1/messages", json={"model": "a", "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"}]})
    assert anthropic.status_code == 503 and anthropic.json()["type"] == "error"  # its shape
    farm.fail = None
    assert c.post("/v1/chat/completions", json=chat("a")).status_code == 200
    assert state(c)["a"] == "loaded"


def test_a_busy_model_is_never_evicted(several, tokenizer):
    farm = Farm(tokenizer, replies=("word " * 60,), load_seconds=0)
    farm.delay = 0.02
    c = several(farm, max_loaded_models=1, load_timeout=30)
    chunks: list[str] = []
    started = threading.Event()

    def long_stream():
        with c.stream("POST", "/v1/chat/completions", json=chat("a", stream=True)) as r:
            for line in r.iter_lines():
                if line:
                    chunks.append(line)
                    started.set()

    reader = threading.Thread(target=long_stream)
    reader.start()
    assert started.wait(10)
    r = c.post("/v1/chat/completions", json=chat("b"))      # waits for a to go idle
    reader.join(30)
    assert r.status_code == 200
    assert chunks[-1] == "data: [DONE]"                    # a's stream ran to its end
    events = [json.loads(line[6:]) for line in chunks[:-1] if line.startswith("data: ")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text == "word " * 60
    assert farm.closed == ["a"] and state(c) == {"a": "unloaded", "b": "loaded"}


def test_no_room_in_time_is_a_503_with_retry_after(several, tokenizer):
    farm = Farm(tokenizer, replies=("word " * 200,), load_seconds=0)
    farm.delay = 0.02
    c = several(farm, max_loaded_models=1, load_timeout=0.3)
    started = threading.Event()

    def long_stream():
        with c.stream("POST", "/v1/chat/completions", json=chat("a", stream=True)) as r:
            for _ in r.iter_lines():
                started.set()

    reader = threading.Thread(target=long_stream)
    reader.start()
    assert started.wait(10)
    r = c.post("/v1/chat/completions", json=chat("b"))
    reader.join(30)
    assert r.status_code == 503 and r.headers["retry-after"]
    assert r.json()["error"]["code"] == "model_unavailable"
    assert "'b'" in r.json()["error"]["message"] and "busy" in r.json()["error"]["message"]


def test_a_background_response_holds_its_model_after_its_request_ends(several, tokenizer):
    farm = Farm(tokenizer, replies=("word " * 100,), load_seconds=0)
    farm.delay = 0.02
    c = several(farm, max_loaded_models=1, load_timeout=0.3)
    bg = c.post("/v1/responses", json={"model": "a", "input": "x", "background": True})
    assert bg.status_code == 200
    r = c.post("/v1/chat/completions", json=chat("b"))
    assert r.status_code == 503                 # a still runs its background response
    deadline = time.monotonic() + 30
    while c.get(f"/v1/responses/{bg.json()['id']}").json()["status"] != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.1)
    assert c.post("/v1/chat/completions", json=chat("b")).status_code == 200


def test_a_stored_response_continues_on_another_model(several, tokenizer):
    farm = Farm(tokenizer)
    c = several(farm)
    first = c.post("/v1/responses", json={"model": "a", "input": "My cat is Tiberius."}).json()
    second = c.post("/v1/responses", json={"model": "b", "input": "Name my cat.",
                                           "previous_response_id": first["id"]}).json()
    assert second["model"] == "b" and second["previous_response_id"] == first["id"]
    b_engine = farm.made[1]
    prompt = tokenizer.decode(b_engine.requests[-1].prompt_token_ids)
    assert "My cat is Tiberius." in prompt and "Hello from a." in prompt


def test_each_model_renders_with_its_own_settings(several, tokenizer, tmp_path):
    farm = Farm(tokenizer)
    server = Settings(store_url=f"sqlite:///{tmp_path / 'm.db'}")
    (tmp_path / "other.jinja").write_text(OTHER)
    other = dataclasses.replace(server, chat_template_file=str(tmp_path / "other.jinja"))
    c = several(farm, [ModelConfig("a", source=server), ModelConfig("b", source=other)])
    c.post("/v1/chat/completions", json=chat("a"))
    c.post("/v1/chat/completions", json=chat("b"))
    a, b = (tokenizer.decode(e.requests[-1].prompt_token_ids) for e in farm.made)
    assert a.startswith("user\nHi\n") and b.startswith("[user] Hi\n")   # (specials unshown)


def test_unload_and_load_by_hand(several, tokenizer):
    farm = Farm(tokenizer, load_seconds=0)
    c = several(farm)
    loaded = c.post("/v1/models/a/load")
    assert loaded.status_code == 200 and loaded.json()["state"] == "loaded"
    unloaded = c.post("/v1/models/a/unload")
    assert unloaded.json()["state"] == "unloaded" and farm.closed == ["a"]
    assert c.post("/v1/models/zzz/unload").status_code == 404
    assert c.post("/v1/chat/completions", json=chat("a")).status_code == 200   # loads again
    health = c.get("/health").json()["models"]["a"]
    assert (health["loads"], health["unloads"], health["state"]) == (2, 1, "loaded")


def test_the_load_and_unload_routes_are_behind_the_admin_key(several, tokenizer):
    c = several(Farm(tokenizer, load_seconds=0), api_key=["k"], admin_key=["op"])
    assert c.post("/v1/models/a/load").status_code == 401
    assert c.post("/v1/models/a/load", headers={"authorization": "Bearer k"}
                  ).status_code == 403
    assert c.post("/v1/models/a/load", headers={"authorization": "Bearer op"}
                  ).status_code == 200


def test_an_idle_model_is_unloaded_after_its_keep_alive(several, tokenizer):
    farm = Farm(tokenizer, load_seconds=0)
    c = several(farm, [ModelConfig("a", keep_alive=0.3), ModelConfig("b")])
    c.post("/v1/chat/completions", json=chat("a"))
    c.post("/v1/chat/completions", json=chat("b"))
    deadline = time.monotonic() + 10
    while state(c)["a"] != "unloaded":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert state(c)["b"] == "loaded" and farm.closed == ["a"]


def test_memory_budget(several, tokenizer):
    farm = Farm(tokenizer, load_seconds=0)
    c = several(farm, [ModelConfig("big", estimate=3 * 2**30), ModelConfig("a", estimate=1),
                       ModelConfig("b", estimate=2**30)], memory_budget="2G")
    r = c.post("/v1/chat/completions", json=chat("big"))
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "3072 MB" in r.json()["error"]["message"]
    assert c.post("/v1/chat/completions", json=chat("a")).status_code == 200
    assert c.post("/v1/chat/completions", json=chat("b")).status_code == 200
    assert state(c) == {"big": "unloaded", "a": "loaded", "b": "loaded"}   # both fit
    with pytest.raises(ValueError, match="more than the whole budget"):
        create_app(Settings(memory_budget="1G"), [
            ModelConfig("big", estimate=2 * 2**30, pinned=True, source=Settings())],
            make=farm)


def test_preloaded_and_pinned_models_load_at_start(several, tokenizer):
    farm = Farm(tokenizer, load_seconds=0)
    c = several(farm, [ModelConfig("a", preload=True), ModelConfig("b"),
                       ModelConfig("p", pinned=True)])
    assert state(c) == {"a": "loaded", "b": "unloaded", "p": "loaded"}
    assert c.get("/ready").json()["models"] == ["a", "p"]
