"""Constraint grammars: bounded and escaped before llama.cpp sees them, and accepted by it.

llama.cpp's parser is the judge here (the real one, on the default model's vocabulary). A
grammar that could crash it is only ever handed to it in a subprocess.
"""

import ctypes
import json
import subprocess
import sys
import textwrap

import llama_cpp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podium.engine.base import SamplingParams
from podium.engine.llamacpp.model import LlamaModel
from podium.engine.llamacpp.sampling import Sampler
from podium.errors import InvalidRequestError
from podium.grammar import (MAX_REPETITION, GrammarError, check_grammar,
                            check_strict, schema_grammar, tool_call_grammar)

PARAM = "response_format.json_schema.schema"


@pytest.fixture(scope="module")
def vocab(model_path):
    model = LlamaModel(model_path, vocab_only=True)
    yield model.vocab
    model.close()


def llama_accepts(vocab, grammar: str) -> bool:
    """Whether llama.cpp's parser takes ``grammar`` (it prints the ones it refuses)."""
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if sampler:
        llama_cpp.llama_sampler_free(sampler)
    return bool(sampler)


def matches(vocab, grammar: str, text: str) -> bool:
    """Whether ``grammar`` lets a model write exactly ``text``: each token of it offered alone
    to llama.cpp's grammar sampler (a refused one is masked, never accepted: accepting it
    would abort the process), then the end of the text."""
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert sampler
    data = text.encode()
    tokens = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), tokens, len(tokens), False, False)
    assert n >= 0
    try:
        for token in [*tokens[:n], llama_cpp.llama_vocab_eos(vocab)]:
            candidate = llama_cpp.llama_token_data(token, 0.0, 0.0)
            array = llama_cpp.llama_token_data_array(ctypes.pointer(candidate), 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
            if candidate.logit == float("-inf"):
                return False
            if token != llama_cpp.llama_vocab_eos(vocab):
                llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)


def refusal(schema) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        schema_grammar(schema, PARAM)
    assert info.value.param == PARAM
    return info.value


# -- bounds -----------------------------------------------------------------------------------

@pytest.mark.parametrize("schema, says", [
    ({"type": "string", "pattern": "^a{1,30000}$"}, "{1,30000}"),
    ({"type": "string", "pattern": "^a{1,3000}$"}, "{1,3000}"),
    ({"type": "string", "pattern": "^(ab|c){2000}$"}, "{2000}"),
    ({"type": "string", "pattern": "^a{5,2}$"}, "{5,2}"),
    ({"type": "string", "maxLength": 5000}, "maxLength is 5000"),
    ({"type": "string", "minLength": 30000}, "minLength is 30000"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength is more than maxLength"),
    ({"type": "string", "maxLength": "5"}, "maxLength must be a non-negative integer"),
    ({"type": "string", "maxLength": -1}, "maxLength must be a non-negative integer"),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 2000}, "maxItems is 2000"),
    ({"type": "object", "properties": {"deep": {"type": "string", "maxLength": 5000}}},
     "#/properties/deep"),
    ({"enum": []}, "enum must be a non-empty list"),
    ({"anyOf": []}, "anyOf must be a non-empty list"),
    ({"type": []}, "type must not be an empty list"),
    ({"type": "object", "properties": {"": {"type": "string"}}}, "property names"),
    ({"$ref": "https://example.com/schema.json"}, "only local references"),
    ({"$ref": "#/definitions/missing"}, "names no subschema"),
    ({"$ref": "#/definitions/", "definitions": {}}, "names no subschema"),
    ({"$ref": "#/x", "x": {"type": "string", "maxLength": 99999}}, "maxLength is 99999"),
    ({"type": "string", "pattern": "^" + "a" * 2000 + "$"}, "1000 characters"),
    ({"type": "string", "pattern": "^a\nb$"}, "control character"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(200)}},
     "optional"),
])
def test_schemas_past_the_bounds_are_refused_naming_the_parameter(schema, says):
    assert says in refusal(schema).message


def test_nesting_is_bounded():
    schema = {"type": "string"}
    for _ in range(40):
        schema = {"type": "array", "items": schema}
    assert "nest" in refusal(schema).message


