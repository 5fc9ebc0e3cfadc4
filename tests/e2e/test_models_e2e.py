"""Several real models behind one ``podium serve``: the default model and Gemma 3 270M (its
file carries no chat template: Gemma's turn format from ``chat-template-file``), with one
model loaded at a time (``--max-loaded-models 1``), driven by the official SDKs."""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from podium.engine.llamacpp.model_files import EMBED_MODEL, GEMMA_MODEL, default_model_path
from tests.e2e.conftest import podium_process

TEMPLATE = Path(__file__).parent.parent / "data" / "gemma3.jinja"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    broken = folder / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)                 # not a model llama.cpp loads
    config = folder / "podium.toml"
    config.write_text(f'''
ctx-size = 2048
max-num-seqs = 2
max-loaded-models = 1
[[models]]
name = "qwen"
model = "{default_model_path()}"
[[models]]
name = "gemma"
model = "{default_model_path(GEMMA_MODEL)}"
chat-template-file = "{TEMPLATE}"
aliases = ["claude-*"]
[[models]]
name = "brief"
model = "{default_model_path()}"
keep-alive = 2
[[models]]
name = "broken"
model = "{broken}"
[[models]]
name = "minilm"
model = "{default_model_path(EMBED_MODEL)}"
''')
    with podium_process("--config", str(config), "--log-level", "warning") as (url, process):
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        yield url, process, sdk, broken
        sdk.close()


def states(url: str) -> dict[str, str]:
    return {m["id"]: m["state"] for m in httpx.get(f"{url}/v1/models").json()["data"]}


def unload_all(url: str) -> None:
    for name, state in states(url).items():
        if state == "loaded":
            assert httpx.post(f"{url}/v1/models/{name}/unload", timeout=60
                              ).json()["state"] == "unloaded"


def loads(url: str, name: str) -> int:
    return httpx.get(f"{url}/health").json()["models"][name]["loads"]


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def ask(sdk: openai.OpenAI, model: str, **extra):
    return sdk.chat.completions.create(model=model, max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": "Name a colour."}], **extra)


def test_loaded_on_demand_and_the_least_recently_used_makes_room(served):
    url, _, sdk, _ = served
    unload_all(url)
    assert set(states(url).values()) <= {"unloaded", "failed"}
    models = sdk.models.list()
    assert {m.id for m in models} == {"qwen", "gemma", "brief", "broken", "minilm"}
    assert ask(sdk, "qwen").choices[0].message.content
    assert states(url)["qwen"] == "loaded"
    assert ask(sdk, "gemma").choices[0].message.content
    assert (states(url)["qwen"], states(url)["gemma"]) == ("unloaded", "loaded")
    card = sdk.models.retrieve("gemma").model_dump()
    assert card["memory_estimate"] > 100 * 2**20 and card["resident_memory"] > 0


def test_a_busy_model_is_not_evicted_its_stream_completes_whole(served):
    url, _, sdk, _ = served
    ask(sdk, "qwen")
    text: list[str] = []
    ends: list[tuple[str | None, float]] = []
    begun = threading.Event()

    def count():
        stream = sdk.chat.completions.create(
            model="qwen", stream=True, max_tokens=120, temperature=0,
            messages=[{"role": "user", "content": "Count from 1 to 100, separated by commas."}])
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
                begun.set()
            if chunk.choices and chunk.choices[0].finish_reason:
                ends.append((chunk.choices[0].finish_reason, time.monotonic()))

    reader = threading.Thread(target=count)
    reader.start()
    assert begun.wait(60)
    other = ask(sdk, "gemma")                   # waits for qwen's stream to end
    answered = time.monotonic()
    reader.join(60)
    assert ends and ends[0][0] == "length" and ends[0][1] < answered
    assert "1, 2, 3" in "".join(text)
    assert other.choices[0].message.content and states(url)["gemma"] == "loaded"


def test_eight_requests_arriving_during_a_load_are_all_answered(served):
    url, _, sdk, _ = served
    unload_all(url)
    before = loads(url, "gemma")
    claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)

    def chat(_):
        return ask(sdk, "gemma").choices[0].message.content

    def chat_stream(_):
        return "".join(c.choices[0].delta.content or "" for c in ask(sdk, "gemma", stream=True)
                       if c.choices)

    def completion(_):
        return sdk.completions.create(model="gemma", prompt="Red, green,", max_tokens=6,
                                      temperature=0).choices[0].text

    def response(_):
        return sdk.responses.create(model="gemma", input="Name a colour.", temperature=0,
                                    max_output_tokens=8).output_text

    def message(_):
        return claude.messages.create(model="claude-haiku-4-5", max_tokens=8, messages=[
            {"role": "user", "content": "Name a colour."}]).content[0].text

    calls = [chat, chat_stream, completion, response, message, chat, response, message]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda call: call(None), calls))
    claude.close()
    assert all(isinstance(a, str) for a in answers) and sum(bool(a) for a in answers) >= 6
    assert loads(url, "gemma") == before + 1                # one load served them all


