"""Ollama's /api/chat and /api/generate on the scripted engine: every field and error, read
by the official ``ollama`` client's own types (0.6.3)."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import ollama
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.test_errors import FailingEngine
from tests.server.test_responses import CALL, THINK

CHAT, GENERATE = "/api/chat", "/api/generate"
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
COUNTERS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
            "eval_count", "eval_duration")


def chat(**extra):
    return {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}], **extra}


def gen(**extra):
    return {"model": SERVED, "prompt": "Hi", **extra}


def lines(r) -> list[dict]:
    """An NDJSON body's objects (each line one object, the body ending with a newline)."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-ndjson"
    assert r.text.endswith("\n") and "\n\n" not in r.text
    return [json.loads(line) for line in r.text.splitlines()]


def error(r, status: int, says: str | None = None) -> str:
    """Ollama's error shape: ``{"error": "message"}`` and nothing else."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str)
    if says is not None:
        assert says in body["error"], body["error"]
    return body["error"]


@pytest.fixture
def app(tokenizer, chat_template):
    """``app(replies, template=..., **settings)``: a TestClient on a scripted engine (the
    default model's template unless ``template``), its engine as ``.engine``."""
    from starlette.testclient import TestClient

    def build(replies, template=None, context=4096, engine_class=ScriptedEngine,
              delay=0.0, **settings):
        engine = engine_class(tokenizer, ModelInfo(SERVED, context, template or chat_template,
                                                   0), replies, delay=delay)
        client = TestClient(create_app(Settings(**settings), engine),
                            raise_server_exceptions=False)
        client.engine = engine
        return client
    return build


class _Through(httpx.BaseTransport):
    """httpx (the ``ollama`` client's) to the app through a TestClient (httpx2's); each
    answer whole, its lines read as they would arrive."""

    def __init__(self, client):
        self._client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self._client.request(request.method, request.url.path, content=request.read(),
                                 headers=dict(request.headers))
        return httpx.Response(r.status_code, headers=r.headers.multi_items(), content=r.content)


def sdk(client) -> ollama.Client:
    """The official client, speaking to the app."""
    return ollama.Client(host="http://testserver", transport=_Through(client))


def prompt_of(client) -> str:
    return client.engine.tokenizer.decode(client.engine.requests[-1].prompt_token_ids)


# -- the answer, streamed and not -----------------------------------------------------------

def test_chat_answer_through_the_official_client(app):
    c = app(["Hello there, how can I help?"] * 2)
    answer = sdk(c).chat(model=SERVED, messages=[{"role": "user", "content": "Hi"}])
    assert answer.message.role == "assistant"
    assert answer.message.content == "Hello there, how can I help?"
    assert answer.done and answer.done_reason == "stop"
    assert answer.eval_count == len(c.engine.tokenizer.encode(
        "Hello there, how can I help?", add_special=False)) + 1        # + end of turn
    assert answer.prompt_eval_count == len(c.engine.requests[-1].prompt_token_ids)
    parts = list(sdk(c).chat(model=SERVED, messages=[{"role": "user", "content": "Hi"}],
                             stream=True))
    assert "".join(p.message.content for p in parts) == answer.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == answer.eval_count


def test_generate_answer_through_the_official_client(app):
    c = app(["Blue, mostly."] * 2)
    answer = sdk(c).generate(model=SERVED, prompt="Why is the sky blue?", system="Be brief.")
    assert answer.response == "Blue, mostly." and answer.done_reason == "stop"
    assert c.engine.requests[-1].prompt_token_ids == c.engine.tokenizer.encode(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        "Why is the sky blue?<|im_end|>\n<|im_start|>assistant\n")
    assert answer.context is None          # no context: Podium does not take it back
    parts = list(sdk(c).generate(model=SERVED, prompt="Why is the sky blue?", stream=True))
    assert "".join(p.response for p in parts) == "Blue, mostly."
    assert parts[-1].done and parts[-1].response == ""


REPLIES = ["Plain text, nothing else.",
           "<think>First, the weather.</think>It is sunny.",
           f"<think>Need a tool.</think>Checking.{CALL}",
           f"{CALL}{CALL}",
           "ünïcödé \"quotes\" \\ and\ttabs\n"]


@pytest.mark.parametrize("reply", REPLIES)
@pytest.mark.parametrize("path", [CHAT, GENERATE])
def test_the_stream_folds_to_the_answer(app, reply, path):
    """A streamed answer's objects, folded, are the non-stream answer (counters aside)."""
    c = app([reply] * 2, template=THINK)
    body = chat(tools=WEATHER) if path == CHAT else gen()
    objs = lines(c.post(path, json=body))
    answer = c.post(path, json={**body, "stream": False}).json()
    (ollama.ChatResponse if path == CHAT else ollama.GenerateResponse).model_validate(answer)
    *chunks, last = objs
    assert all(o["done"] is False for o in chunks) and last["done"] is True
    assert len({o["created_at"] for o in chunks}) <= 1      # the time the answer began
    said = [o.get("message", o) for o in chunks]
    text_field = "content" if path == CHAT else "response"
    folded = {text_field: "".join(s[text_field] for s in said)}
    thinking = "".join(s.get("thinking", "") for s in said)
    if thinking:
        folded["thinking"] = thinking
    calls = [call for s in said for call in s.get("tool_calls", ())]
    if calls:
        folded["tool_calls"] = calls
    mine = answer["message"] if path == CHAT else answer
    for call in [*calls, *mine.get("tool_calls", ())]:      # ids are new per answer
        assert call.pop("id").startswith("call")
    if path == CHAT:
        assert mine.pop("role") == "assistant"
    assert {k: mine[k] for k in folded} == folded
    assert set(mine) - set(folded) <= {"model", "created_at", "done", "done_reason",
                                       *COUNTERS, "content", "response"}
    assert set(last) == set(answer) - {"thinking"} and last["done_reason"] == answer["done_reason"]
    for k in ("prompt_eval_count", "eval_count"):
        assert last[k] == answer[k]


def test_ndjson_lines_from_templates_are_the_bytes_of_their_dicts():
    """The per-token lines, written from their shape's template, are orjson's encoding of
    the whole object, byte for byte, whatever the text and the model's name."""
    from podium.parsing.events import ReasoningDelta, TextDelta
    from podium.render.base import filled
    from podium.render.ollama import OllamaChunks
    from podium.server.sse import NDJSON

    @settings(max_examples=200, deadline=None)
    @given(text=st.text(), model=st.text(min_size=1, max_size=30), chat=st.booleans(),
           thinking=st.booleans())
    def check(text, model, chat, thinking):
        renderer, encoder = OllamaChunks(model, chat, lambda usage: {}), NDJSON()
        event = ReasoningDelta(text) if thinking else TextDelta(text)
        for obj in renderer.event(0, event) * 2:        # the template, then its reuse
            assert encoder.encode(obj) == orjson.dumps(filled(obj)) + b"\n"
    check()


# -- tools ----------------------------------------------------------------------------------

def test_a_tool_call_is_sent_whole_with_arguments_as_an_object(app):
    c = app([f"Let me check.{CALL}"] * 2, template=THINK)
    objs = lines(c.post(CHAT, json=chat(tools=WEATHER)))
    with_calls = [o for o in objs if o["message"].get("tool_calls")]
    assert len(with_calls) == 1 and with_calls[0]["done"] is False
    [call] = with_calls[0]["message"]["tool_calls"]
    assert call["function"] == {"index": 0, "name": "get_weather",
                                "arguments": {"city": "Paris"}}
    assert call["id"].startswith("call")
    answer = sdk(c).chat(model=SERVED, messages=[{"role": "user", "content": "Weather?"}],
                         tools=WEATHER)
    assert answer.message.content == "Let me check." and answer.done_reason == "stop"
    assert answer.message.tool_calls[0].function.arguments == {"city": "Paris"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_lone_surrogate_in_a_calls_arguments_is_no_500(app, stream):
    call = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris \\ud83c"}}\n'
            "</tool_call>")
    c = app([call])
    r = c.post(CHAT, json=chat(tools=WEATHER, stream=stream))
    objs = lines(r) if stream else [r.json()]
    [called] = [o for o in objs if o["message"].get("tool_calls")]
    assert called["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris \ufffd"}


def test_a_tool_result_goes_back_by_tool_name(app):
    """The client's round trip: the call as it came (arguments an object, no id), then the
    result named by ``tool_name``; the model's template sees both."""
    c = app(["It is 11 degrees in Toronto."])
    answer = sdk(c).chat(model=SERVED, tools=WEATHER, messages=[
        {"role": "user", "content": "Weather in Toronto?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Toronto"}}}]},
        {"role": "tool", "content": "11 degrees celsius", "tool_name": "get_weather"}])
    assert answer.message.content == "It is 11 degrees in Toronto."
    prompt = prompt_of(c)
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Toronto"}}\n'
            '</tool_call>') in prompt
    assert "<tool_response>\n11 degrees celsius\n</tool_response>" in prompt


