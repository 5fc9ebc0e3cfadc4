"""Ollama's model routes (/api/tags, /api/show, /api/ps, /api/version, /), its embedding
routes (/api/embed, /api/embeddings), per-request keep_alive and the model-file routes'
refusal, on an app of several models: scripted chat engines (each load counted) beside the
real embedding model (all-MiniLM-L6-v2, llama.cpp's embeddings context). What the routes
say of a model comes from its real file (the default model's GGUF, MiniLM's)."""

from __future__ import annotations

import math
import re
import time
from datetime import datetime, timezone

import pytest
from hypothesis import example, given, settings as hsettings, strategies as st
from starlette.testclient import TestClient

from podium import __version__
from podium.protocol.ollama_keepalive import FOREVER, LONGEST, parse, seconds_of
from podium.engine.llamacpp.embed import LlamaEmbedder
from podium.engine.llamacpp.header import human_count, read_header
from podium.engine.llamacpp.model_files import EMBED_MODEL, default_model_path
from podium.errors import InvalidRequestError
from podium.models import ModelConfig
from podium.server.app import create_app
from podium.settings import Settings
from tests.server.test_several_models import Farm

CHAT_FILE = default_model_path()
EMBED_FILE = default_model_path(EMBED_MODEL)
HOW = "Podium serves the models it is configured with"


class Makers(Farm):
    """Scripted chat engines; the real embedder for an embedding model."""

    def __call__(self, settings: Settings, name: str, kind: str = "chat"):
        if kind == "embedding":
            engine = LlamaEmbedder(EMBED_FILE, served_name=name, n_threads=2)
            self.made.append(engine)
            return engine
        return super().__call__(settings, name, kind)


@pytest.fixture
def app_of(tokenizer, tmp_path):
    clients: list[TestClient] = []

    def build(configs: list[ModelConfig] | None = None, farm: Makers | None = None,
              **options):
        server = Settings(store_url=f"sqlite:///{tmp_path / 'o.db'}", keep_alive=300,
                          **options)
        configs = configs or [
            ModelConfig("chat", keep_alive=300, source=Settings(model=(str(CHAT_FILE),))),
            ModelConfig("minilm", keep_alive=300, kind="auto", source=Settings(model=(str(EMBED_FILE),)))]
        farm = farm or Makers(tokenizer, load_seconds=0.05)
        client = TestClient(create_app(server, configs, make=farm),
                            raise_server_exceptions=False)
        client.__enter__()
        client.farm = farm              # type: ignore[attr-defined]
        clients.append(client)
        return client
    yield build
    for client in clients:
        client.__exit__(None, None, None)


def ps(client: TestClient) -> dict[str, dict]:
    return {m["name"]: m for m in client.get("/api/ps").json()["models"]}


def seconds_until(stamp: str) -> float:
    return (datetime.fromisoformat(stamp) - datetime.now(timezone.utc)).total_seconds()


def chat(client: TestClient, model: str = "chat", **extra):
    r = client.post("/api/chat", json={"model": model, "stream": False, "messages": [
        {"role": "user", "content": "Hi"}], **extra})
    assert r.status_code == 200, r.text
    return r.json()


# -- tags, show, version, / -----------------------------------------------------------------

def test_tags_lists_every_configured_model_from_its_file(app_of):
    c = app_of()
    models = {m["name"]: m for m in c.get("/api/tags").json()["models"]}
    assert set(models) == {"chat", "minilm"}                        # none loaded yet
    qwen, minilm = models["chat"], models["minilm"]
    assert qwen["model"] == "chat" and qwen["size"] == CHAT_FILE.stat().st_size
    header = read_header(CHAT_FILE)
    assert qwen["details"] == {
        "parent_model": "", "format": "gguf", "family": "qwen2", "families": ["qwen2"],
        "parameter_size": human_count(header.parameters), "quantization_level": "Q4_K_M"}
    assert header.parameters == 630_167_424 and qwen["details"]["parameter_size"] == "630.17M"
    assert minilm["details"]["family"] == "bert"
    assert minilm["details"]["quantization_level"] == "F16"
    assert minilm["details"]["parameter_size"] == "22.57M"
    for m in (qwen, minilm):
        assert re.fullmatch(r"[0-9a-f]{64}", m["digest"])
        modified = datetime.fromisoformat(m["modified_at"])
        assert abs(modified.timestamp() - (CHAT_FILE if m is qwen else EMBED_FILE
                                           ).stat().st_mtime) < 1e-3
    assert qwen["digest"] != minilm["digest"]
    again = {m["name"]: m["digest"] for m in c.get("/api/tags").json()["models"]}
    assert again == {"chat": qwen["digest"], "minilm": minilm["digest"]}   # stable
    assert c.head("/api/tags").status_code == 200
    assert c.farm.made == []                                        # nothing was loaded


