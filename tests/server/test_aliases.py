"""--model-alias: names matching an alias pattern are served by the served model on every
generating endpoint, answers echo the name asked for, and anything else is still 404."""

import pytest
from openai.types import Model
from openai.types.chat import ChatCompletion
from openai.types.completion import Completion
from openai.types.responses import Response

from tests.conftest import SERVED
from tests.server.responses_check import sse_events
from tests.server.sse import events

CLAUDE = "claude-haiku-4-5"
ALIASES = (f"claude-*={SERVED}", f"gpt-?o={SERVED}")


@pytest.fixture
def aliased(scripted, client_for):
    return client_for(scripted(["Hello there"]), model_alias=ALIASES)


def chat(model, **extra):
    return ("/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "Hi"}], **extra})


def completion(model, **extra):
    return "/v1/completions", {"model": model, "prompt": "Hi", **extra}


def response(model, **extra):
    return "/v1/responses", {"model": model, "input": "Hi", **extra}


def test_every_endpoint_serves_an_aliased_name_and_echoes_it(aliased, client):
    for ask, kind in ((chat, ChatCompletion), (completion, Completion), (response, Response)):
        url, body = ask(CLAUDE)
        r = aliased.post(url, json=body)
        assert r.status_code == 200, (url, r.text)
        assert kind.model_validate(r.json()).model == CLAUDE, url
        # the same request to a server without the alias: not found
        assert client.post(url, json=body).json()["error"]["code"] == "model_not_found"


def test_streams_echo_the_aliased_name(aliased):
    for ask in (chat, completion):
        url, body = ask("claude-sonnet-4-5-20250929", stream=True)
        chunks = events(aliased.post(url, json=body).text)
        assert chunks and {c["model"] for c in chunks} == {"claude-sonnet-4-5-20250929"}, url
    url, body = response(CLAUDE, stream=True)
    done = sse_events(aliased.post(url, json=body).text)[-1]
    assert done["type"] == "response.completed" and done["response"]["model"] == CLAUDE


def test_a_second_pattern_works_and_globs_match_whole_names_case_sensitively(aliased):
    url, body = chat("gpt-4o")
    assert aliased.post(url, json=body).json()["model"] == "gpt-4o"
    for name in ("gpt-40o", "Claude-haiku-4-5", "my-claude-haiku", "gpt-4o-mini", ""):
        for ask in (chat, completion, response):
            url, body = ask(name)
            r = aliased.post(url, json=body)
            assert r.status_code == 404, (url, name)
            error = r.json()["error"]
            assert error["code"] == "model_not_found" and error["param"] == "model"
            assert error["message"] == (f"The model '{name}' does not exist; this server "
                                        f"serves '{SERVED}'")


def test_model_retrieval_answers_for_an_alias_but_the_list_shows_only_the_served_model(aliased):
    assert [m["id"] for m in aliased.get("/v1/models").json()["data"]] == [SERVED]
    assert Model.model_validate(aliased.get(f"/v1/models/{CLAUDE}").json()).id == CLAUDE
    assert Model.model_validate(aliased.get(f"/v1/models/{SERVED}").json()).id == SERVED
    r = aliased.get("/v1/models/llama-3")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_an_alias_to_a_model_not_served_is_refused_when_the_app_is_made(scripted, client_for):
    with pytest.raises(ValueError, match="this server serves 'test-model', not 'other'"):
        client_for(scripted(["x"]), model_alias=(f"claude-*={SERVED}", "gpt-*=other"))
