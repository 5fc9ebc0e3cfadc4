"""Custom tools (free text, or a grammar's language) in Responses and Chat Completions, on
the scripted engine: declared and checked, their calls in OpenAI's shapes streamed and
folded, their outputs taken back into the conversation."""

import json
import socket
import threading
import time

import openai
import pytest
import uvicorn
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import ResponseCustomToolCall

from podium.api.chat import options
from podium.api.responses.translate import ToolMap
from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.protocol.chat import ChatCompletionRequest
from podium.render.custom_input import CustomInput, call_input
from podium.server.app import create_app
from podium.server.lifecycle import Server
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.responses_check import check_stream, sse_events
from tests.server.sse import events
from tests.server.test_responses import app_for  # noqa: F401 (a fixture)

RESPONSES, CHAT = "/v1/responses", "/v1/chat/completions"
# what a patch looks like: newlines, quotes, a backslash, a tab, non-ASCII, an emoji
PATCH = '*** Begin Patch\n*** Update File: a.py\n-print("hi")\n+print("h\\u00e9 \t😀")\n' \
        '*** End Patch'
LARK = 'start: "*** Begin Patch" /(.|\\n)*/ "*** End Patch"'


def call(name: str, value: str) -> str:
    """A Hermes call of a custom tool, as the model writes it."""
    arguments = json.dumps({"input": value}, ensure_ascii=False)
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def custom(fmt: dict | None = None, name: str = "apply_patch") -> dict:
    tool = {"type": "custom", "name": name, "description": "Apply a patch"}
    return tool if fmt is None else {**tool, "format": fmt}


def chat_custom(fmt: dict | None = None, name: str = "apply_patch") -> dict:
    body = {"name": name, "description": "Apply a patch"}
    return {"type": "custom", "custom": body if fmt is None else {**body, "format": fmt}}


# -- declaring them -----------------------------------------------------------------------

def test_a_custom_tools_format_reaches_the_conversation_stage():
    tools = ToolMap([custom(), custom({"type": "text"}, "notes"),
                     custom({"type": "grammar", "syntax": "lark", "definition": LARK}, "patch"),
                     {"type": "namespace", "name": "fs", "tools": [
                         custom({"type": "grammar", "syntax": "regex", "definition": r"\d+"},
                                "count")]}]).tools
    assert [(t.name, t.grammar, t.where) for t in tools] == [
        ("apply_patch", None, "tools[0].format"), ("notes", None, "tools[1].format"),
        ("patch", ("lark", LARK), "tools[2].format"),
        ("fs__count", ("regex", r"\d+"), "tools[3].tools[0].format")]
    assert tools[0].parameters["properties"] == {"input": {"type": "string"}}
    req = ChatCompletionRequest.model_validate({
        "model": SERVED, "messages": [{"role": "user", "content": "hi"}],
        "tools": [chat_custom({"type": "grammar",
                               "grammar": {"syntax": "regex", "definition": "[a-z]+"}}),
                  {"type": "function", "function": {"name": "f"}}],
        "tool_choice": {"type": "custom", "custom": {"name": "apply_patch"}}})
    opts = options(req, 1000)
    assert [(t.name, t.grammar, t.where) for t in opts.tools] == [
        ("apply_patch", ("regex", "[a-z]+"), "tools[0].custom.format"),
        ("f", None, "tools[1].function.parameters")]
    assert opts.tool_choice == "apply_patch"


BIG = "x" * (64 * 1024 - 1) + "é"      # 64 KiB of characters, one byte over in UTF-8


