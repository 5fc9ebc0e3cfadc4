"""Ollama's model routes and embeddings end to end: one ``podium serve`` of the default model
with the real embedding model beside it, driven by the official ``ollama`` Python client:
list, show, ps, version, embed, ``keep_alive: 0`` unloading a model (seen in ps), and the
refusal of a pull."""

from __future__ import annotations

import math
import time

import httpx
import ollama
import pytest

from podium import __version__
from podium.engine.llamacpp.model_files import EMBED_MODEL
from tests.e2e.conftest import MODEL, podium_serve

EMBED = EMBED_MODEL.served_name


@pytest.fixture(scope="module")
def served():
    with podium_serve("--model", MODEL, "--model", EMBED, "--ctx-size", "2048",
                      "--log-level", "warning") as url:
        with ollama.Client(host=url) as client:
            yield url, client


def loaded(client: ollama.Client) -> set[str]:
    return {m.model for m in client.ps().models}


def test_list_show_version(served):
    url, client = served
    models = {m.model: m for m in client.list().models}
    assert set(models) == {MODEL, EMBED}
    qwen = models[MODEL]
    assert qwen.details.family == "qwen2" and qwen.details.format == "gguf"
    assert qwen.details.quantization_level == "Q4_K_M"
    assert qwen.details.parameter_size.endswith("M") and qwen.size > 400_000_000
    assert len(qwen.digest) == 64 and qwen.modified_at is not None
    shown = client.show(MODEL)
    assert {"completion", "tools"} <= set(shown.capabilities) and "vision" not in (
        shown.capabilities)
    assert shown.modelinfo["general.architecture"] == "qwen2"
    assert shown.modelinfo["qwen2.context_length"] == 32768
    assert "<|im_start|>" in shown.template
    assert client.show(EMBED).capabilities == ["embedding"]
    with pytest.raises(ollama.ResponseError) as missing:
        client.show("llama3.2")
    assert missing.value.status_code == 404 and "not found" in missing.value.error
    with httpx.Client(base_url=url) as http:
        assert http.get("/api/version").json() == {"version": __version__}
        assert http.head("/").status_code == 200 and http.get("/").text == "Ollama is running"


def test_embed_gives_normalized_vectors_of_the_models_size(served):
    _, client = served
    answer = client.embed(model=EMBED, input=["A lighthouse on a cliff.", "Tomato soup."])
    assert len(answer.embeddings) == 2
    for vector in answer.embeddings:
        assert len(vector) == 384
        assert abs(math.sqrt(sum(x * x for x in vector)) - 1) < 1e-3
    assert answer.prompt_eval_count > 4 and answer.total_duration > 0
    old = client.embeddings(model=EMBED, prompt="A lighthouse on a cliff.")
    # alone, an input is decoded without flash attention: the same up to float rounding
    assert old.embedding == pytest.approx(answer.embeddings[0], abs=5e-4)
    assert EMBED in loaded(client)
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=EMBED, input="word " * 400, truncate=False)
    assert refused.value.status_code == 400 and "256" in refused.value.error


def test_keep_alive_zero_unloads_the_model(served):
    _, client = served
    answer = client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                         options={"num_predict": 4}, keep_alive="10m")
    assert answer.done
    [running] = [m for m in client.ps().models if m.model == MODEL]
    left = running.expires_at.timestamp() - time.time()
    assert 590 < left <= 600 and running.size_vram == 0 and running.context_length == 2048
    client.embed(model=EMBED, input="x", keep_alive=0)
    client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                options={"num_predict": 4}, keep_alive=0)
    deadline = time.monotonic() + 30
    while loaded(client) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert loaded(client) == set()
    client.generate(model=MODEL, prompt="", keep_alive=-1)          # loads it: kept
    [running] = client.ps().models
    assert running.model == MODEL and running.expires_at.year > 2300


def test_pull_is_refused_with_how_to_add_a_model(served):
    _, client = served
    with pytest.raises(ollama.ResponseError) as refused:
        client.pull("llama3.2")
    assert refused.value.status_code == 403
    assert "--model" in refused.value.error and "[[models]]" in refused.value.error
    assert client.pull(MODEL).status == "success"           # served already