def test_show_a_chat_model(app_of):
    c = app_of()
    r = c.post("/api/show", json={"model": "chat"})
    assert r.status_code == 200
    body = r.json()
    assert body["capabilities"] == ["completion", "tools", "insert"]   # Qwen2.5-Coder: FIM
    info = body["model_info"]
    assert info["general.architecture"] == "qwen2"
    assert info["qwen2.context_length"] == 32768
    assert info["general.parameter_count"] == 630_167_424
    assert info["tokenizer.ggml.tokens"] == []                      # long arrays left empty
    assert "tokenizer.chat_template" not in info and "general.name" not in info
    assert body["template"].startswith("{%- if tools %}")           # the file's Jinja
    assert body["details"]["quantization_level"] == "Q4_K_M"
    assert body["parameters"].split() == ["num_ctx", "32768"]
    # the older "name", Ollama's default tag, and Copilot's basename echo
    assert c.post("/api/show", json={"name": "chat:latest"}).json()["details"] == body[
        "details"]
    copilot = c.post("/api/show", json={"model": "chat"},
                     headers={"user-agent": "GitHubCopilotChat/0.30.0"}).json()
    assert copilot["model_info"]["general.basename"] == "chat"
    assert body["model_info"]["general.basename"] == "Qwen2.5-Coder"


def test_show_an_embedding_model_and_a_thinking_one(app_of):
    c = app_of([
        ModelConfig("minilm", kind="auto", source=Settings(model=(str(EMBED_FILE),))),
        ModelConfig("thinker", source=Settings(model=(str(CHAT_FILE),),
                                               reasoning_parser="think", tool_parser="none"))])
    minilm = c.post("/api/show", json={"model": "minilm"}).json()
    assert minilm["capabilities"] == ["embedding"]
    assert minilm["model_info"]["bert.pooling_type"] == 1
    assert minilm["model_info"]["bert.embedding_length"] == 384
    thinker = c.post("/api/show", json={"model": "thinker"}).json()
    assert thinker["capabilities"] == ["completion", "thinking", "insert"]


def test_show_errors_in_ollamas_shape(app_of):
    c = app_of()
    missing = c.post("/api/show", json={"model": "llama3"})
    assert missing.status_code == 404
    assert missing.json()["error"].startswith('model "llama3" not found')
    assert "'chat', 'minilm'" in missing.json()["error"]
    for body in ({}, {"model": ""}, {"model": 3}, {"model": "x" * 600}):
        r = c.post("/api/show", json=body)
        assert r.status_code == 400 and set(r.json()) == {"error"}, body
    assert c.post("/api/show", content=b"{").status_code == 400


def test_version_and_the_probe(app_of):
    c = app_of()
    assert c.get("/api/version").json() == {"version": __version__}
    assert c.head("/api/version").status_code == 200
    root = c.get("/")
    assert root.status_code == 200 and root.text == "Ollama is running"
    assert c.head("/").status_code == 200


def test_keys_and_metrics_as_every_route(app_of):
    c = app_of(api_key=("secret",))
    refused = c.get("/api/tags")
    assert refused.status_code == 401 and set(refused.json()) == {"error"}
    auth = {"authorization": "Bearer secret"}
    assert c.get("/api/tags", headers=auth).status_code == 200
    assert c.post("/api/show", json={"model": "chat"}, headers=auth).status_code == 200
    metrics = c.get("/metrics").text
    assert re.search(r'podium_requests_total\{endpoint="/api/tags",status="200"\} 1', metrics)
    assert re.search(r'podium_requests_total\{endpoint="/api/show",status="200"\} 1', metrics)


