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
import sqlalchemy as sa
from starlette.testclient import TestClient

from podium.api import vector_ingest
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
from podium.store.vector_stores import VectorStoreStore, chunks
from tests.conftest import SERVED
from tests.server.responses_check import check_stream, sse_events
from tests.server.test_files import db_url  # noqa: F401 - the fixture (sqlite, postgresql)
from tests.server.test_mcp import call

EMBED, RANK = "minilm", "keyword-rank"
DOCS = {
    "lighthouse.md": "# The Harrow Point lighthouse\n\nThe lighthouse at Harrow Point was "
                     "built in 1871 and its lamp is kept by Ada Morrow.",
    "soup.txt": "Leek and potato soup: soften two leeks in butter, add three potatoes and "
                "stock, simmer for twenty minutes and blend.",
    "tax.md": "Quarterly tax filings are due on the fifteenth day after the quarter ends; "
              "late filings pay a penalty of two percent.",
}


class KeywordReranker:
    """A reranker whose head likes one word: a document holding it scores 0.9, any other
    0.2 (an order cosine similarity does not give). It reads with MiniLM's tokenizer."""

    kind, pair_overhead = "rerank", 0

    def __init__(self, embedder: LlamaEmbedder, word: str):
        self.tokenizer, self.info, self.word = embedder.tokenizer, embedder.info, word
        self.queries: list[str] = []

    async def score(self, query: list[int], documents: list[list[int]], priority: int = 0
                    ) -> list[float]:
        self.queries.append(self.tokenizer.decode(query))
        return [0.9 if self.word in self.tokenizer.decode(d) else 0.2 for d in documents]

    async def aclose(self) -> None:
        pass


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

    def build(replies=("Hi.",), reranker: str | None = None, **settings) -> TestClient:
        """``reranker``: a word; a ``KeywordReranker`` of it is served as RANK."""
        settings.setdefault("store_url", db_url)
        server = Settings(**settings)
        chat = ScriptedEngine(tokenizer, ModelInfo(SERVED, 4096, chat_template, 0),
                              list(replies))
        embed = minilm()
        configs = [ModelConfig(SERVED, pinned=True, source=server),
                   ModelConfig(EMBED, pinned=True, kind="embedding", source=server)]
        loaded = {SERVED: chat, EMBED: embed}       # the app closes them
        if reranker is not None:
            configs.append(ModelConfig(RANK, pinned=True, kind="rerank", source=server))
            loaded[RANK] = KeywordReranker(embed, reranker)
        app = create_app(server, configs, loaded=loaded)
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
    assert one.chunking_strategy.static.max_chunk_size_tokens == 248     # MiniLM reads 256
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


def test_files_show_the_chunking_their_chunks_are_cut_with(app_for):
    """Chunks are cut to what the embedding model reads (MiniLM: 256 tokens, 8 left for its
    markers): a file shows the sizes used, from its attaching, not the sizes asked."""
    client = sdk(app_for())
    a, b, c, d = (upload(client, f"{n}.txt", DOCS["tax.md"]) for n in "abcd")
    store = client.vector_stores.create(file_ids=[a])       # auto: OpenAI's 800 / 400

    def chunking(file_id: str) -> tuple[int, int]:
        found = client.vector_stores.files.retrieve(file_id, vector_store_id=store.id)
        static = found.chunking_strategy.static
        return static.max_chunk_size_tokens, static.chunk_overlap_tokens

    def static(size: int, overlap: int) -> dict:
        return {"type": "static", "static": {"max_chunk_size_tokens": size,
                                             "chunk_overlap_tokens": overlap}}
    made = client.vector_stores.files.create(store.id, file_id=b,
                                             chunking_strategy=static(1000, 100))
    assert made.chunking_strategy.static.max_chunk_size_tokens == 248
    client.vector_stores.file_batches.create(store.id, files=[
        {"file_id": c, "chunking_strategy": static(200, 100)}])
    client.vector_stores.file_batches.create(store.id, file_ids=[d],
                                             chunking_strategy=static(4000, 2000))
    want = {a: (248, 124), b: (248, 100), c: (200, 100), d: (248, 124)}
    assert {f: chunking(f) for f in want} == want
    assert settled(client, store.id).file_counts.completed == 4
    assert {f: chunking(f) for f in want} == want
    listed = {f.id: f.chunking_strategy.static.max_chunk_size_tokens
              for f in client.vector_stores.files.list(store.id)}
    assert listed == {f: size for f, (size, _) in want.items()}


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
    ({"query": "x", "ranking_options": {"hybrid_search": {
        "embedding_weight": 1, "text_weight": 1}}}, "ranking_options.hybrid_search"),
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
        assert (row["chunk_size"], row["chunk_overlap"]) == (248, 124)  # as MiniLM reads
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


