"""The watch beside a response: a client gone, the shutdown grace period over, or the request's
own task cancelled each stop the work once, and the engine's clean-up then runs to its end,
however often it awaits (podium/server/sse.py, podium/server/watch.py)."""

import asyncio

import orjson
import pytest

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED

PATH = "/v1/chat/completions"


class SlowAbort(ScriptedEngine):
    """An engine whose ``abort`` awaits, as one that asks another thread or process may."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.aborts: list[str] = []

    async def abort(self, request_id: str) -> None:
        for _ in range(3):
            await asyncio.sleep(0)
        await super().abort(request_id)
        self.aborts.append(request_id)


@pytest.fixture
def engine(tokenizer, chat_template) -> SlowAbort:
    info = ModelInfo(SERVED, 4096, chat_template, created=0)
    return SlowAbort(tokenizer, info, ["word " * 400], delay=0.005)


def _scope(body: bytes) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": PATH, "raw_path": PATH.encode(),
            "query_string": b"", "root_path": "", "state": {},
            "headers": [(b"host", b"test"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}


def _body(stream: bool) -> bytes:
    return orjson.dumps({"model": SERVED, "stream": stream,
                         "messages": [{"role": "user", "content": "hi"}]})


async def _call(app, body: bytes, after_bodies: int, act, sent: list) -> None:
    """One request; ``act(task, gone)`` once ``after_bodies`` body messages were sent (0:
    after a pause, for a request that sends nothing until its answer is whole)."""
    gone = asyncio.Event()
    given: list[bytes] = []

    async def receive():
        if not given:
            given.append(body)
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        bodies = sum(m["type"] == "http.response.body" for m in sent)
        if after_bodies and bodies == after_bodies:
            act(task, gone)

    task = asyncio.ensure_future(app(_scope(body), receive, send))
    if not after_bodies:
        await asyncio.sleep(0.05)
        act(task, gone)
    try:
        await asyncio.wait_for(task, timeout=5)
    except asyncio.CancelledError:
        assert task.cancelled()
    for _ in range(10):             # let a cancelled stream's clean-up finish
        await asyncio.sleep(0)


def _texts(sent: list) -> list[bytes]:
    return [m["body"] for m in sent if m["type"] == "http.response.body" and m["body"]]


def test_a_client_gone_mid_stream_lets_the_engine_request_end(engine):
    app = create_app(Settings(), engine)
    sent: list = []
    asyncio.run(_call(app, _body(True), 3, lambda task, gone: gone.set(), sent))
    assert len(engine.aborts) == 1                   # the abort ran to its end
    assert engine.stats["running"] == 0
    assert engine.stats["generated_tokens"] < 100    # stopped, nowhere near the 400 words
    assert not _texts(sent)[-1].startswith(b"data: [DONE]")  # nobody left to tell


def test_the_end_of_the_grace_period_mid_stream_is_told_in_band(engine):
    app = create_app(Settings(), engine)
    sent: list = []
    asyncio.run(_call(app, _body(True), 3, lambda task, gone: app.state.drain._fire(), sent))
    texts = _texts(sent)
    assert texts[-1] == b"data: [DONE]\n\n"
    assert orjson.loads(texts[-2][len(b"data: "):])["error"]["code"] == "server_shutting_down"
    assert len(engine.aborts) == 1 and engine.stats["running"] == 0


def test_the_request_task_cancelled_mid_stream_ends_the_engine_request(engine):
    app = create_app(Settings(), engine)
    sent: list = []
    asyncio.run(_call(app, _body(True), 3, lambda task, gone: task.cancel(), sent))
    assert len(engine.aborts) == 1 and engine.stats["running"] == 0
    assert engine.stats["generated_tokens"] < 100


def test_a_client_gone_before_the_answer_ends_its_engine_request(engine):
    app = create_app(Settings(), engine)
    sent: list = []
    asyncio.run(_call(app, _body(False), 0, lambda task, gone: gone.set(), sent))
    assert sent[0]["status"] == 499                  # (dropped by the server: nobody there)
    assert orjson.loads(_texts(sent)[0])["error"]["code"] == "client_disconnected"
    assert len(engine.aborts) == 1 and engine.stats["running"] == 0


def test_the_grace_period_over_before_the_answer_is_a_503(engine):
    app = create_app(Settings(), engine)
    sent: list = []
    asyncio.run(_call(app, _body(False), 0, lambda task, gone: app.state.drain._fire(), sent))
    assert sent[0]["status"] == 503
    assert orjson.loads(_texts(sent)[0])["error"]["code"] == "server_shutting_down"
    assert len(engine.aborts) == 1 and engine.stats["running"] == 0