# -- ps and keep_alive ----------------------------------------------------------------------

def test_ps_shows_loaded_models_and_their_expiry(app_of):
    c = app_of()
    assert ps(c) == {}
    chat(c)
    [running] = ps(c).values()
    assert running["name"] == running["model"] == "chat"
    assert running["size_vram"] == 0 and running["size"] > 0
    assert running["context_length"] == 4096
    assert running["details"]["family"] == "qwen2"
    assert 290 < seconds_until(running["expires_at"]) <= 300        # the model's keep-alive
    chat(c, keep_alive="1h")
    assert 3590 < seconds_until(ps(c)["chat"]["expires_at"]) <= 3600
    chat(c, keep_alive=90)                                          # seconds
    assert 80 < seconds_until(ps(c)["chat"]["expires_at"]) <= 90
    chat(c, keep_alive=-1)                                          # kept: Ollama's "never"
    assert datetime.fromisoformat(ps(c)["chat"]["expires_at"]).year > 2300
    chat(c)                                             # no keep_alive: the last one stands
    assert datetime.fromisoformat(ps(c)["chat"]["expires_at"]).year > 2300


def test_a_short_keep_alive_unloads_the_idle_model(app_of):
    c = app_of()
    chat(c, keep_alive="300ms")
    assert "chat" in ps(c)
    deadline = time.monotonic() + 5
    while "chat" in ps(c) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ps(c) == {} and c.farm.closed == ["chat"]
    chat(c)                                     # loaded again: the model's own keep-alive
    assert 290 < seconds_until(ps(c)["chat"]["expires_at"]) <= 300


def test_keep_alive_zero_unloads_once_the_request_ends(app_of):
    c = app_of()
    chat(c)
    answer = chat(c, keep_alive=0)
    assert answer["done"] is True                       # answered, then unloaded
    deadline = time.monotonic() + 5
    while "chat" in ps(c) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ps(c) == {} and c.farm.closed == ["chat"]
    states = {m["id"]: m["state"] for m in c.get("/v1/models").json()["data"]}
    assert states["chat"] == "unloaded"
    chat(c)
    assert len([e for e in c.farm.made if e.info.served_name == "chat"]) == 2


def test_a_pinned_model_stays_unless_asked_to_unload(app_of, tokenizer):
    c = app_of([ModelConfig("chat", pinned=True, keep_alive=300,
                            source=Settings(model=(str(CHAT_FILE),)))])
    assert datetime.fromisoformat(ps(c)["chat"]["expires_at"]).year > 2300   # loaded at start
    chat(c, keep_alive="5m")                    # a deadline: a pinned model has none
    assert datetime.fromisoformat(ps(c)["chat"]["expires_at"]).year > 2300
    chat(c, keep_alive=0)                       # an explicit unload, as the unload route
    deadline = time.monotonic() + 5
    while ps(c) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ps(c) == {}
    chat(c)                                     # loaded again, pinned again
    assert datetime.fromisoformat(ps(c)["chat"]["expires_at"]).year > 2300


def test_empty_prompts_load_and_unload(app_of):
    c = app_of()
    r = c.post("/api/chat", json={"model": "chat", "messages": [], "keep_alive": "10m"})
    assert r.status_code == 200 and r.json()["done_reason"] == "load"
    assert 590 < seconds_until(ps(c)["chat"]["expires_at"]) <= 600
    r = c.post("/api/generate", json={"model": "chat", "prompt": "", "keep_alive": 0})
    assert r.status_code == 200 and r.json()["done_reason"] == "unload"
    assert ps(c) == {}                          # gone before the answer
    assert c.farm.closed == ["chat"]


def test_bad_keep_alive_is_a_400_before_anything_loads(app_of):
    c = app_of()
    for value in ("5 minutes", "300", "", True, {"m": 5}, [5], "1e3s", "9999999999999h",
                  1e300):
        r = c.post("/api/embed", json={"model": "minilm", "input": "x", "keep_alive": value})
        assert r.status_code == 400, value
        assert r.json()["error"].startswith("keep_alive"), r.json()
    assert c.farm.made == []


