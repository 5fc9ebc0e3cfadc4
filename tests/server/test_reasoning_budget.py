"""Reasoning budgets, the API side (issue 41): each API's fields become one budget in the
request's ``Options`` (an explicit count over an effort through the model's table; thinking
off is 0 and the template's switch), bad values are 400s in the API's shape, the table is a
setting (per model too), and the reasoning tokens spent are reported."""

from __future__ import annotations

import json
from types import SimpleNamespace

import anthropic
import openai
import pytest
from starlette.testclient import TestClient

from podium import cli
from podium.api import chat, messages, responses
from podium.api.chat import options as chat_options
from podium.api.messages import MessagesService
from podium.api.ollama import chat as ollama_chat
from podium.api.responses.translate import ToolMap, to_options
from podium.catalog import catalog
from podium.engine.base import ModelInfo
from podium.engine.scripted import ScriptedEngine
from podium.errors import InvalidRequestError
from podium.protocol.chat import ChatCompletionRequest
from podium.protocol.messages import CountTokensRequest, MessagesRequest
from podium.protocol.ollama import ChatRequest
from podium.protocol.responses import ResponsesRequest
from podium.server.app import create_app
from podium.settings import Settings
from tests.conftest import SERVED
from tests.server.responses_check import check_stream, sse_events
from tests.server.test_responses import THINK

TABLE = {"none": 0, "minimal": 0, "low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768,
         "max": 32768}                                      # the documented defaults
OFF_KWARGS = {"enable_thinking": False}
HI = [{"role": "user", "content": "hi"}]


def budget(opts) -> tuple:
    """What an adapter's options say about reasoning."""
    return (opts.reasoning_budget, opts.reasoning_budget_param, opts.thinking,
            opts.chat_template_kwargs)


# -- the table ----------------------------------------------------------------------------

def test_the_default_table_is_the_documented_one():
    assert Settings().effort_budgets() == TABLE


def test_flag_environment_and_config_set_entries_over_the_defaults(tmp_path):
    flag = Settings.from_sources(["--reasoning-budgets", "low=100, high = 200"], {})
    assert flag.effort_budgets() == {**TABLE, "low": 100, "high": 200}
    env = Settings.from_sources([], {"PODIUM_REASONING_BUDGETS": "max=9"})
    assert env.effort_budgets() == {**TABLE, "max": 9}
    config = tmp_path / "podium.toml"
    config.write_text('reasoning-budgets = "minimal=64"\n')
    assert Settings.from_sources(["--config", str(config)], {}).effort_budgets() == {
        **TABLE, "minimal": 64}


@pytest.mark.parametrize("given, error", [
    ("low", "'low' is not EFFORT=TOKENS"), ("low=lots", "'low=lots' is not EFFORT=TOKENS"),
    ("low=-1", "'low=-1' is not"), ("low=1.5", "'low=1.5' is not"), ("=5", "'=5' is not"),
    ("huge=5", "unknown effort 'huge'")])
def test_a_malformed_table_is_a_start_up_error(given, error, capsys):
    with pytest.raises(ValueError, match=f"--reasoning-budgets {given!r}: {error}"):
        Settings(reasoning_budgets=given)
    assert cli.main(["serve", "--reasoning-budgets", given]) == 2
    assert f"podium: --reasoning-budgets {given!r}" in capsys.readouterr().err


def test_a_model_table_has_its_own_budgets_and_a_bad_one_names_the_table(tmp_path):
    config = tmp_path / "podium.toml"
    config.write_text('reasoning-budgets = "low=100"\n[[models]]\nname = "a"\nmodel = "x"\n'
                      'reasoning-budgets = "low=7,high=70"\n[[models]]\nname = "b"\n'
                      'model = "y"\n')
    a, b = catalog(Settings.from_sources(["--config", str(config)], {}))
    assert a.source.effort_budgets() == {**TABLE, "low": 7, "high": 70}   # over the defaults
    assert b.source.effort_budgets() == {**TABLE, "low": 100}             # the server's
    config.write_text('[[models]]\nmodel = "x"\nreasoning-budgets = "low=some"\n')
    with pytest.raises(ValueError, match=r"\[\[models\]\] #1: --reasoning-budgets"):
        catalog(Settings.from_sources(["--config", str(config)], {}))


# -- Chat Completions ---------------------------------------------------------------------

def chat_req(**extra) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": SERVED, "messages": HI, **extra})


