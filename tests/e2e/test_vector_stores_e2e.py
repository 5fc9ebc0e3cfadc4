"""Vector stores and ``file_search`` on the real default model beside all-MiniLM-L6-v2, one
``podium serve`` of both, driven by the official openai SDK: files uploaded, a store made of
them and ingested in the background, searched, then a Responses call that searches it and
cites the right file, and the OpenAI Agents SDK's ``FileSearchTool`` doing the same through
an ``Agent`` (one server for the module). Then a replica killed (-9) mid-ingestion: the file
is ingested after the restart; and two replicas on one PostgreSQL database (skipped, saying
so in one line, without one): a file attached through one is ingested once, by one of
them, and searched alike from both."""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, podium_process, podium_serve
from tests.store.conftest import postgres_url

EMBED = "minilm"
DOCS = {
    "lighthouse.md": "# Harrow Point lighthouse\n\nThe lighthouse at Harrow Point was built "
                     "in 1871. Its lamp is kept by Ada Morrow, who climbs 212 steps each "
                     "evening to light it.",
    "soup.txt": "Leek and potato soup: soften two leeks in butter, add three potatoes and "
                "a litre of stock, simmer for twenty minutes, then blend until smooth.",
    "tax.md": "Quarterly tax filings are due fifteen days after the quarter ends. A late "
              "filing pays a penalty of two percent of the tax owed.",
}
ARGS = ("--model", MODEL, "--model", f"{EMBED}=all-minilm-l6-v2", "--ctx-size", "4096",
        "--log-level", "warning")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("vs") / "podium.db"
    with podium_serve(*ARGS, "--store-url", f"sqlite:///{db}") as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    sdk = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    yield sdk
    sdk.close()


def upload(client: openai.OpenAI, name: str, text: str) -> str:
    return client.files.create(file=(name, io.BytesIO(text.encode())),
                               purpose="user_data").id


def settled(client: openai.OpenAI, store_id: str, seconds: float = 120.0):
    deadline = time.monotonic() + seconds
    while True:
        store = client.vector_stores.retrieve(store_id)
        if store.status != "in_progress":
            return store
        assert time.monotonic() < deadline, store.file_counts
        time.sleep(0.2)


@pytest.fixture(scope="module")
def store(client):
    ids = {name: upload(client, name, text) for name, text in DOCS.items()}
    made = client.vector_stores.create(name="docs", file_ids=list(ids.values()))
    for name, file_id in ids.items():
        client.vector_stores.files.update(file_id, vector_store_id=made.id,
                                          attributes={"kind": name.rsplit(".", 1)[1]})
    return settled(client, made.id), ids


def test_a_store_is_ingested_and_searched(client, store):
    made, ids = store
    assert made.status == "completed" and made.file_counts.completed == 3
    results = list(client.vector_stores.search(made.id,
                                               query="Who keeps the lamp at Harrow Point?"))
    assert results[0].file_id == ids["lighthouse.md"] and "Ada Morrow" in \
        results[0].content[0].text
    narrowed = list(client.vector_stores.search(
        made.id, query="Who keeps the lamp at Harrow Point?",
        filters={"type": "eq", "key": "kind", "value": "txt"}))
    assert [r.file_id for r in narrowed] == [ids["soup.txt"]]


def test_a_response_searches_the_store_and_cites_the_file(client, store):
    made, ids = store
    answer = client.responses.create(
        model=MODEL, input="Who keeps the lamp of the Harrow Point lighthouse?",
        tools=[{"type": "file_search", "vector_store_ids": [made.id], "max_num_results": 2}],
        tool_choice={"type": "file_search"}, include=["file_search_call.results"],
        max_output_tokens=120, temperature=0)
    call = next(item for item in answer.output if item.type == "file_search_call")
    assert call.status == "completed" and call.queries
    assert call.results[0].file_id == ids["lighthouse.md"]
    message = answer.output[-1]
    assert message.type == "message"
    text = message.content[0].text
    assert "Ada" in text or "Morrow" in text, text
    assert ids["lighthouse.md"] in {a.file_id for a in message.content[0].annotations
                                    if a.type == "file_citation"}


