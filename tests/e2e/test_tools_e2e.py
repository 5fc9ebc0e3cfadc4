"""Tool calls and structured output on the real default model, through the openai SDK."""

import json
import re

import jsonschema
import pytest

from tests.e2e.conftest import MODEL

WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                           "description": "Current weather in a city"}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME,
                                           "description": "Current time in a time zone"}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


def streamed_calls(stream):
    """Fold streamed tool-call deltas, checking the streaming contract on the way."""
    calls, finish, content = {}, None, ""
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or ():
            if d.index not in calls:
                assert d.id and d.type == "function" and d.function.name
                calls[d.index] = {"name": d.function.name, "arguments": d.function.arguments or ""}
            else:
                assert d.id is None and d.function.name is None   # once, in the first delta
                calls[d.index]["arguments"] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, content


@pytest.mark.parametrize("stream", [False, True])
def test_required_gives_a_schema_valid_call(client, stream):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a joke."}],
              tools=TOOLS, tool_choice="required", max_tokens=120, seed=3)
    if stream:
        calls, finish, content = streamed_calls(client.chat.completions.create(stream=True, **kw))
    else:
        r = client.chat.completions.create(**kw)
        message, finish, content = r.choices[0].message, r.choices[0].finish_reason, None
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in message.tool_calls]
    assert finish == "tool_calls" and calls and not content
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_is_called_and_finishes_stop(client, stream):
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=80,
              tool_choice={"type": "function", "function": {"name": "get_time"}})
    if stream:
        calls, finish, _ = streamed_calls(client.chat.completions.create(stream=True, **kw))
    else:
        r = client.chat.completions.create(**kw)
        finish = r.choices[0].finish_reason
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in r.choices[0].message.tool_calls]
    assert finish == "stop" and [c["name"] for c in calls] == ["get_time"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), TIME)


def test_json_schema_output_validates(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer", "minimum": 0}},
              "required": ["name", "age"], "additionalProperties": False}
    for stream in (False, True):
        kw = dict(model=MODEL, max_tokens=60, seed=5,
                  messages=[{"role": "user", "content": "Invent a person."}],
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": "person", "schema": schema,
                                                   "strict": True}})
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(stream=True, **kw) if c.choices)
        else:
            text = client.chat.completions.create(**kw).choices[0].message.content
        jsonschema.validate(json.loads(text), schema)


def test_json_object_output_parses(client):
    r = client.chat.completions.create(model=MODEL, max_tokens=400, seed=2,
                                       response_format={"type": "json_object"},
                                       messages=[{"role": "user", "content": "Describe a cat."}])
    # a stream cut by max_tokens cannot close its object: room enough to end on its own
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_auto_tool_call_from_the_default_model(client):
    """The small default model answers a tool request on its own (no constraint)."""
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=80,
                                       temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(choice.message.tool_calls[0].function.arguments)["city"] == "Paris"
    assert not choice.message.content        # no markup leaked into content


def test_full_tool_round_trip(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                           tool_choice="required", max_tokens=80, seed=1)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id,
         "content": json.dumps({"temperature": 21, "sky": "sunny"})}]
    # the client wants the answer now: no more calls. (What a 0.5B model says is its own
    # business; the protocol is what is checked.)
    final = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS,
                                           tool_choice="none", max_tokens=60, temperature=0)
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.content and not choice.message.tool_calls
    # the call and its result were part of the prompt
    alone = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                           tool_choice="none", max_tokens=1)
    assert final.usage.prompt_tokens > alone.usage.prompt_tokens + 20


def test_tool_choice_none_means_no_calls(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                       tool_choice="none", max_tokens=30, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason != "tool_calls"


SUM = r"[0-9]{1,4} [+*-] [0-9]{1,4}"       # a custom tool's regex grammar
CALC = {"name": "calc", "description": "Evaluate an arithmetic expression",
        "format": {"type": "grammar", "syntax": "regex", "definition": SUM}}
MATH = [{"role": "user", "content": "What is 12 times 7? Use the calculator."}]


def test_a_forced_custom_tool_comes_back_in_openais_shapes(client):
    """Responses and Chat, streamed: the custom call's input streams as the decoded string
    and matches its grammar; the folded items are OpenAI's ``custom_tool_call`` and
    ``tool_calls[].custom``."""
    fmt = CALC["format"]
    with client.responses.stream(model=MODEL, input=MATH, max_output_tokens=40,
                                 tools=[{"type": "custom", **CALC}],
                                 tool_choice={"type": "custom", "name": "calc"}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    [made] = [item for item in final.output if item.type == "custom_tool_call"]
    deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    [done] = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert made.name == "calc" and made.call_id and deltas == done.input == made.input
    assert re.fullmatch(SUM, made.input), made.input

    grammar = {"type": "grammar", "grammar": {"syntax": fmt["syntax"],
                                              "definition": fmt["definition"]}}
    chunks = client.chat.completions.create(
        model=MODEL, messages=MATH, max_tokens=40, stream=True,
        tools=[{"type": "custom", "custom": {**CALC, "format": grammar}}],
        tool_choice={"type": "custom", "custom": {"name": "calc"}})
    calls = [t for chunk in chunks if chunk.choices
             for t in chunk.choices[0].delta.tool_calls or ()]
    first = calls[0]
    assert first.type == "custom" and first.id and _field(first.custom, "name") == "calc"
    text = "".join(_field(t.custom, "input") or "" for t in calls)
    assert re.fullmatch(SUM, text), text


def _field(custom, name: str):
    """A field of a chunk's ``custom``: a dict in SDKs that predate it, a model after."""
    return custom.get(name) if isinstance(custom, dict) else getattr(custom, name)