def test_chat_without_effort_or_count_has_no_limit():
    assert budget(chat_options(chat_req(), 1000)) == (None, None, True, None)


@pytest.mark.parametrize("effort", ["low", "medium", "high", "xhigh"])
def test_chat_efforts_map_through_the_table(effort):
    opts = chat_options(chat_req(reasoning_effort=effort), 1000)
    assert budget(opts) == (TABLE[effort], "reasoning_effort", True, None)
    assert opts.reasoning_effort == effort                      # Harmony's system message


@pytest.mark.parametrize("effort", ["none", "minimal"])
def test_chat_none_and_minimal_turn_thinking_off(effort):
    opts = chat_options(chat_req(reasoning_effort=effort,
                                 chat_template_kwargs={"custom": 1}), 1000)
    assert budget(opts) == (0, "reasoning_effort", False, {"custom": 1, **OFF_KWARGS})


def test_chat_count_wins_over_effort_and_minus_one_is_unset():
    opts = chat_options(chat_req(reasoning_effort="high", thinking_token_budget=300), 1000)
    assert budget(opts) == (300, "thinking_token_budget", True, None)
    opts = chat_options(chat_req(reasoning_effort="none", thinking_token_budget=0), 1000)
    assert budget(opts) == (0, "thinking_token_budget", True, None)     # counted, not off
    opts = chat_options(chat_req(reasoning_effort="low", thinking_token_budget=-1), 1000)
    assert budget(opts) == (1024, "reasoning_effort", True, None)
    assert budget(chat_options(chat_req(thinking_token_budget=-1), 1000))[0] is None


def test_chat_enable_thinking_false_is_off_whatever_else():
    kwargs = {"enable_thinking": False, "custom": 1}
    for extra in ({}, {"reasoning_effort": "high"}, {"thinking_token_budget": 500}):
        opts = chat_options(chat_req(chat_template_kwargs=kwargs, **extra), 1000)
        assert budget(opts) == (0, "chat_template_kwargs.enable_thinking", False, kwargs)


def test_chat_a_table_of_the_models_own():
    table = {**TABLE, "low": 12, "high": 0}
    assert budget(chat_options(chat_req(reasoning_effort="low"), 1000, budgets=table))[:3] \
        == (12, "reasoning_effort", True)
    assert budget(chat_options(chat_req(reasoning_effort="high"), 1000, budgets=table)) \
        == (0, "reasoning_effort", False, OFF_KWARGS)                 # 0 tokens: off


def test_chat_effort_none_beside_enable_thinking_true_is_refused():
    with pytest.raises(InvalidRequestError) as exc:
        chat_options(chat_req(reasoning_effort="none",
                              chat_template_kwargs={"enable_thinking": True}), 1000)
    assert exc.value.param == "reasoning_effort"
    opts = chat_options(chat_req(reasoning_effort="low",
                                 chat_template_kwargs={"enable_thinking": True}), 1000)
    assert budget(opts)[:3] == (1024, "reasoning_effort", True)


# -- Responses ----------------------------------------------------------------------------

def responses_req(**extra) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": SERVED, "input": "hi", **extra})


def responses_options(budgets=TABLE, **extra):
    return to_options(responses_req(**extra), ToolMap(None), budgets)


def test_responses_fields_map_to_one_budget():
    assert budget(responses_options()) == (None, None, True, None)
    for effort in ("low", "medium", "high", "xhigh"):
        assert budget(responses_options(reasoning={"effort": effort})) == (
            TABLE[effort], "reasoning.effort", True, None)
    for effort in ("none", "minimal"):
        assert budget(responses_options(reasoning={"effort": effort})) == (
            0, "reasoning.effort", False, OFF_KWARGS)
    assert budget(responses_options(reasoning={"effort": "none"},
                                    thinking_token_budget=77)) == (
        77, "thinking_token_budget", True, None)
    assert budget(responses_options(reasoning={"effort": "low", "summary": "auto"},
                                    thinking_token_budget=-1))[0] == 1024
    assert budget(responses_options({**TABLE, "medium": 5},
                                    reasoning={"effort": "medium"}))[0] == 5


# -- Anthropic Messages -------------------------------------------------------------------

def anthropic_options(budgets: str = "", count: bool = False, **extra):
    service = MessagesService(None, None, Settings(reasoning_budgets=budgets), None)
    body = {"model": SERVED, "messages": HI, **extra}
    if count:
        return service._options(CountTokensRequest.model_validate(body), None)
    req = MessagesRequest.model_validate({"max_tokens": 4096, **body})
    return service._options(req, req)


