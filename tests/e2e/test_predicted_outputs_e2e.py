"""Predicted Outputs on the default model through the official ``openai`` SDK (issue 42): a
server that drafts (``--no-deterministic``) renames a variable in a 150-line Python file,
with the file as the prediction: the same answer as without it, most of it accepted."""

from __future__ import annotations

import time

import openai
import pytest

from tests.e2e.conftest import podium_serve

MODEL = "qwen2.5-coder-0.5b-instruct"


def source_file() -> str:
    """A 150-line module whose functions all use ``records``."""
    parts = ['"""Small helpers over lists of records."""\n', "\n"]
    i = 0
    while len("".join(parts).splitlines()) < 150:
        parts.append(f"def total_{i}(records):\n"
                     f"    \"\"\"The sum of field {i} over the records.\"\"\"\n"
                     f"    result = 0\n"
                     f"    for item in records:\n"
                     f"        result += item[{i}]\n"
                     f"    return result\n\n\n")
        i += 1
    return "".join(parts).rstrip() + "\n"


@pytest.fixture(scope="module")
def drafting_client():
    with podium_serve("--no-deterministic", "--ctx-size", "8192", "--log-level",
                      "warning") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                               timeout=600)
        yield client
        client.close()


def test_a_prediction_makes_the_same_edit_with_most_of_it_accepted(drafting_client):
    code = source_file()
    assert len(code.splitlines()) >= 144
    messages = [{"role": "user", "content": (
        "Rename the parameter `records` to `rows` everywhere in this file. Reply with the "
        f"whole file and nothing else.\n\n```python\n{code}```")}]
    kw = dict(model=MODEL, messages=messages, temperature=0, max_tokens=2500)
    start = time.monotonic()
    plain = drafting_client.chat.completions.create(**kw)
    plain_s = time.monotonic() - start
    start = time.monotonic()
    fast = drafting_client.chat.completions.create(
        **kw, prediction={"type": "content", "content": code})
    fast_s = time.monotonic() - start
    assert fast.choices[0].message.content == plain.choices[0].message.content
    assert "rows" in plain.choices[0].message.content
    details = fast.usage.completion_tokens_details
    # the renames themselves (two or three a function) are rejected drafts, and each costs
    # the draft until the output is found in the file again
    assert details.accepted_prediction_tokens > fast.usage.completion_tokens // 4
    assert details.rejected_prediction_tokens >= 0
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0
    print(f"no prediction {plain_s:.1f} s, with {fast_s:.1f} s, "
          f"{details.accepted_prediction_tokens} of {fast.usage.completion_tokens} accepted")