# Each of these, handed to llama.cpp, ran it out of memory (std::bad_alloc, then abort) when
# tried in a subprocess with a 3 GB limit: at the grammar's creation, or at the first
# character sampled after the opening quote (2**24 stacks).
EXPLODING = "^" + "(" * 24 + "a?" + "){2}" * 24 + "$"


def test_a_pattern_that_explodes_llama_cpp_is_refused():
    assert "too many ways" in refusal({"type": "string", "pattern": EXPLODING}).message


def test_left_recursion_llama_cpp_misses_is_refused():
    with pytest.raises(GrammarError, match="left recursion"):
        check_grammar('root ::= ("a"?) root "b" | "c"')


@pytest.mark.parametrize("schema, says", [
    ({"type": "string", "pattern": "^\\d+$"}, "escape"),            # \d: no GBNF escape
    ({"type": "string", "pattern": "^[^\\x00-\\U0010FFFF]$"}, "matches no character"),
    ({"type": "string", "pattern": "^(a{0,1000})*$"}, "repetition over"),
])
def test_grammars_llama_cpp_would_refuse_are_refused_first(vocab, schema, says):
    assert says in refusal(schema).message


@pytest.mark.parametrize("at_the_bound", [
    lambda n: {"type": "string", "maxLength": n},
    lambda n: {"type": "string", "minLength": n, "maxLength": n},
    lambda n: {"type": "array", "items": {"type": "integer"}, "maxItems": n},
    lambda n: {"type": "string", "pattern": f"^(ab|c){{0,{n}}}$"},
    lambda n: {"type": "object", "properties": {"a": {"$ref": "#/definitions/node"}},
               "definitions": {"node": {"type": "object", "properties": {
                   "next": {"$ref": "#/definitions/node"},
                   "v": {"type": "string", "maxLength": n}}}}},
])
def test_the_bound_is_exact_and_llama_cpp_takes_what_is_within(vocab, at_the_bound):
    assert llama_accepts(vocab, schema_grammar(at_the_bound(MAX_REPETITION), PARAM))
    refusal(at_the_bound(MAX_REPETITION + 1))


# -- escaping ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ['a"b', "a\\b", 'end\\"', 'line\nbreak\ttab "q"',
                                   'é "名字" \u2028', '" | root ::= "pwned', "\\u0041",
                                   "\x7f\x01"])
def test_consts_and_property_names_match_their_exact_json(vocab, value):
    schema = {"type": "object", "properties": {value: {"const": value}}, "required": [value]}
    grammar = schema_grammar(schema, PARAM)
    text = json.dumps({value: value}, ensure_ascii=False, separators=(",", ":"))
    assert matches(vocab, grammar, text)
    assert not matches(vocab, grammar, '{"x":"pwned"}')


def test_a_lone_surrogate_stays_an_escape(vocab):
    grammar = schema_grammar({"enum": ["\ud800", "ok"]}, PARAM)
    assert matches(vocab, grammar, '"\\ud800"') and matches(vocab, grammar, '"ok"')


@pytest.mark.parametrize("family, parallel", [("hermes", True), ("json", False)])
def test_tool_names_reach_the_grammar_escaped(vocab, family, parallel):
    name = 'x" | root ::= "pwned\\'
    grammar = tool_call_grammar({name: {"type": "object"}}, family, parallel)
    call = json.dumps({"name": name, "arguments": {}}, separators=(",", ":"))
    call = f"<tool_call>\n{call}\n</tool_call>" if family == "hermes" else call
    assert matches(vocab, grammar, call)
    assert not matches(vocab, grammar, "pwned")


def test_a_rule_named_like_the_call_rule_does_not_replace_it(vocab):
    # the reference resolves (in the call object) to properties.call: a rule named "call"
    grammar = tool_call_grammar({"f": {"type": "object", "properties": {
        "arguments": {"type": "object", "properties": {"call": {"type": "integer"}}},
        "call": {"type": "string", "maxLength": 5},
        "x": {"$ref": "#/properties/arguments/properties/call"}}, "required": ["x"]}},
        "json", False)
    assert matches(vocab, grammar, '{"name":"f","arguments":{"x":"s"}}')


