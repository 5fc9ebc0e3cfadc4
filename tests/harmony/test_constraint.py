"""Harmony (gpt-oss) constrained: a response format and a forced call as grammars over
Harmony's message structure, checked with llguidance on the real o200k_harmony vocabulary
against the turns openai-harmony renders; and through the API, the grammar reaches the
engine instead of the 400 Podium answered before."""

from __future__ import annotations

import functools
import json

import llguidance
import pytest
from starlette.testclient import TestClient

from podium.errors import InvalidRequestError
from podium.grammar.harmony import call_grammar, format_grammar
from podium.server.app import create_app
from podium.settings import Settings
from tests.harmony import harness as h

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}


class _Vocabulary:
    """o200k_harmony for llguidance: ordinary pieces, and the specials (``<|channel|>`` ...)
    marked special, as llguidance reads a gpt-oss GGUF's control tokens."""

    def __init__(self) -> None:
        tok, enc = h.tokenizer(), h.encoding()
        n = len(tok._pieces)
        self.special_token_ids = list(range(n, tok.vocab_size))
        self.tokens = list(tok._pieces) + [_special(enc, i) for i in self.special_token_ids]
        self.eos_token_id = enc.encode("<|return|>", allowed_special="all")[0]
        self.bos_token_id = None
        self._enc = enc

    def __call__(self, text: str) -> list[int]:
        return self._enc.encode(text, allowed_special="all")


def _special(enc, token_id: int) -> bytes:
    try:
        return enc.decode([token_id]).encode()
    except Exception:       # noqa: BLE001 - an unused reserved id
        return f"<|reserved_{token_id}|>".encode()


@functools.cache
def _tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary()))


def accepts(grammar: str, tokens: list[int]) -> bool:
    matcher = llguidance.LLMatcher(_tokenizer(), grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(tokens) and matcher.is_accepting()


def raw(text: str) -> list[int]:
    """Tokens of a turn written by hand (Harmony markup parsed as its special tokens)."""
    return h.encoding().encode(text, allowed_special="all")


def test_a_response_format_holds_the_final_message_and_leaves_reasoning_free():
    grammar = format_grammar(PERSON, "response_format.json_schema.schema", False)
    good = json.dumps({"name": "Ada", "age": 36})
    assert accepts(grammar, h.completion(h.final(good)))
    assert accepts(grammar, h.completion(h.analysis("They want a person.\nOk."),
                                         h.final(good)))
    assert not accepts(grammar, h.completion(h.final("Ada, 36")))
    assert not accepts(grammar, h.completion(h.final(json.dumps({"name": "Ada"}))))
    assert not accepts(grammar, h.completion(h.call("get_weather", '{"city": "Oslo"}')))


def test_a_forced_call_is_one_call_to_a_declared_tool_with_valid_arguments():
    grammar = call_grammar({"get_weather": WEATHER, "get_time": None},
                           {"get_weather": "tools[0].function.parameters",
                            "get_time": "tools[1].function.parameters"}, set())
    assert accepts(grammar, h.completion(h.call("get_weather", '{"city": "Oslo"}')))
    assert accepts(grammar, h.completion(h.analysis("Need weather."),
                                         h.call("get_time", "{}")))
    # the recipient in the role header, as openai-harmony renders history; no <|constrain|>
    assert accepts(grammar, raw(' to=functions.get_weather<|channel|>commentary json'
                                '<|message|>{"city": "Rome"}<|call|>'))
    assert not accepts(grammar, h.completion(h.call("get_weather", '{"town": "Oslo"}')))
    assert not accepts(grammar, h.completion(h.call("launch", "{}")))
    assert not accepts(grammar, h.completion(h.final("It is sunny.")))


def test_a_schema_no_grammar_can_be_made_from_names_its_parameter():
    with pytest.raises(InvalidRequestError) as refused:
        call_grammar({"f": {"type": "frog"}}, {"f": "tools[0].function.parameters"}, set())
    assert refused.value.param == "tools[0].function.parameters"


def test_through_the_api_a_forced_call_and_a_format_reach_the_engine(tmp_path):
    engine = h.engine([h.completion(h.call("get_weather", '{"city": "Paris"}')),
                       h.completion(h.final('{"name": "Ada", "age": 36}'))])
    settings = Settings(store_url=f"sqlite:///{tmp_path / 'r.db'}")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    with TestClient(create_app(settings, engine)) as client:
        r = client.post("/v1/chat/completions", json={
            "model": h.SERVED, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": tools, "tool_choice": "required"})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == \
            "get_weather"
        assert "to=functions.get_weather" in engine.requests[-1].sampling.grammar
        r = client.post("/v1/chat/completions", json={
            "model": h.SERVED, "messages": [{"role": "user", "content": "A person."}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "p", "schema": PERSON}}})
        assert r.status_code == 200, r.text
        assert json.loads(r.json()["choices"][0]["message"]["content"])["age"] == 36
        assert '"final"' in engine.requests[-1].sampling.grammar


def test_a_reasoning_budget_ends_the_analysis_and_the_final_message_follows(tmp_path):
    """Harmony's reasoning is the analysis channel: at the budget the engine writes the end
    of that message and the start of the final one, and the answer follows."""
    thought = "Let me think about the weather in Paris in great detail. " * 4
    engine = h.engine([h.completion(h.analysis(thought), h.final("Sunny."))])
    settings = Settings(store_url=f"sqlite:///{tmp_path / 'r.db'}", reasoning_budgets="low=5")
    with TestClient(create_app(settings, engine)) as client:
        r = client.post("/v1/chat/completions", json={
            "model": h.SERVED, "reasoning_effort": "low",
            "messages": [{"role": "user", "content": "Weather in Paris?"}]})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["content"] == "Sunny."
    written = h.encoding().encode(message["reasoning_content"], allowed_special="all")
    assert len(written) == 5 and thought.startswith(message["reasoning_content"])
    assert engine.requests[-1].sampling.reasoning.tokens == 5
