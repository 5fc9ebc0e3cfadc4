"""The prompt cache through a real server and the official ``openai`` SDK (issue 43): a long
prompt's prefix, prefilled once, is restored from disk after the model is unloaded, after a
second model evicted it (``--max-loaded-models 1``) and after the server restarts on the
same folder: ``cached_tokens`` covers it, the answer (temperature 0) is the first one, and
the first token comes much sooner than cold."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai

from podium.engine.llamacpp.model_files import GEMMA_MODEL, default_model_path
from tests.e2e.conftest import podium_serve

MODEL = "qwen"
TEMPLATE = Path(__file__).parent.parent / "data" / "gemma3.jinja"
SYSTEM = "".join(f"Policy {i}: requests about region {i} go to desk {i * 7 % 13}.\n"
                 for i in range(120))


def ask(url: str, model: str = MODEL) -> tuple[str, int, int, float]:
    """The answer, its prompt and cached tokens, and the seconds to its first delta."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    start, first, text, usage = time.monotonic(), None, [], None
    with client.chat.completions.create(
            model=model, temperature=0, max_tokens=24, stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": "Which desk handles region 42?"}]) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.monotonic()
                text.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
    client.close()
    assert usage is not None and first is not None
    return ("".join(text), usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens,
            first - start)


def test_a_long_prefix_is_restored_after_an_unload_a_swap_and_a_restart(tmp_path):
    config = tmp_path / "podium.toml"
    config.write_text(f'''
ctx-size = 4096
max-loaded-models = 1
prompt-cache-dir = "{tmp_path / 'cache'}"
prompt-cache-min-tokens = 256
[[models]]
name = "{MODEL}"
model = "{default_model_path()}"
[[models]]
name = "gemma"
model = "{default_model_path(GEMMA_MODEL)}"
chat-template-file = "{TEMPLATE}"
''')
    args = ("--config", str(config), "--log-level", "warning")
    with podium_serve(*args) as url:
        answer, prompt, cached, cold = ask(url)
        assert prompt > 2000 and cached == 0
        assert httpx.post(f"{url}/v1/models/{MODEL}/unload", timeout=60
                          ).json()["state"] == "unloaded"
        again, _, cached, warm = ask(url)      # loads the model again, then restores
        assert again == answer and cached >= prompt - 256
        health = httpx.get(f"{url}/health").json()
        figures = health["models"][MODEL]["prompt_cache"]
        assert figures["hits"] >= 1 and figures["restored_tokens"] >= cached
        assert "podium_prompt_cache_hits_total" in httpx.get(f"{url}/metrics").text
        ask(url, "gemma")                      # one model at a time: qwen is evicted
        states = {m["id"]: m["state"] for m in httpx.get(f"{url}/v1/models").json()["data"]}
        assert states == {MODEL: "unloaded", "gemma": "loaded"}
        again, _, cached, swapped = ask(url)   # gemma evicted in turn; qwen restores
        assert again == answer and cached >= prompt - 256
    with podium_serve(*args) as url:          # a restart on the same folder
        again, _, cached, restarted = ask(url)
        assert again == answer and cached >= prompt - 256
    print(f"first delta: cold {cold:.2f} s, after an unload {warm:.2f} s, after a swap "
          f"{swapped:.2f} s, after a restart {restarted:.2f} s")
    assert restarted < cold / 3 and swapped < cold / 3
