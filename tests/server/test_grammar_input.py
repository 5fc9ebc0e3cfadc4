"""Constraint input through the APIs: schemas no grammar can be made from, and tool names a
model cannot write, are 400s naming the parameter, before anything reaches the engine."""

import json
import logging

import pytest
from starlette.testclient import TestClient

from podium.api.responses.translate import ToolMap, response_format
from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
# schemas no grammar can be made from: llguidance refuses each (unsatisfiable, an unknown
# type, a lookaround it cannot run, a reference to nothing)
BAD_SCHEMAS = [{"enum": []}, {"type": "frog"},
               {"type": "string", "pattern": "^(?=a)b$"},
               {"type": "string", "minLength": 5, "maxLength": 2},
               {"$ref": "#/$defs/missing"}]
BAD = {"type": "frog"}
# schemas llama.cpp's grammars could not take, and Podium refused: llguidance takes each
FORMERLY_REFUSED = [{"type": "string", "pattern": "^a{1,30000}$"},
                    {"type": "string", "pattern": "^a{1,3000}$"},
                    {"type": "string", "maxLength": 5000}, {"type": "string", "pattern": "^\\d+$"},
                    {"enum": [f"customer_account_reference_identifier_{i:04d}"
                              for i in range(1000)]}]
BAD_NAMES = ['get"weather', "get\\weather", "get weather", "{{ x }}", "get\nweather"]


def params_with(schema):
    return {"type": "object", "properties": {"q": schema}, "required": ["q"]}


def chat(**extra):
    return {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}], **extra}


def chat_tools(schema):
    return [{"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "lookup", "parameters": params_with(
                schema)}}]


def responses(**extra):
    return {"model": SERVED, "input": "Hi", "store": False, **extra}


def responses_tools(schema):
    return [{"type": "function", "name": "ok", "parameters": {"type": "object"}},
            {"type": "function", "name": "lookup", "parameters": params_with(schema)}]


@pytest.fixture
def served(scripted, tmp_path):
    """A client (lifespan running) and its scripted engine, which records what it is sent."""
    engine = scripted(["{}"])
    settings = Settings(store_url=f"sqlite:///{tmp_path / 'r.db'}")
    with TestClient(create_app(settings, engine), raise_server_exceptions=False) as client:
        yield client, engine


def refused(r, param=None):
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
def test_chat_response_format(served, schema):
    client, engine = served
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    refused(client.post(CHAT, json=chat(response_format=fmt)),
            "response_format.json_schema.schema")
    assert not engine.requests


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
def test_chat_tools_required(served, schema):
    client, engine = served
    error = refused(client.post(CHAT, json=chat(tools=chat_tools(schema),
                                                tool_choice="required")))
    assert error["param"].startswith("tools") and "'lookup'" in error["message"]
    assert not engine.requests
    # a tool the model may or may not call is only shown to it: no grammar, no limits
    r = client.post(CHAT, json=chat(tools=chat_tools(schema), tool_choice="auto"))
    assert r.status_code == 200, r.text
    assert engine.requests[-1].sampling.grammar is None


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
def test_responses_text_format(served, schema):
    client, engine = served
    fmt = {"format": {"type": "json_schema", "name": "x", "schema": schema}}
    error = refused(client.post(RESPONSES, json=responses(text=fmt)))
    assert error["param"]
    assert not engine.requests


@pytest.mark.parametrize("stream", [False, True])
def test_responses_refuse_instead_of_failing(served, stream):
    client, _ = served
    fmt = {"format": {"type": "json_schema", "name": "x", "schema": BAD}}
    r = client.post(RESPONSES, json=responses(text=fmt, stream=stream))
    refused(r)          # not a 200 whose response has status "failed"


@pytest.mark.parametrize("schema", BAD_SCHEMAS)
def test_responses_tools_required(served, schema):
    client, engine = served
    error = refused(client.post(RESPONSES, json=responses(tools=responses_tools(schema),
                                                          tool_choice="required")))
    assert error["param"].startswith("tools") and "'lookup'" in error["message"]
    assert not engine.requests


