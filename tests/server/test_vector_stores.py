"""The Vector Stores API through the official openai SDK: a scripted chat model beside a real
embedding model (all-MiniLM-L6-v2 on llama.cpp), on SQLite and PostgreSQL; files ingested by
the app's own ingestor in the background, searched by exact cosine scan."""

from __future__ import annotations

import asyncio
import io
import time

import numpy as np
import openai
import pytest
from starlette.testclient import TestClient

from podium.api.vector_ingest import Ingestor, chunk_text, counter
from podium.api.vector_stores import Scan
from podium.engine.base import ModelInfo
from podium.engine.llamacpp.embed import LlamaEmbedder
from podium.engine.llamacpp.model_files import EMBED_MODEL, default_model_path
from podium.engine.scripted import ScriptedEngine
from podium.models import ModelConfig
from podium.server.app import create_app
from podium.settings import Settings
from podium.store.files import FileStore
from podium.store.vector_stores import VectorStoreStore
from tests.conftest import SERVED
from tests.server.responses_check import check_stream, sse_events
from tests.server.test_files import db_url  # noqa: F401 - the fixture (sqlite, postgresql)
from tests.server.test_mcp import call

EMBED = "minilm"
DOCS = {
    "lighthouse.md": "# The Harrow Point lighthouse\n\nThe lighthouse at Harrow Point was "
                     "built in 1871 and its lamp is kept by Ada Morrow.",
    "soup.txt": "Leek and potato soup: soften two leeks in butter, add three potatoes and "
                "stock, simmer for twenty minutes and blend.",
    "tax.md": "Quarterly tax filings are due on the fifteenth day after the quarter ends; "
              "late filings pay a penalty of two percent.",
}


def minilm() -> LlamaEmbedder:
    return LlamaEmbedder(default_model_path(EMBED_MODEL), served_name=EMBED, n_threads=2)


@pytest.fixture
def embedder():
    engine = minilm()
    yield engine
    asyncio.run(engine.aclose())


@pytest.fixture
def app_for(tokenizer, chat_template, db_url):  # noqa: F811
    clients: list[TestClient] = []

    def build(replies=("Hi.",), **settings) -> TestClient:
        settings.setdefault("store_url", db_url)
        server = Settings(**settings)
        chat = ScriptedEngine(tokenizer, ModelInfo(SERVED, 4096, chat_template, 0),
                              list(replies))
        app = create_app(server, [ModelConfig(SERVED, pinned=True, source=server),
                                  ModelConfig(EMBED, pinned=True, kind="embedding",
                                              source=server)],
                         loaded={SERVED: chat, EMBED: minilm()})   # the app closes it
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        client.engine = chat            # type: ignore[attr-defined]
        clients.append(client)
        return client
    yield build
    for client in clients:
        client.__exit__(None, None, None)


def sdk(http: TestClient, key: str = "x") -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=http,
                         max_retries=0)


