"""A model's load progress in its card (``/v1/models``, the web UI's picker and server view):
``load_progress`` is what the loader reports through ``podium.models.LOAD_PROGRESS`` from
its own thread while the model is ``loading``, null while it has said nothing (vLLM never
does), and gone once the model is loaded. The engines are scripted; the loader's thread
reports and waits as a llama.cpp load's callback would (tests/engine/test_load_progress.py
has the real one)."""

from __future__ import annotations

import threading
import time

from starlette.testclient import TestClient

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.models import LOAD_PROGRESS, ModelConfig
from podium.server.app import create_app
from podium.settings import Settings

TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")


class SteppedLoad:
    """The engine maker: reports each fraction it is told to, one at a time, from the
    loader's thread (``step`` lets the next one through), then makes the engine."""

    def __init__(self, tokenizer, fractions: list[float | None]):
        self.tokenizer, self.fractions = tokenizer, fractions
        self.go = threading.Semaphore(0)

    def step(self) -> None:
        self.go.release()

    def __call__(self, settings: Settings, name: str, kind: str = "chat") -> ScriptedEngine:
        report = LOAD_PROGRESS.get()
        for fraction in self.fractions:
            assert self.go.acquire(timeout=10)
            if fraction is not None and report is not None:
                report(fraction)
        assert self.go.acquire(timeout=10)
        return ScriptedEngine(self.tokenizer, ModelInfo(name, 2048, TEMPLATE, 0), ["Hi."])


def card(client: TestClient, name: str) -> dict:
    return next(m for m in client.get("/v1/models").json()["data"] if m["id"] == name)


def progress(card: dict) -> float | None | str:
    return card.get("load_progress", "absent")


def until(client: TestClient, name: str, check, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got = card(client, name)
        if check(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.01)


def test_a_loading_models_card_shows_its_progress_then_drops_it(tokenizer, tmp_path):
    loader = SteppedLoad(tokenizer, [None, 0.25, 0.7])
    settings = Settings(store_url=f"sqlite:///{tmp_path / 'p.db'}")
    app = create_app(settings, [ModelConfig("big", source=settings),
                                ModelConfig("small", source=settings)], make=loader)
    with TestClient(app, raise_server_exceptions=False) as client:
        loading = threading.Thread(target=client.post, args=("/v1/models/big/load",))
        try:
            assert progress(card(client, "big")) == "absent"        # unloaded: no figure
            loading.start()
            first = until(client, "big", lambda c: c["state"] == "loading")
            assert first["state"] == "loading" and progress(first) is None   # nothing said
            loader.step()                                           # (None: still nothing)
            loader.step()
            assert progress(until(client, "big", lambda c: progress(c) == 0.25)) == 0.25
            loader.step()
            assert progress(until(client, "big", lambda c: progress(c) == 0.7)) == 0.7
            assert progress(card(client, "small")) == "absent"      # another model's own
            loader.step()
            loading.join(10)
            done = card(client, "big")
            assert done["state"] == "loaded" and progress(done) == "absent"
            assert app.state.models.entry("big").progress is None
        finally:
            for _ in range(4):          # a failed check must not leave the load waiting
                loader.step()
            if loading.is_alive():
                loading.join(10)
