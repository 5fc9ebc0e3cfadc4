"""gpt-oss (Harmony) through both APIs, from token ids rendered by openai-harmony.

Each case replays a real Harmony token sequence through the scripted engine and checks the
Chat Completions answer (folded and streamed) and the Responses answer (object and events)
at several chunkings: one token per step up to the whole reply at once.
"""

from __future__ import annotations

import datetime
import json

import openai_harmony as oh
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from starlette.testclient import TestClient

from podium.server.app import create_app
from podium.settings import Settings
from tests.harmony import harness as h
from tests.server.responses_check import check_stream, sse_events
from tests.server.sse import events
from tests.server.test_chat_parsing import fold_stream

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                 "parameters": WEATHER}},
              {"type": "function", "function": {"name": "get_time",
                                                 "parameters": {"type": "object"}}}]
RESP_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather",
               "parameters": WEATHER},
              {"type": "function", "name": "get_time", "parameters": {"type": "object"}}]
STEPS = [1, 2, 5, 1000]

# name -> (reply tokens, expected content, reasoning, calls, finish)
CASES = {
    "plain": (h.completion(h.final("Hello! How can I help?")),
              "Hello! How can I help?", "", [], "stop"),
    "reasoning": (h.completion(h.analysis("Simple greeting; answer politely. é🌍"),
                               h.final("Hi there 👋")),
                  "Hi there 👋", "Simple greeting; answer politely. é🌍", [], "stop"),
    "one_call": (h.completion(h.analysis("Need the weather."),
                              h.call("get_weather", '{"city":"Paris"}')),
                 "", "Need the weather.", [("get_weather", '{"city":"Paris"}')], "tool_calls"),
    "two_calls": (h.completion(h.analysis("Weather and time."),
                               h.call("get_weather", '{"city": "Rome"}'),
                               h.call("get_time", "{}")),
                  "", "Weather and time.",
                  [("get_weather", '{"city": "Rome"}'), ("get_time", "{}")], "tool_calls"),
    "preamble": (h.completion(h.analysis("Look it up."), h.preamble("Let me check the weather."),
                              h.call("get_weather", '{"city":"Oslo"}')),
                 "Let me check the weather.", "Look it up.",
                 [("get_weather", '{"city":"Oslo"}')], "tool_calls"),
}


@pytest.fixture
def serve(tmp_path):
    clients = []

    def build(replies, **pacing) -> TestClient:
        settings = Settings(store_url=f"sqlite:///{tmp_path / f'r{len(clients)}.db'}")
        engine = h.engine(replies, **pacing)
        client = TestClient(create_app(settings, engine), raise_server_exceptions=False)
        client.__enter__()
        client.engine = engine
        clients.append(client)
        return client
    yield build
    for client in clients:
        client.__exit__(None, None, None)


def chat_body(**extra):
    return {"model": h.SERVED, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": CHAT_TOOLS, **extra}


def fold_chat(body: dict) -> tuple:
    message, choice = body["choices"][0]["message"], body["choices"][0]
    calls = [(c["function"]["name"], c["function"]["arguments"])
             for c in message.get("tool_calls") or ()]
    return (message["content"] or "", message.get("reasoning_content") or "", calls,
            choice["finish_reason"])


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("case", CASES)
def test_chat_folded_and_streamed(serve, case, step):
    reply, *expected = CASES[case]
    client = serve([reply], tokens_per_step=step)
    whole = client.post("/v1/chat/completions", json=chat_body())
    assert whole.status_code == 200, whole.text
    ChatCompletion.model_validate(whole.json())
    assert fold_chat(whole.json()) == tuple(expected)
    assert whole.json()["usage"]["completion_tokens"] == len(reply)
    streamed = client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert fold_stream(events(streamed.text)) == tuple(expected)
    for calls in (json.loads(args) for _, args in expected[2]):
        assert isinstance(calls, dict)


def response_summary(body: dict) -> tuple:
    content, reasoning, calls = "", "", []
    for item in body["output"]:
        if item["type"] == "message":
            content += "".join(p["text"] for p in item["content"])
        elif item["type"] == "reasoning":
            reasoning += "".join(p["text"] for p in item.get("content") or ())
        elif item["type"] == "function_call":
            calls.append((item["name"], item["arguments"]))
    return content, reasoning, calls


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("case", CASES)
def test_responses_object_and_stream(serve, case, step):
    reply, content, reasoning, calls, _ = CASES[case]
    client = serve([reply], tokens_per_step=step)
    ask = {"model": h.SERVED, "input": "Weather in Paris?", "tools": RESP_TOOLS}
    whole = client.post("/v1/responses", json=ask)
    assert whole.status_code == 200, whole.text
    Response.model_validate(whole.json())
    assert whole.json()["status"] == "completed"
    assert response_summary(whole.json()) == (content, reasoning, calls)
    usage = whole.json()["usage"]
    assert usage["output_tokens"] == len(reply)
    assert (usage["output_tokens_details"]["reasoning_tokens"] > 0) == bool(reasoning)
    streamed = client.post("/v1/responses", json={**ask, "stream": True})
    final = check_stream(sse_events(streamed.text))
    assert final["status"] == "completed"
    assert response_summary(final) == (content, reasoning, calls)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.integers(1, 40), case=st.sampled_from(sorted(CASES)))