@pytest.mark.parametrize("value, seconds", [
    ("5m", 300), ("1h30m", 5400), ("300ms", 0.3), ("1.5h", 5400), (".5s", 0.5),
    ("2h45m30.5s", 9930.5), ("1us", 1e-6), ("1µs", 1e-6), ("0", 0), ("0s", 0), ("-0", 0),
    ("+5s", 5), ("-1m", FOREVER), (-1, FOREVER), (0, 0), (300, 300),
    (0.5, 0.5), (None, None)])
def test_keep_alive_values(value, seconds):
    got = parse(value)
    assert got == pytest.approx(seconds) if seconds not in (None, FOREVER) else got == seconds


@pytest.mark.parametrize("value", ["300", "-1", "5 m", "5M", "m", ".s", "5m ", "1h-5m", "1d",
                                   "x" * 65, "NaN", "inf", True, [1], {}])
def test_keep_alive_refusals_name_the_field(value):
    with pytest.raises(InvalidRequestError) as caught:
        parse(value)
    assert caught.value.param == "keep_alive"


UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@hsettings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(sorted(UNITS))),
                min_size=1, max_size=6), st.sampled_from(["", "+", "-"]))
@example(parts=[(562048, "h"), (1000000, "h"), (1000000, "h")], sign="")   # CI found it
def test_any_go_duration_is_the_sum_of_its_parts(parts, sign):
    text = sign + "".join(f"{n}{unit}" for n, unit in parts)
    total = sum(n * UNITS[unit] for n, unit in parts)
    if total > LONGEST:                         # over Go's ~292 years: refused, as Go does
        with pytest.raises(ValueError, match="longest duration"):
            seconds_of(text)
        with pytest.raises(InvalidRequestError):
            parse(text)
        return
    seconds = seconds_of(text)
    assert seconds == pytest.approx(-total if sign == "-" else total, rel=1e-9, abs=1e-12)
    parsed = parse(text)
    if sign == "-" and total > 0:
        assert parsed == FOREVER                # negative: kept
    else:
        assert parsed == pytest.approx(total, rel=1e-9, abs=1e-12) and parsed <= LONGEST


@hsettings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12))
def test_numbers_are_seconds(number):
    if number > LONGEST:                        # past Go's longest duration
        with pytest.raises(InvalidRequestError):
            parse(number)
    else:
        assert parse(number) == (math.inf if number < 0 else number)


# -- embeddings -----------------------------------------------------------------------------

def norm(vector) -> float:
    return math.sqrt(sum(x * x for x in vector))


def test_embed_strings_with_ollamas_counters(app_of):
    c = app_of()
    r = c.post("/api/embed", json={"model": "minilm", "input": ["A lighthouse.", "Soup."]})
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == "minilm" and len(body["embeddings"]) == 2
    assert all(len(v) == 384 and abs(norm(v) - 1) < 1e-3 for v in body["embeddings"])
    assert body["embeddings"][0] != body["embeddings"][1]
    assert body["load_duration"] > 0 and body["total_duration"] > body["load_duration"]
    assert body["prompt_eval_count"] == 2 * 2 + 3 + 2   # [CLS] .. [SEP] each
    one = c.post("/api/embed", json={"model": "minilm", "input": "A lighthouse."}).json()
    # alone, an input is decoded without flash attention: the same up to float rounding
    assert one["embeddings"][0] == pytest.approx(body["embeddings"][0], abs=5e-4)
    old = c.post("/api/embeddings", json={"model": "minilm", "prompt": "A lighthouse."})
    assert old.json()["embedding"] == pytest.approx(one["embeddings"][0], abs=1e-6)
    openai = c.post("/v1/embeddings", json={"model": "minilm", "input": "A lighthouse."})
    assert openai.json()["data"][0]["embedding"] == pytest.approx(one["embeddings"][0],
                                                                  abs=1e-6)


def test_an_empty_input_loads_the_model(app_of):
    c = app_of()
    for body in ({"input": ""}, {"input": []}, {}):
        r = c.post("/api/embed", json={"model": "minilm", **body})
        assert r.status_code == 200 and r.json()["embeddings"] == [], body
    assert "minilm" in ps(c)
    assert c.post("/api/embeddings", json={"model": "minilm"}).json() == {"embedding": []}