def upload(client: openai.OpenAI, name: str, data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return client.files.create(file=(name, io.BytesIO(raw)), purpose="user_data").id


def settled(client: openai.OpenAI, store_id: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while True:
        store = client.vector_stores.retrieve(store_id)
        if store.status != "in_progress":
            return store
        assert time.monotonic() < deadline, store.file_counts
        time.sleep(0.05)


@pytest.fixture
def docs(app_for):
    """A store of the three documents (attributes: their topic), ingested."""
    return ingested(app_for())


def ingested(http: TestClient):
    client = sdk(http)
    ids = {name: upload(client, name, text) for name, text in DOCS.items()}
    store = client.vector_stores.create(name="docs", file_ids=[ids["soup.txt"]])
    batch = client.vector_stores.file_batches.create(
        store.id, files=[{"file_id": ids["lighthouse.md"], "attributes": {"topic": "sea",
                                                                         "year": 1871}},
                         {"file_id": ids["tax.md"], "attributes": {"topic": "money",
                                                                  "year": 2024}}])
    assert batch.object == "vector_store.files_batch" and batch.file_counts.total == 2
    client.vector_stores.files.update(ids["soup.txt"], vector_store_id=store.id,
                                      attributes={"topic": "food", "year": 1990})
    return client, settled(client, store.id), ids


def test_a_store_is_made_ingested_and_searched(docs):
    client, store, ids = docs
    assert store.status == "completed" and store.file_counts.completed == 3
    assert store.file_counts.total == 3 and store.usage_bytes > 3 * 384 * 4
    assert store.model_extra["embedding_model"] == EMBED
    page = client.vector_stores.search(store.id, query="Who keeps the lamp of the lighthouse?")
    results = list(page)
    assert results[0].file_id == ids["lighthouse.md"]
    assert results[0].filename == "lighthouse.md"
    assert "Ada Morrow" in results[0].content[0].text
    assert results[0].score > results[-1].score and len(results) == 3
    assert results[0].attributes == {"topic": "sea", "year": 1871}
    soup = client.vector_stores.search(store.id, query="how do I cook leeks", max_num_results=1)
    assert [r.file_id for r in soup] == [ids["soup.txt"]]


def test_filters_narrow_a_search(docs):
    client, store, ids = docs
    query = "Who keeps the lamp of the lighthouse?"
    found = client.vector_stores.search(store.id, query=query, filters={
        "type": "eq", "key": "topic", "value": "money"})
    assert [r.file_id for r in found] == [ids["tax.md"]]
    found = client.vector_stores.search(store.id, query=query, filters={
        "type": "or", "filters": [{"type": "lt", "key": "year", "value": 1900},
                                  {"type": "in", "key": "topic", "value": ["food"]}]})
    assert {r.file_id for r in found} == {ids["lighthouse.md"], ids["soup.txt"]}
    found = client.vector_stores.search(store.id, query=query, filters={
        "type": "and", "filters": [{"type": "gte", "key": "year", "value": 1900},
                                   {"type": "ne", "key": "topic", "value": "food"}]})
    assert [r.file_id for r in found] == [ids["tax.md"]]
    found = client.vector_stores.search(store.id, query=query,
                                        ranking_options={"score_threshold": 0.99})
    assert list(found) == []


def test_files_batches_content_and_deletes(docs):
    client, store, ids = docs
    files = client.vector_stores.files.list(store.id)
    assert {f.id for f in files} == set(ids.values())
    one = client.vector_stores.files.retrieve(ids["tax.md"], vector_store_id=store.id)
    assert one.status == "completed" and one.last_error is None and one.usage_bytes > 0
    assert one.chunking_strategy.static.max_chunk_size_tokens == 800
    content = list(client.vector_stores.files.content(ids["tax.md"], vector_store_id=store.id))
    assert "".join(c.text for c in content) == DOCS["tax.md"]
    [batch_file] = [f for f in client.vector_stores.files.list(store.id, filter="completed")
                    if f.id == ids["soup.txt"]]
    assert batch_file.attributes == {"topic": "food", "year": 1990}
    gone = client.vector_stores.files.delete(ids["tax.md"], vector_store_id=store.id)
    assert gone.deleted
    after = client.vector_stores.retrieve(store.id)
    assert after.file_counts.total == 2 and after.usage_bytes < store.usage_bytes
    found = client.vector_stores.search(store.id, query="tax filing penalty")
    assert ids["tax.md"] not in {r.file_id for r in found}
    assert client.vector_stores.delete(store.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.retrieve(store.id)


def test_files_that_cannot_be_read_fail_with_the_reason(app_for):
    client = sdk(app_for())
    pdf = upload(client, "paper.pdf", b"%PDF-1.7 \x00\x01")
    latin = upload(client, "notes.txt", "caf\xe9".encode("latin-1"))
    store = settled(client, client.vector_stores.create(file_ids=[pdf, latin]).id)
    assert store.file_counts.failed == 2 and store.status == "completed"
    errors = {f.id: f.last_error for f in client.vector_stores.files.list(store.id)}
    assert errors[pdf].code == "unsupported_file" and "PDF" in errors[pdf].message
    assert errors[latin].code == "invalid_file" and "UTF-8" in errors[latin].message


def test_another_keys_stores_are_missing(app_for):
    http = app_for(api_key=["key-a", "key-b"])
    alice, bob = sdk(http, "key-a"), sdk(http, "key-b")
    mine = upload(alice, "a.txt", "alpha")
    store = alice.vector_stores.create(file_ids=[mine])
    for call in (lambda: bob.vector_stores.retrieve(store.id),
                 lambda: bob.vector_stores.search(store.id, query="alpha"),
                 lambda: bob.vector_stores.files.list(store.id),
                 lambda: bob.vector_stores.delete(store.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(bob.vector_stores.list()) == []
    with pytest.raises(openai.BadRequestError) as refused:      # alice's file is not bob's
        bob.vector_stores.create(file_ids=[mine])
    assert refused.value.body["param"] == "file_ids[0]"
    assert alice.vector_stores.retrieve(store.id).id == store.id


@pytest.mark.parametrize("body, param", [
    ({"query": "x", "max_num_results": 51}, "max_num_results"),
    ({"query": "x", "rewrite_query": True}, "rewrite_query"),
    ({"query": ""}, "query"),
    ({"query": "x" * 5000}, "query"),
    ({"query": "x", "filters": {"type": "like", "key": "k", "value": 1}}, "filters.type"),
    ({"query": "x", "filters": {"type": "eq", "key": "k", "value": {"a": 1}}},
     "filters.value"),
    ({"query": "x", "ranking_options": {"ranker": "mine"}}, "ranking_options.ranker"),
])
def test_bad_searches_are_400s_naming_the_parameter(app_for, body, param):
    http = app_for()
    store = sdk(http).vector_stores.create()
    r = http.post(f"/v1/vector_stores/{store.id}/search", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param)


def test_bounds_on_what_a_store_is_given(app_for):
    http = app_for()
    deep: dict = {"type": "eq", "key": "k", "value": 1}
    for _ in range(9):
        deep = {"type": "and", "filters": [deep]}
    store = sdk(http).vector_stores.create()
    r = http.post(f"/v1/vector_stores/{store.id}/search", json={"query": "x", "filters": deep})
    assert r.status_code == 400 and "nest" in r.json()["error"]["message"]
    cases = [({"file_ids": [f"file-{i}" for i in range(501)]}, "file_ids"),
             ({"chunking_strategy": {"type": "static", "static": {
                 "max_chunk_size_tokens": 100, "chunk_overlap_tokens": 60}}},
              "chunking_strategy.static.chunk_overlap_tokens"),
             ({"embedding_model": "nope"}, "embedding_model"),
             ({"embedding_model": SERVED}, "model"),
             ({"metadata": {"k" * 65: "v"}}, "metadata")]
    for body, param in cases:
        r = http.post("/v1/vector_stores", json=body)
        assert r.status_code == 400, (body, r.text)
        assert (r.json()["error"]["param"] or "").startswith(param), (body, r.text)
    file_id = upload(sdk(http), "a.txt", "alpha")
    r = http.post(f"/v1/vector_stores/{store.id}/files", json={
        "file_id": file_id, "attributes": {f"k{i}": i for i in range(17)}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "attributes"


def test_a_batch_is_cancelled_and_lists_its_files(app_for):
    http = app_for()
    client = sdk(http)
    ids = [upload(client, f"{i}.txt", f"document {i} " * 2000) for i in range(3)]
    store = client.vector_stores.create()
    batch = client.vector_stores.file_batches.create(store.id, file_ids=ids)
    cancelled = client.vector_stores.file_batches.cancel(batch.id, vector_store_id=store.id)
    assert cancelled.status == "cancelled"
    counts = cancelled.file_counts
    assert counts.cancelled + counts.completed == 3 and counts.in_progress == 0
    listed = client.vector_stores.file_batches.list_files(batch.id, vector_store_id=store.id)
    assert {f.id for f in listed} == set(ids)
    with pytest.raises(openai.BadRequestError):
        client.vector_stores.file_batches.cancel(batch.id, vector_store_id=store.id)


def test_without_an_embedding_model_a_store_needs_one_named(tokenizer, tmp_path):
    chat = ScriptedEngine(tokenizer, ModelInfo(SERVED, 4096, "", 0), ["Hi."])
    with TestClient(create_app(Settings(store_url=f"sqlite:///{tmp_path / 's.db'}"), chat),
                    raise_server_exceptions=False) as http:
        r = http.post("/v1/vector_stores", json={"name": "x"})
        assert r.status_code == 400 and "no embedding model" in r.json()["error"]["message"]


# -- the parts ------------------------------------------------------------------------------

def test_chunks_keep_the_text_and_stay_within_their_tokens(tokenizer):
    text = ("Podium serves models.  Vector stores cut text\ninto chunks, "
            "measured in tokens! " * 40 + "x" * 300 + " end")
    count = counter(tokenizer)
    for size, overlap in ((100, 0), (100, 50), (256, 100)):
        pieces = chunk_text(text, count, size, overlap)
        assert all(len(tokenizer.encode(p, add_special=False)) <= size + 4 for p in pieces)
        assert all(p in text for p in pieces)
        assert pieces[0] == text[:len(pieces[0])] and text.endswith(pieces[-1])
        if overlap == 0:
            assert "".join(pieces) == text
        else:       # each chunk begins inside the one before
            for a, b in zip(pieces, pieces[1:]):
                assert b[:20] in a


def test_an_exact_scan_ranks_by_cosine_and_masks_files():
    rows = [(0, 0, _f32(1, 0)), (0, 1, _f32(0.6, 0.8)), (1, 0, _f32(0, 1))]
    scan = Scan.build(7, [{"file_id": "a"}, {"file_id": "b"}], rows)
    query = np.asarray([[0, 1]], np.float32)
    both = np.array([True, True])
    assert [(f, s) for _, f, s in scan.top(query, both, 3, 0.0)] == [(1, 0), (0, 1), (0, 0)]
    assert [(f, s) for _, f, s in scan.top(query, np.array([True, False]), 5, 0.0)] == \
        [(0, 1), (0, 0)]
    assert len(scan.top(query, both, 3, 0.5)) == 2


def _f32(*values: float) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def test_a_file_whose_replica_died_is_ingested_by_another(embedder, tmp_path):
    """The lease of a file held by a replica that died lapses; another replica's ingestor
    claims it, drops the chunks the dead one wrote, and completes it."""
    async def go():
        from contextlib import asynccontextmanager

        from podium.store.sql import SQLStore
        sql = SQLStore(f"sqlite:///{tmp_path / 'r.db'}")
        files, store = FileStore(sql.engine), VectorStoreStore(sql.engine)
        from podium.store.files import StoredFile
        await files.finish("file-aaaaaaaaaaaaaaaaaaaaaaaaa", "o", 0, b"a lighthouse keeper",
                           StoredFile("file-aaaaaaaaaaaaaaaaaaaaaaaaa", "user_data", "k.txt",
                                      19, 0, None))
        now = int(time.time())
        await store.create(dict(id="vs_1", owner="o", name=None, description=None, meta=None,
                                embedding_model=EMBED, chunk_size=800, chunk_overlap=400,
                                created_at=now, expires_days=None, expires_at=None,
                                last_active_at=now),
                           [dict(store_id="vs_1", file_id="file-aaaaaaaaaaaaaaaaaaaaaaaaa",
                                 owner="o", batch_id=None, filename="k.txt", attributes=None,
                                 chunk_size=800, chunk_overlap=400, created_at=now)])
        dead = await store.claim_file("dead", time.time() + 0.3, time.time())
        key = (dead["store_id"], dead["file_id"])
        assert await store.add_chunks(key, "dead", time.time() + 0.3, [(5, "junk", _f32(1))])

        @asynccontextmanager
        async def embedders(name):
            yield embedder
        ingestor = Ingestor(store, files, embedders, lease_seconds=5)
        assert not await ingestor.turn()            # still held by the dead replica
        await asyncio.sleep(0.4)
        assert await ingestor.turn()
        row = await store.get_file(*key, "o")
        assert row["status"] == "completed"
        assert await store.file_chunks(*key, 10) == ["a lighthouse keeper"]
        sql.engine.dispose()
    asyncio.run(go())


def test_the_sdk_sees_openai_shapes(docs):
    client, store, _ = docs
    listed = client.vector_stores.list(limit=1)
    assert [s.id for s in listed.data] == [store.id]
    updated = client.vector_stores.update(store.id, name="renamed", metadata={"a": "b"},
                                          expires_after={"anchor": "last_active_at",
                                                         "days": 2})
    assert updated.name == "renamed" and updated.metadata == {"a": "b"}
    assert updated.expires_after.days == 2 and updated.expires_at > time.time() + 86400


# -- file_search in Responses ---------------------------------------------------------------

SEARCH = call("file_search", queries=["who keeps the lighthouse lamp"])
ANSWER = "Ada Morrow keeps the lamp, as lighthouse.md says."


def test_file_search_runs_in_a_response_and_the_answer_cites_the_file(app_for):
    http = app_for([SEARCH, ANSWER])
    client, store, ids = ingested(http)
    tool = {"type": "file_search", "vector_store_ids": [store.id], "max_num_results": 2}
    body = {"model": SERVED, "input": "Who keeps the lamp?", "tools": [tool],
            "include": ["file_search_call.results"]}
    plain = http.post("/v1/responses", json=body).json()
    events = sse_events(http.post("/v1/responses", json={**body, "stream": True}).text)
    final = check_stream(events)
    for response in (plain, final):
        call_item, message = response["output"]
        assert call_item["type"] == "file_search_call" and call_item["status"] == "completed"
        assert call_item["queries"] == ["who keeps the lighthouse lamp"]
        assert [r["file_id"] for r in call_item["results"]][0] == ids["lighthouse.md"]
        assert len(call_item["results"]) == 2
        [part] = message["content"]
        assert part["text"] == ANSWER
        assert part["annotations"] == [{"type": "file_citation",
                                        "file_id": ids["lighthouse.md"],
                                        "filename": "lighthouse.md",
                                        "index": ANSWER.index(".md") + 3}]
    kinds = [e["type"] for e in events]
    assert kinds.index("response.file_search_call.in_progress") < kinds.index(
        "response.file_search_call.searching") < kinds.index(
        "response.file_search_call.completed")
    assert "response.output_text.annotation.added" in kinds
    # the second round read the results: the model's prompt holds the passage
    prompt = http.engine.tokenizer.decode(http.engine.requests[1].prompt_token_ids)
    assert "Ada Morrow" in prompt and "lighthouse.md" in prompt


def test_without_include_the_results_stay_out_of_the_item(app_for):
    http = app_for([SEARCH, "The lamp is kept by Ada Morrow."])
    client, store, ids = ingested(http)
    answer = sdk(http).responses.create(model=SERVED, input="Who keeps the lamp?", tools=[{
        "type": "file_search", "vector_store_ids": [store.id]}])
    call_item, message = answer.output
    assert call_item.type == "file_search_call" and call_item.results is None
    [annotation] = message.content[0].annotations        # the best file, at the end
    assert annotation.file_id == ids["lighthouse.md"]
    assert annotation.index == len(message.content[0].text)
    prompt = http.engine.tokenizer.decode(http.engine.requests[-1].prompt_token_ids)
    assert "Ada Morrow" in prompt


def test_file_search_stores_are_checked_before_the_model_runs(app_for):
    http = app_for(api_key=["key-a", "key-b"])
    alice = sdk(http, "key-a")
    store = alice.vector_stores.create()
    for tool, param in [({"vector_store_ids": ["vs_nope"]}, "tools[0].vector_store_ids[0]"),
                        ({"vector_store_ids": []}, "tools[0].vector_store_ids"),
                        ({"vector_store_ids": [store.id], "max_num_results": 99},
                         "tools[0].max_num_results")]:
        r = http.post("/v1/responses", headers={"Authorization": "Bearer key-a"}, json={
            "model": SERVED, "input": "x", "tools": [{"type": "file_search", **tool}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = http.post("/v1/responses", headers={"Authorization": "Bearer key-b"}, json={
        "model": SERVED, "input": "x", "tools": [{"type": "file_search",
                                                  "vector_store_ids": [store.id]}]})
    assert r.status_code == 400 and "No vector store" in r.json()["error"]["message"]
    assert not http.engine.requests          # the model never ran