def test_any_chunking_streams_the_same(serve, step, case):
    reply, *expected = CASES[case]
    client = serve([reply], tokens_per_step=step)
    streamed = client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert fold_stream(events(streamed.text)) == tuple(expected)


def test_cut_at_max_tokens_mid_call_and_mid_message(serve):
    reply = CASES["preamble"][0]
    for cut in range(1, len(reply)):
        client = serve([reply])
        body = client.post("/v1/chat/completions", json=chat_body(max_tokens=cut)).json()
        assert body["choices"][0]["finish_reason"] == "length", (cut, body)
        content, reasoning, calls, _ = fold_chat(body)
        assert "<|" not in content + reasoning
        for _, arguments in calls:
            json.loads(arguments)             # closed as valid JSON
        streamed = fold_stream(events(client.post(
            "/v1/chat/completions", json=chat_body(max_tokens=cut, stream=True)).text))
        assert streamed == (content, reasoning, calls, "length")
        resp = client.post("/v1/responses", json={"model": h.SERVED, "input": "Weather?",
                                                  "tools": RESP_TOOLS, "max_output_tokens": cut})
        assert resp.status_code == 200
        assert resp.json()["status"] == "incomplete"
        assert resp.json()["incomplete_details"] == {"reason": "max_output_tokens"}



def test_stop_string_in_the_final_text(serve):
    client = serve([h.completion(h.analysis("Count."), h.final("one, two, three, four"))])
    body = client.post("/v1/chat/completions", json=chat_body(stop=[", three"])).json()
    assert fold_chat(body) == ("one, two", "Count.", [], "stop")


def test_undeclared_function_is_not_shown(serve):
    reply = h.completion(h.call("rm_rf", "{}"))
    client = serve([reply])
    body = client.post("/v1/chat/completions", json=chat_body(tools=None)).json()
    assert body["choices"][0]["message"].get("tool_calls") in (None, [])
    assert body["choices"][0]["finish_reason"] == "stop"


def test_malformed_output_recovers_at_the_next_message(serve):
    enc = h.encoding()
    garbage = enc.encode("<|channel|>final<|message|>Hi<|end|>stray text", allowed_special="all")
    rest = h.completion(h.analysis("x"), h.final("Recovered."))
    reply = garbage + enc.encode("<|start|>assistant", allowed_special="all") + rest
    client = serve([reply])
    body = client.post("/v1/chat/completions", json=chat_body()).json()
    assert body["choices"][0]["message"]["content"] == "HiRecovered."


def test_refuses_what_it_cannot_enforce(serve):
    client = serve([h.completion(h.final("x"))])
    custom = {"type": "custom", "custom": {"name": "patch", "format": {
        "type": "grammar", "grammar": {"syntax": "regex", "definition": "[a-z]+"}}}}
    r = client.post("/v1/chat/completions", json=chat_body(
        tools=[custom], tool_choice={"type": "custom", "custom": {"name": "patch"}}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


# -- prompts ----------------------------------------------------------------------------

def expected_prompt(effort: oh.ReasoningEffort, instructions: str | None, tools: bool,
                    history: list[oh.Message]) -> list[int]:
    """openai-harmony's own rendering of the conversation."""
    system = (oh.SystemContent.new().with_reasoning_effort(effort)
              .with_conversation_start_date(datetime.date.today().isoformat()))
    messages = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
    developer = oh.DeveloperContent.new()
    if instructions:
        developer = developer.with_instructions(instructions)
    if tools:
        developer = developer.with_function_tools([
            oh.ToolDescription.new("get_weather", "Weather", parameters=WEATHER),
            oh.ToolDescription.new("get_time", "", parameters={"type": "object"})])
    messages.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer))
    conversation = oh.Conversation.from_messages(messages + history)
    return h.encoding().render_conversation_for_completion(conversation, oh.Role.ASSISTANT)


def user(text):
    return oh.Message.from_role_and_content(oh.Role.USER, text)


def tool_result(name, text):
    return (oh.Message.from_author_and_content(oh.Author.new(oh.Role.TOOL, f"functions.{name}"),
                                               text)
            .with_channel("commentary").with_recipient("assistant"))


HISTORY = [user("Weather in Paris?"), h.analysis("Need the weather."),
           h.call("get_weather", '{"city":"Paris"}'), tool_result("get_weather", '{"temp": 21}'),
           h.analysis("It is 21."), h.final("It is 21 °C in Paris."), user("And in Rome?"),
           h.analysis("Call again."), h.call("get_weather", '{"city":"Rome"}'),
           tool_result("get_weather", '{"temp": 25}')]
# the same conversation as gpt-oss should see it: answered turns without their reasoning
ANSWERED = [m for i, m in enumerate(HISTORY) if i not in (1, 4)]


