"""``POST /v1/embeddings`` on a real embedding model (all-MiniLM-L6-v2 from PyPI as a GGUF,
llama.cpp's embeddings context), driven by the ``openai`` SDK; vectors checked against
sentence-transformers' own (tests/data/all_minilm_l6_v2_reference.json)."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import struct
from pathlib import Path

import openai
import pytest
from starlette.testclient import TestClient

from podium.engine.llamacpp.embed import LlamaEmbedder
from podium.engine.llamacpp.model_files import EMBED_MODEL, default_model_path
from podium.server.app import create_app
from podium.settings import Settings

REFERENCE = json.loads((Path(__file__).parent.parent / "data" /
                        "all_minilm_l6_v2_reference.json").read_text())["items"]
NAME = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    engine = LlamaEmbedder(default_model_path(EMBED_MODEL), served_name=NAME, n_threads=2)
    db = tmp_path_factory.mktemp("embed") / "s.db"
    with TestClient(create_app(Settings(store_url=f"sqlite:///{db}"), engine),
                    raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def sdk(http):
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                           max_retries=0)
    yield client


def cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) *
                                                        sum(y * y for y in b))


def test_vectors_match_sentence_transformers(sdk):
    texts = [item["text"] for item in REFERENCE]
    for fmt in ("float", "base64", None):       # the SDK asks for base64 when not told
        extra = {"encoding_format": fmt} if fmt else {}
        answer = sdk.embeddings.create(model=NAME, input=texts, **extra)
        assert [d.index for d in answer.data] == list(range(len(texts)))
        for got, item in zip(answer.data, REFERENCE):
            vector = got.embedding
            if isinstance(vector, str):         # asked for base64: the SDK leaves it so
                vector = struct.unpack("<384f", base64.b64decode(vector))
            assert len(vector) == 384
            assert cosine(vector, item["embedding"]) >= 0.999, item["text"]
            assert abs(math.sqrt(sum(x * x for x in vector)) - 1) < 1e-3
        assert answer.usage.prompt_tokens == sum(len(i["token_ids"]) for i in REFERENCE)
        assert answer.usage.total_tokens == answer.usage.prompt_tokens


def test_base64_is_the_float32_of_the_floats(http):
    body = {"model": NAME, "input": "A lighthouse on a cliff."}
    floats = http.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    packed = http.post("/v1/embeddings", json={**body, "encoding_format": "base64"}
                       ).json()["data"][0]["embedding"]
    decoded = struct.unpack(f"<{len(floats)}f", base64.b64decode(packed))
    assert all(abs(a - b) < 1e-6 for a, b in zip(decoded, floats))


def test_token_ids_and_batches(http):
    item = REFERENCE[0]
    one = http.post("/v1/embeddings", json={"model": NAME, "input": item["token_ids"]}).json()
    assert cosine(one["data"][0]["embedding"], item["embedding"]) >= 0.999
    many = http.post("/v1/embeddings", json={"model": NAME, "input": [
        item["token_ids"]] * 3}).json()
    assert len(many["data"]) == 3 and many["usage"]["prompt_tokens"] == 3 * len(
        item["token_ids"])
    texts = [f"Sentence number {i} about the sea." for i in range(2048)]
    big = http.post("/v1/embeddings", json={"model": NAME, "input": texts}).json()
    assert len(big["data"]) == 2048
    # batched with the others, each vector is what it is alone
    alone = http.post("/v1/embeddings", json={"model": NAME, "input": texts[1234]}).json()
    assert cosine(big["data"][1234]["embedding"], alone["data"][0]["embedding"]) > 0.9999


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input[0]"),
    ({"input": []}, "input"),
    ({"input": ["ok", ""]}, "input[1]"),
    ({"input": "word " * 300}, "input[0]"),                 # over its 256 tokens
    ({"input": [[1, 2], [10**8]]}, "input[1][0]"),
    ({"input": "x", "dimensions": 128}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": ["x"] * 2049}, "input"),
])
def test_bad_requests_name_their_parameter(http, body, param):
    r = http.post("/v1/embeddings", json={"model": NAME, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("value, says", [
    ([], "empty"), (["x"] * 2049, "2049"), ([1.5], "token ids"), ({"a": 1}, "token ids"),
    ([[]], "empty"), ([-1], "token ids"), (["a", 1], "token ids"), (None, "token ids"),
    ([True], "token ids"), ([[1, True]], "token ids"), ([1.0], "token ids"),
])
def test_a_malformed_input_is_one_plain_sentence(http, value, says):
    """Not pydantic's attempt at every member of the union ("Input should be a valid
    string; List should have at least 1 item; ...")."""
    r = http.post("/v1/embeddings", json={"model": NAME, "input": value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input" and says in error["message"]
    assert "should be a valid" not in error["message"] and ";" not in error["message"]


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    """The same model, its requests bounded to 1,000 tokens together."""
    engine = LlamaEmbedder(default_model_path(EMBED_MODEL), served_name=NAME, n_threads=2)
    db = tmp_path_factory.mktemp("embed-bounded") / "s.db"
    settings = Settings(store_url=f"sqlite:///{db}", max_embedding_tokens=1000)
    with TestClient(create_app(settings, engine), raise_server_exceptions=False) as client:
        yield client


LONG = "word " * 300                                   # cut to the model's 256 tokens


def test_a_requests_tokens_together_are_bounded(bounded):
    """--max-embedding-tokens: the inputs' tokens summed after truncation; past it a 400
    naming input in each API's own error shape, before anything is embedded."""
    from tests.server.apps import served

    engine = served(bounded.app).engine
    before = engine.stats["requests"]
    fits = {"model": NAME, "input": [LONG] * 3, "truncate_prompt_tokens": 256}
    r = bounded.post("/v1/embeddings", json=fits)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 768
    r = bounded.post("/v1/embeddings", json={**fits, "input": [LONG] * 4})     # 1,024
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input" and error["type"] == "invalid_request_error"
    assert "1000 tokens together" in error["message"]
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=bounded,
                        max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model=NAME, input=[[7] * 200] * 6)               # token ids
    assert refused.value.body["param"] == "input"
    ollama = bounded.post("/api/embed", json={"model": NAME, "input": [LONG] * 4})
    assert ollama.status_code == 400 and set(ollama.json()) == {"error"}
    assert "1000 tokens together" in ollama.json()["error"]
    assert bounded.post("/api/embed", json={"model": NAME, "input": [LONG] * 3}
                        ).json()["prompt_eval_count"] == 768
    rerank = bounded.post("/v1/rerank", json={"model": NAME, "query": "a word",
                                              "documents": ["word " * 200] * 5})
    assert rerank.status_code == 400 and rerank.json()["error"]["param"] == "documents"
    assert engine.stats["requests"] - before == 3 + 3          # only the two that fit


def test_the_campaigns_request_is_refused_by_the_default_bound(http):
    """2,048 inputs of 256 tokens (524,288) held the model for minutes: past the default
    300,000 tokens, OpenAI's own limit."""
    r = http.post("/v1/embeddings", json={"model": NAME, "input": [[7] * 256] * 2048})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "input"
    assert "300000 tokens together" in r.json()["error"]["message"]


def _gone_after(path: str, body: bytes, seconds: float):
    """An ASGI call of ``path`` whose client sends ``body`` and leaves ``seconds`` later."""
    sent: list[dict] = []
    given: list[bool] = []

    async def receive():
        if not given:
            given.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(seconds)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "state": {},
             "headers": [(b"host", b"test"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    return scope, receive, send, sent


@pytest.mark.parametrize("path", ["/v1/embeddings", "/api/embed"])
def test_a_client_that_leaves_stops_its_embeddings(http, path):
    """The campaign's second finding: the big request's client hung up and the server
    embedded every input anyway. Now its inputs stop at the next decode."""
    from tests.server.apps import served

    engine = served(http.app).engine
    text = "the lighthouse keeper climbed the stairs again " * 8     # about 60 tokens
    body = json.dumps({"model": NAME, "input": [text] * 1000}).encode()
    scope, receive, send, sent = _gone_after(path, body, 0.5)

    async def main():
        embedded = engine.stats["requests"]
        await asyncio.wait_for(http.app(scope, receive, send), timeout=30)
        left = engine.decodes
        await asyncio.sleep(1.0)                        # several decodes' time
        return engine.decodes - left, engine.stats["requests"] - embedded

    decodes_after, embedded = asyncio.run(main())
    assert decodes_after <= 1                           # the one in progress, at most
    assert embedded < 500                               # of the 1,000 inputs
    assert not any(m.get("status") == 200 for m in sent)


def test_truncation_on_request_and_dimensions_as_they_are(http):
    long = "word " * 600
    r = http.post("/v1/embeddings", json={"model": NAME, "input": long,
                                          "truncate_prompt_tokens": 100})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 100
    r = http.post("/v1/embeddings", json={"model": NAME, "input": long,
                                          "truncate_prompt_tokens": -1})
    assert r.json()["usage"]["prompt_tokens"] == 256
    assert http.post("/v1/embeddings", json={"model": NAME, "input": "x", "dimensions": 384}
                     ).status_code == 200


def test_an_embedding_model_does_not_chat_and_says_what_it_is_for(http):
    r = http.post("/v1/chat/completions", json={"model": NAME, "messages": [
        {"role": "user", "content": "Hi"}]})
    assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"]
    card = http.get(f"/v1/models/{NAME}").json()
    assert card["kind"] == "embedding" and card["rerank"] == "cosine"


def test_tokenize_counts_an_embedding_models_tokens(http):
    """A chunker budgets its chunks in the embedding model's own tokens (vLLM's /tokenize
    serves pooling models too); messages need a chat template, which it has not."""
    from tests.server.apps import served

    tok = served(http.app).engine.tokenizer
    text = "Retrieval chunks are measured in tokens."
    r = http.post("/tokenize", json={"model": NAME, "prompt": text})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok.encode(text) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 256 and body["tokens"][0] == 101     # [CLS]
    bare = http.post("/tokenize", json={"model": NAME, "prompt": text,
                                        "add_special_tokens": False}).json()
    assert bare["tokens"] == body["tokens"][1:-1]
    r = http.post("/detokenize", json={"model": NAME, "tokens": bare["tokens"]})
    assert r.status_code == 200     # WordPiece: lower case, and spaces around punctuation
    assert r.json()["prompt"].split() == text.lower().replace(".", " .").split()
    r = http.post("/tokenize", json={"model": NAME, "messages": [
        {"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages" and "embedding model" in error["message"]


def test_rerank_orders_documents_by_relevance(http):
    query = "How do I bake bread at home?"
    documents = ["The stock market fell sharply on Tuesday.",
                 "How do I bake bread at home?",
                 {"text": "A simple recipe for baking a loaf of bread in your own kitchen."},
                 "Penguins live in the southern hemisphere."]
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        r = http.post(path, json={"model": NAME, "query": query, "documents": documents,
                                  "top_n": 3, "return_documents": True}).json()
        assert [x["index"] for x in r["results"]][:2] == [1, 2]     # duplicate, paraphrase
        assert len(r["results"]) == 3
        scores = [x["relevance_score"] for x in r["results"]]
        assert scores == sorted(scores, reverse=True) and scores[0] > 0.99
        assert r["results"][1]["document"] == {"text": documents[2]["text"]}
        assert r["usage"]["total_tokens"] > 0
    bare = http.post("/v1/rerank", json={"model": NAME, "query": query,
                                         "documents": documents}).json()
    assert len(bare["results"]) == 4 and "document" not in bare["results"][0]
    bad = http.post("/v1/rerank", json={"model": NAME, "query": query,
                                        "documents": ["ok", ""]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "documents[1]"


@pytest.fixture(scope="module")
def shortening(tmp_path_factory):
    """The same model served as trained to be shortened (--matryoshka-dimensions): MiniLM is
    not, so only the arithmetic is checked here, not the quality of its short vectors."""
    engine = LlamaEmbedder(default_model_path(EMBED_MODEL), served_name=NAME, n_threads=2)
    db = tmp_path_factory.mktemp("embed-short") / "s.db"
    settings = Settings(store_url=f"sqlite:///{db}", matryoshka_dimensions="256,128")
    with TestClient(create_app(settings, engine), raise_server_exceptions=False) as client:
        yield client


def test_dimensions_cut_and_normalize_where_the_model_is_trained_for_them(http, shortening):
    body = {"model": NAME, "input": ["A lighthouse on a cliff.", "Bread and butter."]}
    full = http.post("/v1/embeddings", json=body).json()["data"]
    for n in (128, 256):
        short = shortening.post("/v1/embeddings", json={**body, "dimensions": n}).json()["data"]
        for got, whole in zip(short, full):
            head = whole["embedding"][:n]
            norm = math.sqrt(sum(x * x for x in head))
            assert len(got["embedding"]) == n
            assert all(abs(a - b / norm) < 1e-6 for a, b in zip(got["embedding"], head))
    packed = shortening.post("/v1/embeddings", json={**body, "dimensions": 128,
                                                     "encoding_format": "base64"}).json()
    assert len(base64.b64decode(packed["data"][0]["embedding"])) == 128 * 4
    as_is = shortening.post("/v1/embeddings", json={**body, "dimensions": 384}).json()
    assert len(as_is["data"][0]["embedding"]) == 384
    for n, says in ((100, "256, 128"), (500, "at most 384")):
        r = shortening.post("/v1/embeddings", json={**body, "dimensions": n})
        assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
        assert says in r.json()["error"]["message"]


def test_a_vllm_folder_declares_its_matryoshka_lengths_in_config_json(tmp_path):
    from types import SimpleNamespace

    from podium.server.served import _matryoshka

    engine = SimpleNamespace(kind="embedding", info=SimpleNamespace(metadata={}))
    (tmp_path / "config.json").write_text(json.dumps({"matryoshka_dimensions": [768, 256]}))
    settings = Settings(model=(str(tmp_path),), engine="vllm")
    assert _matryoshka(settings, engine) == (768, 256)
    assert _matryoshka(Settings(model=(str(tmp_path),), engine="vllm",
                                matryoshka_dimensions="any"), engine) == ()
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 768}))
    assert _matryoshka(settings, engine) is None
    assert _matryoshka(settings, SimpleNamespace(kind="chat")) is None


# ---- a reranker with its own head (llama.cpp's rank pooling) ----------------------------------

@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    """A tiny random cross-encoder converted to a rank GGUF (no reranker is on PyPI; its
    scores are checked against the model's forward pass in tests/engine/test_embed_model.py),
    served by file, its kind read from the file."""
    from podium.catalog import catalog
    from podium.engine.llamacpp.convert import convert
    from tests.engine.test_embed_model import tiny_cross_encoder

    root = tmp_path_factory.mktemp("rank")
    tiny_cross_encoder(root / "ce")
    convert(root / "ce", root / "rank.gguf", dtype="f32")
    settings = Settings(model=(f"tiny-rank={root / 'rank.gguf'}",),
                        store_url=f"sqlite:///{root / 's.db'}")
    with TestClient(create_app(settings, catalog(settings)),
                    raise_server_exceptions=False) as client:
        yield client


def test_a_reranker_scores_with_its_own_head(reranker):
    from tests.server.apps import served

    documents = ["a cat sat on the mat!", "hello", {"text": "the mat, the cat"}]
    r = reranker.post("/v1/rerank", json={"model": "tiny-rank", "query": "the cat sat",
                                          "documents": documents, "return_documents": True})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    engine = served(reranker.app).engine
    tok = engine.tokenizer
    want = asyncio.run(engine.score(tok.encode("the cat sat", add_special=False), [
        tok.encode(d if isinstance(d, str) else d["text"], add_special=False)
        for d in documents]))
    assert sorted(x["index"] for x in results) == [0, 1, 2]
    query_ids = tok.encode("the cat sat", add_special=False)
    assert engine.pair_overhead == 3                    # [CLS] q [SEP] d [SEP]
    assert r.json()["usage"]["total_tokens"] == sum(
        len(query_ids) + len(tok.encode(d if isinstance(d, str) else d["text"],
                                        add_special=False)) + 3 for d in documents)
    for x in results:                   # the head's probability, as the engine gives it
        assert abs(x["relevance_score"] - want[x["index"]]) < 1e-6
        assert 0 < x["relevance_score"] < 1
    assert [x["relevance_score"] for x in results] == sorted(want, reverse=True)
    assert results[0]["document"]["text"] in ("a cat sat on the mat!", "hello",
                                              "the mat, the cat")
    top = reranker.post("/rerank", json={"model": "tiny-rank", "query": "the cat sat",
                                         "documents": documents, "top_n": 1}).json()
    assert [x["index"] for x in top["results"]] == [results[0]["index"]]
    assert "document" not in top["results"][0] and top["usage"]["total_tokens"] > 0
    card = reranker.get("/v1/models/tiny-rank").json()
    assert card["kind"] == "rerank" and card["rerank"] == "model"
    r = reranker.post("/tokenize", json={"model": "tiny-rank", "prompt": "the cat sat"})
    assert r.status_code == 200 and r.json()["max_model_len"] == 64
    assert r.json()["tokens"] == tok.encode("the cat sat")


def test_a_reranker_refuses_what_it_is_not_for(reranker):
    r = reranker.post("/v1/embeddings", json={"model": "tiny-rank", "input": "the cat"})
    assert r.status_code == 400 and "reranker" in r.json()["error"]["message"]
    r = reranker.post("/v1/chat/completions", json={"model": "tiny-rank", "messages": [
        {"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "reranker" in r.json()["error"]["message"]
    long = "the cat sat on the mat " * 20             # the tiny model reads 64 tokens
    body = {"model": "tiny-rank", "query": "the cat", "documents": ["hello", long]}
    r = reranker.post("/v1/rerank", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents[1]"
    r = reranker.post("/v1/rerank", json={**body, "truncate_prompt_tokens": -1})
    assert r.status_code == 200 and len(r.json()["results"]) == 2
    r = reranker.post("/v1/rerank", json={**body, "query": long})
    assert r.status_code == 400 and r.json()["error"]["param"] == "query"


def test_a_cross_encoder_folder_is_detected_as_a_reranker(tmp_path):
    from podium.models import ModelConfig
    from podium.server.served import detect_kind

    def kind(config: dict) -> str:
        (tmp_path / "config.json").write_text(json.dumps(config))
        return detect_kind(ModelConfig("m", source=Settings(model=(str(tmp_path),),
                                                            engine="vllm")))
    assert kind({"architectures": ["BertForSequenceClassification"]}) == "rerank"
    assert kind({"architectures": ["XLMRobertaForSequenceClassification"]}) == "rerank"
    assert kind({"architectures": ["Qwen2ForCausalLM"]}) == "chat"
