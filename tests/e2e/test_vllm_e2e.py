"""``podium serve`` with a vLLM model end to end on the default model's weights (a bf16 folder
made from the GGUF once), driven by the ``openai`` SDK, beside a llama.cpp model of the same
server. Runs where vLLM is installed (``./dev test-vllm``, which CI runs)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest

pytest.importorskip("vllm")

from podium.engine.llamacpp.model_files import (EMBED_MODEL, cache_dir,  # noqa: E402
                                                default_model_path)
from tests.e2e.conftest import MODEL, podium_process  # noqa: E402

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    default_model_path(EMBED_MODEL)             # the embedding model's folder, unpacked
    # the vLLM model is pinned (loaded at start, on the server's loop); the llama.cpp one
    # loads on demand
    config = tmp_path_factory.mktemp("vllm") / "podium.toml"
    config.write_text(f'''
ctx-size = 4096
[[models]]
name = "{MODEL}"
engine = "vllm"
enforce-eager = true
engine-arg = ["kv_cache_memory_bytes=1073741824"]
pinned = true
[[models]]
name = "gguf"
model = "{default_model_path()}"
ctx-size = 2048
[[models]]
name = "minilm"
model = "{cache_dir() / EMBED_MODEL.folder_name}"
engine = "vllm"
ctx-size = 256
enforce-eager = true
engine-arg = ["kv_cache_memory_bytes=67108864"]
''')
    with podium_process("--config", str(config), "--log-level", "warning",
                        timeout=600) as (url, process):
        yield url, process


@pytest.fixture(scope="module")
def server(served):
    return served[0]


@pytest.fixture(scope="module")
def client(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    yield client
    client.close()


def test_streamed_chat(client):
    stream = client.chat.completions.create(
        model=MODEL, stream=True, max_tokens=24, temperature=0,
        messages=[{"role": "user", "content": "Write one sentence about the sea."}])
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert text.strip() and finish in ("stop", "length")


def test_a_tool_call_forced_by_grammar(client):
    r = client.chat.completions.create(
        model=MODEL, max_tokens=64, temperature=0, tools=WEATHER,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "How warm is it in Lisbon?"}])
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_a_json_schema_answer(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=MODEL, max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person",
                                                                "schema": schema}},
        messages=[{"role": "user", "content": "Invent a person."}])
    person = json.loads(r.choices[0].message.content)
    assert isinstance(person["name"], str) and isinstance(person["age"], int)


def test_a_responses_round_trip(client):
    first = client.responses.create(model=MODEL, input="My name is Ada. Say hello.",
                                    max_output_tokens=16, temperature=0)
    second = client.responses.create(model=MODEL, previous_response_id=first.id,
                                     input="What is my name?", max_output_tokens=16,
                                     temperature=0)
    assert first.status in ("completed", "incomplete") and second.output_text
    assert second.usage.input_tokens > first.usage.input_tokens


def test_the_same_seed_gives_the_same_tokens(client):
    def ask():
        return client.chat.completions.create(
            model=MODEL, max_tokens=24, temperature=1.0, seed=11,
            messages=[{"role": "user", "content": "Name three colours."}]
        ).choices[0].message.content
    assert ask() == ask()


def test_a_client_that_leaves_ends_the_vllm_request(server):
    body = {"model": MODEL, "stream": True, "max_tokens": 2000, "temperature": 1.0,
            "logit_bias": {"151645": -100, "151643": -100},
            "messages": [{"role": "user", "content": "Tell a very long story."}]}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=120) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 6:
                break               # a few tokens in, the client goes
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = httpx.get(f"{server}/health").json()["models"][MODEL]["engine"]
        if stats["running"] == 0 and stats["waiting"] == 0:
            break
        time.sleep(0.2)
    assert stats["running"] == 0 and stats["waiting"] == 0, stats


def tree_rss(pid: int) -> int:
    """Resident memory of a process and its descendants (vLLM's engine core is a child)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def test_a_vllm_embedding_model_loaded_on_demand(server, client):
    card = client.models.retrieve("minilm").model_dump()
    assert card["kind"] == "embedding"          # a sentence-transformers folder
    first, second, other = (d.embedding for d in client.embeddings.create(
        model="minilm", input=["a red apple", "a green apple", "tax law"]).data)
    assert len(first) == 384 and abs(sum(x * x for x in first) - 1) < 1e-3
    assert sum(x * y for x, y in zip(first, second)) > sum(x * y for x, y in zip(first, other))
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model="minilm", max_tokens=4,
                                       messages=[{"role": "user", "content": "Hi"}])
    counted = httpx.post(f"{server}/tokenize", json={"model": "minilm", "prompt": "a red apple"},
                         timeout=60)
    assert counted.status_code == 200, counted.text     # [CLS] a red apple [SEP]
    assert counted.json()["tokens"][0] == 101 and counted.json()["tokens"][-1] == 102
    assert counted.json()["count"] == 5
    unloaded = httpx.post(f"{server}/v1/models/minilm/unload", timeout=120).json()
    assert unloaded["state"] == "unloaded"


def test_beside_a_llamacpp_model_unloaded_and_loaded_again_on_demand(served, client):
    # (last in this module: the vLLM model comes back on a loop of its own)
    url, process = served
    r = client.chat.completions.create(model="gguf", max_tokens=8, temperature=0,
                                       messages=[{"role": "user", "content": "Hi"}])
    assert r.choices[0].message.content
    loaded = tree_rss(process.pid)
    card = httpx.post(f"{url}/v1/models/{MODEL}/unload", timeout=120).json()
    assert card["state"] == "unloaded"
    freed = loaded - tree_rss(process.pid)
    print(f"unloading the vLLM model freed {freed / 2**20:.0f} MiB")
    assert freed > 1024 * 2**20              # its KV cache (1 GiB) and its weights
    again = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": "Hi"}])
    assert again.choices[0].message.content
    health = httpx.get(f"{url}/health").json()["models"][MODEL]
    assert (health["loads"], health["unloads"], health["state"]) == (2, 1, "loaded")
