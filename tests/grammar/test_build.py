"""podium/grammar/build.py: the grammars Podium hands llguidance, judged by llguidance itself.

A matcher over the default model's real vocabulary reads each text token by token, as the
model would write it: a text it accepts is one decoding can produce, one it refuses is not.
The keyword policy (enforced; else a 400 under ``strict``, a warning otherwise) is checked
keyword by keyword, the README's table against ``keyword_support``, and the keywords the
README used to list as "accepted and not enforced" each on the real model as well.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import jsonschema
import pytest

from podium.errors import InvalidRequestError
from podium.grammar.build import (KEYWORD_PROBES, custom_input, keyword_support,
                                  schema_grammar, tool_call_grammar)
from tests.grammar.conftest import generate

PARAM = "response_format.json_schema.schema"
README = Path(__file__).resolve().parents[2] / "README.md"
ENFORCED, REFUSED = keyword_support()

# for each keyword llguidance enforces: an instance of its probe schema, and one the keyword
# alone makes invalid
EXAMPLES = {
    "type": (3, "3"),
    "enum": ("a", "b"),
    "const": ({"a": 1}, {"a": 2}),
    "multipleOf": (1.5, 1.25),
    "minimum": (0.5, 0.25),
    "maximum": (0.5, 0.75),
    "exclusiveMinimum": (0.75, 0.5),
    "exclusiveMaximum": (0.25, 0.5),
    "minLength": ("ab", "a"),
    "maxLength": ("ab", "abc"),
    "pattern": ("abc", "ab1"),
    "minItems": ([1, "a"], [1]),
    "maxItems": ([1], [1, 2]),
    "items": ([1, 2], [1, "a"]),
    "prefixItems": ([1], [1, 2]),
    "additionalItems": ([1], [1, 2]),
    "properties": ({"a": 1}, {"a": "x"}),
    "required": ({"a": None}, {}),
    "additionalProperties": ({"a": 1}, {"b": 1}),
    "patternProperties": ({"xa": 1, "b": "s"}, {"xa": "s"}),
    "minProperties": ({"a": 1}, {}),
    "maxProperties": ({"a": 1}, {"a": 1, "b": 2}),
    "allOf": (2, 1),
    "anyOf": ("a", None),
    "oneOf": (1, None),
    "$ref": (1, "a"),
    "format: date-time": ("2024-01-02T03:04:05Z", "2024-01-02"),
    "format: date": ("2024-01-02", "2024-13-02"),
    "format: time": ("03:04:05Z", "25:04:05Z"),
    "format: duration": ("P1DT2H", "1D"),
    "format: email": ("a.b@example.com", "a.example.com"),
    "format: hostname": ("api.example.com", "a b"),
    "format: ipv4": ("10.0.0.1", "10.0.0.256"),
    "format: ipv6": ("::1", "1:2:3"),
    "format: uri": ("https://example.com/a?b=c", "not a uri"),
    "format: uuid": ("123e4567-e89b-12d3-a456-426614174000", "123e4567"),
}
DRAFT7 = {"additionalItems"}    # a draft-7 keyword: 2020-12 validators ignore it


def validator(keyword: str, schema: dict) -> jsonschema.protocols.Validator:
    cls = jsonschema.Draft7Validator if keyword in DRAFT7 else jsonschema.Draft202012Validator
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def test_every_enforced_keyword_has_examples_and_the_policy_splits_all_probes():
    assert set(EXAMPLES) == set(ENFORCED)
    assert set(ENFORCED) | set(REFUSED) == set(KEYWORD_PROBES)
    assert not set(ENFORCED) & set(REFUSED)
    assert {"propertyNames", "uniqueItems", "contains", "not", "if"} <= set(REFUSED)


@pytest.mark.parametrize("keyword", ENFORCED)
def test_an_enforced_keyword_is_held_to(matchers, keyword):
    schema = KEYWORD_PROBES[keyword]
    valid, invalid = EXAMPLES[keyword]
    check = validator(keyword, schema)
    check.validate(valid)                       # the examples are what they claim to be
    if not keyword.startswith("format"):        # (format checkers need extra packages)
        assert not check.is_valid(invalid)
    grammar = schema_grammar(schema, PARAM, strict=True)
    assert matchers.accepts_json(grammar, valid)
    assert not matchers.accepts(grammar, json.dumps(invalid))


@pytest.mark.parametrize("keyword", REFUSED)
def test_a_keyword_not_enforced_is_a_400_under_strict_and_a_warning_otherwise(
        matchers, caplog, keyword):
    schema = KEYWORD_PROBES[keyword]
    named = keyword.removeprefix("format: ")
    with pytest.raises(InvalidRequestError) as refused:
        schema_grammar(schema, PARAM, strict=True)
    assert refused.value.param == PARAM and named in refused.value.message
    with caplog.at_level(logging.WARNING, logger="podium.grammar.build"):
        grammar = schema_grammar(schema, PARAM)
    assert any(PARAM in r.getMessage() and named in r.getMessage() for r in caplog.records)
    matchers.grammars.check(grammar)            # and the rest compiles for the model


def test_the_readme_lists_exactly_what_llguidance_enforces_and_what_it_does_not():
    lines = README.read_text().splitlines()

    def listed(head: str) -> list[str]:
        """The names in backquotes of the list item starting ``head`` (and its indented
        continuation lines)."""
        first = [i for i, line in enumerate(lines) if line.startswith(head)]
        assert len(first) == 1, head
        item = [lines[first[0]].removeprefix(head)]
        for line in lines[first[0] + 1:]:
            if not line.startswith("  "):
                break
            item.append(line)
        return re.findall(r"`([^`]+)`", " ".join(item))
    assert listed("- Enforced:") == ENFORCED
    assert listed("- Not enforced:") == REFUSED


# -- schemas no grammar can be made from ------------------------------------------------------

@pytest.mark.parametrize("schema, says", [
    ({"enum": []}, ""),
    ({"type": "frog"}, "frog"),
    ({"type": "string", "pattern": "^(?=a)b$"}, ""),
    ({"type": "string", "minLength": 5, "maxLength": 2}, ""),
    ({"$ref": "#/$defs/missing"}, "missing"),
    ([1], "object or a boolean"),
    ({"enum": [f"v{i}" for i in range(100_000)]}, "too big"),    # over LIMITS, refused fast
])
def test_a_schema_no_grammar_can_be_made_from_is_a_400_naming_the_parameter(schema, says):
    with pytest.raises(InvalidRequestError) as refused:
        schema_grammar(schema, PARAM)
    assert refused.value.param == PARAM and says in refused.value.message
    assert "start:" not in refused.value.message        # not a quote of Podium's grammar


def test_properties_come_in_the_schemas_order(matchers):
    grammar = schema_grammar({"type": "object", "properties": {"a": {}, "b": {}}}, PARAM)
    assert matchers.accepts(grammar, '{"a": 1, "b": 2}')
    assert not matchers.accepts(grammar, '{"b": 2, "a": 1}')     # valid JSON Schema, not written


def test_a_false_schema_within_a_schema_admits_nothing(matchers):
    grammar = schema_grammar({"type": "object", "properties": {"a": False}}, PARAM)
    assert matchers.accepts(grammar, '{"b": 1}')
    assert not matchers.accepts(grammar, '{"a": 1}')


def test_what_used_to_be_too_costly_is_a_grammar_now(matchers):
    values = [f"customer_account_reference_identifier_{i:04d}" for i in range(1000)]
    wide = schema_grammar({"enum": values}, PARAM)
    assert matchers.accepts_json(wide, values[999])
    assert not matchers.accepts(wide, json.dumps(values[999] + "0"))
    long = schema_grammar({"type": "string", "pattern": "^a{1,3000}$"}, PARAM)
    assert matchers.accepts(long, json.dumps("a" * 3000))
    assert not matchers.accepts(long, json.dumps("a" * 3001))


# -- the keywords the README listed as "accepted and not enforced" ----------------------------

FORMERLY_UNENFORCED = [       # what, schema, a valid instance, an invalid one | refused keyword
    ("minimum on a number", {"type": "number", "minimum": 1.5}, 2.5, 1.25),
    ("multipleOf", {"type": "number", "multipleOf": 0.25}, 0.75, 0.8),
    ("propertyNames", {"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames"),
    ("patternProperties", {"type": "object", "patternProperties": {"^n_": {"type": "integer"}},
                           "additionalProperties": False}, {"n_a": 1}, {"n_a": "x"}),
    ("minProperties", {"type": "object", "minProperties": 2}, {"a": 1, "b": 2}, {"a": 1}),
    ("maxProperties", {"type": "object", "maxProperties": 1}, {}, {"a": 1, "b": 2}),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
     "uniqueItems"),
    ("contains", {"type": "array", "contains": {"const": 1}}, "contains"),
    ("oneOf, branches apart", {"oneOf": [{"type": "integer"}, {"type": "string",
                                                                "maxLength": 2}]}, "ab", "abc"),
    ("oneOf, branches overlapping", {"oneOf": [{"type": "integer"}, {"type": "number"}]},
     "oneOf"),
    ("allOf", {"allOf": [{"type": "string", "pattern": "^a"}, {"maxLength": 3}]}, "abc",
     "abcd"),
    ("not", {"type": "string", "not": {"const": "a"}}, "not"),
    ("if", {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if"),
    ("nullable (OpenAPI, ignored: never null)", {"type": "string", "nullable": True}, "a", None),
    ("format: email", {"type": "string", "format": "email"}, "x@example.org", "x@"),
    ("format: ipv6", {"type": "string", "format": "ipv6"}, "fe80::1", "fe80::g"),
    ("format: uri-reference", {"type": "string", "format": "uri-reference"}, "uri-reference"),
    ("minItems without items", {"type": "array", "minItems": 2}, [{}, 1], [{}]),
    ("length bounds beside a pattern", {"type": "string", "pattern": "^[a-z]+$",
                                        "minLength": 2, "maxLength": 4}, "abcd", "abcde"),
]


@pytest.mark.parametrize("case", FORMERLY_UNENFORCED, ids=[c[0] for c in FORMERLY_UNENFORCED])
def test_a_formerly_unenforced_keyword_is_enforced_or_refused(matchers, case):
    what, schema, *rest = case
    if len(rest) == 1:                      # refused under strict, left out otherwise
        with pytest.raises(InvalidRequestError, match=re.escape(rest[0])):
            schema_grammar(schema, PARAM, strict=True)
        matchers.grammars.check(schema_grammar(schema, PARAM))
        return
    valid, invalid = rest
    jsonschema.validate(valid, schema)
    grammar = schema_grammar(schema, PARAM, strict=True)
    assert matchers.accepts_json(grammar, valid)
    assert not matchers.accepts(grammar, json.dumps(invalid))


GENERATED = [
    ({"type": "object", "properties": {
        "price": {"type": "number", "minimum": 1.5, "maximum": 500, "multipleOf": 0.25},
        "code": {"type": "string", "pattern": "^[A-Z]+$", "minLength": 3, "maxLength": 5},
        "contact": {"type": "string", "format": "email", "maxLength": 40},
        "size": {"oneOf": [{"type": "integer", "minimum": 1, "maximum": 9},
                           {"enum": ["small", "large"]}]}},
      "required": ["price", "code", "contact", "size"], "additionalProperties": False},
     "Describe a product for sale as JSON: its price, product code, contact and size."),
    ({"type": "object", "patternProperties": {"^[a-z]{1,8}$": {
        "type": "integer", "minimum": 0, "maximum": 99}},
      "additionalProperties": False, "minProperties": 2, "maxProperties": 3},
     "Give the stock count of a few fruits as a JSON object."),
    ({"allOf": [{"type": "object", "properties": {"host": {"type": "string", "format": "ipv4"}},
                 "required": ["host"]},
                {"properties": {"ports": {"type": "array", "minItems": 2, "maxItems": 3}},
                 "required": ["ports"]}],
      "maxProperties": 2},
     "Give a server's host address and its open ports as JSON."),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("schema, prompt", GENERATED, ids=["numbers-strings-oneOf",
                                                           "patternProperties", "allOf"])
def test_formerly_unenforced_keywords_hold_on_the_real_model(real, schema, prompt, stream):
    generate(real, schema, prompt, stream)


# -- forced tool calls ------------------------------------------------------------------------

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
QUOTED = 'say"hi\\'                  # a name with JSON's two escaped characters
TOOLS = {"get_weather": WEATHER, QUOTED: {"type": "object"}}


def call(name, arguments) -> str:
    return json.dumps({"name": name, "arguments": arguments})


def hermes(*calls: str) -> str:
    return "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)


PARIS = call("get_weather", {"city": "Paris", "days": 3})
ROME = call("get_weather", {"city": "Rome", "days": 1})


@pytest.fixture(scope="module")
def specials(matchers):
    return matchers.tokenizer.grammar_specials


def test_hermes_calls_use_the_models_own_markup_tokens(matchers, specials):
    assert "<tool_call>" in specials
    one = tool_call_grammar(TOOLS, "hermes", False, specials)
    assert "podium_one: <tool_call> " in one          # the token, not its text
    assert matchers.accepts(one, hermes(PARIS))
    assert matchers.accepts(one, hermes(call(QUOTED, {"x": [1]})))
    as_text = tool_call_grammar(TOOLS, "hermes", False, ())
    assert not matchers.accepts(as_text, hermes(PARIS))   # the model writes the token


def bare(*calls: str) -> str:
    return "\n".join(calls)


def bare_list(*calls: str) -> str:
    return "[" + ", ".join(calls) + "]"


@pytest.mark.parametrize("family, parallel, wrap", [
    ("hermes", False, hermes), ("hermes", True, hermes),
    ("json", False, bare), ("json", True, bare_list),      # parallel: always a list
])
def test_a_forced_call_is_one_of_the_tools_with_valid_arguments(matchers, specials, family,
                                                                parallel, wrap):
    grammar = tool_call_grammar(TOOLS, family, parallel, specials)
    assert matchers.accepts(grammar, wrap(PARIS))
    assert matchers.accepts(grammar, wrap(call(QUOTED, {})))
    for wrong in (call("get_wether", {"city": "Paris", "days": 3}),     # no such tool
                  call("get_weather", {"city": "Paris", "days": 9}),    # over maximum
                  call("get_weather", {"city": "Paris"}),               # days missing
                  call("get_weather", {"city": "Paris", "days": 3, "x": 1}),
                  call('say"hi', {}),
                  '{"name": "say"hi\\", "arguments": {}}',             # unescaped
                  ""):
        assert not matchers.accepts(grammar, wrap(wrong)), wrong
    assert matchers.accepts(grammar, wrap(PARIS, ROME)) == parallel
    other_form = bare(PARIS, ROME) if parallel else bare_list(PARIS, ROME)
    assert not matchers.accepts(grammar, other_form)


def test_a_tools_schema_refusal_names_the_tool_and_its_parameter(caplog):
    params = {"ok": "tools[0].function.parameters", "lookup": "tools[1].function.parameters"}
    with pytest.raises(InvalidRequestError) as bad:
        tool_call_grammar({"ok": {}, "lookup": {"type": "frog"}}, "hermes", False,
                          params=params)
    assert bad.value.param == params["lookup"] and "'lookup'" in bad.value.message
    unique = {"ok": {}, "lookup": {"type": "array", "uniqueItems": True}}
    with pytest.raises(InvalidRequestError) as strict:
        tool_call_grammar(unique, "hermes", False, params=params, strict=("lookup",))
    assert strict.value.param == params["lookup"] and "uniqueItems" in strict.value.message
    with caplog.at_level(logging.WARNING, logger="podium.grammar.build"):
        tool_call_grammar(unique, "hermes", False, params=params, strict=("ok",))
    assert any(params["lookup"] in r.getMessage() and "uniqueItems" in r.getMessage()
               for r in caplog.records)


# -- custom tools: the input, as the JSON string the call carries it in ------------------------

INPUT_PARAM = "tools[1].format.definition"


@pytest.fixture(scope="module")
def custom_calls(specials):
    rule, rules = custom_input("regex", r'say "[a-z]+"\n[0-9]{1,3}', INPUT_PARAM, "c0")
    return {family: tool_call_grammar({"get_weather": WEATHER, "speak": None}, family, False,
                                      specials, custom={"speak": rule}, rules=rules)
            for family in ("hermes", "json")}


@pytest.mark.parametrize("family, wrap", [("hermes", hermes), ("json", lambda c: c)])
def test_a_regex_custom_tools_input_is_constrained_in_its_escaped_form(matchers, custom_calls,
                                                                      family, wrap):
    grammar = custom_calls[family]

    def speak(escaped_input: str) -> str:
        return wrap('{"name": "speak", "arguments": {"input": "' + escaped_input + '"}}')
    assert matchers.accepts(grammar, wrap(call("speak", {"input": 'say "hi"\n42'})))
    assert matchers.accepts(grammar, speak('say \\"hi\\"\\u000a7'))     # another escaping
    for wrong in ('say \\"hi\\"\n42',         # a raw newline: not JSON
                  'say "hi"\\n42',            # unescaped quotes end the string
                  'say \\"Hi\\"\\n42',        # not in the language
                  'say \\"hi\\"\\n1234',
                  'say \\"hi\\"\\n42\\n'):
        assert not matchers.accepts(grammar, speak(wrong)), wrong
    assert not matchers.accepts(grammar, wrap(call("speak", {"input": 'say "hi"', "x": 1})))


def test_a_custom_tool_grammar_that_cannot_be_used_is_a_400_naming_it():
    with pytest.raises(InvalidRequestError) as bad:
        custom_input("frog", "a", INPUT_PARAM, "c0")
    assert bad.value.param == INPUT_PARAM and "frog" in bad.value.message
    for definition in ("(?=a)a", "(a"):          # a lookaround; unbalanced
        with pytest.raises(InvalidRequestError) as unusable:
            custom_input("regex", definition, INPUT_PARAM, "c0")
        assert unusable.value.param == INPUT_PARAM


@pytest.mark.parametrize("family, wrap", [("hermes", hermes), ("json", lambda c: c)])
def test_beside_a_custom_tool_the_functions_stay_callable(matchers, custom_calls, family, wrap):
    assert matchers.accepts(custom_calls[family], wrap(PARIS))
