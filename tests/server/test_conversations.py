"""The Conversations API through the official openai SDK (``client.conversations``), and
``conversation`` on ``responses.create``, against Podium served over HTTP (scripted engine)."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import uvicorn

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
from podium.server.lifecycle import Server
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.test_responses import CALL, THINK, TOOLS


class Served:
    """A Podium server (uvicorn in a thread) on a scripted engine; ``client(key)`` gives an
    openai client for an API key."""

    def __init__(self, engine: ScriptedEngine, settings: Settings):
        self.engine = engine
        self.app = create_app(settings, engine)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = Server(uvicorn.Config(self.app, port=self.port, log_level="warning"),
                             self.app.state.drain, grace=1)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        self.clients: list[openai.OpenAI] = []

    def client(self, key: str = "x") -> openai.OpenAI:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key,
                               max_retries=0)
        self.clients.append(client)
        return client

    def prompt(self, index: int = -1) -> str:
        """The text of a prompt the engine was given (the last one by default)."""
        return self.engine.tokenizer.decode(self.engine.requests[index].prompt_token_ids)

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def serve(tokenizer, tmp_path):
    servers: list[Served] = []

    def build(replies=("Hello there!",), template=THINK, delay=0.0, **settings) -> Served:
        engine = ScriptedEngine(tokenizer, ModelInfo(SERVED, 4096, template, 0), list(replies),
                                delay=delay)
        settings.setdefault("store_url", f"sqlite:///{tmp_path / 'c.db'}")
        served = Served(engine, Settings(**settings))
        served.db = tmp_path / "c.db"
        servers.append(served)
        return served
    yield build
    for served in servers:
        served.stop()


@pytest.fixture
def sdk(serve) -> openai.OpenAI:
    return serve().client()


def texts(items) -> list[str]:
    return [(item.content if isinstance(item.content, str)
             else "".join(getattr(p, "text", "") for p in item.content))
            if item.type == "message" else item.type for item in items]


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


# -- conversations ------------------------------------------------------------------------

def test_create_retrieve_update_delete(sdk):
    conv = sdk.conversations.create(metadata={"topic": "cats"}, items=[user("Hi.")])
    assert conv.id.startswith("conv_") and conv.object == "conversation"
    assert conv.metadata == {"topic": "cats"} and abs(conv.created_at - time.time()) < 5
    got = sdk.conversations.retrieve(conv.id)
    assert got.model_dump() == conv.model_dump()
    updated = sdk.conversations.update(conv.id, metadata={"topic": "dogs", "n": "2"})
    assert updated.metadata == {"topic": "dogs", "n": "2"} and updated.id == conv.id
    assert updated.created_at == conv.created_at
    assert sdk.conversations.retrieve(conv.id).metadata == {"topic": "dogs", "n": "2"}
    assert sdk.conversations.update(conv.id, metadata=None).metadata == {}
    deleted = sdk.conversations.delete(conv.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (conv.id, "conversation.deleted",
                                                             True)
    for call in (lambda: sdk.conversations.retrieve(conv.id),
                 lambda: sdk.conversations.delete(conv.id),
                 lambda: sdk.conversations.update(conv.id, metadata={}),
                 lambda: sdk.conversations.items.list(conv.id)):
        with pytest.raises(openai.NotFoundError):
            call()


def test_empty_conversation(sdk):
    conv = sdk.conversations.create()
    assert conv.metadata == {}
    page = sdk.conversations.items.list(conv.id)
    assert page.data == [] and page.has_more is False and page.last_id is None


def test_items_get_ids_and_listing_shapes(sdk):
    conv = sdk.conversations.create(items=[
        {"type": "message", "role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}],
         "id": "msg_mine"},
    ])
    added = sdk.conversations.items.create(conv.id, items=[
        {"type": "message", "role": "assistant", "content": "Calling."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ])
    assert added.object == "list" and added.has_more is False
    assert [i.type for i in added.data] == ["message", "function_call", "function_call_output"]
    assert added.first_id == added.data[0].id and added.last_id == added.data[-1].id
    assert [i.id[:3] for i in added.data] == ["msg", "fc_", "fco"]
    items = sdk.conversations.items.list(conv.id, order="asc").data
    assert [i.id for i in items][1:] == ["msg_mine", *[i.id for i in added.data]]
    first, _, answer, call, output = items
    assert first.id.startswith("msg_") and first.role == "developer"
    assert first.content[0].type == "input_text" and first.content[0].text == "Be brief."
    assert first.status == "completed"
    assert answer.content[0].type == "output_text" and answer.content[0].text == "Calling."
    assert (call.name, call.arguments, call.status) == ("get_weather", '{"city": "Paris"}',
                                                         "completed")
    assert output.output == "sunny"
    one = sdk.conversations.items.retrieve(call.id, conversation_id=conv.id)
    assert one.model_dump() == call.model_dump()


def test_items_paging_after_limit_order(sdk):
    conv = sdk.conversations.create(items=[user(f"m{i}") for i in range(20)])
    sdk.conversations.items.create(conv.id, items=[user(f"m{i}") for i in range(20, 25)])
    page = sdk.conversations.items.list(conv.id)              # desc, 20
    assert texts(page.data) == [f"m{i}" for i in range(24, 4, -1)] and page.has_more is True
    assert page.first_id == page.data[0].id and page.last_id == page.data[-1].id
    rest = sdk.conversations.items.list(conv.id, after=page.last_id)
    assert texts(rest.data) == [f"m{i}" for i in range(4, -1, -1)] and rest.has_more is False
    asc = sdk.conversations.items.list(conv.id, order="asc", limit=10)
    assert texts(asc.data) == [f"m{i}" for i in range(10)] and asc.has_more is True
    nxt = sdk.conversations.items.list(conv.id, order="asc", limit=10, after=asc.last_id)
    assert texts(nxt.data) == [f"m{i}" for i in range(10, 20)] and nxt.has_more is True
    assert texts(sdk.conversations.items.list(conv.id, order="asc", limit=100).data) == [
        f"m{i}" for i in range(25)]
    # the SDK's auto-pagination follows last_id / has_more to the end
    everything = list(sdk.conversations.items.list(conv.id, limit=7, order="asc"))
    assert texts(everything) == [f"m{i}" for i in range(25)]
    for bad in ({"limit": 0}, {"limit": 101}, {"order": "up"}):
        with pytest.raises(openai.BadRequestError) as err:
            sdk.conversations.items.list(conv.id, **bad)
        assert err.value.body["param"] == next(iter(bad))


def test_include_shows_sealed_reasoning_only_when_asked(serve):
    sdk = serve([f"<think>Look it up.</think>Looking.{CALL}"]).client()
    conv = sdk.conversations.create()
    sdk.responses.create(model=SERVED, input="Weather?", tools=TOOLS, conversation=conv.id,
                         include=["reasoning.encrypted_content"])
    (reasoning,) = [i for i in sdk.conversations.items.list(conv.id).data
                    if i.type == "reasoning"]
    assert reasoning.encrypted_content is None
    shown = [i for i in sdk.conversations.items.list(
        conv.id, include=["reasoning.encrypted_content"]).data if i.type == "reasoning"]
    assert shown[0].encrypted_content
    assert sdk.conversations.items.retrieve(reasoning.id, conversation_id=conv.id,
                                            include=["reasoning.encrypted_content"]
                                            ).encrypted_content
    with pytest.raises(openai.BadRequestError) as err:
        sdk.conversations.items.list(conv.id, include=["nonsense"])
    assert err.value.body["param"] == "include"


def test_delete_item_returns_the_conversation(sdk):
    conv = sdk.conversations.create(metadata={"a": "b"}, items=[user("one"), user("two")])
    one, two = sdk.conversations.items.list(conv.id, order="asc").data
    after = sdk.conversations.items.delete(one.id, conversation_id=conv.id)
    assert after.object == "conversation" and after.id == conv.id
    assert after.metadata == {"a": "b"}
    assert texts(sdk.conversations.items.list(conv.id).data) == ["two"]
    with pytest.raises(openai.NotFoundError) as err:
        sdk.conversations.items.retrieve(one.id, conversation_id=conv.id)
    assert err.value.body["param"] == "item_id"
    with pytest.raises(openai.NotFoundError):
        sdk.conversations.items.delete(one.id, conversation_id=conv.id)


# -- limits and errors --------------------------------------------------------------------

def bad_request(call) -> dict:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    assert err.value.status_code == 400
    body = err.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    return body["error"]


def test_item_and_metadata_limits(sdk):
    assert bad_request(lambda: sdk.conversations.create(
        items=[user("x")] * 21))["param"] == "items"
    conv = sdk.conversations.create(items=[user("x")] * 20)
    assert bad_request(lambda: sdk.conversations.items.create(
        conv.id, items=[user("x")] * 21))["param"] == "items"
    assert bad_request(lambda: sdk.conversations.items.create(
        conv.id, items=[user("x"), {"type": "message", "content": "no role"}]))[
        "param"] == "items[1]"
    assert bad_request(lambda: sdk.conversations.items.create(
        conv.id, items=[{"type": "teleport"}]))["param"] == "items[0]"
    assert bad_request(lambda: sdk.conversations.items.create(
        conv.id, items=[dict(user("x"), id="msg_" + "x" * 61)]))["param"] == "items[0].id"
    sixteen = {f"k{i}": "v" for i in range(16)}
    assert sdk.conversations.create(metadata=sixteen).metadata == sixteen
    longest = {"k" * 64: "v" * 512}
    assert sdk.conversations.update(conv.id, metadata=longest).metadata == longest
    for make in (lambda m: sdk.conversations.create(metadata=m),
                 lambda m: sdk.conversations.update(conv.id, metadata=m)):
        assert bad_request(lambda: make({f"k{i}": "v" for i in range(17)}))[
            "param"] == "metadata"
        assert bad_request(lambda: make({"k" * 65: "v"}))["param"] == "metadata"
        assert bad_request(lambda: make({"key": "v" * 513}))["param"] == "metadata.key"
        assert bad_request(lambda: make({"key": 5}))["param"].startswith("metadata")
    assert sdk.conversations.retrieve(conv.id).metadata == longest     # unchanged
    assert len(sdk.conversations.items.list(conv.id, limit=100).data) == 20


def test_missing_conversations_and_items_are_404_in_openai_shape(sdk):
    for call in (lambda: sdk.conversations.retrieve("conv_nope"),
                 lambda: sdk.conversations.update("conv_nope", metadata={}),
                 lambda: sdk.conversations.delete("conv_nope"),
                 lambda: sdk.conversations.items.list("conv_nope"),
                 lambda: sdk.conversations.items.create("conv_nope", items=[user("x")]),
                 lambda: sdk.conversations.items.retrieve("msg_x", conversation_id="conv_nope"),
                 lambda: sdk.conversations.items.delete("msg_x", conversation_id="conv_nope")):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        body = err.value.response.json()["error"]
        assert body["type"] == "invalid_request_error" and body["param"] == "conversation_id"
        assert "conv_nope" in body["message"]
    conv = sdk.conversations.create()
    for call in (lambda: sdk.conversations.items.retrieve("msg_x", conversation_id=conv.id),
                 lambda: sdk.conversations.items.delete("msg_x", conversation_id=conv.id)):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.body["param"] == "item_id"
    with pytest.raises(openai.NotFoundError) as err:
        sdk.responses.create(model=SERVED, input="hi", conversation="conv_nope")
    assert err.value.body["param"] == "conversation"


def test_another_keys_conversation_is_not_found(serve):
    served = serve(api_key=["key-a", "key-b"])
    a, b = served.client("key-a"), served.client("key-b")
    conv = a.conversations.create(metadata={"who": "a"}, items=[user("secret")])
    item = a.conversations.items.list(conv.id).data[0]
    calls = (lambda: b.conversations.retrieve(conv.id),
             lambda: b.conversations.update(conv.id, metadata={"who": "b"}),
             lambda: b.conversations.items.list(conv.id),
             lambda: b.conversations.items.create(conv.id, items=[user("mine")]),
             lambda: b.conversations.items.retrieve(item.id, conversation_id=conv.id),
             lambda: b.conversations.items.delete(item.id, conversation_id=conv.id),
             lambda: b.responses.create(model=SERVED, input="hi", conversation=conv.id),
             lambda: b.conversations.delete(conv.id))
    for call in calls:
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert conv.id in err.value.body["message"]
    assert a.conversations.retrieve(conv.id).metadata == {"who": "a"}
    assert texts(a.conversations.items.list(conv.id).data) == ["secret"]
    # B's own 404 for an id that never existed reads the same
    with pytest.raises(openai.NotFoundError) as err:
        b.conversations.retrieve("conv_" + "0" * 24)
    assert err.value.body["message"].replace("0" * 24, conv.id[5:]) == (
        f"Conversation with id '{conv.id}' not found.")


# -- responses in a conversation ----------------------------------------------------------

def test_conversation_with_previous_response_id_is_400(sdk):
    conv = sdk.conversations.create()
    first = sdk.responses.create(model=SERVED, input="hi")
    error = bad_request(lambda: sdk.responses.create(
        model=SERVED, input="again", conversation=conv.id, previous_response_id=first.id))
    assert error["param"] == "conversation"
    assert bad_request(lambda: sdk.responses.create(
        model=SERVED, input="x", conversation={"nope": 1}))["param"] == "conversation"
    assert sdk.conversations.items.list(conv.id).data == []
    # a response made in a conversation is continued through the conversation
    turn = sdk.responses.create(model=SERVED, input="hi", conversation=conv.id)
    error = bad_request(lambda: sdk.responses.create(model=SERVED, input="next",
                                                     previous_response_id=turn.id))
    assert error["param"] == "previous_response_id" and conv.id in error["message"]


def test_failed_turns_append_nothing(serve):
    served = serve()
    conversations = served.app.state.conversations
    conv = served.client().conversations.create()
    for status in ("failed", "cancelled", "in_progress", "queued"):
        response = {"status": status, "output": [{"id": "msg_out", "type": "message",
                                                  "role": "assistant", "content": []}]}
        assert not asyncio.run(conversations.append_turn(conv.id, "", response, [
            {"id": "msg_in", "type": "message", "role": "user", "content": "x"}]))
    assert served.client().conversations.items.list(conv.id).data == []


def test_turns_are_appended_and_come_before_the_input(serve):
    served = serve(["Noted, Tiberius.", "Your cat is Tiberius."])
    sdk = served.client()
    conv = sdk.conversations.create(items=[
        {"type": "message", "role": "developer", "content": "Answer in five words."}])
    first = sdk.responses.create(model=SERVED, input="My cat is called Tiberius.",
                                 conversation=conv.id)
    assert first.conversation is not None and first.conversation.id == conv.id
    assert first.previous_response_id is None
    assert sdk.responses.retrieve(first.id).conversation.id == conv.id
    prompt = served.prompt()
    assert prompt.index("Answer in five words.") < prompt.index("My cat is called Tiberius.")
    # the {"id": ...} form, streamed: the turn is in the conversation by the terminal event
    seen = []
    with sdk.responses.create(model=SERVED, input="What is my cat called?",
                              conversation={"id": conv.id}, stream=True) as stream:
        for event in stream:
            if event.type == "response.completed":
                assert event.response.conversation.id == conv.id
                listed = sdk.conversations.items.list(conv.id, order="asc").data
                assert texts(listed)[-2:] == ["What is my cat called?",
                                              "Your cat is Tiberius."]
                seen.append(event)
    assert len(seen) == 1
    prompt = served.prompt()
    for earlier in ("Answer in five words.", "My cat is called Tiberius.", "Noted, Tiberius."):
        assert prompt.index(earlier) < prompt.index("What is my cat called?")
    items = sdk.conversations.items.list(conv.id, order="asc").data
    assert texts(items) == ["Answer in five words.", "My cat is called Tiberius.",
                            "Noted, Tiberius.", "What is my cat called?",
                            "Your cat is Tiberius."]
    assert [i.role for i in items] == ["developer", "user", "assistant", "user", "assistant"]
    assert items[2].id == first.output[0].id and items[2].content[0].type == "output_text"
    # the response keeps its own input items only
    assert texts(sdk.responses.input_items.list(first.id).data) == ["My cat is called Tiberius."]


def test_tool_turns_append_reasoning_calls_and_outputs(serve):
    served = serve([f"<think>Look it up.</think>Looking.{CALL}", "It is sunny."])
    sdk = served.client()
    conv = sdk.conversations.create()
    r = sdk.responses.create(model=SERVED, input="Weather in Paris?", tools=TOOLS,
                             conversation=conv.id)
    call = r.output[-1]
    sdk.responses.create(model=SERVED, tools=TOOLS, conversation=conv.id, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    items = sdk.conversations.items.list(conv.id, order="asc").data
    assert [i.type for i in items] == ["message", "reasoning", "message", "function_call",
                                       "function_call_output", "message"]
    assert "Look it up." in served.prompt() and "sunny" in served.prompt()


def test_store_false_background_and_incomplete_append_cancelled_does_not(serve):
    served = serve(["one two three four five six seven eight"], delay=0.02)
    sdk = served.client()
    conv = sdk.conversations.create()
    unstored = sdk.responses.create(model=SERVED, input="unstored", store=False,
                                    conversation=conv.id)
    assert unstored.conversation.id == conv.id
    cut = sdk.responses.create(model=SERVED, input="short", max_output_tokens=2,
                               conversation=conv.id)
    assert cut.status == "incomplete"
    bg = sdk.responses.create(model=SERVED, input="background", background=True,
                              conversation=conv.id)
    assert bg.conversation.id == conv.id
    deadline = time.monotonic() + 10
    while sdk.responses.retrieve(bg.id).status != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    inputs = [t for t in texts(sdk.conversations.items.list(conv.id, order="asc").data)]
    assert inputs[0::2] == ["unstored", "short", "background"]
    assert len(inputs) == 6
    before = len(inputs)
    stopped = sdk.responses.create(model=SERVED, input="stopped", background=True,
                                   conversation=conv.id)
    time.sleep(0.05)
    assert sdk.responses.cancel(stopped.id).status == "cancelled"
    assert len(sdk.conversations.items.list(conv.id, limit=100).data) == before


def test_a_deleted_conversation_takes_no_more_turns(serve):
    served = serve(["one two three four five"], delay=0.05)
    sdk = served.client()
    conv = sdk.conversations.create()
    bg = sdk.responses.create(model=SERVED, input="hi", background=True, conversation=conv.id)
    sdk.conversations.delete(conv.id)
    deadline = time.monotonic() + 10
    while sdk.responses.retrieve(bg.id).status != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(openai.NotFoundError):
        sdk.conversations.items.list(conv.id)


def test_concurrent_turns_append_in_order_each_together(serve):
    served = serve([f"<think>Look it up.</think>Looking.{CALL}"], delay=0.005)
    sdk = served.client()
    conv = sdk.conversations.create(items=[user("start")])

    def turn(i: int, stream: bool):
        if stream:
            with sdk.responses.create(model=SERVED, input=f"turn {i}", tools=TOOLS,
                                      conversation=conv.id, stream=True) as events:
                return [e for e in events][-1].response.id
        return sdk.responses.create(model=SERVED, input=f"turn {i}", tools=TOOLS,
                                    conversation=conv.id).id

    with ThreadPoolExecutor(10) as pool:     # all at once: turns, and items added meanwhile
        turns_run = [pool.submit(turn, i, i % 2 == 0) for i in range(6)]
        added = [pool.submit(sdk.conversations.items.create, conv.id,
                             items=[user(f"extra {i}a"), user(f"extra {i}b")])
                 for i in range(4)]
        ids = [f.result() for f in turns_run]
        assert all(len(f.result().data) == 2 for f in added)
    items = list(sdk.conversations.items.list(conv.id, order="asc", limit=100))
    assert texts(items)[0] == "start" and len(items) == 1 + 6 * 4 + 4 * 2
    rest, turns, extras = items[1:], [], []
    while rest:         # each response's four items together: input, reasoning, text, call
        if texts(rest)[0].startswith("extra"):
            assert texts(rest[:2]) == [texts(rest)[0][:-1] + "a", texts(rest)[0][:-1] + "b"]
            extras.append(texts(rest)[0]), rest.__delitem__(slice(0, 2))
            continue
        assert [i.type for i in rest[:4]] == ["message", "reasoning", "message",
                                              "function_call"]
        turns.append(texts(rest)[0])
        del rest[:4]
    assert sorted(turns) == [f"turn {i}" for i in range(6)] and len(extras) == 4
    # every response's output items are in the conversation, under their own ids
    listed = {i.id for i in items}
    for rid in ids:
        assert {o.id for o in sdk.responses.retrieve(rid).output} <= listed


# -- items are validated as responses.create validates its input ------------------------

IMAGE = {"type": "message", "role": "user", "content": [
    {"type": "input_text", "text": "What is this?"},
    {"type": "input_image", "image_url": "https://example.com/cat.png"}]}
APPROVAL = {"type": "mcp_approval_request", "id": "mcpr_mine", "server_label": "calc",
            "name": "delete_everything", "arguments": "{}"}


def test_items_are_refused_as_responses_input_is(serve):
    """Each item responses.create refuses, the Conversations API refuses with the same
    message, its param naming ``items[i]`` where responses.create names ``input[i]``."""
    served = serve([f"<think>Look it up.</think>Looking.{CALL}"])
    sdk = served.client()
    conv = sdk.conversations.create(items=[dict(user("first"), id="msg_taken")])
    forged = {"type": "reasoning", "summary": [],
              "encrypted_content": "podium.v2." + "A" * 60}
    cases = [(forged, "[1].encrypted_content"), (IMAGE, "[1].content[1]"),
             (dict(user("x"), status="hacked"), "[1].status"),
             ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}",
               "status": "done"}, "[1].status"),
             (APPROVAL, "[1]")]
    for item, where in cases:
        made = refused_both(sdk, conv.id, item, where)
        assert made["message"] == bad_request(lambda: sdk.conversations.create(
            items=[user("x"), item]))["message"]
    # ids: unique within the conversation, whether already there or twice in one request
    error = bad_request(lambda: sdk.conversations.items.create(
        conv.id, items=[user("x"), dict(user("again"), id="msg_taken")]))
    assert error["param"] == "items[1].id" and "msg_taken" in error["message"]
    error = bad_request(lambda: sdk.responses.create(
        model=SERVED, conversation=conv.id, input=[dict(user("again"), id="msg_taken")]))
    assert error["param"] == "input[0].id" and "msg_taken" in error["message"]
    error = bad_request(lambda: sdk.conversations.create(
        items=[dict(user("a"), id="msg_twice"), dict(user("b"), id="msg_twice")]))
    assert error["param"] == "items[1].id"
    # nothing was stored, and the conversation still answers
    assert texts(sdk.conversations.items.list(conv.id).data) == ["first"]
    assert sdk.responses.create(model=SERVED, input="go", conversation=conv.id,
                                tools=TOOLS).status == "completed"
    assert len(served.engine.requests) == 1


def refused_both(sdk, conversation_id: str, item: dict, where: str) -> dict:
    """``item`` refused by responses.create and by items.create alike."""
    by_responses = bad_request(lambda: sdk.responses.create(
        model=SERVED, input=[user("x"), item], store=False))
    by_items = bad_request(lambda: sdk.conversations.items.create(
        conversation_id, items=[user("x"), item]))
    assert by_responses["param"] == "input" + where and by_items["param"] == "items" + where
    assert by_responses["message"] == by_items["message"]
    return by_items


def test_a_seal_from_another_key_is_refused_as_a_forged_one(serve):
    served = serve(["<think>Key A's plan.</think>Done."], api_key=["key-a", "key-b"])
    a, b = served.client("key-a"), served.client("key-b")
    reasoning = a.responses.create(model=SERVED, input="hi", store=False,
                                   include=["reasoning.encrypted_content"]).output[0]
    item = {"type": "reasoning", "summary": [], "encrypted_content": reasoning.encrypted_content}
    mine = a.conversations.create(items=[     # its own key's: taken
        user("hi"), item, {"type": "message", "role": "assistant", "content": "Done."}])
    theirs = b.conversations.create()
    stolen = bad_request(lambda: b.conversations.items.create(theirs.id, items=[item]))
    forged = bad_request(lambda: b.conversations.items.create(theirs.id, items=[dict(
        item, encrypted_content=item["encrypted_content"][:-4] + "AAAA")]))
    assert stolen == forged and stolen["param"] == "items[0].encrypted_content"
    assert a.responses.create(model=SERVED, input="more", conversation=mine.id).status == (
        "completed")
    assert "Key A's plan." in served.prompt()


@pytest.mark.parametrize("stored, what", [
    ({"type": "reasoning", "summary": [], "encrypted_content": "podium.v2.forged"},
     "encrypted_content"),
    (dict(user("x"), status="hacked"), "status"),
    (dict(user("x"), id="msg_first"), "id")])
def test_a_bad_item_stored_earlier_is_a_400_naming_conversation_and_item(serve, stored, what):
    served = serve()
    sdk = served.client()
    conv = sdk.conversations.create(items=[dict(user("hello"), id="msg_first")])
    store = served.app.state.conversations._store
    # Podium's own approval request (stored by a turn) is no fault
    assert asyncio.run(store.append(conv.id, "", [dict(APPROVAL, id="mcpr_podium")]))
    # old data: stored before items were checked (the store takes what it is given)
    bad = dict(stored, id=stored.get("id") or "item_old")
    with sqlite3.connect(served.db) as db:
        db.execute("INSERT INTO podium_conversation_items VALUES (?, 2, ?, ?)",
                   (conv.id, bad["id"], json.dumps(bad)))
        db.execute("UPDATE podium_conversations SET next_position = 3")
    error = bad_request(lambda: sdk.responses.create(model=SERVED, input="go",
                                                     conversation=conv.id))
    assert error["param"] == "conversation"
    assert conv.id in error["message"] and repr(bad["id"]) in error["message"]
    assert f"items[2].{what}" in error["message"]
    assert len(served.engine.requests) == 0
    if what != "id":        # the way out the message names: delete the item
        sdk.conversations.items.delete(bad["id"], conversation_id=conv.id)
        assert sdk.responses.create(model=SERVED, input="go",
                                    conversation=conv.id).status == "completed"


# -- retention (the store itself: tests/store/test_conversations.py) ----------------------

def test_start_up_prunes_conversations_past_retention(serve, tmp_path):
    served = serve()
    conv = served.client().conversations.create(items=[user("old")])
    served.stop()
    with sqlite3.connect(tmp_path / "c.db") as db:      # last updated long ago
        db.execute("UPDATE podium_conversations SET updated_at = 0")
    again = serve(response_retention_days=30)
    with pytest.raises(openai.NotFoundError):
        again.client().conversations.retrieve(conv.id)