def test_tool_results_are_matched_to_their_calls(app):
    from podium.api.ollama.chat import _messages
    from podium.protocol.ollama import ChatRequest

    req = ChatRequest.model_validate(chat(messages=[
        {"role": "user", "content": "Two cities"},
        {"role": "assistant", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "A"}}},
            {"id": "mine", "function": {"name": "get_time", "arguments": {}}},
            {"function": {"name": "get_weather", "arguments": {"city": "B"}}}]},
        {"role": "tool", "content": "time", "tool_name": "get_time"},
        {"role": "tool", "content": "a", "tool_name": "get_weather"},
        {"role": "tool", "content": "b"},
        {"role": "tool", "content": "given", "tool_call_id": "x7"}]))
    messages = _messages(req)
    ids = [c.id for c in messages[1].tool_calls]
    assert ids == ["call_1_0", "mine", "call_1_2"]
    assert [m.tool_call_id for m in messages[2:]] == ["mine", "call_1_0", "call_1_2", "x7"]
    assert messages[1].tool_calls[0].arguments == '{"city":"A"}'


# -- think ----------------------------------------------------------------------------------

def test_think_puts_reasoning_in_thinking(app):
    c = app(["<think>Sunny, says the sky.</think>It is sunny."] * 3, template=THINK)
    answer = sdk(c).chat(model=SERVED, messages=[{"role": "user", "content": "Weather?"}],
                         think=True)
    assert answer.message.thinking == "Sunny, says the sky."
    assert answer.message.content == "It is sunny."
    default = c.post(GENERATE, json=gen(stream=False)).json()     # absent: thinks when able
    assert default["thinking"] == "Sunny, says the sky." and default["response"] == "It is sunny."
    off = sdk(c).chat(model=SERVED, messages=[{"role": "user", "content": "Weather?"}],
                      think=False)
    # off is a budget of 0: a model that thinks anyway has its <think> closed at once
    assert off.message.thinking is None and off.message.content == "It is sunny."


