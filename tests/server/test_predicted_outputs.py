"""Chat Completions' Predicted Outputs (``prediction``) through the real app on the scripted
engine, with the official SDK: the answer is the same with a prediction or without, and
``usage.completion_tokens_details`` tells how much of the prediction was accepted."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import openai
import pytest

from podium.conversation import Options
from podium.engine.base import SamplingParams
from podium.generation import predicted
from tests.conftest import SERVED
from tests.harmony import harness as h
from tests.server.sse import events

REPLY = ("def area(width, height):\n    \"\"\"The rectangle's area.\"\"\"\n"
         "    return width * height\n\n\nprint(area(3, 4))\n")
UNRELATED = "Il pleut sur la ville comme il pleut dans mon coeur."
HI = [{"role": "user", "content": "Rename the function."}]


@pytest.fixture
def app(scripted, client_for):
    engine = scripted([REPLY])
    client = client_for(engine)
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client,
                        max_retries=0)
    return SimpleNamespace(engine=engine, client=client, sdk=sdk)


def content(text: str) -> dict:
    return {"type": "content", "content": text}


def details(usage) -> tuple[int, int]:
    d = usage.completion_tokens_details
    return d.accepted_prediction_tokens, d.rejected_prediction_tokens


def test_a_prediction_of_the_answer_is_accepted_and_changes_nothing_else(app):
    plain = app.sdk.chat.completions.create(model=SERVED, messages=HI)
    assert details(plain.usage) == (0, 0)
    ahead = app.sdk.chat.completions.create(model=SERVED, messages=HI,
                                            prediction=content(REPLY))
    assert app.engine.requests[-1].sampling.prediction == tuple(
        app.engine.tokenizer.encode(REPLY, add_special=False))
    assert ahead.choices[0].message.content == plain.choices[0].message.content == REPLY
    assert ahead.usage.completion_tokens == plain.usage.completion_tokens
    accepted, rejected = details(ahead.usage)
    # every reply token but the few each verify draws itself (the end of turn is one)
    assert plain.usage.completion_tokens * 2 // 3 < accepted < plain.usage.completion_tokens
    assert rejected == 0


def test_an_unrelated_prediction_is_not_accepted_and_changes_nothing(app):
    answer = app.sdk.chat.completions.create(model=SERVED, messages=HI,
                                             prediction=content(UNRELATED))
    assert answer.choices[0].message.content == REPLY
    accepted, rejected = details(answer.usage)
    # the output never meets the prediction: nothing is drafted from it, so none rejected
    assert accepted == 0 and rejected == 0
    assert app.engine.requests[-1].sampling.prediction        # it did reach the engine


def test_text_parts_are_the_prediction_joined(app):
    half = len(REPLY) // 2
    parts = [{"type": "text", "text": REPLY[:half]}, {"type": "text", "text": REPLY[half:]}]
    answer = app.sdk.chat.completions.create(model=SERVED, messages=HI,
                                             prediction={"type": "content", "content": parts})
    whole = app.sdk.chat.completions.create(model=SERVED, messages=HI,
                                            prediction=content(REPLY))
    assert app.engine.requests[-2].sampling.prediction == app.engine.requests[-1].sampling.prediction
    assert details(answer.usage) == details(whole.usage) and details(answer.usage)[0] > 0


def test_streamed_usage_carries_the_same_details(app):
    folded = app.sdk.chat.completions.create(model=SERVED, messages=HI,
                                             prediction=content(REPLY))
    stream = app.sdk.chat.completions.create(model=SERVED, messages=HI, stream=True,
                                             stream_options={"include_usage": True},
                                             prediction=content(REPLY))
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
    assert chunks[-1].choices == []
    assert details(chunks[-1].usage) == details(folded.usage)
    assert details(folded.usage)[0] > 0


def test_the_details_are_always_there_and_null_is_no_prediction(app):
    body = {"model": SERVED, "messages": HI, "prediction": None}
    r = app.client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens_details"] == {
        "reasoning_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    assert app.engine.requests[-1].sampling.prediction is None
    r = app.client.post("/v1/chat/completions", json={
        **body, "stream": True, "stream_options": {"include_usage": True}})
    assert events(r.text)[-1]["usage"]["completion_tokens_details"][
        "accepted_prediction_tokens"] == 0


@pytest.mark.parametrize("prediction, param", [
    ({"type": "file", "content": REPLY}, "prediction.type"),
    ({"content": REPLY}, "prediction.type"),
    ({"type": "content"}, "prediction.content"),
    ({"type": "content", "content": 5}, "prediction.content"),
    ({"type": "content", "content": [{"type": "text", "text": "a"},
                                     {"type": "image_url", "image_url": {"url": "x"}}]},
     "prediction.content[1].type"),
    ({"type": "content", "content": [{"type": "text", "text": 5}]}, "prediction.content[0].text"),
    ({"type": "content", "content": [{"type": "text"}]}, "prediction.content[0].text"),
    (REPLY, "prediction"),
])
def test_a_bad_prediction_is_a_400_naming_the_field(app, prediction, param):
    with pytest.raises(openai.BadRequestError) as exc:
        app.sdk.chat.completions.create(model=SERVED, messages=HI, prediction=prediction)
    assert exc.value.status_code == 400
    assert exc.value.body["type"] == "invalid_request_error"
    assert exc.value.body["param"] == param


def test_several_choices_are_answered_without_the_prediction(app):
    answer = app.sdk.chat.completions.create(model=SERVED, messages=HI, n=2,
                                             prediction=content(REPLY))
    assert [c.message.content for c in answer.choices] == [REPLY, REPLY]
    assert details(answer.usage) == (0, 0)
    assert [r.sampling.prediction for r in list(app.engine.requests)[-2:]] == [None, None]


def test_harmony_is_answered_without_the_prediction(client_for):
    engine = h.engine([h.completion(h.final("Hello! How can I help?"))])
    client = client_for(engine)
    r = client.post("/v1/chat/completions", json={
        "model": h.SERVED, "messages": HI, "prediction": content("Hello! How can I help?")})
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Hello! How can I help?"
    details = r.json()["usage"]["completion_tokens_details"]
    assert (details["accepted_prediction_tokens"], details["rejected_prediction_tokens"]) == (0, 0)
    assert engine.requests[-1].sampling.prediction is None


def test_an_engine_that_does_not_draft_gets_no_prediction(scripted):
    engine = scripted([REPLY])
    opts = Options(model=SERVED, sampling=SamplingParams(), prediction=REPLY)
    template = SimpleNamespace(name="template")
    assert predicted(engine, template, opts) is not None
    no_drafts = SimpleNamespace(capabilities=SimpleNamespace(drafts=False),
                                tokenizer=engine.tokenizer, info=engine.info)
    assert predicted(no_drafts, template, opts) is None


def test_a_prediction_is_cut_at_the_context_length(scripted):
    engine = scripted([REPLY], context_length=8)
    opts = Options(model=SERVED, sampling=SamplingParams(), prediction=REPLY)
    assert predicted(engine, SimpleNamespace(name="template"), opts) == tuple(
        engine.tokenizer.encode(REPLY, add_special=False)[:8])


def test_the_request_line_carries_the_prediction_figures(app, caplog):
    with caplog.at_level(logging.INFO, logger="podium.access"):
        answer = app.sdk.chat.completions.create(model=SERVED, messages=HI,
                                                 prediction=content(REPLY))
        app.sdk.chat.completions.create(model=SERVED, messages=HI)
    with_prediction, without = [r.getMessage() for r in caplog.records
                                if r.name == "podium.access"]
    accepted, rejected = details(answer.usage)
    predicted_tokens = len(app.engine.tokenizer.encode(REPLY, add_special=False))
    assert (f"prediction_tokens={predicted_tokens} accepted_prediction_tokens={accepted} "
            f"rejected_prediction_tokens={rejected}") in with_prediction
    assert "prediction" not in without
