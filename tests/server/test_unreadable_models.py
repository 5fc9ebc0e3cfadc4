"""A model whose file cannot be read, beside a good one (issue 38): a ``--models-dir``
holding the real default model and hostile GGUF files (arrays nested 200,000 deep, tensor
sizes past 64 bits, a file cut short) and a Hugging Face folder whose safetensors header is
JSON nested too deep. Every model route answers 200 for the good model; the bad ones are
listed ``failed`` with their cause (/api/tags, /v1/models, /health), and /api/show of one is
a 422 in Ollama's shape naming the cause, never a 500 for everyone."""

from __future__ import annotations

import re
import struct

import pytest
from starlette.testclient import TestClient

from podium.catalog import catalog
from podium.engine.llamacpp.model_files import default_model_path
from podium.models import ModelConfig
from podium.server.app import create_app
from podium.settings import Settings
from tests.engine.test_header import nested_arrays, tensor, with_tensors
from tests.server.test_ollama_models import Makers

CHAT_FILE = default_model_path()
BAD = {"deep": "arrays nested more than", "huge": "a tensor dimension of",
       "cut": "ends early|past the end|bytes left", "hf": "RecursionError"}


@pytest.fixture
def models_dir(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "good.gguf").symlink_to(CHAT_FILE)
    (folder / "deep.gguf").write_bytes(nested_arrays(200_000))
    (folder / "huge.gguf").write_bytes(with_tensors(tensor("w", 2**64 - 1, 2**64 - 1)))
    with open(CHAT_FILE, "rb") as f:
        (folder / "cut.gguf").write_bytes(f.read(1 << 20))
    hf = folder / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "llama"}')
    header = b"[" * 100_000 + b"]" * 100_000
    (hf / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


@pytest.fixture
def serve(tokenizer, tmp_path):
    clients: list[TestClient] = []

    def build(settings: Settings, configs: list[ModelConfig]) -> TestClient:
        client = TestClient(create_app(settings, configs, make=Makers(tokenizer, 0.0)),
                            raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client
    yield build
    for client in clients:
        client.__exit__(None, None, None)


def test_a_models_dir_with_hostile_files_lists_them_failed(models_dir, serve, tmp_path):
    settings = Settings(models_dir=str(models_dir), store_url=f"sqlite:///{tmp_path / 'd.db'}")
    configs = catalog(settings)
    assert {c.name for c in configs} == {"good", *BAD}
    c = serve(settings, configs)

    tags = c.get("/api/tags")
    assert tags.status_code == 200, tags.text
    listed = {m["name"]: m for m in tags.json()["models"]}
    assert set(listed) == {"good", *BAD}
    good = listed["good"]
    assert "error" not in good and good["details"]["parameter_size"] == "630.17M"
    assert good["size"] == CHAT_FILE.stat().st_size
    for name, cause in BAD.items():
        assert re.search(cause, listed[name]["error"]), listed[name]
        assert listed[name]["details"]["parameter_size"] == ""
    assert listed["deep"]["size"] == (models_dir / "deep.gguf").stat().st_size

    shown = c.post("/api/show", json={"model": "good"})
    assert shown.status_code == 200 and shown.json()["details"]["family"] == "qwen2"
    for name, cause in BAD.items():
        bad = c.post("/api/show", json={"model": name})
        assert bad.status_code == 422, bad.text
        assert set(bad.json()) == {"error"}                 # Ollama's shape
        assert re.search(cause, bad.json()["error"]) and name in bad.json()["error"]

    cards = c.get("/v1/models")
    assert cards.status_code == 200, cards.text
    states = {m["id"]: m for m in cards.json()["data"]}
    assert states["good"]["state"] == "unloaded" and "error" not in states["good"]
    for name in ("deep", "huge", "cut"):          # read at start: failed, with the cause
        assert states[name]["state"] == "failed"
        assert re.search(BAD[name], states[name]["error"])
    assert c.get("/v1/models/huge").json()["state"] == "failed"
    assert c.get("/health").status_code == 200
    assert c.get("/api/ps").json() == {"models": []}


def test_a_file_broken_after_start_is_listed_with_its_cause(serve, tmp_path):
    """Read only when listed (no catalog check at start): the listing still says why."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF")
    settings = Settings(store_url=f"sqlite:///{tmp_path / 'd.db'}")
    c = serve(settings, [
        ModelConfig("good", source=Settings(model=(str(CHAT_FILE),))),
        ModelConfig("bad", source=Settings(model=(str(bad),)))])
    bad.write_bytes(nested_arrays(200_000))
    tags = c.get("/api/tags")
    assert tags.status_code == 200, tags.text
    listed = {m["name"]: m for m in tags.json()["models"]}
    assert "arrays nested more than" in listed["bad"]["error"]
    assert "error" not in listed["good"]
    assert c.post("/api/show", json={"model": "bad"}).status_code == 422
    assert c.post("/api/show", json={"model": "good"}).status_code == 200
