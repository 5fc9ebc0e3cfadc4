"""vLLM's ``structured_outputs`` extension on Chat Completions and Completions: the grammar
each kind reaches the engine as (scripted engine), the refusals (400s naming the field),
what the default model writes under each kind (real engine), and that the same grammar
texts compile on vLLM's own llguidance."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
from openai import BadRequestError

from podium.api.chat import options
from podium.api.structured import structured_grammar
from podium.conversation import Conversation, Message, TextPart
from podium.dialect.harmony import HarmonyDialect
from podium.errors import InvalidRequestError
from podium.protocol.chat import ChatCompletionRequest
from podium.protocol.structured import StructuredOutputs
from tests.conftest import SERVED
from tests.grammar.conftest import real  # noqa: F401 (a fixture)

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3,
                                                 "maximum": 9}},
          "required": ["n"]}
GBNF = 'root ::= "Answer: " ("yes" | "no")'
LARK = 'start: "Answer: " ANSWER\nANSWER: "yes" | "no"'
VLLM_PYTHON = Path(__file__).parents[2] / ".venv-vllm" / "bin" / "python"


def chat(so: dict, **extra) -> dict:
    return {"model": SERVED, "messages": [{"role": "user", "content": "Go"}],
            "structured_outputs": so, **extra}


def grammar_of(so: dict) -> str:
    return structured_grammar(StructuredOutputs.model_validate(so))


# -- what reaches the engine ----------------------------------------------------------------

@pytest.mark.parametrize("so, expected", [
    ({"regex": r"[A-Z]{3}-[0-9]{4}"}, "start: /[A-Z]{3}-[0-9]{4}/\n"),
    ({"choice": ["yes", "no", 'say "hi"']}, 'start: "yes" | "no" | "say \\"hi\\""\n'),
    ({"grammar": LARK}, LARK),
    ({"grammar": GBNF}, '%llguidance {}\n\nstart: "Answer: " ("yes" | "no")\n\n'),
    ({"json_object": True}, 'start: %json {"x-guidance": {"whitespace_pattern": '
                            '"[\\\\x20\\\\x0A\\\\x0D\\\\x09]{1,64}", "lenient": true}, '
                            '"type": "object"}\n'),
    ({"json": SCHEMA, "disable_any_whitespace": True, "disable_additional_properties": True},
     'start: %json ' + json.dumps({"x-guidance": {"lenient": True,
                                                  "whitespace_flexible": False},
                                   **SCHEMA, "additionalProperties": False}) + "\n"),
    ({"json": json.dumps(SCHEMA), "whitespace_pattern": " ?"},
     'start: %json ' + json.dumps({"x-guidance": {"whitespace_pattern": " ?",
                                                  "lenient": True}, **SCHEMA}) + "\n"),
], ids=["regex", "choice", "lark", "gbnf", "json_object", "json_options", "json_string"])
def test_each_kind_reaches_the_engine_as_its_grammar(scripted, client_for, so, expected):
    engine = scripted(["x"])
    for url, body in ((CHAT, chat(so)),
                      (COMPLETIONS, {"model": SERVED, "prompt": "Go", "structured_outputs": so})):
        r = client_for(engine).post(url, json=body)
        assert r.status_code == 200, r.text
        assert engine.requests[-1].sampling.grammar.split() == expected.split()


def test_a_structural_tag_holds_each_structure_after_its_trigger(scripted, client_for):
    tag = {"triggers": ["<function="], "structures": [
        {"begin": "<function=get>", "schema": SCHEMA, "end": "</function>"}]}
    engine = scripted(["x"])
    r = client_for(engine).post(CHAT, json=chat({"structural_tag": json.dumps(tag)}))
    assert r.status_code == 200, r.text
    grammar = engine.requests[-1].sampling.grammar
    assert 'tag_0_trig[lazy]: TAG_TEXT "<function="' in grammar
    assert 'tag_0: tag_0_trig "get>" %json ' in grammar and grammar.endswith('"</function>"\n')


def test_a_structural_tag_trigger_is_the_special_token_where_the_model_has_one():
    tag = {"triggers": ["<tool_call>"], "structures": [
        {"begin": "<tool_call>", "schema": {"type": "object"}, "end": "</tool_call>"}]}
    so = StructuredOutputs.model_validate({"structural_tag": json.dumps(tag)})
    assert "TAG_TEXT <tool_call>" in structured_grammar(so, {"<tool_call>"})
    assert 'TAG_TEXT "<tool_call>"' in structured_grammar(so, ())


def test_the_option_closes_nested_objects_too():
    nested = {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "array", "items": {"type": "object", "properties": {}}}}}},
        "$defs": {"d": {"properties": {"x": {}}, "additionalProperties": True}}}
    text = grammar_of({"json": nested, "disable_additional_properties": True})
    body = json.loads(text.removeprefix("start: %json "))
    assert body["additionalProperties"] is False
    inner = body["properties"]["a"]
    assert inner["additionalProperties"] is False
    assert inner["properties"]["b"]["items"]["additionalProperties"] is False
    assert body["$defs"]["d"]["additionalProperties"] is True     # said so: kept
    assert "additionalProperties" not in nested                 # the caller's copy untouched


# -- refusals -------------------------------------------------------------------------------

BIG = "a" * (64 * 1024 + 1)


@pytest.mark.parametrize("so, param, says", [
    ({}, "structured_outputs", "exactly one of"),
    ({"regex": "a", "choice": ["a"]}, "structured_outputs", "got regex, choice"),
    ({"json_object": False}, "structured_outputs", "must be true"),
    ({"choice": []}, "structured_outputs.choice", "at least 1"),
    ({"choice": ["a"] * 1001}, "structured_outputs.choice", "at most 1000"),
    ({"choice": ["a" * 1025]}, "structured_outputs.choice[0]", "1024 bytes"),
    ({"regex": BIG}, "structured_outputs.regex", "65536 bytes"),
    ({"grammar": BIG}, "structured_outputs.grammar", "65536 bytes"),
    ({"json": {"enum": [BIG]}}, "structured_outputs.json", "65536 bytes"),
    ({"regex": "(("}, "structured_outputs.regex", "regex"),
    ({"grammar": "root ::= ("}, "structured_outputs.grammar", "not GBNF"),
    ({"grammar": "start: foo"}, "structured_outputs.grammar", "foo"),
    ({"json": "{not json"}, "structured_outputs.json", "does not parse"),
    ({"json": "false"}, "structured_outputs.json", "admits no value"),
    ({"structural_tag": "{}"}, "structured_outputs.structural_tag", "triggers"),
    ({"structural_tag": json.dumps({"triggers": ["<f"], "structures": [
        {"begin": "<g>", "schema": {}, "end": ""}]})},
     "structured_outputs.structural_tag", "none of the triggers"),
    ({"json_object": True, "disable_any_whitespace": True, "whitespace_pattern": " "},
     "structured_outputs.whitespace_pattern", "contradict"),
], ids=["none", "two", "json_object_false", "no_choices", "many_choices", "long_choice",
        "long_regex", "long_grammar", "long_json", "bad_regex", "bad_gbnf", "bad_lark",
        "bad_json_string", "false_schema", "bad_tag", "untriggered_tag", "contradiction"])
def test_a_bad_constraint_is_a_400_naming_it(scripted, client_for, so, param, says):
    client = client_for(scripted(["x"]))
    for url, body in ((CHAT, chat(so)),
                      (COMPLETIONS, {"model": SERVED, "prompt": "Go", "structured_outputs": so})):
        r = client.post(url, json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and says in error["message"], error


@pytest.mark.parametrize("extra", [
    {"response_format": {"type": "json_object"}},
    {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
    {"tools": [{"type": "function", "function": {"name": "f"}}],
     "tool_choice": {"type": "function", "function": {"name": "f"}}},
], ids=["response_format", "required", "named"])
def test_beside_another_constraint_it_is_a_400(scripted, client_for, extra):
    r = client_for(scripted(["x"])).post(CHAT, json=chat({"regex": "a"}, **extra))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "structured_outputs"


def test_beside_a_text_response_format_or_auto_tools_it_constrains(scripted, client_for):
    engine = scripted(["x"])
    r = client_for(engine).post(CHAT, json=chat(
        {"regex": "a"}, response_format={"type": "text"}, tool_choice="auto",
        tools=[{"type": "function", "function": {"name": "f"}}]))
    assert r.status_code == 200, r.text
    assert engine.requests[-1].sampling.grammar == "start: /a/\n"


def test_a_harmony_model_refuses_it():
    req = ChatCompletionRequest.model_validate(chat({"choice": ["a"]}))
    dialect = HarmonyDialect(SimpleNamespace(render=lambda *a, **k: [1]))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError) as caught:
        dialect.prompt(Conversation([Message("user", [TextPart("Go")], "messages[0]")]),
                       options(req, 10))
    assert caught.value.param == "structured_outputs"
    assert "Harmony" in str(caught.value)


# -- on the default model -------------------------------------------------------------------

def _answer(client, so: dict, prompt: str) -> str:
    choice = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], temperature=0,
        max_tokens=60, extra_body={"structured_outputs": so}).choices[0]
    assert choice.finish_reason == "stop", choice
    return choice.message.content or ""


def test_the_model_writes_a_regex(real):  # noqa: F811
    text = _answer(real, {"regex": r"[A-Z]{3}-[0-9]{4}"}, "Make a ticket id for billing.")
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{4}", text), text


def test_the_model_writes_a_choice(real):  # noqa: F811
    text = _answer(real, {"choice": ["Paris", "London", "Rome"]},
                   "Which city is the capital of Italy?")
    assert text in ("Paris", "London", "Rome"), text


@pytest.mark.parametrize("grammar", [LARK, GBNF], ids=["lark", "gbnf"])
def test_the_model_writes_a_grammar(real, grammar):  # noqa: F811
    text = _answer(real, {"grammar": grammar}, "Is the sky blue? Say yes or no.")
    assert text in ("Answer: yes", "Answer: no"), text


def test_the_model_writes_a_json_schema(real):  # noqa: F811
    text = _answer(real, {"json": SCHEMA, "disable_any_whitespace": True},
                   "Give an object with a number n between 3 and 9.")
    jsonschema.validate(json.loads(text), SCHEMA)
    assert " " not in text and "\n" not in text, text


def test_a_raw_completion_writes_a_regex(real):  # noqa: F811
    out = real.completions.create(model="m", prompt="The year the first moon landing "
                                  "happened was", max_tokens=10, temperature=0,
                                  extra_body={"structured_outputs": {"regex": r" [0-9]{4}"}})
    assert re.fullmatch(r" [0-9]{4}", out.choices[0].text), out.choices[0].text


def test_a_bad_grammar_is_refused_on_the_real_engine(real):  # noqa: F811
    with pytest.raises(BadRequestError) as caught:      # the vocabulary has no such token
        _answer(real, {"grammar": "start: <|no_such_token|>"}, "Go")
    assert caught.value.body["param"] == "structured_outputs.grammar"


# -- the same texts on vLLM's llguidance ----------------------------------------------------

VLLM_CASES = [{"regex": r"[A-Z]{3}-[0-9]{4}"}, {"choice": ["yes", "no"]}, {"grammar": LARK},
              {"grammar": GBNF}, {"json_object": True},
              {"json": SCHEMA, "disable_any_whitespace": True,
               "disable_additional_properties": True},
              {"structural_tag": json.dumps({"triggers": ["<function="], "structures": [
                  {"begin": "<function=get>", "schema": SCHEMA, "end": "</function>"}]})}]

# as vLLM's guidance backend takes a grammar (``StructuredOutputsParams(grammar=...)``)
VLLM_CHECK = """
import json, sys, llguidance
for text in json.load(sys.stdin):
    print(json.dumps(llguidance.LLMatcher.validate_grammar(
        llguidance.grammar_from("grammar", text), None)))
"""


def test_the_same_grammars_compile_on_vllms_llguidance():
    """Runs in ./dev test-vllm (vLLM's own environment) and wherever .venv-vllm exists."""
    texts = [grammar_of(so) for so in VLLM_CASES]
    if importlib.util.find_spec("vllm"):
        python = sys.executable
    elif VLLM_PYTHON.exists():
        python = str(VLLM_PYTHON)
    else:
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON}: ./dev test-vllm runs this")
    done = subprocess.run([python, "-c", VLLM_CHECK], input=json.dumps(texts),
                          capture_output=True, text=True, timeout=120, check=True)
    assert [json.loads(line) for line in done.stdout.splitlines()] == [""] * len(texts)