# -- ranking_options.ranker -----------------------------------------------------------------

LAMP = "Who keeps the lamp of the lighthouse?"


def _search(http: TestClient, store_id: str, **body) -> list[dict]:
    r = http.post(f"/v1/vector_stores/{store_id}/search", json={"query": LAMP, **body})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_the_served_reranker_re_scores_a_search(app_for):
    http = app_for(reranker="soup")
    client, store, ids = ingested(http)
    cosine = _search(http, store.id, ranking_options={"ranker": "none"})
    assert cosine[0]["file_id"] == ids["lighthouse.md"]
    soup_cosine = next(r["score"] for r in cosine if r["file_id"] == ids["soup.txt"])
    assert soup_cosine < 0.5
    for options in (None, {"ranker": "auto"}, {"ranker": "default-2024-11-15"},
                    {"ranker": RANK}):
        found = _search(http, store.id, **({"ranking_options": options} if options else {}))
        assert [(r["file_id"], r["score"]) for r in found] == [
            (ids["soup.txt"], 0.9), *[(f, 0.2) for f in (r["file_id"] for r in cosine)
                                      if f != ids["soup.txt"]]], options
    rank_engine = http.app.state.models.entry(RANK).engine.engine
    assert rank_engine.queries[-1].split() == "who keeps the lamp of the lighthouse ?".split()
    # score_threshold bounds the reranker's score, not the cosine that found the chunk
    kept = _search(http, store.id, ranking_options={"score_threshold": 0.5})
    assert [r["file_id"] for r in kept] == [ids["soup.txt"]]
    sdk_kept = client.vector_stores.search(store.id, query=LAMP, max_num_results=1,
                                           ranking_options={"ranker": "auto"})
    assert [r.file_id for r in sdk_kept] == [ids["soup.txt"]]


def test_an_embedding_model_ranks_as_v1_rerank_scores(app_for):
    http = app_for(reranker="soup")
    _, store, ids = ingested(http)
    found = _search(http, store.id, ranking_options={"ranker": EMBED})
    texts = [r["content"][0]["text"] for r in found]
    rerank = http.post("/v1/rerank", json={"model": EMBED, "query": LAMP,
                                            "documents": texts}).json()["results"]
    want = {texts[r["index"]]: r["relevance_score"] for r in rerank}
    assert [(r["content"][0]["text"], r["score"]) for r in found] == \
        sorted(want.items(), key=lambda kv: -kv[1])
    assert found[0]["file_id"] == ids["lighthouse.md"]