def test_truncate_cuts_the_end_and_keeps_the_closing_token(app_of):
    c = app_of()
    long = "word " * 400
    cut = c.post("/api/embed", json={"model": "minilm", "input": long}).json()
    assert cut["prompt_eval_count"] == 256                          # the model's length
    [embedder] = c.farm.made
    tokens = embedder.tokenizer.encode(long)
    assert len(tokens) == 402 and tokens[-1] == 102                 # ... [SEP]
    kept = tokens[:255] + [102]                 # the same as its first 255 tokens and [SEP]
    same = c.post("/v1/embeddings", json={"model": "minilm", "input": kept}).json()
    assert same["data"][0]["embedding"] == pytest.approx(cut["embeddings"][0], abs=1e-6)
    shorter = c.post("/api/embed", json={"model": "minilm", "input": "word " * 254}).json()
    assert shorter["embeddings"][0] == pytest.approx(cut["embeddings"][0], abs=1e-6)
    refused = c.post("/api/embed", json={"model": "minilm", "input": ["ok", long],
                                         "truncate": False})
    assert refused.status_code == 400
    assert refused.json()["error"].startswith("input 1 has 402 tokens, more than this "
                                              "model's 256")


def test_embed_errors_in_ollamas_shape(app_of):
    c = app_of()
    cases = [({"model": "minilm", "input": ["fine", ""]}, 400, "empty"),
             ({"model": "minilm", "input": [1, 2]}, 400, "input"),
             ({"model": "minilm", "input": "x", "dimensions": 0}, 400, "dimensions"),
             ({"model": "minilm", "input": "x", "dimensions": 100}, 400, "dimensions"),
             ({"model": "minilm", "input": ["x"] * 2049}, 400, "input"),
             ({"model": "chat", "input": "x"}, 400, "chat model"),
             ({"model": "nope", "input": "x"}, 404, 'model "nope" not found'),
             ({"input": "x"}, 400, "model")]
    for body, status, words in cases:
        r = c.post("/api/embed", json=body)
        assert r.status_code == status, (body, r.text)
        assert set(r.json()) == {"error"} and words in r.json()["error"], (body, r.text)
    assert c.post("/api/embeddings", json={"model": "chat", "prompt": "x"}).status_code == 400


def test_embed_keep_alive_zero_unloads_the_embedding_model(app_of):
    c = app_of()
    r = c.post("/api/embed", json={"model": "minilm", "input": "x", "keep_alive": "2m"})
    assert r.status_code == 200
    assert 110 < seconds_until(ps(c)["minilm"]["expires_at"]) <= 120
    assert c.post("/api/embeddings", json={"model": "minilm", "prompt": "x",
                                           "keep_alive": 0}).status_code == 200
    deadline = time.monotonic() + 5
    while "minilm" in ps(c) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ps(c) == {}


# -- model files ----------------------------------------------------------------------------

def test_model_file_routes_say_how_to_add_a_model(app_of):
    c = app_of()
    pulled = c.post("/api/pull", json={"model": "llama3.2"})
    assert pulled.status_code == 403
    message = pulled.json()["error"]
    assert HOW in message and "--model" in message and "--models-dir" in message
    assert "[[models]]" in message and "'llama3.2'" in message
    served = c.post("/api/pull", json={"model": "chat", "stream": False})
    assert served.status_code == 200 and served.json() == {"status": "success"}
    streamed = c.post("/api/pull", json={"model": "minilm"})
    assert streamed.headers["content-type"] == "application/x-ndjson"
    assert streamed.text == '{"status":"success"}\n'
    for method, path, body in [("POST", "/api/push", {"model": "chat"}),
                               ("POST", "/api/create", {"model": "m", "from": "chat"}),
                               ("POST", "/api/copy", {"source": "chat", "destination": "b"}),
                               ("DELETE", "/api/delete", {"model": "chat"}),
                               ("POST", "/api/blobs/sha256:" + "0" * 64, None)]:
        r = c.request(method, path, json=body)
        assert r.status_code == 403 and HOW in r.json()["error"], path
    assert c.head("/api/blobs/sha256:" + "0" * 64).status_code == 403
    assert c.farm.made == []                    # nothing loaded for any of it
