"""A request's own chat template (``--allow-request-chat-template``) never holds the event loop.

Small bodies are prepared on the event loop (``generation.off_loop``: cheaper than a thread
hop); a request's template can spend seconds of CPU whatever the body's size, so it is always
rendered on a worker thread, where the GIL's switch interval lets the loop in between.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED

# about 12 million loop steps, in a 200-byte body: 1.6 s of CPU on a quiet machine (the
# render's limit is 5 s of CPU); a busy one stretches it
HEAVY = ("{%- for i in range(3500) %}{%- for j in range(3500) %}{%- endfor %}{%- endfor %}"
         "{{ messages[0]['content'] }}")


def test_health_answers_while_a_requests_own_template_renders(scripted):
    app = create_app(Settings(allow_request_chat_template=True), scripted(["Hi"]))
    body = {"model": SERVED, "chat_template": HEAVY,
            "messages": [{"role": "user", "content": "hi"}]}

    async def run() -> tuple[httpx.Response, list[float], float]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://podium") as client:
            started = time.monotonic()
            chat = asyncio.create_task(client.post("/v1/chat/completions", json=body))
            # a /health every 50 ms: a call made any time waits at most one gap to be answered
            gaps, last = [], time.monotonic()
            while not chat.done():
                assert (await client.get("/health")).status_code == 200
                await asyncio.sleep(0.05)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()
            return await chat, gaps, time.monotonic() - started

    answer, gaps, took = asyncio.run(run())
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "Hi"
    assert took > 1.0                   # the render was long enough to matter
    assert max(gaps) < 0.5, gaps
    assert len(gaps) >= 8               # /health answered all along


def test_a_chat_template_file_replaces_the_models_own(scripted, client_for, tmp_path):
    """``--chat-template-file``: the server's template for a model file that carries none
    (or a broken one); the model's own is not used."""
    path = tmp_path / "turns.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}: {{ m.content }}]{% endfor %}"
                    "{% if add_generation_prompt %}[assistant:{% endif %}")
    engine = scripted(["Hi"])
    client = client_for(engine, chat_template_file=str(path))
    r = client.post("/v1/chat/completions", json={
        "model": SERVED, "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200, r.text
    prompt = engine.tokenizer.decode(engine.requests[-1].prompt_token_ids)
    assert "[user: hello][assistant:" in prompt and "<|im_start|>" not in prompt


@pytest.mark.parametrize("content, why", [(None, "No such file"), (b"", "empty"),
                                          (b"\xff\xfe{{", "not UTF-8")])
def test_a_chat_template_file_that_cannot_be_used_stops_the_start(scripted, tmp_path,
                                                                  content, why):
    path = tmp_path / "t.jinja"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=f"--chat-template-file {path}: .*{why}"):
        create_app(Settings(chat_template_file=str(path)), scripted(["Hi"]))
