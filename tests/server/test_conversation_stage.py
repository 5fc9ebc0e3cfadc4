"""The seams between the APIs and the pipeline: errors name the caller's own parameters,
usage is counted from tokens, a failed run is stored as failed, a chain stores linearly."""

from __future__ import annotations

import sqlalchemy as sa

from tests.conftest import SERVED
from tests.server.responses_check import check_stream, sse_events
from tests.server.sse import events as chat_events
from tests.server.test_responses import THINK, URL, app_for, ask  # noqa: F401 - fixture

CHAT = "/v1/chat/completions"


def refused(r, param):
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


# -- errors name the caller's parameters ------------------------------------------------

def test_chat_content_errors_name_the_message(app_for):
    c = app_for(["ok"])
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    r = c.post(CHAT, json={"model": SERVED, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "see"}, image]}]})
    refused(r, "messages[1].content[1]")


def test_responses_content_errors_name_the_input_item(app_for):
    c = app_for(["ok", "ok"])
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    r = c.post(URL, json={"model": SERVED, "input": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [image]}]})
    refused(r, "input[2].content[0]")
    # after a stored conversation, input[k] is still the k-th item of this request's input
    first = c.post(URL, json=ask()).json()
    r = c.post(URL, json={"model": SERVED, "previous_response_id": first["id"],
                          "input": [{"role": "user", "content": [image]}]})
    refused(r, "input[0].content[0]")


def test_responses_limits_name_responses_parameters(app_for):
    c = app_for(["ok"], context=64, max_tokens_cap=8)
    refused(c.post(URL, json=ask(max_output_tokens=9)), "max_output_tokens")
    r = c.post(URL, json=ask(input="word " * 200))
    assert r.json()["error"]["code"] == "context_length_exceeded"
    refused(r, "input")
    refused(c.post(URL, json=ask(reasoning={"effort": "enormous"})), "reasoning.effort")
    refused(c.post(URL, json=ask(input=[])), "input")


# -- usage from tokens ------------------------------------------------------------------

def _tokens_through(tokenizer, text: str, marker: str) -> int:
    """How many of ``text``'s tokens it takes to reach the end of ``marker``."""
    ids = tokenizer.encode(text, add_special=False)
    end = text.index(marker) + len(marker)
    for n in range(1, len(ids) + 1):
        if len(tokenizer.decode(ids[:n])) >= end:
            return n
    raise AssertionError("marker not reached")


def test_reasoning_tokens_are_the_tokens_spent_thinking(app_for, tokenizer):
    reply = "<think>First the weather, then the answer.</think>It is sunny."
    c = app_for([reply])
    expected = _tokens_through(tokenizer, reply, "</think>")
    total = len(tokenizer.encode(reply, add_special=False))
    for stream in (False, True):
        r = c.post(URL, json=ask(stream=stream))
        body = check_stream(sse_events(r.text)) if stream else r.json()
        usage = body["usage"]
        # the tags are tokens the model spent thinking too (re-encoding the reasoning text
        # without them, as before, undercounts)
        assert usage["output_tokens_details"]["reasoning_tokens"] == expected
        assert usage["output_tokens"] == total + 1          # and the end-of-turn token


def test_chat_stream_usage_is_the_fold_of_its_choices(app_for):
    c = app_for(["one two three"])
    body = {"model": SERVED, "n": 3, "messages": [{"role": "user", "content": "count"}]}
    folded = c.post(CHAT, json=body).json()["usage"]
    chunks = chat_events(c.post(CHAT, json={**body, "stream": True,
                                            "stream_options": {"include_usage": True}}).text)
    streamed = chunks[-1]["usage"]
    assert streamed == folded
    assert folded["completion_tokens"] == 3 * (folded["completion_tokens"] // 3) > 0


# -- failures are stored as failures ----------------------------------------------------

def _exploding(engine, after: int = 2):
    real = engine.generate

    def generate(request):
        outputs = real(request)

        async def gen():
            n = 0
            async for out in outputs:
                yield out
                n += 1
                if n == after:
                    await outputs.aclose()
                    raise RuntimeError("a bug in the engine")
        return gen()
    engine.generate = generate


def test_an_unexpected_error_mid_stream_is_stored_as_failed(app_for):
    c = app_for(["a long answer with many words in it"])
    _exploding(c.engine)
    r = c.post(URL, json=ask(stream=True))
    events = sse_events(r.text)
    rid = events[0]["response"]["id"]
    stored = c.get(f"{URL}/{rid}").json()
    for _ in range(50):             # the last write runs after the stream closed
        if stored["status"] != "in_progress":
            break
        stored = c.get(f"{URL}/{rid}").json()
    assert stored["status"] == "failed", stored
    assert stored["error"]["code"] == "server_error"


def test_an_unexpected_error_in_a_non_streamed_response_is_stored_as_failed(app_for):
    c = app_for(["a long answer with many words in it"])
    _exploding(c.engine)
    r = c.post(URL, json=ask())
    assert r.status_code == 500
    db = sa.create_engine(str(c.app.state.store.engine.url))
    with db.connect() as conn:
        rows = conn.execute(sa.text("SELECT status FROM podium_responses")).all()
    assert [row[0] for row in rows] == ["failed"]


# -- a chain stores linearly ------------------------------------------------------------

def test_a_long_chain_stores_each_turn_once(app_for):
    """100 turns along previous_response_id: the bytes stored for turn 100 are within 1.5x
    of those for turn 10 (each turn stored whole history before: ~10x)."""
    c = app_for(["The answer is fine."] * 100, template=THINK, context=32768)
    ids, previous = [], None
    for turn in range(100):
        body = ask(input=f"Question number {turn:03d}?")
        if previous:
            body["previous_response_id"] = previous
        r = c.post(URL, json=body)
        assert r.status_code == 200, r.text
        previous = r.json()["id"]
        ids.append(previous)
    # the model saw the whole conversation
    prompt = c.engine.tokenizer.decode(c.engine.requests[-1].prompt_token_ids)
    assert "Question number 000?" in prompt and "Question number 099?" in prompt

    def stored(rid):
        with c.app.state.store.engine.connect() as conn:
            row = conn.execute(sa.text(
                "SELECT length(body) + length(history) FROM podium_responses WHERE id = :i"),
                {"i": rid}).scalar_one()
            items = conn.execute(sa.text(
                "SELECT coalesce(sum(length(body)), 0) FROM podium_input_items "
                "WHERE response_id = :i"), {"i": rid}).scalar_one()
        return row + items
    assert stored(ids[99]) <= 1.5 * stored(ids[9]), (stored(ids[9]), stored(ids[99]))
