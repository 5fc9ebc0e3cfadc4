"""Ollama's /api/chat and /api/generate on the real default model, driven by the official
``ollama`` Python client and by the ``ollama`` npm client (a Node application speaking
Ollama natively), against the session's one ``podium serve``.

The npm package comes from the npm registry (cached between runs), like Codex's CLI.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import ollama
import pytest

from tests.e2e.conftest import MODEL, npm_package

OLLAMA_JS_VERSION = "0.6.4"
GREEDY = {"temperature": 0, "seed": 1}
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
SYSTEM = {"role": "system",
          "content": "Answer the user's question in one sentence using the tool results."}
ASK = {"role": "user", "content": "What is the weather in Paris right now?"}


@pytest.fixture(scope="module")
def client(server_url):
    client = ollama.Client(host=server_url)
    yield client
    client.close()


def counted(answer) -> None:
    """The last object's counters: present, and its parts within the whole."""
    assert answer.done is True and answer.done_reason in ("stop", "length")
    assert answer.prompt_eval_count > 0 and answer.eval_count > 0
    assert answer.total_duration >= (answer.load_duration + answer.prompt_eval_duration
                                     + answer.eval_duration) > 0


def test_chat_streamed_and_not(client):
    kw = dict(model=MODEL, options={**GREEDY, "num_predict": 16},
              messages=[{"role": "user", "content": "Name three colors, comma separated."}])
    answer = client.chat(**kw)
    assert answer.message.role == "assistant" and answer.message.content
    counted(answer)
    parts = list(client.chat(stream=True, **kw))
    assert "".join(p.message.content for p in parts) == answer.message.content   # greedy
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    counted(parts[-1])
    assert parts[-1].eval_count == answer.eval_count


def test_generate(client):
    answer = client.generate(model=MODEL, system="Reply with one word.",
                             prompt="What color is the sky on a clear day?",
                             options={**GREEDY, "num_predict": 8})
    assert "blue" in answer.response.lower()
    counted(answer)


def test_a_tool_call_round_trip(client):
    first = client.chat(model=MODEL, messages=[SYSTEM, ASK], tools=WEATHER,
                        options={**GREEDY, "num_predict": 60})
    [call] = first.message.tool_calls
    assert call.function.name == "get_weather"
    assert call.function.arguments == {"city": "Paris"}          # an object, not JSON text
    # the call goes back as the client gave it, its result named by tool_name
    second = client.chat(model=MODEL, options={**GREEDY, "num_predict": 40}, messages=[
        SYSTEM, ASK, first.message,
        {"role": "tool", "content": "18 degrees Celsius, sunny", "tool_name": "get_weather"}])
    assert "18" in second.message.content and not second.message.tool_calls


def test_format_with_a_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"]}
    answer = client.chat(model=MODEL, format=schema, options={**GREEDY, "num_predict": 40},
                         messages=[{"role": "user", "content": "Ada is 36 years old. Reply "
                                    "in JSON with her name and age."}])
    value = json.loads(answer.message.content)
    jsonschema.validate(value, schema)
    assert value["age"] == 36


def test_suffix_fills_in_the_middle(client):
    answer = client.generate(model=MODEL, prompt="def add(a, b):\n    ",
                             suffix="\n\nprint(add(1, 2))\n",
                             options={**GREEDY, "num_predict": 12})
    assert answer.response.startswith("return a + b")
    assert "<|fim" not in answer.response


def test_errors(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MODEL, think=True, messages=[{"role": "user", "content": "Hi"}])
    assert e.value.status_code == 400
    assert e.value.error == f'"{MODEL}" does not support thinking'
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="llama3.2", prompt="Hi")
    assert e.value.status_code == 404
    assert e.value.error.startswith('model "llama3.2" not found, try pulling it first')


CHAT_JS = """\
// A streamed chat through the ollama npm client, as its users write one.
import { Ollama } from 'ollama'
const [host, model] = process.argv.slice(2)
const ollama = new Ollama({ host })
const stream = await ollama.chat({
  model, stream: true, options: { temperature: 0, num_predict: 24 },
  messages: [{ role: 'user', content: 'Name three colors, comma separated.' }],
})
let content = '', parts = 0, last
for await (const part of stream) { content += part.message.content; parts += 1; last = part }
console.log(JSON.stringify({ content, parts, done: last.done, done_reason: last.done_reason,
                             eval_count: last.eval_count }))
"""


def ollama_js() -> Path:
    """The ``ollama`` npm package, installed once into the cache; its folder."""
    return npm_package(f"ollama@{OLLAMA_JS_VERSION}", f"ollama-js-{OLLAMA_JS_VERSION}",
                       "ollama npm client")


def test_the_ollama_npm_client_streams_a_chat(server_url):
    root = ollama_js()
    script = root / "podium_chat.mjs"           # beside its node_modules, so it resolves
    script.write_text(CHAT_JS)
    run = subprocess.run(["node", str(script), server_url, MODEL], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    said = json.loads(run.stdout)
    assert said["done"] is True and said["done_reason"] in ("stop", "length")
    assert said["parts"] > 2 and said["eval_count"] > 0
    assert len([c for c in said["content"].split(",") if c.strip()]) == 3