def test_a_failed_load_is_reported_then_tried_again(served):
    url, _, sdk, broken = served
    with pytest.raises(openai.APIStatusError) as failed:
        ask(sdk, "broken")
    assert failed.value.status_code == 503
    error = failed.value.body
    assert error["code"] == "model_load_failed" and "'broken'" in error["message"]
    card = next(m for m in httpx.get(f"{url}/v1/models").json()["data"] if m["id"] == "broken")
    assert card["state"] == "failed" and card["error"]
    shutil.copyfile(default_model_path(), broken)                  # mended in place
    assert ask(sdk, "broken").choices[0].message.content
    assert states(url)["broken"] == "loaded"


def test_an_idle_model_is_unloaded_after_its_keep_alive_and_loads_again(served):
    url, _, sdk, _ = served
    ask(sdk, "brief")
    first = loads(url, "brief")
    deadline = time.monotonic() + 15
    while states(url)["brief"] != "unloaded":
        assert time.monotonic() < deadline, "brief was not unloaded after its keep-alive"
        time.sleep(0.2)
    assert ask(sdk, "brief").choices[0].message.content
    assert loads(url, "brief") == first + 1


def test_unloading_gives_the_memory_back(served):
    url, process, sdk, _ = served
    unload_all(url)
    before = rss(process.pid)
    ask(sdk, "qwen")
    loaded = rss(process.pid)
    httpx.post(f"{url}/v1/models/qwen/unload", timeout=60)
    after = rss(process.pid)
    print(f"server RSS: {before / 2**20:.0f} MiB, with qwen {loaded / 2**20:.0f} MiB, "
          f"unloaded {after / 2**20:.0f} MiB")
    assert loaded > before + 300 * 2**20
    assert after < before * 1.10


def test_each_model_speaks_its_own_template(served):
    url, _, sdk, _ = served
    call = sdk.chat.completions.create(
        model="qwen", max_tokens=60, temperature=0, tools=TOOLS, tool_choice="required",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    [tool_call] = call.choices[0].message.tool_calls            # Qwen's own tool calls
    assert tool_call.function.name == "get_weather"
    assert json.loads(tool_call.function.arguments)["city"]
    gemma = ask(sdk, "gemma")
    from llama_cpp import Llama

    vocab = Llama(str(default_model_path(GEMMA_MODEL)), vocab_only=True, verbose=False)
    expected = vocab.tokenize(b"<bos><start_of_turn>user\nName a colour.<end_of_turn>\n"
                              b"<start_of_turn>model\n", add_bos=False, special=True)
    assert gemma.usage.prompt_tokens == len(expected)     # Gemma's turns, its special tokens
    # a stored response goes on with another model
    first = sdk.responses.create(model="qwen", input="My cat is called Tiberius. Say OK.",
                                 max_output_tokens=8, temperature=0)
    second = sdk.responses.create(model="gemma", previous_response_id=first.id,
                                  input="What is my cat called?", max_output_tokens=8,
                                  temperature=0)
    alone = sdk.responses.create(model="gemma", input="What is my cat called?",
                                 max_output_tokens=1, temperature=0)
    assert second.model == "gemma"
    assert second.usage.input_tokens > alone.usage.input_tokens + 10      # the history came


def test_an_embedding_model_among_the_chat_models(served):
    url, _, sdk, _ = served
    card = sdk.models.retrieve("minilm").model_dump()
    assert card["kind"] == "embedding"                  # detected from its file
    vectors = sdk.embeddings.create(model="minilm", input=["a red apple", "a green apple",
                                                           "tax law"]).data
    a, b, c = (v.embedding for v in vectors)
    assert len(a) == 384
    assert sum(x * y for x, y in zip(a, b)) > sum(x * y for x, y in zip(a, c))
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        ask(sdk, "minilm")
    with pytest.raises(openai.BadRequestError, match="chat model"):
        sdk.embeddings.create(model="qwen", input="x")
    assert ask(sdk, "qwen").choices[0].message.content     # and back to chat