@pytest.mark.parametrize("name", BAD_NAMES)
def test_chat_tool_names(served, name):
    client, engine = served
    tools = [{"type": "function", "function": {"name": name, "parameters": {}}}]
    refused(client.post(CHAT, json=chat(tools=tools)), "tools[0].function.name")
    assert not engine.requests


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("tools, param", [
    (lambda n: [{"type": "function", "name": n}], "tools[0].name"),
    (lambda n: [{"type": "custom", "name": n}], "tools[0].name"),
    (lambda n: [{"type": "namespace", "name": n, "tools": [{"type": "function", "name": "f"}]}],
     "tools[0].name"),
    (lambda n: [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": n}]}],
     "tools[0].tools[0].name"),
])
def test_responses_tool_names(served, name, tools, param):
    client, engine = served
    refused(client.post(RESPONSES, json=responses(tools=tools(name))), param)
    assert not engine.requests


def test_good_names_pass_and_quotes_in_values_are_escaped(served):
    client, engine = served
    tools = [{"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {"mode": {"enum": ['say "hi"', "back\\slash"]}}}}}
             for name in ("files.read", "get-weather_2")]
    r = client.post(CHAT, json=chat(tools=tools, tool_choice="required"))
    assert r.status_code == 200, r.text
    grammar = engine.requests[-1].sampling.grammar
    assert '"enum": ["say \\"hi\\"", "back\\\\slash"]' in grammar    # as JSON, escaped
    assert '\\"name\\": \\"files.read\\"' in grammar       # a Lark literal of the JSON
    assert '\\"name\\": \\"get-weather_2\\"' in grammar


def test_responses_tools_carry_their_place_in_the_request():
    tools = ToolMap([{"type": "function", "name": "a"},
                     {"type": "namespace", "name": "ns", "tools": [
                         {"type": "function", "name": "b"}, {"type": "custom", "name": "c"}]}])
    assert [(t.name, t.where) for t in tools.tools] == [
        ("a", "tools[0].parameters"), ("ns__b", "tools[1].tools[0].parameters"),
        ("ns__c", "tools[1].tools[1].format")]          # a custom tool: its format
    assert response_format({"type": "json_schema", "schema": {}}).where == "text.format.schema"

def test_chat_tools_required_names_the_tool(served):
    client, _ = served
    refused(client.post(CHAT, json=chat(tools=chat_tools(BAD), tool_choice="required")),
            "tools[1].function.parameters")


def test_responses_text_format_names_text_format(served):
    client, _ = served
    fmt = {"format": {"type": "json_schema", "name": "x", "schema": BAD}}
    refused(client.post(RESPONSES, json=responses(text=fmt)), "text.format.schema")


def test_responses_tools_required_names_the_tool(served):
    client, _ = served
    refused(client.post(RESPONSES, json=responses(tools=responses_tools(BAD),
                                                  tool_choice="required")),
            "tools[1].parameters")


# -- strict: keywords llguidance cannot enforce are refused, named; without strict accepted --

UNENFORCED = {"type": "object", "properties": {"q": {"type": "number", "minimum": 0}},
              "propertyNames": {"pattern": "^[a-z]+$"}}
CONSTRAINED = {"type": "object", "properties": {"n": {"type": "number", "minimum": 1.5,
                                                      "multipleOf": 0.5}}, "required": ["n"]}


def strict_refusal(r, param, keyword):
    error = refused(r, param)
    assert f'"{keyword}"' in error["message"], error


def test_chat_strict_response_format(served):
    client, engine = served
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                  "schema": UNENFORCED}}
    strict_refusal(client.post(CHAT, json=chat(response_format=fmt)),
                   "response_format.json_schema.schema", "propertyNames")
    assert not engine.requests
    fmt["json_schema"]["strict"] = False
    assert client.post(CHAT, json=chat(response_format=fmt)).status_code == 200
    fmt["json_schema"] = {"name": "x", "strict": True, "schema": CONSTRAINED}
    assert client.post(CHAT, json=chat(response_format=fmt)).status_code == 200
    grammar = engine.requests[-1].sampling.grammar     # the bounds reach llguidance, strict
    assert '"minimum": 1.5, "multipleOf": 0.5' in grammar and '"lenient": false' in grammar


def test_chat_strict_function_tool(served):
    client, engine = served
    tools = [{"type": "function", "function": {"name": "f", "strict": True,
                                               "parameters": UNENFORCED}}]
    strict_refusal(client.post(CHAT, json=chat(tools=tools)), "tools[0].function.parameters",
                   "propertyNames")
    tools[0]["function"].pop("strict")
    assert client.post(CHAT, json=chat(tools=tools)).status_code == 200


def test_responses_strict_text_format_and_tool(served):
    client, _ = served
    fmt = {"format": {"type": "json_schema", "name": "x", "strict": True,
                      "schema": {"type": "object", "dependentRequired": {"a": ["b"]}}}}
    strict_refusal(client.post(RESPONSES, json=responses(text=fmt)), "text.format.schema",
                   "dependentRequired")
    fmt["format"]["schema"] = {"type": "object", "patternProperties": {"^x": {}}}
    assert client.post(RESPONSES, json=responses(text=fmt)).status_code == 200   # enforced now
    unique = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    tools = [{"type": "function", "name": "f", "strict": True, "parameters": unique}]
    strict_refusal(client.post(RESPONSES, json=responses(tools=tools)), "tools[0].parameters",
                   "uniqueItems")
    tools[0]["strict"] = False
    assert client.post(RESPONSES, json=responses(tools=tools)).status_code == 200
    tools[0].update(strict=True, parameters=CONSTRAINED)    # minimum on a number: enforced now
    assert client.post(RESPONSES, json=responses(tools=tools)).status_code == 200


def test_messages_strict_tool(served):
    client, _ = served
    body = {"model": SERVED, "max_tokens": 20, "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"name": "f", "strict": True, "input_schema": UNENFORCED}]}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 400, r.text
    assert '"propertyNames"' in r.json()["error"]["message"]
    body["tools"][0].pop("strict")
    assert client.post("/v1/messages", json=body).status_code == 200


@pytest.mark.parametrize("schema", FORMERLY_REFUSED)
def test_wide_enums_and_long_repetitions_reach_the_engine_now(served, schema):
    client, engine = served
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": schema}}
    r = client.post(CHAT, json=chat(response_format=fmt))
    assert r.status_code == 200, r.text
    assert json.dumps(schema)[1:-1] in engine.requests[-1].sampling.grammar


def test_non_strict_leaves_a_keyword_out_with_a_warning_naming_the_parameter(served, caplog):
    client, engine = served
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": UNENFORCED}}
    with caplog.at_level(logging.WARNING, logger="podium.grammar.build"):
        assert client.post(CHAT, json=chat(response_format=fmt)).status_code == 200
    assert '"lenient": true' in engine.requests[-1].sampling.grammar
    assert any("response_format.json_schema.schema" in r.getMessage()
               and "propertyNames" in r.getMessage() for r in caplog.records)