def test_anthropic_thinking_and_effort_map_to_one_budget():
    assert budget(anthropic_options()) == (None, None, True, None)
    assert budget(anthropic_options(thinking={"type": "disabled"})) == (
        0, "thinking.type", False, OFF_KWARGS)
    enabled = {"type": "enabled", "budget_tokens": 2048}
    for extra in ({}, {"output_config": {"effort": "low"}}):        # the count wins
        assert budget(anthropic_options(thinking=enabled, **extra)) == (
            2048, "thinking.budget_tokens", True, None)
    assert budget(anthropic_options(thinking={"type": "adaptive"}))[0] is None
    for effort in ("low", "medium", "high", "xhigh", "max"):
        for extra in ({"thinking": {"type": "adaptive"}}, {}):
            opts = anthropic_options(output_config={"effort": effort}, **extra)
            assert budget(opts) == (TABLE[effort], "output_config.effort", True, None)
            assert opts.reasoning_effort == ("xhigh" if effort == "max" else effort)
    assert budget(anthropic_options("low=0", output_config={"effort": "low"})) == (
        0, "output_config.effort", False, OFF_KWARGS)
    counted = anthropic_options(count=True, thinking={"type": "enabled",
                                                      "budget_tokens": 9000})
    assert budget(counted)[:2] == (9000, "thinking.budget_tokens")      # no max_tokens there


@pytest.mark.parametrize("extra, count, words", [
    ({"thinking": {"type": "enabled", "budget_tokens": 1023}}, False, "at least 1024"),
    ({"thinking": {"type": "enabled"}}, False, "needs budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, False,
     "`max_tokens` must be greater than `thinking.budget_tokens`"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1000}}, True, "at least 1024"),
    ({"output_config": {"effort": "enormous"}}, False, "output_config.effort must be one of"),
    ({"output_config": {"effort": "none"}}, True, "output_config.effort must be one of")])
def test_anthropic_refuses_budgets_against_its_rules(extra, count, words):
    with pytest.raises(InvalidRequestError, match=words) as exc:
        anthropic_options(count=count, **extra)
    assert exc.value.param == next(iter(extra)) + (
        ".budget_tokens" if "thinking" in extra else ".effort")


@pytest.fixture
def http(tokenizer):
    """A TestClient on a scripted engine (THINK template); ``settings`` are the server's."""
    def build(replies=("ok",), **settings):
        engine = ScriptedEngine(tokenizer, ModelInfo(SERVED, 8192, THINK, 0), list(replies))
        return TestClient(create_app(Settings(**settings), engine),
                          raise_server_exceptions=False)
    return build


def test_anthropics_400s_come_in_its_shape(http):
    sdk = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=http(),
                              max_retries=0)
    asks = [dict(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 512}),
            dict(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 2000}),
            dict(max_tokens=2000, output_config={"effort": "enormous"})]
    for extra in asks:
        with pytest.raises(anthropic.BadRequestError) as exc:
            sdk.messages.create(model=SERVED, messages=HI, **extra)
        assert exc.value.body["type"] == "error"
        assert exc.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        sdk.messages.count_tokens(model=SERVED, messages=HI,
                                  thinking={"type": "enabled", "budget_tokens": 100})
    ok = sdk.messages.create(model=SERVED, messages=HI, max_tokens=2000,
                             thinking={"type": "enabled", "budget_tokens": 1024})
    assert ok.content[0].text == "ok"


# -- Ollama -------------------------------------------------------------------------------

THINKER = SimpleNamespace(name="template", reasoning_family="think")
HARMONY = SimpleNamespace(name="harmony")


def ollama_options(dialect=THINKER, budgets=TABLE, **extra):
    req = ChatRequest.model_validate({"model": SERVED, "messages": HI, **extra})
    return ollama_chat.options(req, dialect, "messages", [], budgets)


def test_ollama_think_maps_to_one_budget():
    assert budget(ollama_options()) == (None, None, True, None)
    assert budget(ollama_options(think=True)) == (None, None, True, None)
    assert budget(ollama_options(think=False)) == (0, "think", False, OFF_KWARGS)
    for level in ("low", "medium", "high", "max"):
        assert budget(ollama_options(think=level)) == (TABLE[level], "think", True, None)
    assert ollama_options(HARMONY, think="max").reasoning_effort == "high"  # Harmony's
    assert budget(ollama_options(budgets={**TABLE, "low": 0}, think="low")) == (
        0, "think", False, OFF_KWARGS)
    plain = SimpleNamespace(name="template", reasoning_family="none")
    assert budget(ollama_options(plain)) == (None, None, False, None)   # as before


