"""The Responses API on the real default model and through the official openai SDK."""

import json
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest
from openai.types.responses import Response

from tests.e2e.conftest import MODEL, _free_port
from tests.server.responses_check import check_stream, sse_events

TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"], "additionalProperties": False}}]


def test_text_response(client):
    raw = client.responses.with_raw_response.create(model=MODEL, input="Say hi in five words.",
                                                    max_output_tokens=20, temperature=0)
    body = Response.model_validate(raw.http_response.json())
    assert body.status in ("completed", "incomplete") and body.output_text.strip()
    assert client.responses.retrieve(body.id).output_text == body.output_text


def test_stream_helper_runs_to_the_final_response(client):
    with client.responses.stream(model=MODEL, input="Name three colors.",
                                 max_output_tokens=20, temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text and final.output_text


def test_raw_stream_events_validate(server_url):
    body = {"model": MODEL, "input": "Count to three.", "stream": True, "max_output_tokens": 16}
    r = httpx.post(f"{server_url}/v1/responses", json=body, timeout=60)
    check_stream(sse_events(r.text))


def test_function_call_round_trip_over_previous_response_id(client):
    first = client.responses.create(model=MODEL, input="What is the weather in Paris?",
                                    tools=TOOLS, tool_choice="required", max_output_tokens=60,
                                    extra_body={"seed": 1})
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments)["city"]
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=TOOLS, tool_choice="none",
        max_output_tokens=40, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id,
                "output": json.dumps({"temperature": 21, "sky": "sunny"})}])
    assert second.previous_response_id == first.id
    assert second.output_text and not any(i.type == "function_call" for i in second.output)
    assert second.usage.input_tokens > first.usage.input_tokens - 200   # history came along
    items = client.responses.input_items.list(second.id)
    assert [i.type for i in items.data] == ["function_call_output"]


def test_background_resume_and_cancel(client, server_url):
    # greedy counting runs its whole budget: a sampled story could end before the cancel
    # (it did, once in CI: "this one is completed")
    bg = client.responses.create(model=MODEL, input="Count from 1 to 1000, separated by "
                                 "commas.", temperature=0, background=True,
                                 max_output_tokens=400)
    assert bg.status in ("queued", "in_progress")
    deadline = time.monotonic() + 30
    while client.responses.retrieve(bg.id).status == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(0.5)
    resumed = []
    with httpx.stream("GET", f"{server_url}/v1/responses/{bg.id}",
                      params={"stream": "true", "starting_after": 2}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                resumed.append(json.loads(line[6:]))
            if len(resumed) == 5:
                break
    assert resumed[0]["sequence_number"] == 3
    cancelled = client.responses.cancel(bg.id)
    assert cancelled.status == "cancelled"
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(bg.id)
    events = sse_events(httpx.get(f"{server_url}/v1/responses/{bg.id}",
                                  params={"stream": "true"}, timeout=60).text)
    check_stream(events)


def test_store_false(client):
    r = client.responses.create(model=MODEL, input="Hi", store=False, max_output_tokens=5)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_chat_and_responses_agree(client):
    question = "What is the capital of France? Answer in one sentence."
    chat = client.chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": question}], max_tokens=30, temperature=0.7, seed=11)
    resp = client.responses.create(model=MODEL, input=question, max_output_tokens=30,
                                   temperature=0.7, extra_body={"seed": 11})
    assert resp.output_text == chat.choices[0].message.content
    tools_chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Rome?"}], seed=4,
        tools=[{"type": "function", "function": {k: v for k, v in TOOLS[0].items()
                                                 if k != "type"}}],
        tool_choice="required", max_tokens=60)
    tools_resp = client.responses.create(model=MODEL, input="Weather in Rome?", tools=TOOLS,
                                         tool_choice="required", max_output_tokens=60,
                                         extra_body={"seed": 4})
    chat_call = tools_chat.choices[0].message.tool_calls[0].function
    resp_call = next(i for i in tools_resp.output if i.type == "function_call")
    assert (resp_call.name, resp_call.arguments) == (chat_call.name, chat_call.arguments)


def test_a_restart_between_create_and_retrieve(tmp_path):
    env = {**os.environ, "PODIUM_DATA_DIR": str(tmp_path)}

    def start():
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "podium", "serve", "--port", str(port),
                                 "--ctx-size", "2048", "--log-level", "warning"], env=env)
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return proc, f"http://127.0.0.1:{port}"
            except httpx.HTTPError:
                time.sleep(0.1)
        proc.kill()
        pytest.fail("server did not start")

    proc, url = start()
    try:
        created = httpx.post(f"{url}/v1/responses", timeout=60, json={
            "model": MODEL, "input": "Say hello.", "max_output_tokens": 8,
            "stream": True}).text
        rid = sse_events(created)[0]["response"]["id"]
        before = httpx.get(f"{url}/v1/responses/{rid}").json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    proc, url = start()
    try:
        assert httpx.get(f"{url}/v1/responses/{rid}").json() == before
        replay = sse_events(httpx.get(f"{url}/v1/responses/{rid}",
                                      params={"stream": "true"}).text)
        assert check_stream(replay) == before
    finally:
        proc.terminate()
        proc.wait(timeout=30)