def test_tool_errors_name_the_function_and_its_parameter():
    with pytest.raises(InvalidRequestError) as info:
        tool_call_grammar({"ok": {}, "bad": {"type": "object", "properties": {
            "q": {"type": "string", "maxLength": 5000}}}}, "json", True,
            params={"ok": "tools[0].function.parameters", "bad": "tools[1].function.parameters"})
    assert info.value.param == "tools[1].function.parameters"
    assert "'bad'" in info.value.message and "#/properties/q" in info.value.message
    with pytest.raises(InvalidRequestError) as info:
        tool_call_grammar({"bad": {"enum": []}}, "json", True)
    assert info.value.param == "tools" and "'bad'" in info.value.message


# -- the sampler -------------------------------------------------------------------------------

def test_the_sampler_refuses_an_unchecked_bad_grammar_quietly(vocab, capfd):
    grammar = 'root ::= "\\d" secret-user-content'
    with pytest.raises(InvalidRequestError) as info:
        Sampler(SamplingParams(grammar=grammar), 10, vocab)
    assert "secret" not in info.value.message
    assert "secret" not in capfd.readouterr().err       # llama.cpp never saw it
    Sampler(SamplingParams(grammar='root ::= "ok"'), 10, vocab).close()


CRASH = textwrap.dedent("""
    import json, sys, threading
    from llama_cpp.llama_grammar import json_schema_to_gbnf
    from podium.engine.base import SamplingParams
    from podium.engine.llamacpp.model import LlamaModel
    from podium.engine.llamacpp.model_files import default_model_path
    from podium.engine.llamacpp.sampling import Sampler
    from podium.errors import InvalidRequestError
    from podium.grammar import schema_grammar

    schema = json.loads(sys.argv[2])
    vocab = LlamaModel(default_model_path(), vocab_only=True).vocab

    def run():      # as the engine does: on a thread of its own
        try:
            if sys.argv[1] == "schema":
                grammar = schema_grammar(schema, "response_format.json_schema.schema")
            else:
                grammar = json_schema_to_gbnf(json.dumps(schema))
            Sampler(SamplingParams(grammar=grammar), 10, vocab).close()
            print("accepted")
        except InvalidRequestError as exc:
            print("refused", exc.param)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
""")


@pytest.mark.parametrize("path", ["schema", "raw grammar"])
@pytest.mark.parametrize("schema", [{"type": "string", "pattern": "^a{1,30000}$"},
                                    {"type": "string", "maxLength": 30000}])