# -- end to end: the served model's table reaches every adapter, 400s in OpenAI's shape ----

@pytest.fixture
def seen(monkeypatch):
    """The options every adapter hands ``prepare``, in order."""
    got = []
    for module in (chat, messages, ollama_chat, responses.planner):
        real = module.prepare

        def spy(engine, dialect, conversation, options, settings, *rest, _real=real, **kw):
            got.append(options)
            return _real(engine, dialect, conversation, options, settings, *rest, **kw)
        monkeypatch.setattr(module, "prepare", spy)
    return got


def test_each_models_table_reaches_each_api(tokenizer, tmp_path, seen):
    settings = Settings(reasoning_budgets="low=100", store_url=f"sqlite:///{tmp_path}/r.db",
                        models=({"name": "a", "model": "x", "reasoning_budgets": "low=7"},
                                {"name": "b", "model": "y"}))
    engines = {name: ScriptedEngine(tokenizer, ModelInfo(name, 8192, THINK, 0), ["ok"] * 4)
               for name in ("a", "b")}
    with TestClient(create_app(settings, catalog(settings), loaded=engines),
                    raise_server_exceptions=False) as c:
        for model, tokens in (("a", 7), ("b", 100)):
            del seen[:]
            asks = [("/v1/chat/completions", {"messages": HI, "reasoning_effort": "low"}),
                    ("/v1/responses", {"input": "hi", "reasoning": {"effort": "low"}}),
                    ("/v1/messages", {"messages": HI, "max_tokens": 50,
                                      "output_config": {"effort": "low"}}),
                    ("/api/chat", {"messages": HI, "think": "low", "stream": False})]
            for url, body in asks:
                r = c.post(url, json={"model": model, **body})
                assert r.status_code == 200, r.text
            assert [(o.reasoning_budget, o.reasoning_budget_param) for o in seen] == [
                (tokens, "reasoning_effort"), (tokens, "reasoning.effort"),
                (tokens, "output_config.effort"), (tokens, "think")]


@pytest.mark.parametrize("url, body", [
    ("/v1/chat/completions", {"messages": HI}), ("/v1/responses", {"input": "hi"})])
@pytest.mark.parametrize("value", [-2, 1.5, "100", True])
def test_a_bad_thinking_token_budget_is_a_400_naming_it(http, url, body, value):
    r = http().post(url, json={"model": SERVED, **body, "thinking_token_budget": value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["param"] == "thinking_token_budget"


def test_chat_conflict_is_a_400_through_the_sdk(http):
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=http(),
                        max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.chat.completions.create(model=SERVED, messages=HI, reasoning_effort="none",
                                    extra_body={"chat_template_kwargs":
                                                {"enable_thinking": True}})
    assert exc.value.body["param"] == "reasoning_effort"


# -- reporting ----------------------------------------------------------------------------

def test_chat_usage_reports_the_reasoning_tokens(http, tokenizer):
    reply = "<think>First the weather, then the answer.</think>It is sunny."
    spent = next(n for n in range(1, 100) if tokenizer.decode(
        tokenizer.encode(reply, add_special=False)[:n]).endswith("</think>"))
    c = http([reply] * 3)
    body = {"model": SERVED, "messages": HI}
    folded = c.post("/v1/chat/completions", json=body).json()
    assert folded["usage"]["completion_tokens_details"]["reasoning_tokens"] == spent
    assert folded["choices"][0]["message"]["reasoning_content"].startswith("First")
    r = c.post("/v1/chat/completions", json={**body, "stream": True,
                                              "stream_options": {"include_usage": True}})
    last = sse_chunks(r.text)[-1]
    assert last["usage"]["completion_tokens_details"]["reasoning_tokens"] == spent
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=c,
                        max_retries=0)
    usage = sdk.chat.completions.create(model=SERVED, messages=HI).usage
    assert usage.completion_tokens_details.reasoning_tokens == spent


def test_responses_usage_reports_the_reasoning_tokens(http):
    c = http(["<think>Hmm.</think>Sunny."] * 2)
    for stream in (False, True):
        r = c.post("/v1/responses", json={"model": SERVED, "input": "hi", "stream": stream,
                                          "store": False})
        body = check_stream(sse_events(r.text)) if stream else r.json()
        assert body["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


def sse_chunks(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]
