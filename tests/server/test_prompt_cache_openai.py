"""OpenAI's prompt-cache controls (issue 43) through the real app on the scripted engine, with
the official SDK: ``prompt_cache_breakpoint`` on content parts marks the prefix worth keeping
(at the message and part the translation made of it), ``prompt_cache_retention`` and
``prompt_cache_options`` say for how long, ``prompt_cache_key`` is checked and echoed, and
usage counts what the engine wrote (``cache_write_tokens``)."""

from __future__ import annotations

from types import SimpleNamespace

import openai
import pytest
from starlette.testclient import TestClient

import podium.api.chat
import podium.api.responses.planner
from podium.engine.base import CacheHint
from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED

LONG = "You are a careful assistant who answers in one short sentence. " * 8
BREAK = {"mode": "explicit"}


@pytest.fixture
def app_for(scripted, tmp_path, monkeypatch):
    """The SDK on an app (its lifespan running, a fresh store) of a model with that context;
    ``seen`` holds each prepared request's (conversation, options), as the adapters handed
    them to ``prepare``."""
    seen: list = []
    for module in (podium.api.chat, podium.api.responses.planner):
        real = module.prepare

        def spy(engine, dialect, conversation, options, settings, real=real):
            seen.append((conversation, options))
            return real(engine, dialect, conversation, options, settings)
        monkeypatch.setattr(module, "prepare", spy)
    clients = []

    def build(context_length: int = 4096) -> SimpleNamespace:
        engine = scripted(["Sure."], context_length=context_length)
        settings = Settings(store_url=f"sqlite:///{tmp_path / f'r{len(clients)}.db'}")
        client = TestClient(create_app(settings, engine), raise_server_exceptions=False)
        clients.append(client.__enter__())
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client,
                            max_retries=0)
        return SimpleNamespace(engine=engine, sdk=sdk, seen=seen)
    yield build
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def app(app_for):
    return app_for()


def marked(app) -> str:
    """The text of the part the last request's mark names in its own conversation."""
    conversation, options = app.seen[-1]
    at, part = options.cache_mark
    return conversation.messages[at].parts[part].text


def kept(app) -> str:
    """The prompt's text up to the end of what the engine was asked to keep."""
    request = app.engine.requests[-1]
    return app.engine.tokenizer.decode(request.prompt_token_ids[:request.cache.until])


def chat(app, messages, **fields):
    return app.sdk.chat.completions.create(model=SERVED, messages=messages, **fields)


def respond(app, input, **fields):
    return app.sdk.responses.create(model=SERVED, input=input, **fields)


# -- Chat Completions ------------------------------------------------------------------


