"""Streams stay alive while a request waits for its first token (queued, or a long prefill).

Each API sends what its clients' idle timers count, and what their SDKs still parse: a
``response.in_progress`` event in Responses (the response so far; of OpenAI's published
event set, so strict SDKs parse it, where OpenAI's own undocumented ``keepalive`` type broke
several; Codex's timer, which counts SSE events, restarts), a ``ping`` event in Messages, an
SSE comment in Chat and Completions (dropped by every SSE parser, so ``chunk.choices[0]``
never meets an empty chunk; counted by the byte-level timers those clients have). The
scripted engine is made slow to its first token (``start_gate``), and
``--stream-keepalive-seconds`` small.
"""

from __future__ import annotations

import asyncio
import json

import anthropic
import openai
import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter
from starlette.testclient import TestClient

from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.responses_check import sse_events

WAIT, EVERY = 0.75, 0.2         # seconds to the first token; between keep-alives
REPLY = "Hello there, friend"
CHAT = {"model": SERVED, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
RESPONSE_EVENT = TypeAdapter(ResponseStreamEvent)
MESSAGE_EVENT = TypeAdapter(RawMessageStreamEvent)


@pytest.fixture
def slow(scripted, tmp_path):
    """A TestClient on a scripted engine that takes ``WAIT`` s to its first token."""
    def build(every: float = EVERY, **settings) -> TestClient:
        engine = scripted([REPLY])
        engine.start_gate = lambda: asyncio.sleep(WAIT)
        app = create_app(Settings(stream_keepalive_seconds=every,
                                  store_url=f"sqlite:///{tmp_path / 'keep.db'}", **settings),
                         engine)
        return TestClient(app, raise_server_exceptions=False)
    return build


def frames(body: str) -> list[str]:
    return [f for f in body.split("\n\n") if f.strip()]


def expected_ticks() -> range:
    """How many keep-alives fit in the wait: WAIT // EVERY (3); on a loaded machine the
    wait can stretch, or the first tick come late: from 2 (more than one) to 5."""
    return range(2, int(WAIT // EVERY) + 3)


# -- Chat Completions and Completions: SSE comments -------------------------------------------

def test_chat_stream_sends_comments_until_the_first_token(slow):
    body = slow().post("/v1/chat/completions", json=CHAT).text
    parts = frames(body)
    comments = [i for i, f in enumerate(parts) if f.startswith(":")]
    assert len(comments) in expected_ticks(), parts
    assert all(parts[i] == ": keepalive" for i in comments)
    # after the role chunk, before any content: the wait for the first token
    role = json.loads(parts[0][len("data: "):])
    assert role["choices"][0]["delta"]["role"] == "assistant"
    first_text = next(i for i, f in enumerate(parts)
                      if f.startswith("data: {") and '"content":"H' in f)
    assert comments == list(range(1, first_text))
    assert parts[-1] == "data: [DONE]"


def test_chat_sdk_never_sees_the_keepalive(slow):
    """The openai SDK drops comments: every chunk it yields has a choice."""
    http = slow()
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                        max_retries=0)
    chunks = list(sdk.chat.completions.create(model=SERVED, stream=True,
                                              messages=CHAT["messages"]))
    assert chunks and all(len(c.choices) == 1 for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == REPLY


def test_several_choices_each_keep_the_stream_alive(slow):
    body = slow().post("/v1/chat/completions", json={**CHAT, "n": 2}).text
    parts = frames(body)
    assert len([f for f in parts if f == ": keepalive"]) >= 2 * expected_ticks().start
    chunks = [json.loads(f[len("data: "):]) for f in parts if f.startswith("data: {")]
    for index in (0, 1):
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                       if c["choices"] and c["choices"][0]["index"] == index)
        assert text == REPLY


def test_completions_stream_sends_comments_and_the_sdk_parses_it(slow):
    http = slow()
    body = http.post("/v1/completions", json={"model": SERVED, "prompt": "Say hi",
                                               "stream": True}).text
    parts = frames(body)
    comments = [i for i, f in enumerate(parts) if f == ": keepalive"]
    assert len(comments) in expected_ticks() and comments[0] == 0, parts
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                        max_retries=0)
    chunks = list(sdk.completions.create(model=SERVED, prompt="Say hi", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == REPLY


def test_no_keepalive_when_the_setting_is_0(slow):
    parts = frames(slow(every=0).post("/v1/chat/completions", json=CHAT).text)
    assert not [f for f in parts if f.startswith(":")]


def test_the_setting_refuses_a_negative_interval():
    with pytest.raises(ValueError, match="stream-keepalive-seconds"):
        Settings(stream_keepalive_seconds=-1)
    assert Settings.from_sources(["--stream-keepalive-seconds", "2.5"],
                                 {}).stream_keepalive_seconds == 2.5


# -- Responses: response.in_progress again -------------------------------------------------

def responses_body(**extra) -> dict:
    return {"model": SERVED, "input": "hi", "stream": True, **extra}


def keepalive_ticks(events: list[dict]) -> list[int]:
    """Where the keep-alives are: ``response.in_progress`` after the opening pair."""
    return [i for i, e in enumerate(events) if e["type"] == "response.in_progress" and i > 1]


def test_responses_stream_sends_keepalive_events_in_sequence(slow):
    events = sse_events(slow().post("/v1/responses", json=responses_body()).text)
    kinds = [e["type"] for e in events]
    ticks = keepalive_ticks(events)
    assert len(ticks) in expected_ticks(), kinds
    # between response.in_progress and the first output, numbered like any event
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert ticks == list(range(2, 2 + len(ticks)))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "keepalive" not in kinds
    for i in ticks:     # the response as it stands: nothing generated yet
        assert events[i]["response"]["id"] == events[0]["response"]["id"]
        assert events[i]["response"]["status"] == "in_progress"
        assert events[i]["response"]["output"] == []
    for event in events:    # every event one of OpenAI's published set
        RESPONSE_EVENT.validate_python(event)
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == REPLY


def test_responses_sdk_streams_parse_the_keepalive(slow):
    http = slow()
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                        max_retries=0)
    raw = list(sdk.responses.create(model=SERVED, input="hi", stream=True))
    kinds = [e.type for e in raw]
    assert kinds.count("response.in_progress") - 1 in expected_ticks(), kinds
    assert {type(e).__name__ for e in raw if e.type == "response.in_progress"} == {
        "ResponseInProgressEvent"}             # parsed as the SDK's own type
    with sdk.responses.stream(model=SERVED, input="hi") as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds.count("response.in_progress") > 1 and final.output_text == REPLY


def test_a_stored_streams_keepalives_are_in_its_log(slow):
    """Followers of a stored stream (GET ?stream=true, any replica) read the same events,
    keep-alives included: a follower waiting on a long prefill stays alive too."""
    http = slow()
    live = sse_events(http.post("/v1/responses", json=responses_body(store=True)).text)
    rid = live[0]["response"]["id"]
    replay = sse_events(http.get(f"/v1/responses/{rid}", params={"stream": "true"}).text)
    assert [e["type"] for e in replay] == [e["type"] for e in live]
    assert [e["sequence_number"] for e in replay] == list(range(len(live)))
    assert len(keepalive_ticks(replay)) in expected_ticks()


def test_a_non_streamed_response_is_unchanged(slow):
    body = slow().post("/v1/responses", json=responses_body(stream=False)).json()
    assert body["status"] == "completed" and body["output"][0]["content"][0]["text"] == REPLY


# -- Messages: ping events ------------------------------------------------------------------

def test_messages_stream_pings_at_the_setting(slow):
    http = slow()
    body = http.post("/v1/messages", json={"model": SERVED, "max_tokens": 50, "stream": True,
                                           "messages": [{"role": "user", "content": "hi"}]})
    events = sse_events(body.text)
    kinds = [e["type"] for e in events]
    # message_start and its ping, then one ping each EVERY s until the first block
    first_block = kinds.index("content_block_start")
    assert kinds[0] == "message_start"
    assert set(kinds[1:first_block]) == {"ping"}
    assert first_block - 2 in expected_ticks(), kinds
    for event in events:
        if event["type"] != "ping":
            MESSAGE_EVENT.validate_python(event)
    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=http,
                              max_retries=0)
    with sdk.messages.stream(model=SERVED, max_tokens=50,
                             messages=[{"role": "user", "content": "hi"}]) as stream:
        message = stream.get_final_message()
    assert message.content[0].text == REPLY
