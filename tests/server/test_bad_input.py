"""Input the way an attacker or a buggy client sends it: clear 4xx errors, never a 5xx."""

import json

import pytest

from tests.conftest import SERVED

CHAT = "/v1/chat/completions"


def chat(**extra):
    return {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], **extra}


def post_raw(client, body: bytes):
    return client.post(CHAT, content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize("body", [
    chat(messages="hi"), chat(messages=[["user", "hi"]]), chat(n=10_000), chat(max_tokens=-5),
    chat(max_tokens="lots"), chat(temperature="hot"), chat(stop=[1, 2]),
    chat(logit_bias={"1": "up"}), chat(messages=[{"role": "user", "content": None}]),
    {"model": ["a"], "messages": [{"role": "user", "content": "x"}]}, [], "just a string", 42,
])
def test_wrong_shapes_are_400(client, body):
    r = client.post(CHAT, json=body)
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("raw", [b"{", b'{"model": "x", "messages": [}', b"\xff\xfe\x00garbage",
                                 b'{"model": "\xc3\x28"}', b""])
def test_broken_bytes_are_400(client, raw):
    r = post_raw(client, raw)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


LONE = "bad \ud800 half"      # valid JSON, but no UTF-8 text: Python holds it, cannot encode it


@pytest.mark.parametrize("url,body", [
    (CHAT, chat(messages=[{"role": "user", "content": LONE}])),
    (CHAT, chat(model=LONE)),
    ("/v1/responses", {"model": SERVED, "input": LONE}),
    ("/v1/responses", {"model": SERVED, "input": "hi", "instructions": LONE}),
    ("/v1/responses", {"model": SERVED, "input": "hi", "metadata": {"k": LONE}}),
    ("/v1/responses", {"model": SERVED, "input": "hi", "previous_response_id": LONE}),
    ("/v1/completions", {"model": SERVED, "prompt": LONE, "echo": True, "max_tokens": 2}),
])
def test_lone_surrogates_are_400_at_the_edge(client, url, body):
    r = client.post(url, content=json.dumps(body).encode(),
                    headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "JSON" in r.json()["error"]["message"]


def test_escaped_surrogate_pairs_are_text(client):
    raw = json.dumps(chat(messages=[{"role": "user", "content": "smile \U0001F600"}]))
    assert "\\ud83d\\ude00" in raw
    assert post_raw(client, raw.encode()).status_code == 200


@pytest.mark.parametrize("depth", [50, 3000])
def test_deeply_nested_tool_schema(client, depth):
    schema = '{"type":"object","properties":{"x":' * depth + '{"type":"object"}' + "}}" * depth
    for choice in ('"auto"', '"required"'):
        body = ('{"model":"%s","messages":[{"role":"user","content":"hi"}],"tool_choice":%s,'
                '"tools":[{"type":"function","function":{"name":"f","parameters":%s}}]}'
                % (SERVED, choice, schema))
        r = post_raw(client, body.encode())
        assert r.status_code in (200, 400), r.text


def test_enormous_logit_bias_map(client):
    r = client.post(CHAT, json=chat(logit_bias={str(i): 1 for i in range(100_000)}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


def test_template_injection_in_content_and_tool_names(scripted, client_for):
    engine = scripted(["ok"])
    c = client_for(engine)
    attack = "{{ ''.__class__.__mro__ }}{% for x in range(10**9) %}{% endfor %}"
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    r = c.post(CHAT, json=chat(messages=[{"role": "user", "content": attack}], tools=tools))
    assert r.status_code == 200
    prompt = engine.tokenizer.decode(engine.requests[-1].prompt_token_ids)
    assert attack in prompt                     # data stays data
    # a tool name is an identifier (OpenAI's pattern), never template or grammar text
    tools = [{"type": "function", "function": {"name": attack[:64], "parameters": {}}}]
    r = c.post(CHAT, json=chat(tools=tools))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].function.name"


def test_prompt_longer_than_the_context(scripted, client_for):
    c = client_for(scripted(["ok"], context_length=128))
    r = c.post(CHAT, json=chat(messages=[{"role": "user", "content": "word " * 5000}]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_unknown_fields_are_accepted_and_ignored(client):
    r = client.post(CHAT, json=chat(frobnicate=True, metadata={"a": "b"}, store=True,
                                    service_tier="auto", modalities=["text"]))
    assert r.status_code == 200


FUNCTION = {"type": "object", "properties": {}}


@pytest.mark.parametrize("url, body, param", [
    (CHAT, chat(tools=[{"type": "function", "function": {"name": "f", "parameters": FUNCTION}},
                       {"type": "function", "function": {"name": "g", "parameters": FUNCTION}},
                       {"type": "function", "function": {"name": "f"}}]),
     "tools[2].function.name"),
    ("/v1/responses", {"model": SERVED, "input": "hi", "tools": [
        {"type": "function", "name": "f", "parameters": FUNCTION},
        {"type": "function", "name": "f", "parameters": FUNCTION, "description": "again"}]},
     "tools[1].name")])
def test_two_tools_of_one_name_are_400(client, url, body, param):
    """The model could not tell them apart (every API: Messages refuses them too)."""
    r = client.post(url, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and "unique" in r.json()["error"]["message"]
