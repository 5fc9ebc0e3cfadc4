"""Completions through the real app on the scripted engine, checked against openai's types."""

from openai.types import Completion

from tests.conftest import SERVED
from tests.server.sse import events

URL = "/v1/completions"


def req(**extra):
    return {"model": SERVED, "prompt": "def add(a, b):", "max_tokens": 50, **extra}


def validate_chunk(chunk):
    """openai's Completion type (which the SDK also uses for stream chunks) demands a
    finish_reason, but OpenAI's own streams send null until a choice ends; allow that."""
    choices = [{**c, "finish_reason": c["finish_reason"] or "stop"} for c in chunk["choices"]]
    return Completion.model_validate({**chunk, "choices": choices})


def text_of(chunks, index=0):
    return "".join(c["choices"][0]["text"] for c in chunks
                   if c["choices"] and c["choices"][0]["index"] == index)


def test_string_prompt(scripted, client_for):
    engine = scripted(["\n    return a + b"])
    r = client_for(engine).post(URL, json=req())
    body = Completion.model_validate(r.json())
    assert body.object == "text_completion"
    assert body.choices[0].text == "\n    return a + b"
    assert body.usage.prompt_tokens == len(engine.tokenizer.encode("def add(a, b):"))
    assert engine.requests[0].prompt_token_ids == engine.tokenizer.encode("def add(a, b):")


def test_default_max_tokens_is_16(scripted, client_for):
    r = client_for(scripted(["word " * 40])).post(URL, json={"model": SERVED, "prompt": "x"})
    assert r.json()["usage"]["completion_tokens"] == 16
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_prompt_forms_and_choice_indices(scripted, client_for, tokenizer):
    ids = tokenizer.encode("hello world")
    for prompt, n_prompts in [("a", 1), (["a", "b"], 2), (ids, 1), ([ids, ids[:1]], 2)]:
        engine = scripted(["ok"])
        r = client_for(engine).post(URL, json=req(prompt=prompt, n=2)).json()
        Completion.model_validate(r)
        assert [c["index"] for c in r["choices"]] == list(range(2 * n_prompts))
        assert len(engine.requests) == 2 * n_prompts
    engine = scripted(["ok"])
    client_for(engine).post(URL, json=req(prompt=ids))
    assert engine.requests[0].prompt_token_ids == ids


def test_echo_stream_and_non_stream_agree(scripted, client_for):
    c = client_for(scripted(["\n    return a + b"]))
    folded = c.post(URL, json=req(echo=True)).json()
    assert folded["choices"][0]["text"] == "def add(a, b):\n    return a + b"
    chunks = events(c.post(URL, json=req(echo=True, stream=True,
                                         stream_options={"include_usage": True})).text)
    for chunk in chunks:
        validate_chunk(chunk)
    assert text_of(chunks) == folded["choices"][0]["text"]
    assert chunks[-1]["usage"]["completion_tokens"] == folded["usage"]["completion_tokens"]


def test_legacy_logprobs_with_echo(scripted, client_for, tokenizer):
    c = client_for(scripted(["\n    return a + b"]))
    r = c.post(URL, json=req(echo=True, logprobs=2)).json()
    lp = r["choices"][0]["logprobs"]
    n_prompt = len(tokenizer.encode("def add(a, b):"))
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v is not None for v in lp["token_logprobs"][1:])
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]
    assert lp["text_offset"][n_prompt] == len("def add(a, b):")
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"])


def test_max_tokens_zero_with_echo_scores_only(scripted, client_for):
    r = client_for(scripted(["never"])).post(URL, json=req(echo=True, max_tokens=0, logprobs=0))
    choice = r.json()["choices"][0]
    assert choice["text"] == "def add(a, b):" and choice["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 0


def test_bad_completion_requests(client):
    for body, param in [(req(prompt=[]), "prompt"), (req(prompt=""), "prompt[0]"),
                        (req(prompt=[999999999]), "prompt[0]"), (req(suffix="x"), "suffix"),
                        (req(best_of=3), "best_of"), (req(logprobs=6), "logprobs"),
                        (req(max_tokens=0), "max_tokens")]:
        r = client.post(URL, json=body)
        assert r.status_code == 400, body
        assert r.json()["error"]["param"] == param