@pytest.mark.parametrize("fmt, param", [
    ({"type": "grammar", "syntax": "ebnf", "definition": "a"}, "tools[0].format.syntax"),
    ({"type": "grammar", "syntax": "lark"}, "tools[0].format"),
    ({"type": "grammar", "syntax": "regex", "definition": BIG}, "tools[0].format.definition"),
    ({"type": "grammar", "syntax": "lark", "definition": 5}, "tools[0].format.definition"),
    ({"type": "json"}, "tools[0].format.type"),
    ("text", "tools[0].format"),
])
def test_responses_refuses_a_bad_format_naming_it(app_for, fmt, param):  # noqa: F811
    c = app_for(["unused"])
    r = c.post(RESPONSES, json={"model": SERVED, "input": "hi", "tools": [custom(fmt)]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("fmt, param", [
    ({"type": "grammar", "grammar": {"syntax": "ebnf", "definition": "a"}},
     "tools[0].custom.format.grammar.syntax"),
    ({"type": "grammar"}, "tools[0].custom.format"),
    ({"type": "grammar", "grammar": {"syntax": "regex", "definition": BIG}},
     "tools[0].custom.format.grammar.definition"),
    ({"type": "grammar", "syntax": "lark", "definition": "x"}, "tools[0].custom.format"),
])
def test_chat_refuses_a_bad_format_naming_it(scripted, client_for, fmt, param):
    c = client_for(scripted(["unused"]))
    r = c.post(CHAT, json={"model": SERVED, "messages": [{"role": "user", "content": "hi"}],
                           "tools": [chat_custom(fmt)]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_chat_refuses_a_custom_entry_without_its_body(scripted, client_for):
    c = client_for(scripted(["unused"]))
    for body, param in [({"tools": [{"type": "custom", "function": {"name": "f"}}]}, "tools[0]"),
                        ({"tools": [chat_custom()], "tool_choice": {"type": "custom"}},
                         "tool_choice"),
                        ({"messages": [{"role": "user", "content": "hi"},
                                       {"role": "assistant", "tool_calls": [
                                           {"id": "c", "type": "custom",
                                            "function": {"name": "f", "arguments": "{}"}}]}]},
                         "messages[1].assistant.tool_calls[0]")]:   # (the role, as ever)
        r = c.post(CHAT, json={"model": SERVED,
                               "messages": [{"role": "user", "content": "hi"}], **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# -- the calls, streamed and folded ---------------------------------------------------------

def test_responses_custom_call_events_and_object(app_for):  # noqa: F811
    c = app_for([f"Patching.{call('apply_patch', PATCH)}"])
    body = {"model": SERVED, "input": "Fix a.py",
            "tools": [custom({"type": "grammar", "syntax": "lark", "definition": LARK})]}
    folded = c.post(RESPONSES, json=body).json()
    stream = sse_events(c.post(RESPONSES, json={**body, "stream": True}).text)
    final = check_stream(stream)            # every event valid as openai's types
    item = stream_item = final["output"][1]
    assert {k: item[k] for k in ("type", "name", "input", "status")} == {
        "type": "custom_tool_call", "name": "apply_patch", "input": PATCH, "status": "completed"}
    assert item["call_id"] and item["id"].startswith("ctc_")
    ResponseCustomToolCall.model_validate(item)
    mine = [e for e in stream if e.get("item_id") == item["id"]
            or e.get("item", {}).get("id") == item["id"]]
    kinds = [e["type"] for e in mine]
    assert kinds[0] == "response.output_item.added" and kinds[-2:] == [
        "response.custom_tool_call_input.done", "response.output_item.done"]
    assert mine[0]["item"]["input"] == "" and mine[0]["item"]["status"] == "in_progress"
    deltas = [e["delta"] for e in mine if e["type"] == "response.custom_tool_call_input.delta"]
    assert len(deltas) > 5 and "".join(deltas) == PATCH       # streamed as it decodes
    assert mine[-2]["input"] == PATCH and mine[-1]["item"] == stream_item
    assert folded["output"][1]["input"] == PATCH
    assert {k: v for k, v in folded["output"][1].items() if k not in ("id", "call_id")} == {
        k: v for k, v in item.items() if k not in ("id", "call_id")}


def test_chat_custom_call_chunks_and_object(scripted, client_for):
    c = client_for(scripted([f"Patching.{call('apply_patch', PATCH)}"]))
    body = {"model": SERVED, "messages": [{"role": "user", "content": "Fix a.py"}],
            "tools": [chat_custom(), {"type": "function", "function": {"name": "read"}}]}
    completion = ChatCompletion.model_validate(c.post(CHAT, json=body).json())
    [made] = completion.choices[0].message.tool_calls
    assert (made.type, made.custom.name, made.custom.input) == ("custom", "apply_patch", PATCH)
    assert completion.choices[0].finish_reason == "tool_calls"
    chunks = events(c.post(CHAT, json={**body, "stream": True}).text)
    calls = [t for ch in chunks if ch["choices"] for t in ch["choices"][0]["delta"].get(
        "tool_calls") or ()]
    # openai's ChoiceDeltaToolCall with ``custom`` (the SDK installed here predates it)
    assert calls[0] == {"index": 0, "id": calls[0]["id"], "type": "custom",
                        "custom": {"name": "apply_patch", "input": ""}} and calls[0]["id"]
    assert all(set(t) == {"index", "custom"} and set(t["custom"]) == {"input"}
               for t in calls[1:])
    assert len(calls) > 5 and "".join(t["custom"]["input"] for t in calls) == PATCH
    for chunk in chunks:        # the rest of every chunk as openai's type
        for choice in chunk["choices"]:
            choice["delta"].pop("tool_calls", None)
        ChatCompletionChunk.model_validate(chunk)


def test_a_function_call_keeps_its_shape_beside_custom_tools(scripted, client_for):
    reply = '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>'
    c = client_for(scripted([reply]))
    r = c.post(CHAT, json={"model": SERVED, "messages": [{"role": "user", "content": "x"}],
                           "tools": [chat_custom(), {"type": "function",
                                                     "function": {"name": "read"}}]}).json()
    [made] = r["choices"][0]["message"]["tool_calls"]
    assert made["type"] == "function" and made["function"] == {
        "name": "read", "arguments": '{"path": "a.py"}'}


@pytest.fixture
def sdk(tokenizer, chat_template, tmp_path):
    """An openai client talking to Podium (uvicorn in a thread) on a scripted engine that
    answers every request with a call of ``apply_patch``."""
    engine = ScriptedEngine(tokenizer, ModelInfo(SERVED, 4096, chat_template, 0),
                            [call("apply_patch", PATCH)] * 2)
    app = create_app(Settings(store_url=f"sqlite:///{tmp_path / 'sdk.db'}"), engine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Server(uvicorn.Config(app, port=port, log_level="warning"), app.state.drain, grace=1)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    yield client
    client.close()
    server.should_exit = True
    thread.join(timeout=10)


def test_the_sdks_streams_parse_custom_calls(sdk):
    with sdk.responses.stream(model=SERVED, input="Fix a.py", tools=[custom()]) as stream:
        seen = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in seen if e.type == "response.custom_tool_call_input.delta"]
    [done] = [e for e in seen if e.type == "response.custom_tool_call_input.done"]
    assert "".join(deltas) == done.input == PATCH
    [made] = final.output
    assert isinstance(made, ResponseCustomToolCall) and (made.name, made.input) == (
        "apply_patch", PATCH)
    chunks = sdk.chat.completions.create(
        model=SERVED, messages=[{"role": "user", "content": "Fix a.py"}], stream=True,
        tools=[chat_custom()], tool_choice={"type": "custom", "custom": {"name": "apply_patch"}})
    calls = [t for chunk in chunks if chunk.choices
             for t in chunk.choices[0].delta.tool_calls or ()]
    assert calls[0].type == "custom" and part(calls[0].custom, "name") == "apply_patch"
    assert "".join(part(t.custom, "input") for t in calls) == PATCH


def part(custom, name: str):
    """A field of a chunk's ``custom``: a dict in SDKs that predate it, a model after."""
    return custom[name] if isinstance(custom, dict) else getattr(custom, name)


# -- the decoder ----------------------------------------------------------------------------

@pytest.mark.parametrize("value", [PATCH, "", "\\", '"', "\U0001F600 and \u00e9", "a" * 300])
def test_any_split_decodes_to_the_input(value):
    arguments = json.dumps({"input": value}, ensure_ascii=True, indent=1)   # \\u escapes
    for size in (1, 2, 3, 5, 7):
        decoder = CustomInput()
        said = "".join(decoder.feed(arguments[i:i + size])
                       for i in range(0, len(arguments), size))
        assert said == value and decoder.rest(decoder.result(arguments)) == ""


@pytest.mark.parametrize("arguments, said, value", [
    ('{"patch": "x"}', "", '{"patch": "x"}'),           # not a custom call's shape: whole
    ("not json", "", "not json"),
    ('{"other": 1, "input": "y"}', "", "y"),            # another key first: at the end
    ('{"input": "bad \\x escape"}', "bad ", '{"input": "bad \\x escape"}'),   # not JSON
])
def test_other_shapes_come_whole_at_the_end(arguments, said, value):
    decoder = CustomInput()
    assert "".join(decoder.feed(ch) for ch in arguments) == said
    assert decoder.result(arguments) == value == call_input(arguments)
    assert decoder.rest(value) == ("" if said else value)     # never what was not said


def test_a_call_cut_before_its_input_began_has_no_input():
    """The token limit cut a forced custom call before ``"input": "`` (the parser closes
    it as ``{}`` or ``{"input": null}``): its input is empty, not that JSON."""
    for closed in ("{}", '{"input": null}', ' { } '):
        assert call_input(closed) == "" and CustomInput().result(closed) == ""
    assert call_input('{"patch": 1}') == '{"patch": 1}'       # another shape: as written


def test_a_cut_call_keeps_what_was_decoded_and_lone_surrogates_are_replaced():
    decoder = CustomInput()
    assert decoder.feed('{"input": "half a pat') == "half a pat"
    assert decoder.result('{"input": "half a pat') == "half a pat"
    assert call_input('{"input": "x\\ud800y"}') == "x\ufffdy"
    decoder = CustomInput()
    said = "".join(decoder.feed(ch) for ch in '{"input": "x\\ud800y"}')
    assert said == "x\ufffdy"


# -- outputs back in, and continued ----------------------------------------------------------

def test_responses_custom_output_continues_by_id_and_in_conversations(app_for):  # noqa: F811
    c = app_for([call("apply_patch", PATCH), "Patched.", "Done again."])
    tools = [custom({"type": "grammar", "syntax": "lark", "definition": LARK})]
    first = c.post(RESPONSES, json={"model": SERVED, "input": "Fix a.py", "tools": tools}).json()
    made = first["output"][0]
    answer = {"type": "custom_tool_call_output", "call_id": made["call_id"], "output": "ok"}
    second = c.post(RESPONSES, json={"model": SERVED, "tools": tools, "input": [answer],
                                     "previous_response_id": first["id"]})
    assert second.status_code == 200, second.text
    prompt = c.engine.tokenizer.decode(c.engine.requests[-1].prompt_token_ids)
    assert json.dumps({"input": PATCH}, ensure_ascii=False) in prompt and "ok" in prompt
    items = c.get(f"{RESPONSES}/{second.json()['id']}/input_items?order=asc").json()["data"]
    assert [i["type"] for i in items] == ["custom_tool_call_output"]

    conv = c.post("/v1/conversations", json={"items": [
        {"role": "user", "content": "Fix a.py"}, {k: made[k] for k in (
            "type", "call_id", "name", "input")}, answer]}).json()
    third = c.post(RESPONSES, json={"model": SERVED, "tools": tools, "input": "Again?",
                                    "conversation": conv["id"]})
    assert third.status_code == 200, third.text
    prompt = c.engine.tokenizer.decode(c.engine.requests[-1].prompt_token_ids)
    assert json.dumps({"input": PATCH}, ensure_ascii=False) in prompt and "ok" in prompt
    listed = c.get(f"/v1/conversations/{conv['id']}/items?order=asc").json()["data"]
    assert [i["type"] for i in listed][:3] == ["message", "custom_tool_call",
                                               "custom_tool_call_output"]


def test_chat_takes_custom_calls_back_in_the_history(scripted, client_for):
    engine = scripted(["Patched."])
    r = client_for(engine).post(CHAT, json={
        "model": SERVED, "tools": [chat_custom()], "messages": [
            {"role": "user", "content": "Fix a.py"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "custom",
                 "custom": {"name": "apply_patch", "input": PATCH}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "applied"}]})
    assert r.status_code == 200, r.text
    prompt = engine.tokenizer.decode(engine.requests[0].prompt_token_ids)
    assert json.dumps({"input": PATCH}, ensure_ascii=False) in prompt and "applied" in prompt


def test_under_auto_a_grammar_custom_tool_constrains_any_call_the_model_starts(
        scripted, client_for):
    """``tool_choice: auto`` (what Codex sends): with a custom tool of a grammar offered to
    a Hermes model, the request carries the grammar of text then calls; with none, none."""
    engine = scripted(["Hello."])
    c = client_for(engine)
    fmt = {"type": "grammar", "grammar": {"syntax": "lark", "definition": LARK}}
    body = {"model": SERVED, "messages": [{"role": "user", "content": "Fix a.py"}],
            "tools": [chat_custom(fmt), {"type": "function", "function": {"name": "read"}}]}
    r = c.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    grammar = engine.requests[-1].sampling.grammar
    assert grammar.startswith("start: podium_text (") and "podium_ct0_input" in grammar
    c.post(CHAT, json={**body, "tools": [chat_custom(), body["tools"][1]]})
    assert engine.requests[-1].sampling.grammar is None         # free text: nothing to hold
    c.post(CHAT, json={**body, "tool_choice": "none"})
    assert engine.requests[-1].sampling.grammar is None
    c.post(CHAT, json={**body, "response_format": {"type": "json_object"}})
    assert "podium_text" not in engine.requests[-1].sampling.grammar    # the format's own


def test_held_calls_are_read_only_from_the_markup(scripted, client_for):
    """Where the grammar holds the calls (auto, a custom tool of a grammar), a call written
    as bare JSON text escaped it: it stays text, not a call the grammar never checked."""
    bare = '{"name": "apply_patch", "arguments": {"input": "echo hi > a.txt"}}'
    fmt = {"type": "grammar", "grammar": {"syntax": "lark", "definition": LARK}}
    c = client_for(scripted([bare, bare]))
    body = {"model": SERVED, "messages": [{"role": "user", "content": "Fix a.py"}],
            "tools": [chat_custom(fmt)]}
    message = c.post(CHAT, json=body).json()["choices"][0]["message"]
    assert message.get("tool_calls") is None and message["content"] == bare
    free = c.post(CHAT, json={**body, "tools": [chat_custom()]}).json()["choices"][0]
    assert free["message"]["tool_calls"][0]["custom"]["input"] == "echo hi > a.txt"
