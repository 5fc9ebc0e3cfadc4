"""The openai SDK's Responses helpers against Podium served over HTTP (scripted engine)."""

import socket
import threading
import time

import openai
import pytest
import uvicorn

from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
from podium.server.lifecycle import Server
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.test_responses import CALL, THINK, TOOLS


@pytest.fixture
def sdk(tokenizer, tmp_path):
    """An openai client talking to Podium's server (uvicorn) in a thread."""
    engine = ScriptedEngine(tokenizer, ModelInfo(SERVED, 4096, THINK, 0),
                            [f"<think>Let me look it up.</think>Looking.{CALL}"])
    app = create_app(Settings(store_url=f"sqlite:///{tmp_path / 'sdk.db'}"), engine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Server(uvicorn.Config(app, port=port, log_level="warning"), app.state.drain, grace=1)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    yield client
    client.close()
    server.should_exit = True
    thread.join(timeout=10)


def test_stream_helper_with_reasoning_text_and_calls(sdk):
    with sdk.responses.stream(model=SERVED, input="Weather in Paris?", tools=TOOLS) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_response()
    assert {"response.reasoning_text.delta", "response.output_text.delta",
            "response.function_call_arguments.delta", "response.completed"} <= kinds
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "Looking."
    call = final.output[2]
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    assert sdk.responses.retrieve(final.id).id == final.id


def test_sdk_create_and_input_items(sdk):
    r = sdk.responses.create(model=SERVED, input=[{"role": "user", "content": "hi"}],
                             tools=TOOLS)
    assert r.status == "completed" and r.output[-1].type == "function_call"
    page = sdk.responses.input_items.list(r.id)
    assert [i.type for i in page.data] == ["message"]
    sdk.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(r.id)