def test_chat_multi_turn_prompt_matches_openai_harmony(serve):
    client = serve([h.completion(h.final("It is 25 °C in Rome."))])
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Need the weather.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "It is 21 °C in Paris.", "reasoning_content": "It is 21."},
        {"role": "user", "content": "And in Rome?"},
        {"role": "assistant", "reasoning_content": "Call again.", "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "get_weather",
                                                           "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c2", "content": '{"temp": 25}'},
    ]
    r = client.post("/v1/chat/completions", json={"model": h.SERVED, "messages": messages,
                                                   "tools": CHAT_TOOLS, "reasoning_effort": "high"})
    assert r.status_code == 200, r.text
    assert fold_chat(r.json()) == ("It is 25 °C in Rome.", "", [], "stop")
    prompt = client.engine.requests[-1].prompt_token_ids
    want = expected_prompt(oh.ReasoningEffort.HIGH, "Answer briefly.", True, ANSWERED)
    assert h.encoding().decode_utf8(prompt) == h.encoding().decode_utf8(want)
    assert prompt == want
    # the answered turn's reasoning is dropped (a final followed it); the open turn's is kept
    text = h.encoding().decode_utf8(prompt)
    assert "Need the weather." not in text and "Call again." in text


def test_prompt_after_a_final_answer_is_openai_harmonys_own(serve):
    """Where openai-harmony drops answered reasoning itself, the prompts agree verbatim."""
    client = serve([h.completion(h.final("Bye."))])
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "reasoning_content": "Need the weather.",
                 "tool_calls": [{"id": "c1", "type": "function", "function": {
                     "name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
                {"role": "assistant", "content": "It is 21 °C in Paris.",
                 "reasoning_content": "It is 21."},
                {"role": "user", "content": "Thanks"}]
    r = client.post("/v1/chat/completions", json={"model": h.SERVED, "messages": messages,
                                                   "tools": CHAT_TOOLS})
    assert r.status_code == 200
    history = HISTORY[:6] + [user("Thanks")]
    want = expected_prompt(oh.ReasoningEffort.MEDIUM, None, True, history)
    assert client.engine.requests[-1].prompt_token_ids == want
    assert "Need the weather." not in h.encoding().decode_utf8(want)


def test_responses_multi_turn_prompt_matches_openai_harmony(serve):
    client = serve([h.completion(h.analysis("Need the weather."),
                                 h.call("get_weather", '{"city":"Paris"}')),
                    h.completion(h.analysis("It is 21."), h.final("It is 21 °C in Paris.")),
                    h.completion(h.analysis("Call again."),
                                 h.call("get_weather", '{"city":"Rome"}')),
                    h.completion(h.final("It is 25 °C in Rome."))])
    engine = client.engine
    base = {"model": h.SERVED, "tools": RESP_TOOLS, "instructions": "Answer briefly.",
            "reasoning": {"effort": "low"}}
    first = client.post("/v1/responses", json={**base, "input": "Weather in Paris?"}).json()
    (call,) = [i for i in first["output"] if i["type"] == "function_call"]
    second = client.post("/v1/responses", json={**base, "previous_response_id": first["id"],
                                                "input": [{"type": "function_call_output",
                                                           "call_id": call["call_id"],
                                                           "output": '{"temp": 21}'}]}).json()
    assert response_summary(second)[0] == "It is 21 °C in Paris."
    third = client.post("/v1/responses", json={**base, "previous_response_id": second["id"],
                                               "input": "And in Rome?"}).json()
    (call,) = [i for i in third["output"] if i["type"] == "function_call"]
    fourth = client.post("/v1/responses", json={**base, "previous_response_id": third["id"],
                                                "input": [{"type": "function_call_output",
                                                           "call_id": call["call_id"],
                                                           "output": '{"temp": 25}'}]}).json()
    assert fourth["status"] == "completed"
    assert response_summary(fourth)[0] == "It is 25 °C in Rome."
    want = expected_prompt(oh.ReasoningEffort.LOW, "Answer briefly.", True, ANSWERED)
    assert engine.requests[-1].prompt_token_ids == want


def test_detection(chat_template):
    from podium.engine.base import ModelInfo
    from podium.harmony.format import is_harmony

    assert is_harmony(ModelInfo("m", 1, None, 0, {"general.architecture": "gpt-oss"}))
    harmony_template = ("{{ '<|start|>' + m.role + '<|channel|>final<|message|>' + m.content "
                        "+ '<|end|>' }}")
    assert is_harmony(ModelInfo("m", 1, harmony_template, 0, {"general.architecture": "x"}))
    assert not is_harmony(ModelInfo("m", 1, chat_template, 0, {"general.architecture": "qwen2"}))


def test_reasoning_effort_and_response_format_reach_the_prompt(serve):
    client = serve([h.completion(h.final('{"ok": true}'))])
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    r = client.post("/v1/chat/completions", json={
        "model": h.SERVED, "messages": [{"role": "user", "content": "ok?"}],
        "reasoning_effort": "low",
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer",
                                                                   "schema": schema}}})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == '{"ok": true}'
    text = h.encoding().decode_utf8(client.engine.requests[-1].prompt_token_ids)
    assert "Reasoning: low" in text
    assert '# Response Formats\n\n## answer\n\n{"type":"object"' in text