def test_think_refused_on_a_model_that_cannot_think(app):
    c = app(["ok"] * 2)
    for think in (True, "low", "high", "max"):
        error(c.post(CHAT, json=chat(think=think)), 400, f'"{SERVED}" does not support thinking')
        error(c.post(GENERATE, json=gen(think=think)), 400, "does not support thinking")
    with pytest.raises(ollama.ResponseError) as e:
        sdk(c).chat(model=SERVED, messages=[{"role": "user", "content": "Hi"}], think=True)
    assert e.value.status_code == 400
    assert c.post(CHAT, json=chat(think=False, stream=False)).json()["message"]["content"] == "ok"
    error(c.post(CHAT, json=chat(think="extreme")), 400, "think")


def test_thinking_messages_go_back_into_the_prompt(app):
    c = app(["Done."], template=THINK)
    c.post(CHAT, json=chat(stream=False, messages=[
        {"role": "user", "content": "Plan?"},
        {"role": "assistant", "content": "Planned.", "thinking": "Step one, step two."},
        {"role": "user", "content": "Go"}]))
    assert "<think>Step one, step two.</think>Planned." in prompt_of(c)


# -- format ---------------------------------------------------------------------------------

def test_format_constrains_by_the_response_format_grammar(app):
    from podium.dialect.template import format_grammar
    from podium.conversation import ResponseFormat

    schema = {"type": "object", "properties": {"age": {"type": "integer"}},
              "required": ["age"]}
    c = app(['{"age": 22}'] * 4)
    answer = c.post(CHAT, json=chat(format=schema, stream=False)).json()
    assert json.loads(answer["message"]["content"]) == {"age": 22}
    assert c.engine.requests[-1].sampling.grammar == format_grammar(
        ResponseFormat("json_schema", schema, where="format"))
    c.post(GENERATE, json=gen(format="json", stream=False))
    assert c.engine.requests[-1].sampling.grammar == format_grammar(
        ResponseFormat("json_object"))
    c.post(GENERATE, json=gen(format=schema, raw=True, stream=False))       # raw too
    assert c.engine.requests[-1].sampling.grammar is not None
    c.post(CHAT, json=chat(format="", stream=False))
    assert c.engine.requests[-1].sampling.grammar is None
    error(c.post(CHAT, json=chat(format="xml")), 400, "format")
    error(c.post(CHAT, json=chat(format={"type": "object", "properties": {"a": {"$ref": "#/x"}}})),
          400)


