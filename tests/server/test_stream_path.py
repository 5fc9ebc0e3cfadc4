"""The per-token path of a stream: what a body message crosses on its way to the server."""

import asyncio
import sys

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.apps import served


def _call(app, body: bytes) -> list[tuple[dict, str]]:
    """One request through the ASGI app; each message sent, with the file that sent it."""
    sent: list[tuple[dict, str]] = []
    done = asyncio.Event()
    given = []

    async def receive():
        if not given:
            given.append(body)
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append((message, sys._getframe(1).f_code.co_filename))
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"test"), (b"content-type", b"application/json"),
                         (b"origin", b"http://example.com"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {}}
    asyncio.run(app(scope, receive, send))
    return sent


def test_stream_body_messages_go_straight_from_the_sse_response_to_the_server(scripted):
    """Every wrapper (Starlette's error handler, CORS, the request middleware ...) acts on
    the response start only, so each event's body message skips them: one call per token."""
    app = create_app(Settings(cors_origins=["*"]), scripted(["Hello there, friend"]))
    body = orjson.dumps({"model": SERVED, "stream": True,
                         "messages": [{"role": "user", "content": "hi"}]})
    sent = _call(app, body)
    start = sent[0][0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert b"x-request-id" in headers and b"access-control-allow-origin" in headers
    bodies = [(m, caller) for m, caller in sent if m["type"] == "http.response.body"]
    assert len(bodies) > 5 and bodies[-1][0]["body"] == b"data: [DONE]\n\n"
    assert {caller.rsplit("/", 2)[-2:][1] for _, caller in bodies} == {"sse.py"}
    text = "".join(orjson.loads(m["body"][6:])["choices"][0]["delta"].get("content") or ""
                   for m, _ in bodies[:-1] if m["body"].startswith(b"data: {"))
    assert text == "Hello there, friend"


def _as_dict_chunk(cid, model, index, delta):
    return b"data: " + orjson.dumps({
        "id": cid, "object": "chat.completion.chunk", "created": 1700000000, "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": None,
                     "finish_reason": None}]}) + b"\n\n"


@settings(max_examples=300, deadline=None)
@given(text=st.text(), model=st.text(min_size=1, max_size=30), index=st.integers(0, 12),
       field=st.sampled_from(["reasoning_content", "reasoning"]))
def test_template_chunks_are_the_bytes_of_their_dicts(tokenizer, text, model, index, field):
    """The per-token chunks, written by the encoder from their shape's template, equal
    orjson's encoding of the chunk's dict, byte for byte, whatever the text (quotes, control
    characters, non-ASCII) and the model's name."""
    from podium.parsing.events import ReasoningDelta, TextDelta
    from podium.render.chat import ChatChunks
    from podium.server.sse import ChatSSE

    chunks, encoder = ChatChunks("chatcmpl-x\"y", 1700000000, model, tokenizer, False,
                                 field, n=index + 1), ChatSSE()
    for _ in range(2):                  # the template is made once, then used
        [text_chunk] = chunks.event(index, TextDelta(text))
        assert encoder.encode(text_chunk) == _as_dict_chunk(
            "chatcmpl-x\"y", model, index, {"content": text})
        [reasoning_chunk] = chunks.event(index, ReasoningDelta(text))
        assert encoder.encode(reasoning_chunk) == _as_dict_chunk(
            "chatcmpl-x\"y", model, index, {field: text})


def test_a_small_request_is_prepared_on_the_loop_a_big_one_on_a_worker(scripted, client_for):
    """Handing a small request's rendering and tokenizing to a thread costs several times
    the work (wake-ups, the GIL going back and forth); a big one must not hold the loop."""
    import threading

    client = client_for(scripted(["Hi"]))
    chat = served(client.app).chat
    where: list[str] = []
    prepare = chat._prepare

    def spy(req):
        where.append(threading.current_thread().name)
        return prepare(req)

    chat._prepare = spy
    small = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}]}
    big = {"model": SERVED, "messages": [{"role": "user", "content": "word " * 2000}]}
    for body in (small, big, {**small, "stream": True}):
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert not where[0].startswith("podium-prepare")
    assert where[1].startswith("podium-prepare")
    assert not where[2].startswith("podium-prepare")


def test_a_response_with_stored_history_is_prepared_on_a_worker(scripted, client_for):
    """The stored history behind ``previous_response_id`` can be any size, whatever the body's."""
    import threading

    from podium.api.responses import planner as responses_service

    client = client_for(scripted(["Hi"]))
    where: list[str] = []
    off_loop = responses_service.off_loop

    async def spy(fn, *args, **kw):
        def run(*a):
            where.append(threading.current_thread().name)
            return fn(*a)
        return await off_loop(run, *args, **kw)

    responses_service.off_loop = spy
    try:
        first = client.post("/v1/responses", json={"model": SERVED, "input": "hi"}).json()
        client.post("/v1/responses", json={"model": SERVED, "input": "again",
                                           "previous_response_id": first["id"]})
    finally:
        responses_service.off_loop = off_loop
    assert not where[0].startswith("podium-prepare")
    assert where[1].startswith("podium-prepare")