def test_a_chat_breakpoint_marks_its_part_and_usage_counts_the_write(app):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [
                    {"type": "text", "text": "FIRST " + LONG},
                    {"type": "text", "text": "MARKED", "prompt_cache_breakpoint": BREAK},
                    {"type": "text", "text": "AFTERWARDS"}]},
                {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": "LATER"}]
    answer = chat(app, messages)
    assert app.seen[-1][1].cache_mark == (1, 1) and marked(app) == "MARKED"
    request = app.engine.requests[-1]
    assert request.cache == CacheHint(request.cache.until, None)
    assert 0 < request.cache.until < answer.usage.prompt_tokens
    assert "MARKED" in kept(app) and "AFTERWARDS" not in kept(app)
    details = answer.usage.prompt_tokens_details
    assert details.cache_write_tokens == request.cache.until and details.cached_tokens == 0
    chunks = list(chat(app, messages, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cache_write_tokens == request.cache.until
    # no breakpoint, no field: no hint, nothing written
    plain = chat(app, [{"role": "user", "content": "hi"}])
    assert app.engine.requests[-1].cache is None
    assert plain.usage.prompt_tokens_details.cache_write_tokens == 0


POINT = [{"role": "user", "content": [{"type": "text", "text": LONG,
                                       "prompt_cache_breakpoint": BREAK},
                                      {"type": "text", "text": "Question?"}]}]
LONG_POINT = [{"role": "user", "content": [{"type": "text", "text": LONG,
                                            "prompt_cache_breakpoint": {**BREAK, "ttl": "12h"}},
                                           {"type": "text", "text": "Question?"}]}]
PLAIN = [{"role": "user", "content": LONG}]


@pytest.mark.parametrize("messages, fields, marked_, retain", [
    (PLAIN, {"prompt_cache_retention": "24h"}, False, True),
    (PLAIN, {"prompt_cache_retention": "in_memory"}, False, False),
    (PLAIN, {"prompt_cache_options": {"ttl": "12h"}}, False, True),
    (PLAIN, {"prompt_cache_options": {"ttl": "30m"}}, False, None),
    (POINT, {}, True, None),
    (LONG_POINT, {}, True, True),
    # explicit mode keeps what breakpoints mark; with none, nothing (memory only)
    (PLAIN, {"prompt_cache_options": {"mode": "explicit"}}, False, False),
    (POINT, {"prompt_cache_options": {"mode": "explicit"}}, True, None),
    # in_memory promises nothing on disk, whatever ttl is asked
    (LONG_POINT, {"prompt_cache_retention": "in_memory"}, True, False),
    (PLAIN, {"prompt_cache_key": "k" * 64}, False, None),
])
def test_chat_fields_become_the_engine_s_cache_hint(app, messages, fields, marked_, retain):
    chat(app, messages, **fields)
    cache = app.engine.requests[-1].cache
    if not marked_ and retain is None:
        assert cache is None
        return
    assert cache.retain is retain and (cache.until is not None) is marked_


@pytest.mark.parametrize("fields, param", [
    ({"prompt_cache_key": "k" * 65}, "prompt_cache_key"),
    ({"prompt_cache_retention": "1h"}, "prompt_cache_retention"),
    ({"prompt_cache_options": {"mode": "sometimes"}}, "prompt_cache_options.mode"),
    ({"prompt_cache_options": {"ttl": "1h"}}, "prompt_cache_options.ttl"),
])
def test_chat_refuses_bad_cache_fields_naming_them(app, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(app, PLAIN, **fields)
    assert caught.value.param == param
    assert not app.engine.requests


def test_a_bad_breakpoint_is_refused_naming_it(app):
    bad = [{"role": "user", "content": [{"type": "text", "text": "hi",
                                         "prompt_cache_breakpoint": {"ttl": "5m"}}]}]
    with pytest.raises(openai.BadRequestError) as caught:
        chat(app, bad)
    assert ("messages[0].user.content[0].text.prompt_cache_breakpoint.ttl: Input should be "
            "'30m' or '12h'") in caught.value.message
    bad = [{"role": "user", "content": [{"type": "input_text", "text": "hi",
                                         "prompt_cache_breakpoint": {"mode": "implicit"}}]}]
    with pytest.raises(openai.BadRequestError) as caught:
        respond(app, bad)
    assert caught.value.param == "input[0]"
    assert ("content[0].input_text.prompt_cache_breakpoint.mode: Input should be 'explicit'"
            in caught.value.message)
    assert not app.engine.requests


# -- Responses -------------------------------------------------------------------------


def test_a_responses_breakpoint_marks_the_message_its_item_became(app):
    """Items are not messages: calls join the assistant message before them, and the
    breakpoint in the fifth item's output is the third message's second part."""
    items = [{"role": "user", "content": LONG + "Weather in Paris and Rome?"},
             {"type": "function_call", "call_id": "c1", "name": "weather",
              "arguments": '{"city": "Paris"}'},
             {"type": "function_call", "call_id": "c2", "name": "weather",
              "arguments": '{"city": "Rome"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
             {"type": "function_call_output", "call_id": "c2", "output": [
                 {"type": "input_text", "text": "rainy"},
                 {"type": "input_text", "text": "MARKED", "prompt_cache_breakpoint": BREAK}]},
             {"role": "user", "content": [{"type": "input_text", "text": "AFTERWARDS"}]}]
    r = respond(app, items, instructions="Be brief.")
    assert app.seen[-1][1].cache_mark == (3, 1) and marked(app) == "MARKED"
    request = app.engine.requests[-1]
    assert "MARKED" in kept(app) and "AFTERWARDS" not in kept(app)
    details = r.usage.input_tokens_details
    assert details.cache_write_tokens == request.cache.until > 0
    assert (details.cache_write_tokens_details.ttl_30m_tokens,
            details.cache_write_tokens_details.ttl_12h_tokens) == (request.cache.until, 0)
    # the stored input keeps the breakpoint (listed as given)
    listed = app.sdk.responses.input_items.list(r.id, order="asc").data
    assert listed[4].output[1].prompt_cache_breakpoint.mode == "explicit"


def test_a_breakpoint_in_the_history_still_marks_it(app):
    first = respond(app, [{"role": "user", "content": [
        {"type": "input_text", "text": "FIRST " + LONG, "prompt_cache_breakpoint": BREAK}]}])
    respond(app, "And now?", previous_response_id=first.id)
    assert app.seen[-1][1].cache_mark == (0, 0) and marked(app) == "FIRST " + LONG
    assert "And now?" not in kept(app)


def test_the_mark_follows_the_cut_of_truncation(app_for):
    app = app_for(context_length=80)
    items = [{"role": "user", "content": "word " * 80}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": [
                 {"type": "input_text", "text": "short question",
                  "prompt_cache_breakpoint": BREAK},
                 {"type": "input_text", "text": "AFTERWARDS"}]}]
    respond(app, items, max_output_tokens=5, truncation="auto")
    conversation, options = app.seen[-1]
    assert len(conversation.messages) == 1 and options.cache_mark == (0, 0)
    assert marked(app) == "short question"
    assert "word word" not in kept(app) and "AFTERWARDS" not in kept(app)


def test_responses_echo_the_cache_fields_and_split_writes_by_the_ttl_asked(app):
    r = respond(app, POINT_INPUT, prompt_cache_key="conversation-7",
                prompt_cache_retention="24h",
                prompt_cache_options={"ttl": "12h", "comparison_response_id": "resp_abc"})
    assert app.engine.requests[-1].cache.retain is True
    for body in (r, app.sdk.responses.retrieve(r.id)):
        assert body.prompt_cache_key == "conversation-7"
        assert body.prompt_cache_retention == "24h"
        assert body.prompt_cache_options.model_dump(exclude_none=True) == {
            "mode": "implicit", "ttl": "12h", "comparison_response_id": "resp_abc"}
        assert body.prompt_cache_diagnostics.type == "unavailable"
        details = body.usage.input_tokens_details
        assert details.cache_write_tokens > 0
        assert details.cache_write_tokens_details.ttl_12h_tokens == details.cache_write_tokens
        assert details.cache_write_tokens_details.ttl_30m_tokens == 0
    plain = respond(app, "hi")
    assert plain.prompt_cache_options is None and plain.prompt_cache_retention is None
    assert plain.prompt_cache_diagnostics is None
    assert plain.usage.input_tokens_details.cache_write_tokens == 0


POINT_INPUT = [{"role": "user", "content": [
    {"type": "input_text", "text": LONG, "prompt_cache_breakpoint": BREAK},
    {"type": "input_text", "text": "Question?"}]}]


def test_explicit_mode_without_breakpoints_keeps_nothing(app):
    r = respond(app, LONG, prompt_cache_options={"mode": "explicit"})
    assert app.engine.requests[-1].cache == CacheHint(None, False)
    assert r.usage.input_tokens_details.cache_write_tokens == 0
    assert r.prompt_cache_options.mode == "explicit" and r.prompt_cache_options.ttl == "30m"
    respond(app, POINT_INPUT, prompt_cache_options={"mode": "explicit"})
    assert app.engine.requests[-1].cache.until > 0


@pytest.mark.parametrize("fields, param", [
    ({"prompt_cache_options": {"prewarm": True}}, "prompt_cache_options.prewarm"),
    ({"prompt_cache_key": "k" * 65}, "prompt_cache_key"),
    ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
    ({"prompt_cache_options": {"mode": "sometimes"}}, "prompt_cache_options.mode"),
    ({"prompt_cache_options": {"ttl": "24h"}}, "prompt_cache_options.ttl"),
])
def test_responses_refuse_bad_cache_fields_naming_them(app, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        respond(app, "hi", **fields)
    assert caught.value.param == param
    assert not app.engine.requests
