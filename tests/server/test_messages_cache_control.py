"""Anthropic's ``cache_control`` (issue 43), through the official ``anthropic`` SDK on the
scripted engine: each breakpoint becomes the engine request's ``CacheHint`` (``until``: the
prompt's tokens up to the marked block), usage reports what the engine read and wrote, and
what Anthropic refuses is refused in its words."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anthropic
import pytest

from tests.conftest import SERVED
from tests.server.test_messages import (URL, anthropic_error, check_stream, frames,
                                        serve)  # noqa: F401 - serve: the fixture
from tests.server.test_responses import THINK

MARK = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
COUNT = "/v1/messages/count_tokens"
CAPTURED = Path(__file__).parents[1] / "data" / "claude_code" / "tool_result_request.json"


def request(**marks) -> dict:
    """A tool round trip with a ``cache_control`` on each named place: ``tool``, ``system``,
    ``first`` (the user's question), ``said`` (the assistant's text), ``call`` (its tool_use),
    ``result`` (the tool_result), ``inner`` (a text block inside it), ``last`` (the user's
    follow-up); ``top``: the request's own (automatic caching)."""
    def on(place: str, block: dict) -> dict:
        return {**block, "cache_control": marks[place]} if place in marks else block
    return {
        "model": SERVED, "max_tokens": 50,
        "tools": [on("tool", WEATHER)],
        "system": [on("system", {"type": "text", "text": "You are terse."})],
        "messages": [
            {"role": "user", "content": [on("first", {"type": "text",
                                                      "text": "Weather in Paris?"})]},
            {"role": "assistant", "content": [
                on("said", {"type": "text", "text": "Checking."}),
                on("call", {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                            "input": {"city": "Paris"}})]},
            {"role": "user", "content": [
                on("result", {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    on("inner", {"type": "text", "text": "Sunny, 21C"})]}),
                on("last", {"type": "text", "text": "And tomorrow?"})]}],
        **({"cache_control": marks["top"]} if "top" in marks else {})}


def sent(http, body: dict) -> tuple[int | None, list[int], dict]:
    """Post ``body``: the engine request's ``CacheHint.until``, its prompt, the usage."""
    r = http.post(URL, json=body)
    assert r.status_code == 200, r.text
    engine_request = http.engine.requests[-1]
    hint = engine_request.cache
    return (hint.until if hint is not None else None), engine_request.prompt_token_ids, \
        r.json()["usage"]


def covered(http, prompt: list[int], until: int) -> str:
    return http.engine.tokenizer.decode(prompt[:until])


def reading(engine, tokens: int) -> None:
    """The engine reports ``tokens`` of each prompt read from its cache (what a real one
    says on a hit), on the first output, beside the scripted engine's own writes."""
    real = engine.generate

    def generate(request):
        outputs = real(request)

        async def run():
            first = True
            async for out in outputs:
                if first:
                    out.cached_tokens, first = min(tokens, len(request.prompt_token_ids)), False
                yield out
        return run()
    engine.generate = generate


# -- where a breakpoint falls ---------------------------------------------------------------

@pytest.mark.parametrize("template", [THINK, "model"])
def test_a_later_breakpoint_covers_more_of_the_prompt(serve, template):
    _, http = serve(["ok"] * 12, template=template)
    until = {}
    for place in ("system", "tool", "first", "said", "call", "inner", "result", "last", "top"):
        until[place], prompt, _ = sent(http, request(**{place: MARK}))
        assert 0 < until[place] <= len(prompt), (place, until[place], len(prompt))
    assert sent(http, request())[0] is None                 # no breakpoint: no hint
    # tools and system are one head here (the template renders them together)
    assert until["system"] == until["tool"] < until["first"] < until["said"]
    assert until["said"] <= until["call"] < until["result"] == until["inner"] < until["last"]
    assert until["top"] == until["last"]                    # automatic: on the last block
    # the last breakpoint is the one that counts
    assert sent(http, request(system=MARK, first=MARK, result=MARK))[0] == until["result"]


def test_a_breakpoint_covers_its_block_and_not_the_next(serve):
    _, http = serve(["ok"] * 5)
    for place, inside, beyond in (("system", "You are terse.", "Weather in Paris?"),
                                  ("first", "Weather in Paris?", "Checking."),
                                  ("call", "Checking.", "Sunny"),
                                  ("result", "Sunny, 21C", "And tomorrow?"),
                                  ("last", "And tomorrow?", None)):
        until, prompt, _ = sent(http, request(**{place: MARK}))
        head = covered(http, prompt, until)
        assert inside in head and (beyond is None or beyond not in head), (place, head)