# -- options --------------------------------------------------------------------------------

def test_options_reach_the_engine_with_ollamas_defaults(app):
    c = app(["ok"] * 3)
    c.post(CHAT, json=chat(stream=False))
    s = c.engine.requests[-1].sampling
    assert (s.temperature, s.top_k, s.top_p) == (0.8, 40, 0.9)      # Ollama's defaults
    c.post(CHAT, json=chat(stream=False, options={
        "temperature": 0.1, "top_p": 0.5, "top_k": 7, "min_p": 0.05, "seed": 42,
        "repeat_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.25,
        "num_predict": 5, "mirostat": 1, "num_gpu": 99, "whatever": "ignored"}))
    s = c.engine.requests[-1].sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed, s.repetition_penalty,
            s.presence_penalty, s.frequency_penalty, s.max_tokens) == (
        0.1, 0.5, 7, 0.05, 42, 1.2, 0.5, 0.25, 5)
    c.post(GENERATE, json=gen(raw=True, stream=False, options={"temperature": 0, "seed": 7}))
    s = c.engine.requests[-1].sampling
    assert (s.temperature, s.seed, s.top_k) == (0, 7, 40)


@pytest.mark.parametrize("path, body", [(CHAT, chat()), (GENERATE, gen()),
                                        (GENERATE, gen(raw=True))])
def test_num_predict_stop_and_length(app, path, body):
    c = app(["The answer is 42. Goodbye and thanks"] * 3)
    cut = c.post(path, json={**body, "stream": False, "options": {"num_predict": 3}}).json()
    assert cut["done_reason"] == "length" and cut["eval_count"] == 3
    stopped = c.post(path, json={**body, "stream": False, "options": {"stop": ["Good"]}}).json()
    text = stopped["message"]["content"] if path == CHAT else stopped["response"]
    assert text == "The answer is 42. " and stopped["done_reason"] == "stop"
    ceiling = c.post(path, json={**body, "stream": False, "options": {"num_predict": 10**6}})
    assert ceiling.status_code == 200             # a ceiling: cut to the room left