@pytest.mark.parametrize("ranker", ["nope", SERVED])
def test_a_ranker_that_names_no_served_reranker_is_a_400(app_for, ranker):
    http = app_for([SEARCH, ANSWER], reranker="soup")
    store = sdk(http).vector_stores.create()
    r = http.post(f"/v1/vector_stores/{store.id}/search",
                  json={"query": "x", "ranking_options": {"ranker": ranker}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ranking_options.ranker"
    assert repr(ranker) in r.json()["error"]["message"]
    r = http.post("/v1/responses", json={"model": SERVED, "input": "x", "tools": [{
        "type": "file_search", "vector_store_ids": [store.id],
        "ranking_options": {"ranker": ranker}}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tools[0].ranking_options.ranker"
    assert not http.engine.requests          # the model never ran


def test_file_search_ranks_with_the_tools_ranking_options(app_for):
    http = app_for([SEARCH, ANSWER, SEARCH, ANSWER, SEARCH, ANSWER], reranker="soup")
    _, store, ids = ingested(http)

    def results(**options) -> list[tuple[str, float]]:
        tool = {"type": "file_search", "vector_store_ids": [store.id], **options}
        r = http.post("/v1/responses", json={"model": SERVED, "input": "Who keeps the lamp?",
                                             "tools": [tool],
                                             "include": ["file_search_call.results"]})
        assert r.status_code == 200, r.text
        return [(x["file_id"], x["score"]) for x in r.json()["output"][0]["results"]]
    assert results()[0] == (ids["soup.txt"], 0.9)
    assert results(ranking_options={"ranker": "none"})[0][0] == ids["lighthouse.md"]
    assert results(ranking_options={"ranker": "auto", "score_threshold": 0.5}) == [
        (ids["soup.txt"], 0.9)]


# -- expiry ---------------------------------------------------------------------------------

def _expire_now(http: TestClient, store_id: str) -> None:
    """The store's expiry moved to a second ago, as the days passing would."""
    with http.app.state.store.engine.begin() as db:
        db.execute(sa.text("UPDATE podium_vector_stores SET expires_days = 1, expires_at = :t "
                           "WHERE id = :id"), {"t": int(time.time()) - 1, "id": store_id})


def _chunk_rows(http: TestClient, store_id: str) -> int:
    with http.app.state.store.engine.connect() as db:
        return db.execute(sa.select(sa.func.count()).select_from(chunks).where(
            chunks.c.store_id == store_id)).scalar()


def test_an_expired_store_is_emptied_and_refuses_searches(app_for):
    http = app_for()
    client, store, ids = ingested(http)
    assert _chunk_rows(http, store.id) == 3
    _expire_now(http, store.id)
    expired = client.vector_stores.retrieve(store.id)
    assert expired.status == "expired" and expired.usage_bytes == 0
    assert expired.file_counts.total == 0 and expired.file_counts.completed == 0
    assert _chunk_rows(http, store.id) == 0          # pruned from the database
    assert [s.status for s in client.vector_stores.list()] == ["expired"]
    assert list(client.vector_stores.files.list(store.id)) == []
    with pytest.raises(openai.BadRequestError) as refused:
        client.vector_stores.search(store.id, query="lighthouse")
    assert refused.value.body["param"] == "vector_store_id"
    assert "expired" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.vector_stores.files.create(store.id, file_id=ids["tax.md"])
    with pytest.raises(openai.BadRequestError) as refused:      # it cannot be revived
        client.vector_stores.update(store.id, expires_after={"anchor": "last_active_at",
                                                             "days": 7})
    assert refused.value.body["param"] == "expires_after"
    renamed = client.vector_stores.update(store.id, name="old")
    assert renamed.name == "old" and renamed.status == "expired"
    r = http.post("/v1/responses", json={"model": SERVED, "input": "x", "tools": [{
        "type": "file_search", "vector_store_ids": [store.id]}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tools[0].vector_store_ids[0]"
    assert client.vector_stores.delete(store.id).deleted


def test_the_ingestor_sweeps_expired_stores_unread(app_for, monkeypatch):
    monkeypatch.setattr(vector_ingest, "SWEEP_SECONDS", 0.05)
    http = app_for()
    client, store, ids = ingested(http)
    assert _chunk_rows(http, store.id) == 3
    _expire_now(http, store.id)
    deadline = time.monotonic() + 10
    while _chunk_rows(http, store.id):          # nothing reads the store meanwhile
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with http.app.state.store.engine.connect() as db:
        assert db.execute(sa.text("SELECT count(*) FROM podium_vector_store_files WHERE "
                                  "store_id = :id"), {"id": store.id}).scalar() == 0
