"""Bad input gets OpenAI-shaped errors with the right status; failures mid-stream stay in-band."""

import pytest

from podium.engine.scripted import ScriptedEngine
from podium.errors import EngineError
from tests.conftest import SERVED
from tests.server.sse import events

CHAT = "/v1/chat/completions"


def assert_error(r, status, *, param=None, code=None, says=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    if param is not None:
        assert body["error"]["param"] == param
    if code is not None:
        assert body["error"]["code"] == code
    if says is not None:
        assert says in body["error"]["message"]
    return body["error"]


def chat(**extra):
    return {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}], **extra}


@pytest.mark.parametrize("body, param", [
    ({"model": SERVED}, "messages"),
    (chat(messages=[]), "messages"),
    (chat(messages=[{"role": "user"}]), "messages[0].user.content"),
    (chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0]"),
    (chat(temperature=3), "temperature"),
    (chat(n=0), "n"),
    (chat(max_tokens=-1), "max_tokens"),
    (chat(top_logprobs=21, logprobs=True), "top_logprobs"),
    (chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    (chat(logit_bias={"5": 101}), "logit_bias.5"),
    (chat(stream="yes please"), "stream"),
])
def test_validation_errors_are_400_naming_the_field(client, body, param):
    err = assert_error(client.post(CHAT, json=body), 400, param=param)
    assert param.split(".")[0].split("[")[0] in err["message"]


def test_invalid_json_is_400(client):
    r = client.post(CHAT, content=b'{"model": ', headers={"content-type": "application/json"})
    assert_error(r, 400, says="not valid JSON")


def test_unknown_model_is_404_model_not_found(client):
    assert_error(client.post(CHAT, json=chat(model="gpt-9")), 404, code="model_not_found",
                 param="model")
    assert_error(client.get("/v1/models/gpt-9"), 404, code="model_not_found")


def test_unknown_route_is_404(client):
    assert_error(client.get("/v1/nothing"), 404)


def test_unknown_fields_are_ignored(client):
    assert client.post(CHAT, json=chat(some_future_field={"x": 1})).status_code == 200


def test_image_part_on_text_model_is_400(client):
    msg = [{"role": "user", "content": [{"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    assert_error(client.post(CHAT, json=chat(messages=msg)), 400,
                 param="messages[0].content[1]", says="text only")


def test_context_length_exceeded(scripted, client_for):
    c = client_for(scripted(["ok"], context_length=64))
    assert_error(c.post(CHAT, json=chat(max_tokens=60)), 400, code="context_length_exceeded",
                 param="max_tokens")
    long = chat(messages=[{"role": "user", "content": "word " * 200}])
    assert_error(c.post(CHAT, json=long), 400, code="context_length_exceeded")
    assert_error(c.post("/v1/completions", json={"model": SERVED, "prompt": "word " * 200}),
                 400, code="context_length_exceeded")


def test_request_chat_template_refused_unless_allowed(scripted, client_for):
    body = chat(chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    assert_error(client_for(scripted(["ok"])).post(CHAT, json=body), 400, param="chat_template")
    engine = scripted(["ok"])
    r = client_for(engine, allow_request_chat_template=True).post(CHAT, json=body)
    assert r.status_code == 200
    assert engine.tokenizer.decode(engine.requests[0].prompt_token_ids) == "Hi"


def test_template_injection_through_request_template_is_blocked(scripted, client_for):
    c = client_for(scripted(["ok"]), allow_request_chat_template=True)
    body = chat(chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}")
    assert_error(c.post(CHAT, json=body), 400)


def test_bad_logit_bias_key_is_400(client):
    assert_error(client.post(CHAT, json=chat(logit_bias={"abc": 1})), 400, param="logit_bias")
    assert_error(client.post(CHAT, json=chat(logit_bias={"99999999": 1})), 400,
                 param="logit_bias")


def test_inconsistent_requests_say_so(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert_error(client.post(CHAT, json=chat(top_logprobs=2)), 400, param="top_logprobs")
    assert_error(client.post(CHAT, json=chat(tool_choice="required")), 400, param="tool_choice")
    assert_error(client.post(CHAT, json=chat(tools=tools, tool_choice={
        "type": "function", "function": {"name": "g"}})), 400, param="tool_choice")
    assert_error(client.post(CHAT, json=chat(response_format={
        "type": "json_schema", "json_schema": {"name": "x"}})), 400,
        param="response_format.json_schema")


def test_api_keys(scripted, client_for):
    c = client_for(scripted(["ok"]), api_key=["k1", "k2"])
    assert_error(c.post(CHAT, json=chat()), 401, code="invalid_api_key")
    assert_error(c.post(CHAT, json=chat(), headers={"authorization": "Bearer nope"}), 401,
                 code="invalid_api_key")
    assert c.post(CHAT, json=chat(), headers={"authorization": "Bearer k2"}).status_code == 200
    assert c.get("/health").status_code == 200


def test_body_over_the_limit_is_413(scripted, client_for):
    c = client_for(scripted(["ok"]), max_body_bytes=1000)
    big = chat(messages=[{"role": "user", "content": "x" * 2000}])
    assert_error(c.post(CHAT, json=big), 413)

    def chunks():
        yield b'{"model": "' + b"x" * 600
        yield b"y" * 600 + b'"}'
    assert_error(c.post(CHAT, content=chunks(), headers={"content-type": "application/json"}), 413)


def test_cors(scripted, client_for):
    c = client_for(scripted(["ok"]), cors_origins=["https://app.example"])
    r = c.options(CHAT, headers={"origin": "https://app.example",
                                 "access-control-request-method": "POST"})
    assert r.headers["access-control-allow-origin"] == "https://app.example"


class FailingEngine(ScriptedEngine):
    """Produces a few tokens, then fails the way a broken engine would."""

    async def generate(self, request):
        count = 0
        async for out in super().generate(request):
            yield out
            count += 1
            if count == 3:
                raise EngineError("decode failed: out of memory")


def test_failure_after_stream_began_is_an_in_band_error_then_done(tokenizer, client_for, scripted):
    base = scripted(["one two three four five six"])
    c = client_for(FailingEngine(base.tokenizer, base.info, ["one two three four five six"]))
    r = c.post(CHAT, json=chat(stream=True))
    assert r.status_code == 200
    objs = events(r.text)            # ends with exactly one [DONE]
    assert objs[-1]["error"]["type"] == "server_error"
    assert "out of memory" in objs[-1]["error"]["message"]
    assert "".join(o["choices"][0]["delta"].get("content", "") for o in objs[:-1]) == "one two three"
    # and the server is fine afterwards
    assert_error(c.post(CHAT, json=chat()), 500)