def test_num_ctx_limits_the_request(app):
    c = app(["word " * 50] * 3, context=4096)
    prompt_tokens = len(app(["x"]).engine.tokenizer.encode(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"))
    answer = c.post(CHAT, json=chat(stream=False, options={"num_ctx": prompt_tokens + 4})).json()
    assert answer["prompt_eval_count"] == prompt_tokens
    assert answer["eval_count"] == 4 and answer["done_reason"] == "length"
    error(c.post(CHAT, json=chat(options={"num_ctx": 5})), 400, "options.num_ctx is 5")
    big = c.post(CHAT, json=chat(stream=False, options={"num_ctx": 1_000_000})).json()
    assert big["done_reason"] == "stop"           # the model's own context is the limit


@pytest.mark.parametrize("options, names", [
    ({"temperature": "hot"}, "options.temperature"), ({"top_p": 2}, "options.top_p"),
    ({"stop": 5}, "options.stop"), ({"num_ctx": 0}, "options.num_ctx"),
    ({"seed": "x"}, "options.seed")])
def test_bad_options_are_400_naming_them(app, options, names):
    error(app(["ok"]).post(CHAT, json=chat(options=options)), 400, names)


# -- generate: raw, suffix ------------------------------------------------------------------

def test_raw_sends_the_prompt_as_it_is_and_parses_nothing(app):
    c = app(["<think>hm</think>yes"], template=THINK)
    prompt = "<|im_start|>user\nSay yes<|im_end|>\n<|im_start|>assistant\n"
    answer = sdk(c).generate(model=SERVED, prompt=prompt, raw=True)
    assert c.engine.requests[-1].prompt_token_ids == c.engine.tokenizer.encode(prompt)
    assert answer.response == "<think>hm</think>yes" and answer.thinking is None
    for extra, param in [({"system": "s"}, "raw mode does not support"),
                         ({"suffix": "s"}, "suffix cannot be used with raw"),
                         ({"think": True}, "think cannot be used with raw")]:
        error(c.post(GENERATE, json=gen(raw=True, **extra)), 400, param)


def test_suffix_fills_in_the_middle(app):
    c = app(["    return a + b"] * 2)
    answer = sdk(c).generate(model=SERVED, prompt="def add(a, b):\n", suffix="\n\nprint(add(1, 2))",
                             system="ignored, as in Ollama's fill-in-the-middle templates")
    assert answer.response == "    return a + b"
    assert c.engine.requests[-1].prompt_token_ids == c.engine.tokenizer.encode(
        "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n\nprint(add(1, 2))<|fim_middle|>")
    # an empty prefix is still a fill-in-the-middle request, not a load
    empty = c.post(GENERATE, json=gen(prompt="", suffix="x = 1", stream=False)).json()
    assert empty["done_reason"] == "stop" and empty["response"] == "    return a + b"


def test_fim_markers_in_the_clients_code_are_text(app):
    """The code around the gap is the client's text: a ``<|fim_middle|>`` or an
    ``<|endoftext|>`` in it does not become that token (it would end the prefix early, or
    the document)."""
    c = app(["x"])
    tok = c.engine.tokenizer
    specials = {tok.encode(m, add_special=False)[0]
                for m in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|endoftext|>")}
    sdk(c).generate(model=SERVED, prompt="a = '<|fim_middle|>'\n<|endoftext|>",
                    suffix="b = '<|fim_suffix|>'")
    ids = c.engine.requests[-1].prompt_token_ids
    assert [t for t in ids if t in specials] == [tok.encode(m, add_special=False)[0] for m in
                                                 ("<|fim_prefix|>", "<|fim_suffix|>",
                                                  "<|fim_middle|>")]
    # the client's markers are there as text (the FIM tokens themselves decode to nothing)
    assert tok.decode(ids) == "a = '<|fim_middle|>'\n<|endoftext|>b = '<|fim_suffix|>'"


class NoFimTokenizer:
    """The default model's tokenizer as if its vocabulary had no fill-in-the-middle tokens
    (such markers then tokenize as plain text, several tokens each)."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def encode(self, text, *, add_special=True):
        if text.startswith("<|fim_"):
            return self._real.encode("<|", add_special=False) + self._real.encode(
                text[2:], add_special=False)
        return self._real.encode(text, add_special=add_special)


def test_suffix_on_a_model_without_fim_tokens_is_400(tokenizer, chat_template):
    from starlette.testclient import TestClient

    engine = ScriptedEngine(NoFimTokenizer(tokenizer), ModelInfo(SERVED, 4096, chat_template, 0),
                            ["ok"])
    c = TestClient(create_app(Settings(), engine), raise_server_exceptions=False)
    error(c.post(GENERATE, json=gen(suffix="tail")), 400,
          f'"{SERVED}" does not support insert')


# -- refusals and errors --------------------------------------------------------------------

@pytest.mark.parametrize("path, body, says", [
    (CHAT, chat(messages=[{"role": "user", "content": "see", "images": ["iVBORw0KGgo="]}]),
     f'"{SERVED}" does not support images'),
    (GENERATE, gen(images=["iVBORw0KGgo="]), "does not support images"),
    (GENERATE, gen(template="{{ .Prompt }}"), "template is not supported"),
    (GENERATE, gen(context=[1, 2, 3]), "context is not supported"),
    (CHAT, chat(logprobs=True), "logprobs is not supported"),
    (CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
    (CHAT, chat(messages="Hi"), "messages"),
    (CHAT, {"messages": [{"role": "user", "content": "Hi"}]}, "model"),
    (GENERATE, gen(prompt=5), "prompt"),
    (CHAT, chat(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
     "tools[0].function.name"),
    (CHAT, chat(keep_alive="5 minutes"), "keep_alive"),
    (CHAT, chat(stream="yes"), "stream"),
])
def test_client_mistakes_are_400_in_ollamas_shape(app, path, body, says):
    error(app(["ok"]).post(path, json=body), 400, says)


def test_errors_in_ollamas_shape(app):
    c = app(["ok"] * 2)
    says = error(c.post(CHAT, json=chat(model="llama3.2")), 404)
    assert says.startswith('model "llama3.2" not found, try pulling it first')
    with pytest.raises(ollama.ResponseError) as e:
        sdk(c).generate(model="llama3.2", prompt="Hi")
    assert e.value.status_code == 404 and "not found" in e.value.error
    error(c.post(CHAT, content=b"{not json", headers={"content-type": "application/json"}),
          400, "not valid JSON")
    error(c.post("/api/nothing-here", json={}), 404)
    keyed = app(["ok"], api_key=["k1"])
    error(keyed.post(CHAT, json=chat()), 401, "API key")
    assert keyed.post(CHAT, json=chat(), headers={"authorization": "Bearer k1"}).status_code == 200
    small = app(["ok"], max_body_bytes=200)
    error(small.post(CHAT, json=chat(messages=[{"role": "user", "content": "x" * 500}])), 413)


def test_a_failure_after_the_first_line_is_an_error_line(app):
    c = app(["one two three four five six"], engine_class=FailingEngine)
    objs = lines(c.post(CHAT, json=chat()))
    assert objs[-1] == {"error": "decode failed: out of memory"}
    assert "".join(o["message"]["content"] for o in objs[:-1]) == "one two three"
    with pytest.raises(ollama.ResponseError) as e:          # the client raises it
        list(sdk(app(["one two three four"], engine_class=FailingEngine)).chat(
            model=SERVED, messages=[{"role": "user", "content": "Hi"}], stream=True))
    assert "out of memory" in e.value.error


# -- load, unload, keep_alive ---------------------------------------------------------------

def test_empty_messages_or_prompt_load_and_keep_alive_0_unloads(app):
    c = app(["ok"])
    loaded = c.post(CHAT, json=chat(messages=[]))
    assert loaded.status_code == 200 and loaded.headers["content-type"] == "application/json"
    body = loaded.json()
    assert body["done"] is True and body["done_reason"] == "load"
    assert body["message"] == {"role": "assistant", "content": ""}
    ollama.ChatResponse.model_validate(body)
    assert sdk(c).generate(model=SERVED).done_reason == "load"
    unloaded = sdk(c).generate(model=SERVED, keep_alive=0)
    assert unloaded.done_reason == "unload" and unloaded.response == ""
    [entry] = c.app.state.models.entries()
    assert entry.state == "unloaded"


def test_keep_alive_is_set_for_the_model(app, monkeypatch):
    c = app(["ok"] * 2)
    seen = []
    models = c.app.state.models
    monkeypatch.setattr(models, "keep_alive", lambda name, seconds, tenant: seen.append(
        (name, seconds, tenant)))
    c.post(CHAT, json=chat(keep_alive="1h30m", stream=False))
    c.post(GENERATE, json=gen(keep_alive=-1, stream=False))
    # a server without keys: every request is the operator's
    assert seen == [(SERVED, 5400.0, False), (SERVED, float("inf"), False)]


def test_latest_tag_names_the_model(app):
    c = app(["ok"])
    assert c.post(CHAT, json=chat(model=f"{SERVED}:latest", stream=False)).status_code == 200


# -- counters, metrics, disconnects ---------------------------------------------------------

def _metric(text: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def test_counters_are_measured_and_agree_with_metrics(app):
    c = app(["one two three four"] * 3, delay=0.01)
    answers = [c.post(CHAT, json=chat(stream=False)).json(),
               lines(c.post(GENERATE, json=gen()))[-1],
               c.post(GENERATE, json=gen(raw=True, stream=False)).json()]
    for a in answers:
        assert all(isinstance(a[k], int) and a[k] >= 0 for k in COUNTERS)
        # the parts are disjoint spans of the whole
        assert a["total_duration"] >= (a["load_duration"] + a["prompt_eval_duration"]
                                       + a["eval_duration"])
        assert a["eval_duration"] >= 0.01 * (a["eval_count"] - 1) * 1e9 * 0.9   # paced steps
    text = c.get("/metrics").text
    assert _metric(text, "podium_prompt_tokens_total") == sum(
        a["prompt_eval_count"] for a in answers)
    assert _metric(text, "podium_generation_tokens_total") == sum(
        a["eval_count"] for a in answers)
    assert 'podium_requests_total{endpoint="/api/chat",status="200"} 1.0' in text
    assert 'podium_requests_total{endpoint="/api/generate",status="200"} 2.0' in text


def test_prompt_eval_count_is_the_whole_prompt_however_much_was_cached(app):
    """As Ollama's: its runner's ``numPromptInputs`` is every prompt token, taken before the
    cache is consulted (runner/ollamarunner), and its llama-server path reports
    ``cache_n + prompt_n`` (llm/llama_server.go, ``promptEvalCount``)."""
    from tests.server.test_messages_cache_control import reading

    c = app(["one two three"] * 5)
    reading(c.engine, 5)                    # each prompt's first 5 tokens from the cache
    usage = c.post("/v1/chat/completions", json=chat()).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 5
    for path, body in ((CHAT, chat(stream=False)), (GENERATE, gen(stream=False)),
                       (GENERATE, gen(raw=True, stream=False))):
        answer = c.post(path, json=body).json()
        assert answer["prompt_eval_count"] == len(c.engine.requests[-1].prompt_token_ids)
    assert lines(c.post(CHAT, json=chat()))[-1]["prompt_eval_count"] == len(
        c.engine.requests[-1].prompt_token_ids)


def test_a_quiet_stream_sends_empty_chunks_until_the_first_token(app):
    c = app(["ok"], delay=0.3, stream_keepalive_seconds=0.05)
    objs = lines(c.post(CHAT, json=chat()))
    empty = [o for o in objs if not o["done"] and o["message"]["content"] == ""]
    assert len(empty) >= 2
    assert "".join(o["message"]["content"] for o in objs) == "ok"
    for o in objs:
        ollama.ChatResponse.model_validate(o)


def test_a_client_that_leaves_stops_the_generation(app):
    """The same watch as every stream: a disconnect after two lines aborts the engine's
    request at once."""
    c = app(["word " * 500], delay=0.01)
    body = orjson.dumps(chat())
    sent, given_body = [], []
    gone = asyncio.Event()

    async def receive():
        if not given_body:
            given_body.append(1)
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if sum(m["type"] == "http.response.body" for m in sent) == 2:
            gone.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": CHAT, "raw_path": CHAT.encode(),
             "query_string": b"", "root_path": "", "state": {},
             "headers": [(b"host", b"test"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}

    async def run():
        await asyncio.wait_for(c.app(scope, receive, send), timeout=5)
        return dict(c.engine.stats)

    stats = asyncio.run(run())
    assert stats["running"] == 0
    assert stats["generated_tokens"] < 50             # nowhere near the 500 words