def test_a_turn_of_tool_results_marks_the_right_message(serve):
    """A user turn of results and text is several messages (the results first): a breakpoint
    on the second result covers both results and not the text; on the first, only it."""
    _, http = serve(["ok"] * 3)

    def turn(marked: int) -> str:
        blocks = [{"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": f"Result {k}"}
                  for k in (1, 2)] + [{"type": "text", "text": "Go on."}]
        blocks[marked] = {**blocks[marked], "cache_control": MARK}
        body = request()
        body["messages"][1]["content"].append({"type": "tool_use", "id": "toolu_2",
                                               "name": "get_weather",
                                               "input": {"city": "Rome"}})
        body["messages"][2] = {"role": "user", "content": blocks}
        until, prompt, _ = sent(http, body)
        return covered(http, prompt, until)

    first, second, text = turn(0), turn(1), turn(2)
    assert "Result 1" in first and "Result 2" not in first
    assert "Result 2" in second and "Go on." not in second
    assert "Go on." in text


def test_automatic_caching_skips_blocks_that_cannot_hold_a_breakpoint(serve):
    _, http = serve(["ok"] * 4)
    empty = {"type": "text", "text": ""}                    # no breakpoint can go there
    explicit, automatic = request(last=MARK), request(top=MARK)
    for body in (explicit, automatic):
        body["messages"][2]["content"].append(empty)
    until = sent(http, explicit)[0]
    assert until and sent(http, automatic)[0] == until
    # already on the last block, with the same ttl: no second breakpoint (a fifth here)
    until = sent(http, request(last=MARK))[0]
    assert until and sent(http, request(tool=MARK, system=MARK, first=MARK, last=MARK,
                                        top=MARK))[0] == until


def test_a_captured_claude_code_turn(serve):
    """Claude Code's own tool-result turn: two system breakpoints and one on the tool result,
    the last block but for the generation prompt."""
    body = json.loads(CAPTURED.read_text())
    body["model"] = SERVED
    _, http = serve(["ok"], template="model", context=32768)
    until, prompt, usage = sent(http, {**body, "stream": False})
    assert len(prompt) - 10 < until < len(prompt)
    assert usage["cache_creation_input_tokens"] == until
    assert http.engine.requests[-1].cache.retain is None


# -- ttl and usage --------------------------------------------------------------------------

@pytest.mark.parametrize("marks, retain, bucket", [
    ({"first": MARK}, None, "ephemeral_5m_input_tokens"),
    ({"system": HOUR, "first": MARK}, True, "ephemeral_1h_input_tokens"),
    ({"top": HOUR}, True, "ephemeral_1h_input_tokens")])
def test_an_hour_asks_the_cache_to_keep_the_prefix(serve, marks, retain, bucket):
    sdk, http = serve(["ok"])
    message = sdk.messages.create(**request(**marks))
    hint = http.engine.requests[-1].cache
    assert hint.retain is retain
    usage = message.usage
    assert usage.cache_creation_input_tokens == hint.until > 0
    other = ({"ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"} - {bucket}).pop()
    assert getattr(usage.cache_creation, bucket) == hint.until
    assert getattr(usage.cache_creation, other) == 0


@pytest.mark.parametrize("read", [0, 10, 10_000])
def test_usage_splits_the_prompt_in_stream_and_not(serve, read):
    sdk, http = serve(["Sunny tomorrow too."] * 3)
    reading(http.engine, read)
    body = request(first=MARK)
    message = sdk.messages.create(**body)
    prompt = len(http.engine.requests[-1].prompt_token_ids)
    written = http.engine.requests[-1].cache.until
    usage = message.usage
    read = min(read, prompt)
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (read, written)
    assert usage.input_tokens == max(prompt - read - written, 0)
    assert usage.output_tokens > 0
    with sdk.messages.stream(**body) as stream:
        final = stream.get_final_message().usage
    # the SDK takes message_delta's counts; cache_creation it reads from message_start only
    assert final.cache_creation is None
    assert final.model_dump(exclude={"cache_creation"}) == usage.model_dump(
        exclude={"cache_creation"})
    events = frames(http.post(URL, json={**body, "stream": True}).text)
    check_stream(events)
    start = events[0]["message"]["usage"]
    assert start == {"input_tokens": prompt, "cache_creation_input_tokens": 0,
                     "cache_read_input_tokens": 0, "output_tokens": 0}
    assert events[-2]["usage"] == usage.model_dump(exclude_none=True)