def test_an_agent_with_file_search_answers_from_the_store(server, store):
    """The Agents SDK's FileSearchTool on Podium's default model (its Responses model
    pointed at Podium, tracing off): the run holds a completed file_search call with the
    lighthouse's passage first, and an answer citing that file."""
    agents = pytest.importorskip("agents")
    from agents.models.openai_responses import OpenAIResponsesModel

    made, ids = store
    agents.set_tracing_disabled(True)

    async def run() -> Any:
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused",
                                      max_retries=0) as sdk:
            agent = agents.Agent(
                name="keeper", instructions="Answer from the files you search.",
                model=OpenAIResponsesModel(MODEL, sdk),
                tools=[agents.FileSearchTool(vector_store_ids=[made.id], max_num_results=2,
                                             include_search_results=True)],
                model_settings=agents.ModelSettings(tool_choice="file_search",
                                                    temperature=0, max_tokens=400))
            return await agents.Runner.run(agent, "Who keeps the lamp of the Harrow Point "
                                                  "lighthouse?")
    result = asyncio.run(run())
    calls = [item.raw_item for item in result.new_items
             if isinstance(item, agents.ToolCallItem)
             and item.raw_item.type == "file_search_call"]
    assert calls and all(call.status == "completed" and call.queries for call in calls)
    assert calls[0].results and calls[0].results[0].file_id == ids["lighthouse.md"]
    assert "Ada Morrow" in calls[0].results[0].text
    [message] = [item.raw_item for item in result.new_items
                 if isinstance(item, agents.MessageOutputItem)]
    text = result.final_output
    assert text and ("Ada" in text or "Morrow" in text), text
    assert ids["lighthouse.md"] in {a.file_id for a in message.content[0].annotations
                                    if a.type == "file_citation"}


def test_an_ingestion_cut_by_kill_9_completes_after_the_restart(tmp_path):
    db = f"sqlite:///{tmp_path / 'podium.db'}"
    args = (*ARGS, "--store-url", db, "--response-lease-seconds", "3")
    text = " ".join(f"Paragraph {i} tells of the lighthouse keeper and the harbor."
                    for i in range(3000))
    with podium_process(*args) as (url, proc):
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        file_id = upload(sdk, "long.txt", text)
        store_id = sdk.vector_stores.create(file_ids=[file_id]).id
        time.sleep(4)                   # some of its chunks written, not all
        assert sdk.vector_stores.files.retrieve(file_id, vector_store_id=store_id
                                                ).status == "in_progress"
        proc.kill()
        proc.wait()
        sdk.close()
    with podium_serve(*args) as url:
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        done = settled(sdk, store_id, 300)
        assert done.file_counts.completed == 1, done.file_counts
        found = list(sdk.vector_stores.search(store_id, query="lighthouse keeper"))
        assert found and found[0].file_id == file_id
        sdk.close()


def embedded(url: str) -> int:
    """Inputs the replica's embedding model embedded (0 while it is not loaded)."""
    return httpx.get(f"{url}/health").json().get("engine", {}).get("requests", 0)


@pytest.fixture
def database():
    yield from postgres_url()               # skips, saying so, without PostgreSQL


def test_two_replicas_on_postgresql_ingest_a_file_once_and_both_search_it(database):
    args = ("--model", f"{EMBED}=all-minilm-l6-v2", "--store-url", database,
            "--response-lease-seconds", "3", "--log-level", "warning")
    text = " ".join(f"Note {i}: the harbor light at pier {i} is lit by keeper number {i}."
                    for i in range(120)) + " The foghorn at Harrow Point sounds every "\
        "thirty seconds when the fog rolls in."
    with podium_serve(*args) as a, podium_serve(*args) as b, \
            openai.OpenAI(base_url=f"{a}/v1", api_key="unused", max_retries=0) as sdk_a, \
            openai.OpenAI(base_url=f"{b}/v1", api_key="unused", max_retries=0) as sdk_b:
        file_id = upload(sdk_a, "harbor.txt", text)
        store_id = sdk_a.vector_stores.create(file_ids=[file_id]).id
        done = settled(sdk_b, store_id)                 # seen through the other replica
        assert done.file_counts.completed == 1 and done.usage_bytes > 0
        pieces = list(sdk_b.vector_stores.files.content(file_id, vector_store_id=store_id))
        assert len(pieces) > 3
        assert embedded(a) + embedded(b) == len(pieces)     # one replica embedded each chunk
        found = [list(sdk.vector_stores.search(store_id, query="How often does the foghorn "
                                                            "sound?", max_num_results=3))
                 for sdk in (sdk_a, sdk_b)]
        assert [(r.file_id, r.content[0].text) for r in found[0]] == \
            [(r.file_id, r.content[0].text) for r in found[1]]
        assert "foghorn" in found[0][0].content[0].text
        assert [r.score for r in found[0]] == pytest.approx([r.score for r in found[1]])
