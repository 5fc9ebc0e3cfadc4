"""Chat Completions against the real server and model, through the official openai SDK."""

import json
import threading
import time

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.e2e.conftest import MODEL

HI = [{"role": "user", "content": "Say hello in three words."}]


def raw_sse(server_url, body):
    """Each chunk of a streamed answer, as the raw JSON the server sent."""
    chunks = []
    with httpx.stream("POST", f"{server_url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
            elif line == "data: [DONE]":
                chunks.append("[DONE]")
    assert chunks[-1] == "[DONE]"
    return chunks[:-1]


def test_non_stream_raw_response_validates(client):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=HI, max_tokens=16, temperature=0)
    assert raw.http_request.url.path == "/v1/chat/completions"
    completion = ChatCompletion.model_validate(raw.http_response.json())
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content.strip()
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage.total_tokens == (completion.usage.prompt_tokens
                                             + completion.usage.completion_tokens)


def test_sdk_streams_an_answer(client):
    stream = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=16, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_raw_stream_chunks_validate_and_share_identity(server_url):
    chunks = raw_sse(server_url, {"model": MODEL, "messages": HI, "max_tokens": 12, "n": 2,
                                  "stream": True, "stream_options": {"include_usage": True}})
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert len({(c.id, c.created, c.model) for c in parsed}) == 1
    for i in range(2):
        mine = [c.choices[0] for c in parsed if c.choices and c.choices[0].index == i]
        assert mine[0].delta.role == "assistant"
        assert sum(1 for ch in mine if ch.finish_reason) == 1
    assert parsed[-1].choices == [] and parsed[-1].usage.completion_tokens > 0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_stream_equals_non_stream_for_the_same_seed(client, temperature):
    kw = dict(model=MODEL, max_tokens=24, temperature=temperature, seed=1234,
              messages=[{"role": "user", "content": "Write a short poem about rivers."}])
    whole = client.chat.completions.create(**kw)
    streamed = client.chat.completions.create(stream=True, **kw)
    pieces = [c.choices[0].delta.content or "" for c in streamed if c.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    assert len([p for p in pieces if p]) > 3       # it really streamed in pieces


def test_usage_is_exact(client, server_url):
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=5, temperature=0,
                                       logit_bias={"151645": -100})   # never end early
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    # the prompt is the model's own template: count it with the server's tokenizer
    from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
    from podium.engine.llamacpp.model_files import default_model_path
    tok = LlamaTokenizer(LlamaModel(default_model_path(), vocab_only=True))
    prompt = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
              "assistant.<|im_end|>\n<|im_start|>user\nSay hello in three words.<|im_end|>\n"
              "<|im_start|>assistant\n")
    assert r.usage.prompt_tokens == len(tok.encode(prompt))


def test_logprobs_from_the_model(client):
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token          # greedy
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob)


def test_stop_string(client):
    r = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=40, stop=["3"],
        messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}])
    assert r.choices[0].finish_reason == "stop"
    assert "3" not in r.choices[0].message.content
    assert "2" in r.choices[0].message.content


def test_concurrent_requests_all_complete(client):
    results = {}

    def ask(i):
        r = client.chat.completions.create(
            model=MODEL, max_tokens=8, temperature=0,
            messages=[{"role": "user", "content": f"What is {i} + {i}?"}])
        results[i] = r.choices[0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") and c.message.content for c in results.values())


def test_client_disconnect_stops_the_engine(server_url):
    body = {"model": MODEL, "max_tokens": 2000, "stream": True, "temperature": 0.7,
            "logit_bias": {"151645": -100, "151643": -100},   # no natural end
            "messages": [{"role": "user", "content": "Write an extremely long essay."}]}
    before = httpx.get(f"{server_url}/health").json()["engine"]["generated_tokens"]
    with httpx.stream("POST", f"{server_url}/v1/chat/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen == 5:
                break
    # the connection is closed here, mid-answer
    deadline = time.monotonic() + 5
    while httpx.get(f"{server_url}/health").json()["engine"]["running"] != 0:
        assert time.monotonic() < deadline, "the engine kept generating after the disconnect"
        time.sleep(0.05)
    stopped_at = httpx.get(f"{server_url}/health").json()["engine"]["generated_tokens"]
    time.sleep(0.5)
    assert httpx.get(f"{server_url}/health").json()["engine"]["generated_tokens"] == stopped_at
    assert stopped_at - before < 100      # nowhere near the 2000 asked for


def test_bad_input_through_the_sdk(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=HI)
    assert e.value.status_code == 404 and e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HI, temperature=5)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=100_000)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
    assert "text only" in e.value.message


def test_models(client):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