def test_the_30000_repetition_crash_is_a_refusal(schema, path):
    result = subprocess.run([sys.executable, "-c", CRASH, path.split()[0], json.dumps(schema)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[0] == "refused"
    assert len(result.stderr) < 2000               # no grammar dumped


# -- the check mirrors llama.cpp -------------------------------------------------------------

@pytest.mark.parametrize("grammar", [
    'root ::= \nspace ::= " "?', 'root ::= x\nx ::= x "a"', 'root ::= "a" ::= "b"',
    'root ::= ("a"', 'root ::= "a")', 'root ::= undefined', 'x ::= "a"', 'root ::= "\\q"',
    'root ::= "\\x0"', 'root ::= ""*', 'root ::= | *', 'root ::= a\na ::= ("x" | ) a',
])
def test_the_check_refuses_what_llama_cpp_refuses(vocab, grammar):
    assert not llama_accepts(vocab, grammar)
    with pytest.raises(GrammarError):
        check_grammar(grammar)


def test_the_check_follows_llama_cpp_repetition_threshold(vocab):
    def nested(n, forward):
        body = ("(x " * n) + ")?" * n
        return f'root ::= {body}\nx ::= "a"' if forward else f'x ::= "a"\nroot ::= {body}'
    for n in (1000, 1001):
        for forward in (True, False):
            grammar = nested(n, forward)
            accepted = llama_accepts(vocab, grammar)
            assert accepted == (n == 1000)
            try:
                check_grammar(grammar)
                assert accepted
            except GrammarError:
                assert not accepted


ATOMS = st.sampled_from(['"a"', '"\\""', '"\\x41"', '"\\u00e9"', '"é"', '[a-z]', '[^"\\\\]',
                         '[\\]-]', '[a-]', '.', 'x', 'y', 'root'])
BAD = st.sampled_from(['"\\q"', '"\\x00"', '""*', '[]', '[z-a]', '::=', '{2}', '(', ')', '|', '*',
                       '\n', '#c\n', '<x>'])


def _alternatives(items):
    """``a b* | c?``: items with repetitions, in sequences, as alternatives."""
    pair = st.tuples(items, st.sampled_from(["", "*", "+", "?"])).map("".join)
    sequence = st.lists(pair, min_size=1, max_size=4).map(" ".join)
    return st.lists(sequence, min_size=1, max_size=3).map(" | ".join)


ALTERNATIVES = st.recursive(_alternatives(ATOMS), lambda inner: _alternatives(
    st.one_of(ATOMS, inner.map(lambda alternatives: f"({alternatives})"))), max_leaves=10)


@st.composite
def grammars(draw):
    names = ["root"] + draw(st.lists(st.sampled_from(["x", "y"]), unique=True))
    text = "\n".join(f"{name} ::= {draw(ALTERNATIVES)}" for name in names)
    if draw(st.booleans()):                 # now and then something llama.cpp refuses
        at = draw(st.integers(0, len(text)))
        text = text[:at] + " " + draw(BAD) + " " + text[at:]
    return text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grammars())
def test_grammars_the_check_accepts_llama_cpp_accepts(vocab, grammar):
    try:
        check_grammar(grammar)
    except GrammarError:
        return
    assert llama_accepts(vocab, grammar), grammar


STRINGS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
LEAVES = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean",
                                                    "null", "object"])}),
    st.fixed_dictionaries({"type": st.just("string")},
                          optional={"minLength": st.integers(0, 1200),
                                    "maxLength": st.integers(0, 1200)}),
    st.fixed_dictionaries({"type": st.just("string"), "pattern": st.builds(
        lambda body, low, high: f"^{body}{{{low},{high}}}$",
        st.sampled_from(["a", "[a-z]", "(ab|c)", "\\.", '"', "x?", "\\\\"]),
        st.integers(0, 1100), st.integers(0, 1100))}),
    st.fixed_dictionaries({"enum": st.lists(st.one_of(STRINGS, st.integers(), st.none()),
                                            max_size=3)}),
    st.fixed_dictionaries({"const": st.one_of(STRINGS, st.integers())}),
    st.fixed_dictionaries({"type": st.just("string"), "format": st.sampled_from(
        ["date", "time", "date-time", "uuid"])}),
)
SCHEMAS = st.recursive(LEAVES, lambda inner: st.one_of(
    st.fixed_dictionaries({"type": st.just("object"),
                           "properties": st.dictionaries(STRINGS, inner, max_size=3)},
                          optional={"required": st.lists(STRINGS, max_size=2),
                                    "additionalProperties": st.booleans()}),
    st.fixed_dictionaries({"type": st.just("array"), "items": inner},
                          optional={"minItems": st.integers(0, 1100),
                                    "maxItems": st.integers(0, 1100)}),
    st.fixed_dictionaries({"anyOf": st.lists(inner, max_size=3)}),
), max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCHEMAS)
def test_schemas_podium_accepts_make_grammars_llama_cpp_accepts(vocab, schema):
    try:
        grammar = schema_grammar(schema, PARAM)
    except InvalidRequestError as exc:
        assert exc.param == PARAM
        return
    assert llama_accepts(vocab, grammar), grammar[:2000]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(STRINGS, st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                 st.lists(STRINGS, max_size=3),
                 # the converter resolves "$ref" keys anywhere, consts included: such a
                 # const is a 400 (test_a_ref_inside_a_const_is_a_400)
                 st.dictionaries(STRINGS.filter(lambda k: k != "$ref"), STRINGS, max_size=2)))
def test_a_const_matches_its_json_text(vocab, value):
    grammar = schema_grammar({"const": value}, PARAM)
    assert matches(vocab, grammar, json.dumps(value, ensure_ascii=False))


