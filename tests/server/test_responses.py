"""The Responses API on the scripted engine: objects, events, state, background work."""

import time

import pytest
from openai.types.responses import Response
from starlette.testclient import TestClient

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.responses_check import check_stream, sse_events
from tests.server.apps import served

URL = "/v1/responses"
THINK = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
         "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
         "{{ m.content or '' }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}"
         "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
         "<|im_start|>assistant\n")
TOOLS = [{"type": "function", "name": "get_weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def app_for(tokenizer, tmp_path):
    """An app (with its lifespan running) on a scripted engine and a fresh SQLite store."""
    clients = []

    def build(replies, template=THINK, db=None, **settings):
        pacing = {k: settings.pop(k) for k in ("delay", "tokens_per_step") if k in settings}
        engine = ScriptedEngine(tokenizer, ModelInfo(SERVED, settings.pop("context", 4096),
                                                     template, 0), replies, **pacing)
        url = f"sqlite:///{db or tmp_path / 'r.db'}"
        client = TestClient(create_app(Settings(store_url=url, **settings), engine),
                            raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        client.engine = engine
        return client
    yield build
    for client in clients:
        if not getattr(client, "stopped", False):
            client.__exit__(None, None, None)


def stop(client):
    """Shut the app down (its lifespan ends) the way a stopped server would."""
    client.__exit__(None, None, None)
    client.stopped = True


def ask(**extra):
    return {"model": SERVED, "input": "Weather in Paris?", **extra}


def test_text_response_object_and_stream_agree(app_for):
    c = app_for(["Hello there!"])
    body = c.post(URL, json=ask()).json()
    Response.model_validate(body)
    assert set(Response.model_fields) <= set(body)      # every declared field, nulls included
    assert body["status"] == "completed" and body["object"] == "response"
    assert body["output"][0]["content"][0]["text"] == "Hello there!"
    assert body["usage"]["output_tokens"] > 0 and body["usage"]["input_tokens"] > 0
    events = sse_events(c.post(URL, json=ask(stream=True)).text)
    final = check_stream(events)
    assert final["output"][0]["content"][0]["text"] == "Hello there!"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "Hello there!"


def test_reasoning_text_and_calls(app_for):
    c = app_for([f"<think>Need the weather.</think>Checking.{CALL}"])
    for stream in (False, True):
        r = c.post(URL, json=ask(tools=TOOLS, stream=stream))
        body = check_stream(sse_events(r.text)) if stream else r.json()
        Response.model_validate(body)
        kinds = [item["type"] for item in body["output"]]
        assert kinds == ["reasoning", "message", "function_call"]
        reasoning, message, call = body["output"]
        assert reasoning["content"] == [{"type": "reasoning_text", "text": "Need the weather."}]
        assert reasoning["summary"] == []
        assert message["content"][0]["text"] == "Checking."
        assert (call["name"], call["arguments"]) == ("get_weather", '{"city": "Paris"}')
        assert call["call_id"].startswith("call_")
        assert body["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


def test_function_call_round_trip_with_previous_response_id(app_for):
    c = app_for([CALL, "It is sunny in Paris."])
    first = c.post(URL, json=ask(tools=TOOLS, tool_choice="required")).json()
    call = first["output"][0]
    second = c.post(URL, json={"model": SERVED, "previous_response_id": first["id"],
                               "tools": TOOLS, "input": [{"type": "function_call_output",
                                                          "call_id": call["call_id"],
                                                          "output": "sunny, 21C"}]}).json()
    assert second["output"][0]["content"][0]["text"] == "It is sunny in Paris."
    assert second["previous_response_id"] == first["id"]
    prompt = c.engine.tokenizer.decode(c.engine.requests[-1].prompt_token_ids)
    assert "Weather in Paris?" in prompt and "sunny, 21C" in prompt
    assert '<tool_call>get_weather{"city": "Paris"}</tool_call>' in prompt


def test_bad_items_and_unknown_ids(app_for):
    c = app_for(["ok"])
    orphan = {"model": SERVED, "input": [{"type": "function_call_output", "call_id": "nope",
                                          "output": "x"}]}
    r = c.post(URL, json=orphan)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].call_id"
    r = c.post(URL, json={"model": SERVED, "input": [{"role": "wizard", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0]"
    r = c.post(URL, json=ask(previous_response_id="resp_missing"))
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
    assert c.get(f"{URL}/resp_missing").status_code == 404
    r = c.post(URL, json=ask(tools=[{"type": "web_search"}], strict_tools=True))
    assert r.status_code == 200                     # left out with a warning by default
    strict = app_for(["ok"], strict_tools=True)
    r = strict.post(URL, json=ask(tools=[{"type": "web_search"}]))
    assert r.status_code == 400 and "web_search" in r.json()["error"]["message"]


def test_store_false_keeps_nothing(app_for):
    c = app_for(["ok"])
    body = c.post(URL, json=ask(store=False)).json()
    assert c.get(f"{URL}/{body['id']}").status_code == 404
    stored = c.post(URL, json=ask()).json()
    assert c.get(f"{URL}/{stored['id']}").json() == stored


def test_max_output_tokens_gives_incomplete(app_for):
    c = app_for(["one two three four five six seven"])
    body = c.post(URL, json=ask(max_output_tokens=3)).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    events = sse_events(c.post(URL, json=ask(max_output_tokens=3, stream=True)).text)
    assert events[-1]["type"] == "response.incomplete"
    check_stream(events)


def wait_for(c, rid, status, timeout=10):
    deadline = time.monotonic() + timeout
    while (body := c.get(f"{URL}/{rid}").json())["status"] != status:
        assert time.monotonic() < deadline, body["status"]
        time.sleep(0.02)
    return body


def test_background_then_resume_the_stream(app_for):
    c = app_for(["one two three four five six seven eight"], delay=0.01)
    queued = c.post(URL, json=ask(background=True)).json()
    assert queued["status"] in ("queued", "in_progress") and queued["background"] is True
    done = wait_for(c, queued["id"], "completed")
    assert done["output"][0]["content"][0]["text"] == "one two three four five six seven eight"
    everything = sse_events(c.get(f"{URL}/{queued['id']}?stream=true").text)
    check_stream(everything)
    rest = sse_events(c.get(f"{URL}/{queued['id']}?stream=true&starting_after=4").text)
    assert rest == everything[5:]
    check_stream(rest, first_seq=5, whole=False)


def test_background_stream_can_be_dropped_and_resumed(app_for):
    c = app_for(["a b c d e f g h i j k l m n o p"], delay=0.02)
    seen = []
    with c.stream("POST", URL, json=ask(background=True, stream=True)) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.append(line)
            if len(seen) == 6:
                break
    import json
    last = json.loads(seen[-1][6:])["sequence_number"]
    rid = json.loads(seen[0][6:])["response"]["id"]
    rest = sse_events(c.get(f"{URL}/{rid}?stream=true&starting_after={last}").text)
    assert rest[0]["sequence_number"] == last + 1 and rest[-1]["type"] == "response.completed"


def test_cancel_a_background_response(app_for):
    c = app_for(["word " * 400], delay=0.01)
    rid = c.post(URL, json=ask(background=True)).json()["id"]
    wait_for(c, rid, "in_progress")
    cancelled = c.post(f"{URL}/{rid}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert c.get(f"{URL}/{rid}").json()["status"] == "cancelled"
    assert c.engine.stats["running"] == 0
    again = c.post(f"{URL}/{rid}/cancel")
    assert again.status_code == 400
    finished = c.post(URL, json=ask(max_output_tokens=2)).json()
    assert c.post(f"{URL}/{finished['id']}/cancel").status_code == 400


def test_delete(app_for):
    c = app_for(["ok"])
    rid = c.post(URL, json=ask()).json()["id"]
    assert c.delete(f"{URL}/{rid}").json() == {"id": rid, "object": "response", "deleted": True}
    assert c.get(f"{URL}/{rid}").status_code == 404
    assert c.delete(f"{URL}/{rid}").status_code == 404


def test_input_items_pages(app_for):
    c = app_for(["ok"])
    items = [{"role": "user", "content": f"message {i}"} for i in range(5)]
    rid = c.post(URL, json={"model": SERVED, "input": items}).json()["id"]
    page = c.get(f"{URL}/{rid}/input_items?limit=2&order=asc").json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [i["content"] for i in page["data"]] == ["message 0", "message 1"]
    nxt = c.get(f"{URL}/{rid}/input_items?limit=10&order=asc&after={page['last_id']}").json()
    assert [i["content"] for i in nxt["data"]] == ["message 2", "message 3", "message 4"]
    assert nxt["has_more"] is False
    newest = c.get(f"{URL}/{rid}/input_items?limit=1").json()
    assert newest["data"][0]["content"] == "message 4"


def test_restart_fails_unfinished_and_keeps_finished(app_for, tmp_path):
    db = tmp_path / "shared.db"
    first = app_for(["word " * 300], db=db, delay=0.02)
    done = first.post(URL, json=ask(max_output_tokens=3, stream=True)).text
    finished_id = sse_events(done)[0]["response"]["id"]
    running = first.post(URL, json=ask(background=True)).json()["id"]
    wait_for(first, running, "in_progress")
    stop(first)                       # a stop mid-response: left for the next start to resolve
    second = app_for(["ok"], db=db)   # the next start, same database
    assert second.get(f"{URL}/{running}").json()["status"] == "failed"
    raw = second.get(f"{URL}/{finished_id}?stream=true").text
    replay = sse_events(raw) if raw.startswith("event") else pytest.fail(raw)
    check_stream(replay)
    raw = second.get(f"{URL}/{running}?stream=true").text
    tail = sse_events(raw)
    assert tail[-1]["type"] == "response.failed"


def test_namespace_and_custom_tools(app_for):
    reply = ('<tool_call>{"name": "files__read", "arguments": {"path": "a.txt"}}</tool_call>'
             '<tool_call>{"name": "apply_patch", "arguments": {"input": "*** patch"}}</tool_call>')
    c = app_for([reply])
    tools = [{"type": "namespace", "name": "files", "description": "file ops", "tools": [
                 {"type": "function", "name": "read", "parameters": {
                     "type": "object", "properties": {"path": {"type": "string"}}}}]},
             {"type": "custom", "name": "apply_patch", "description": "apply a patch"},
             {"type": "web_search"}]
    for stream in (False, True):
        r = c.post(URL, json=ask(tools=tools, stream=stream))
        body = check_stream(sse_events(r.text)) if stream else r.json()
        Response.model_validate(body)
        fn, custom = body["output"]
        assert (fn["type"], fn["name"], fn["namespace"]) == ("function_call", "read", "files")
        assert (custom["type"], custom["name"], custom["input"]) == (
            "custom_tool_call", "apply_patch", "*** patch")
    prompt = c.engine.tokenizer.decode(c.engine.requests[-1].prompt_token_ids)
    assert "web_search" not in prompt


def test_encrypted_reasoning_round_trip(app_for):
    c = app_for(["<think>secret plan</think>Done.", "Next."])
    body = c.post(URL, json=ask(store=False, include=["reasoning.encrypted_content"])).json()
    reasoning = body["output"][0]
    assert reasoning["encrypted_content"] and "secret plan" not in reasoning["encrypted_content"]
    replay = [{"role": "user", "content": "hi"}, reasoning,
              {"type": "message", "role": "assistant", "content": [
                  {"type": "output_text", "text": "Done."}]},
              {"role": "user", "content": "and?"}]
    reasoning["content"] = None
    c.post(URL, json={"model": SERVED, "input": replay, "store": False})
    prompt = c.engine.tokenizer.decode(c.engine.requests[-1].prompt_token_ids)
    assert "<think>secret plan</think>Done." in prompt
    tampered = dict(reasoning, encrypted_content=reasoning["encrypted_content"][:-4] + "AAAA")
    r = c.post(URL, json={"model": SERVED, "input": [replay[0], tampered, *replay[2:]]})
    assert r.status_code == 400


def test_truncation(app_for):
    c = app_for(["ok"], context=60)
    items = [{"role": "user", "content": "word " * 80}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "short question"}]
    r = c.post(URL, json={"model": SERVED, "input": items, "max_output_tokens": 5})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = c.post(URL, json={"model": SERVED, "input": items, "max_output_tokens": 5,
                          "truncation": "auto"})
    assert r.status_code == 200
    prompt = c.engine.tokenizer.decode(c.engine.requests[-1].prompt_token_ids)
    assert "short question" in prompt and "word word" not in prompt


def test_text_format_logprobs_and_echoed_fields(app_for):
    c = app_for(['{"a": 1}'])
    body = c.post(URL, json=ask(
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        include=["message.output_text.logprobs"], top_logprobs=2, metadata={"k": "v"},
        user="u", prompt_cache_key="pk", safety_identifier="s", max_tool_calls=3,
        client_metadata={"x": 1}, reasoning={"effort": "low", "summary": "auto"})).json()
    Response.model_validate(body)
    assert c.engine.requests[-1].sampling.grammar is not None
    text = body["output"][0]["content"][0]
    assert text["logprobs"] and len(text["logprobs"][0]["top_logprobs"]) <= 2
    for field, value in (("metadata", {"k": "v"}), ("user", "u"), ("prompt_cache_key", "pk"),
                         ("safety_identifier", "s"), ("max_tool_calls", 3)):
        assert body[field] == value


def test_truncation_of_a_long_history_takes_a_few_renders(app_for):
    """200 turns, of which only the last few fit: the cut is found by bisection over turn
    boundaries (a handful of renders, not one per dropped turn), and it is the same cut as
    dropping the oldest turn one at a time would reach: the longest tail of whole turns."""
    c = app_for(["ok"], context=400)
    items = []
    for turn in range(200):
        items += [{"role": "user", "content": f"question {turn} " + "word " * 20},
                  {"role": "assistant", "content": f"answer {turn}"}]
    items.append({"role": "user", "content": "last question"})
    dialect = served(c.app).dialect
    renders = []
    real = dialect.prompt

    def counted(conversation, options):
        renders.append(len(conversation.messages))
        return real(conversation, options)

    dialect.prompt = counted
    r = c.post(URL, json={"model": SERVED, "input": items, "max_output_tokens": 5,
                          "truncation": "auto"})
    assert r.status_code == 200, r.text
    assert len(renders) <= 12                       # 1 + 1 + log2(200) or so; was 195
    prompt = c.engine.tokenizer.decode(c.engine.requests[-1].prompt_token_ids)
    kept = min(t for t in range(200) if f"question {t} " in prompt)
    assert "last question" in prompt and f"answer {kept}" in prompt
    # the turn before the kept ones does not fit with them: the tail is the longest one
    dialect.prompt = real
    longer = items[2 * (kept - 1):]
    r = c.post(URL, json={"model": SERVED, "input": longer, "max_output_tokens": 5})
    assert r.json()["error"]["code"] == "context_length_exceeded"
