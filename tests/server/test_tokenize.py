"""``/tokenize`` and ``/detokenize`` (vLLM's shapes) on the default model's real tokenizer and
chat template."""

from __future__ import annotations

from tests.conftest import SERVED

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}}]
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the weather in Oslo?"}]


def test_a_prompt_is_encoded_as_it_is(client, tokenizer):
    r = client.post("/tokenize", json={"model": SERVED, "prompt": "Hello, world!",
                                       "return_token_strs": True})
    body = r.json()
    assert body["tokens"] == tokenizer.encode("Hello, world!")
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 4096
    assert "".join(body["token_strs"]) == "Hello, world!"


def test_messages_count_what_a_chat_request_would_read(client):
    for extra in ({}, {"tools": WEATHER}):
        counted = client.post("/tokenize", json={"model": SERVED, "messages": MESSAGES,
                                                 **extra}).json()
        chat = client.post("/v1/chat/completions", json={"model": SERVED,
                                                         "messages": MESSAGES, **extra}).json()
        assert counted["count"] == chat["usage"]["prompt_tokens"], extra
    with_tools = client.post("/tokenize", json={"model": SERVED, "messages": MESSAGES,
                                                "tools": WEATHER}).json()["count"]
    plain = client.post("/tokenize", json={"model": SERVED, "messages": MESSAGES}).json()
    assert with_tools > plain["count"] + 20                       # the tools are in it
    without = client.post("/tokenize", json={"model": SERVED, "messages": MESSAGES,
                                             "add_generation_prompt": False}).json()
    assert without["count"] < plain["count"]
    text = client.post("/detokenize", json={"model": SERVED, "tokens": plain["tokens"]}
                       ).json()["prompt"]
    assert "What is the weather in Oslo?" in text and text.endswith("assistant\n")


def test_detokenize_round_trips_and_refuses_ids_outside_the_vocabulary(client, tokenizer):
    ids = tokenizer.encode("Grüße aus München")
    assert client.post("/detokenize", json={"model": SERVED, "tokens": ids}
                       ).json() == {"prompt": "Grüße aus München"}
    r = client.post("/detokenize", json={"model": SERVED, "tokens": [1, 10**9]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens[1]"
    assert client.post("/detokenize", json={"model": SERVED, "tokens": [-1]}
                       ).status_code == 400


def test_bad_requests(client):
    for body in ({"model": SERVED}, {"model": SERVED, "prompt": "x", "messages": MESSAGES},
                 {"model": SERVED, "messages": []}, {"prompt": "x"}):
        r = client.post("/tokenize", json=body)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = client.post("/tokenize", json={"model": "other", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    dup = [WEATHER[0], WEATHER[0]]
    r = client.post("/tokenize", json={"model": SERVED, "messages": MESSAGES, "tools": dup})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[1].function.name"