def test_a_ref_inside_a_const_is_a_400():
    with pytest.raises(InvalidRequestError) as info:
        schema_grammar({"const": {"$ref": ""}}, PARAM)
    assert info.value.param == PARAM


# -- what one step of a grammar can cost ---------------------------------------------------------

SIMILAR = [f"customer_account_reference_identifier_{i:04d}" for i in range(1000)]


@pytest.mark.parametrize("schema", [
    {"type": "string", "enum": SIMILAR},                  # the campaign's 47 KB enum
    {"type": "string", "enum": SIMILAR[:257]},
    {"anyOf": [{"const": v} for v in SIMILAR[:300]]},     # the same, spelled as a union
    {"type": "object", "properties": {"ref": {"enum": SIMILAR[:400]}}},
])
def test_too_many_alternatives_open_at_once_are_refused(schema):
    message = refusal(schema).message
    assert "256" in message and ("enum" in message or "ways at once" in message)


def test_the_widest_union_past_the_bound_names_its_function():
    tools = {"ok": {"type": "object"},
             "pick": {"type": "object", "properties": {"c": {"anyOf": [
                 {"const": v} for v in SIMILAR[:300]]}}}}
    with pytest.raises(InvalidRequestError) as info:
        tool_call_grammar(tools, "json", True, {"ok": "tools[0]", "pick": "tools[1]"})
    assert info.value.param == "tools[1]" and "ways at once" in info.value.message


def test_typical_tool_schemas_stay_accepted(vocab):
    weather = {"type": "object", "properties": {
        "unit": {"type": "string", "enum": [f"unit_{i}" for i in range(40)]},
        "country": {"type": "string", "enum": [f"C{i:03d}" for i in range(249)]},
        "days": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 14},
                 "minItems": 1, "maxItems": 7},
        "filters": {"type": "array", "items": {"type": "string", "maxLength": 40},
                    "minItems": 3}},
        "required": ["unit", "days"]}
    tools = {f"tool_{i}": weather for i in range(20)}
    assert llama_accepts(vocab, tool_call_grammar(tools, "hermes", True))
    assert llama_accepts(vocab, schema_grammar(weather, PARAM))


# -- integer bounds, and keywords the grammar does not enforce ------------------------------------

def number_in(schema):
    return {"type": "object", "properties": {"n": schema}, "required": ["n"]}


@pytest.mark.parametrize("schema, low, high", [
    ({"type": "integer", "minimum": -20, "maximum": 150}, -20, 150),
    ({"type": "integer", "exclusiveMinimum": -20, "exclusiveMaximum": 150}, -19, 149),
    ({"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 9,
      "exclusiveMaximum": True}, 1, 8),                               # draft 4's spelling
    ({"type": "integer", "minimum": 2.5, "maximum": 99.5}, 3, 99),
    ({"type": "integer", "minimum": 37}, 37, None),
    ({"type": "integer", "maximum": -3}, None, -3),
    ({"type": ["integer", "null"], "minimum": 1, "maximum": 12}, 1, 12),
])
def test_integer_bounds_are_enforced_by_llama_cpp(vocab, schema, low, high):
    grammar = schema_grammar(number_in(schema), PARAM)
    for n in [*range(-160, 161), 999, 1000, 12345, -12345]:
        inside = (low is None or n >= low) and (high is None or n <= high)
        assert matches(vocab, grammar, f'{{"n": {n}}}') == inside, n
    assert not matches(vocab, grammar, '{"n": -0}') and not matches(vocab, grammar, '{"n": 05}')


def test_integers_sampled_from_a_bounded_grammar_validate(vocab):
    """Random walks through the grammar (a uniform pick among the tokens llama.cpp allows
    at each step): every finished text validates against the schema."""
    import random

    import jsonschema
    schema = number_in({"type": "integer", "minimum": -75, "exclusiveMaximum": 1200})
    grammar = schema_grammar(schema, PARAM)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    rng = random.Random(7)
    done = 0
    for _ in range(30):
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        text = b""
        try:
            for _ in range(40):
                allowed = allowed_tokens(sampler, n_vocab)
                text_tokens = [t for t in allowed if not llama_cpp.llama_vocab_is_eog(vocab, t)]
                if len(text_tokens) < len(allowed) and (not text_tokens or rng.random() < 0.3):
                    break               # the end of the output is allowed: end here
                token = rng.choice(text_tokens)
                text += piece(vocab, token)
                llama_cpp.llama_sampler_accept(sampler, token)
            else:
                continue
        finally:
            llama_cpp.llama_sampler_free(sampler)
        jsonschema.validate(json.loads(text), schema)
        done += 1
    assert done >= 20