def test_count_tokens_takes_cache_control_and_counts_the_same(serve):
    sdk, http = serve(["ok"])
    bare = sdk.messages.count_tokens(**{k: v for k, v in request().items()
                                        if k != "max_tokens"}).input_tokens
    marked = sdk.messages.count_tokens(**{k: v for k, v in request(
        system=HOUR, first=MARK, result=MARK, top=MARK).items() if k != "max_tokens"})
    assert marked.input_tokens == bare
    assert len(http.engine.requests) == 0


# -- what Anthropic refuses -----------------------------------------------------------------

ORDER = ("a ttl='1h' cache_control block must not come after a ttl='5m' cache_control "
         "block. Note that blocks are processed in the following order: `tools`, `system`, "
         "`messages`.")


def _thinking_marked() -> dict:
    body = request()
    body["messages"][1]["content"].insert(0, {"type": "thinking", "thinking": "Hmm.",
                                              "signature": "x", "cache_control": MARK})
    return body


def _empty_marked() -> dict:
    body = request()
    body["messages"][0]["content"].append({"type": "text", "text": "", "cache_control": MARK})
    return body


def _system_empty_marked() -> dict:
    body = request()
    body["system"].insert(0, {"type": "text", "text": "", "cache_control": MARK})
    return body


@pytest.mark.parametrize("body, says", [
    (request(tool=MARK, system=MARK, first=MARK, said=MARK, last=MARK),
     "A maximum of 4 blocks with cache_control may be provided. Found 5."),
    (request(tool=MARK, system=MARK, first=MARK, said=MARK, top=MARK),  # top: a 5th slot
     "A maximum of 4 blocks with cache_control may be provided. Found 5."),
    (request(first={"type": "persistent"}),
     "messages.0.content.0.cache_control.type: Input should be 'ephemeral'"),
    (request(first={"ttl": "5m"}), "messages.0.content.0.cache_control.type: Field required"),
    (request(result={"type": "ephemeral", "ttl": "10m"}),
     "messages.2.content.0.cache_control.ttl: Input should be '5m' or '1h'"),
    (request(tool="yes"), "tools.0.cache_control: Input should be a valid dictionary"),
    (request(top={"type": "ephemeral", "ttl": "1d"}),
     "cache_control.ttl: Input should be '5m' or '1h'"),
    (_thinking_marked(),
     "messages.1.content.0.thinking.cache_control: Extra inputs are not permitted"),
    (_empty_marked(),
     "messages.0.content.1.text: cache_control cannot be set for empty text blocks"),
    (_system_empty_marked(),
     "system.0.text: cache_control cannot be set for empty text blocks"),
    (request(first=MARK, result=HOUR), "messages.2.content.0.cache_control.ttl: " + ORDER),
    (request(tool=MARK, system=HOUR), "system.0.cache_control.ttl: " + ORDER),
    (request(first=MARK, top=HOUR), "messages.2.content.1.cache_control.ttl: " + ORDER),
    (request(last=MARK, top=HOUR),
     "cache_control.ttl: the automatic breakpoint's ttl='1h' differs from the ttl='5m' of "
     "the cache_control already on the last cacheable block (messages.2.content.1)")])
def test_what_anthropic_refuses_is_a_400_in_its_words(serve, body, says):
    sdk, http = serve(["ok"])
    assert anthropic_error(http.post(URL, json=body), 400, "invalid_request_error") == says
    count = {k: v for k, v in body.items() if k != "max_tokens"}
    assert anthropic_error(http.post(COUNT, json=count), 400, "invalid_request_error") == says
    with pytest.raises(anthropic.BadRequestError, match=re.escape(says)):
        sdk.messages.create(**body)
    assert len(http.engine.requests) == 0


@pytest.mark.parametrize("marks", [
    {"tool": MARK, "system": MARK, "first": MARK, "last": MARK},          # four: the most
    {"tool": HOUR, "system": HOUR, "result": MARK, "last": MARK},         # 1h before 5m
    {"first": HOUR, "last": MARK, "top": MARK},                           # top on last's block
    {"inner": MARK, "result": MARK}])                                     # a result and in it
def test_what_anthropic_takes_is_taken(serve, marks):
    _, http = serve(["ok"])
    until, prompt, _ = sent(http, request(**marks))
    assert 0 < until <= len(prompt)
