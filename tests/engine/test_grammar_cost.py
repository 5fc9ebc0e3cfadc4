"""What a grammar may cost the engine: llguidance's masks on the real default model, and the
per-token budget that ends a constrained request before it slows the others."""

import asyncio
import itertools
import json

import jsonschema
import numpy as np
import pytest

from podium.engine.base import EngineRequest, SamplingParams
from podium.engine.llamacpp.engine import LlamaCppEngine
from podium.errors import InvalidRequestError
from podium.grammar import schema_grammar

_ids = itertools.count()
PARAM = "response_format.json_schema.schema"
WIDE = {"type": "string", "enum": [f"customer_account_reference_identifier_{i:04d}"
                                   for i in range(256)]}
TOOL = {"type": "object", "properties": {
    "unit": {"type": "string", "enum": [f"unit_{i}" for i in range(40)]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["unit", "days"], "additionalProperties": False}


def build(model_path, **kw):
    return LlamaCppEngine(model_path, served_name="m", n_ctx=1024, n_batch=128, **kw)


def request(engine, text, schema=None, **sampling_kw):
    sampling_kw.setdefault("temperature", 0.0)
    grammar = schema_grammar(schema, PARAM) if schema is not None else None
    ids = engine.tokenizer.encode(
        f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    return EngineRequest(f"g{next(_ids)}", ids, SamplingParams(grammar=grammar, **sampling_kw))


async def collect(engine, req):
    tokens = []
    async for out in engine.generate(req):
        tokens += out.token_ids
    return tokens


@pytest.fixture(scope="module")
def tight(model_path):
    """An engine whose grammar budget no 256-value enum can keep to."""
    eng = build(model_path, grammar_ms_per_token=0.01)
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="module")
def default(model_path):
    eng = build(model_path)
    yield eng
    asyncio.run(eng.aclose())


def test_a_grammar_over_budget_ends_alone_and_names_its_parameter(tight):
    async def both():
        victim = request(tight, "Write a story about bees.", max_tokens=24, ignore_eos=True)
        hostile = request(tight, "Pick a customer reference.", WIDE, max_tokens=40)
        return await asyncio.gather(collect(tight, victim), collect(tight, hostile),
                                    return_exceptions=True)
    victim, hostile = asyncio.run(both())
    assert isinstance(hostile, InvalidRequestError), hostile
    assert hostile.code == "grammar_too_costly" and hostile.param == PARAM
    assert "--grammar-ms-per-token" in hostile.message
    assert len(victim) == 24                    # the other stream ran to its end
    assert tight.stats["running"] == 0


def test_typical_constrained_output_keeps_to_the_default_budget_and_validates(default):
    for seed in (1, 2, 3):
        req = request(default, "Call the tool for a week of weather in Celsius.", TOOL,
                      temperature=1.0, seed=seed, max_tokens=60)
        text = default.tokenizer.decode(asyncio.run(collect(default, req)))
        jsonschema.validate(json.loads(text), TOOL)


HOSTILE_ENUM = {"enum": [f"{'p' * 45}{i}" for i in range(1000)]}   # GBNF refused it (400)
DEEP = {"type": "array", "minItems": 2, "items": {"type": "array", "minItems": 1000,
                                                 "items": {"type": "integer"}}}


@pytest.mark.parametrize("schema", [HOSTILE_ENUM, WIDE], ids=["1000-shared-prefix", "wide"])
def test_wide_enums_are_constrained_within_the_default_budget(default, schema):
    """llama.cpp's grammar engine could not mask these without stalling every stream (the
    1,000-value enum was refused); llguidance masks them in microseconds."""
    req = request(default, "Pick one.", schema, temperature=1.0, seed=7, max_tokens=40)
    text = default.tokenizer.decode(asyncio.run(collect(default, req)))
    jsonschema.validate(json.loads(text), schema)


def test_a_long_bounded_array_runs_to_its_budget_without_costing_the_grammar_budget(default):
    req = request(default, "Write numbers.", DEEP, max_tokens=48)
    tokens = asyncio.run(collect(default, req))
    assert len(tokens) == 48        # it ran to max_tokens: no grammar_too_costly refusal
    assert default.tokenizer.decode(tokens).startswith("[")


def test_a_finished_grammar_ends_the_output_even_with_ignore_eos(default):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    req = request(default, "Answer in JSON.", schema, max_tokens=64, ignore_eos=True)
    outs = []

    async def run():
        async for out in default.generate(req):
            outs.append(out)
    asyncio.run(run())
    assert outs[-1].finish_reason == "stop"
    text = default.tokenizer.decode([t for o in outs for t in o.token_ids
                                     if t not in default.tokenizer.eos_token_ids])
    assert json.loads(text) in ({"ok": True}, {"ok": False})


def test_logprobs_under_a_constraint_are_finite(default):
    """Masked tokens' logits are minus infinity: they are never reported as alternatives
    (JSON has no -Infinity)."""
    req = request(default, "Answer.", {"enum": ["yes", "no"]}, max_tokens=8)
    req = EngineRequest(req.request_id, req.prompt_token_ids, req.sampling, 5)
    logprobs = []

    async def run():
        async for out in default.generate(req):
            logprobs.extend(out.logprobs or [])
    asyncio.run(run())
    assert logprobs
    for lp in logprobs:
        assert np.isfinite(lp.logprob)
        assert all(np.isfinite(v) for _, v in lp.top)


def test_a_grammar_the_vocabulary_cannot_write_is_a_400_before_it_is_queued(default):
    with pytest.raises(InvalidRequestError) as caught:
        default.check_grammar("start: <no_such_special_token>\n")
    assert "cannot be used with this model" in caught.value.message
    assert default.stats["waiting"] == 0


def test_under_auto_a_started_call_is_held_to_its_custom_grammar(default):
    """``tool_choice: auto`` with a custom tool of a grammar: text, or text then calls, and
    a call the model starts must be in the grammar (its <tool_call> token opens it)."""
    from podium.grammar import custom_input, tool_call_grammar
    tok = default.tokenizer
    rule, rules = custom_input("regex", "[A-Z]{3}-[0-9]{4}", "tools[0].format", "ct0")
    grammar = tool_call_grammar({"ticket": {}}, "hermes", True, tok.grammar_specials,
                                custom={"ticket": rule}, rules=rules, text_first=True)

    def accepts(text):
        matcher = default._grammars.matcher(grammar)
        ids = tok.encode(text, add_special=False)
        return matcher.consume_tokens(ids) and matcher.is_accepting()
    call = '<tool_call>\n{{"name": "ticket", "arguments": {{"input": "{}"}}}}\n</tool_call>'
    assert accepts("Just text, no call.")
    assert accepts("Let me file it.\n" + call.format("BIL-0042"))
    assert not accepts("Let me file it.\n" + call.format("billing"))
    assert not accepts(call.format("BIL-0042") + "\nand more text")
    # the markup spelled as text (not its token), which the parser would read as a call
    spelled = (tok.encode("Filing it: <tool", add_special=False)
               + tok.encode('_call>\n{"name": "ticket", "arguments": {"input": "no"}}',
                            add_special=False))
    matcher = default._grammars.matcher(grammar)
    assert not (matcher.consume_tokens(spelled) and matcher.is_accepting())