def allowed_tokens(sampler, n_vocab):
    cells = np.zeros(n_vocab, np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
    cells["id"] = np.arange(n_vocab)
    data = llama_cpp.llama_token_data_array(
        cells.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), n_vocab, -1, False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(data))
    return cells["id"][np.isfinite(cells["logit"])].tolist()


def piece(vocab, token) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    return buf.raw[:n]


def test_a_type_list_keeps_the_other_keywords(vocab):
    grammar = schema_grammar(number_in({"type": ["string", "null"], "maxLength": 3}), PARAM)
    assert matches(vocab, grammar, '{"n": "abc"}') and matches(vocab, grammar, '{"n": null}')
    assert not matches(vocab, grammar, '{"n": "abcd"}')


@pytest.mark.parametrize("schema, says", [
    ({"type": "integer", "minimum": "0"}, "minimum must be a number"),
    ({"type": "integer", "maximum": True}, "maximum must be a number"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "no integer"),
    ({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4}, "no integer"),
    ({"type": "integer", "minimum": 1e20}, "no integer"),
])
def test_bad_number_bounds_are_refused(schema, says):
    assert says in refusal(number_in(schema)).message


UNENFORCED = [
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}, "propertyNames"),
    ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "patternProperties"),
    ({"type": "number", "minimum": 0}, "minimum"),
    ({"type": "number", "exclusiveMaximum": 1}, "exclusiveMaximum"),
    ({"type": "integer", "multipleOf": 5}, "multipleOf"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "array", "minItems": 2}, "minItems"),                 # no items: any array
    ({"type": "object", "properties": {"a": {"type": "string"}}, "minProperties": 1},
     "minProperties"),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "oneOf"),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}}]}, "allOf"),
    ({"type": "string", "not": {"const": "x"}}, "not"),
    ({"type": "string", "format": "email"}, "format"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength"),
    ({"type": "string", "nullable": True}, "nullable"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
     "required"),
    ({"type": "object", "properties": {"deep": {"type": "number", "maximum": 9}}}, "maximum"),
]
ENFORCED = [
    {"type": "object", "properties": {
        "unit": {"type": "string", "enum": ["c", "f"], "description": "the unit"},
        "n": {"type": "integer", "minimum": 1, "maximum": 10},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 9}, "maxItems": 3},
        "when": {"type": "string", "format": "date"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "maybe": {"type": ["string", "null"], "minLength": 1},
        "either": {"anyOf": [{"type": "boolean"}, {"$ref": "#/$defs/point"}]}},
     "required": ["unit", "n"], "additionalProperties": False, "title": "args",
     "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}}}},
]


@pytest.mark.parametrize("schema, keyword", UNENFORCED)
def test_strict_refuses_a_keyword_the_grammar_does_not_enforce(schema, keyword):
    with pytest.raises(InvalidRequestError) as info:
        check_strict(schema, PARAM)
    assert info.value.param == PARAM
    assert f"keyword {keyword!r} is not enforced" in info.value.message
    with pytest.raises(InvalidRequestError):
        schema_grammar(schema, PARAM, strict=True)


@pytest.mark.parametrize("schema, keyword", UNENFORCED)
def test_without_strict_such_keywords_are_accepted(vocab, schema, keyword):
    assert llama_accepts(vocab, schema_grammar(schema, PARAM))


@pytest.mark.parametrize("schema", ENFORCED)
def test_strict_accepts_what_the_grammar_enforces(vocab, schema):
    check_strict(schema, PARAM)
    assert llama_accepts(vocab, schema_grammar(schema, PARAM, strict=True))
