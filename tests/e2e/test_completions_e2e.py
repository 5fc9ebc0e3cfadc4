"""Completions against the real server and model, through the official openai SDK."""

import pytest
from openai.types import Completion

from tests.e2e.conftest import MODEL


def test_completion_raw_validates(client):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="def fibonacci(n):",
                                                      max_tokens=12, temperature=0)
    body = Completion.model_validate(raw.http_response.json())
    assert body.choices[0].text and body.usage.completion_tokens <= 12


def test_token_prompts_echo_and_logprobs(client):
    r = client.completions.create(model=MODEL, prompt=[[750, 75698, 1445, 982]], max_tokens=5,
                                  temperature=0, echo=True, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs[0] is None
    assert len(lp.tokens) == 4 + r.usage.completion_tokens
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(v <= 0 for v in lp.token_logprobs[1:])


def test_stream_equals_non_stream(client):
    kw = dict(model=MODEL, prompt="# A function that reverses a string\n", max_tokens=20,
              temperature=0.8, seed=7)
    whole = client.completions.create(**kw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
    assert streamed == whole


@pytest.mark.parametrize("n", [2])
def test_several_prompts_and_choices(client, n):
    r = client.completions.create(model=MODEL, prompt=["Hello", "Goodbye"], max_tokens=3, n=n)
    assert sorted(c.index for c in r.choices) == list(range(2 * n))
