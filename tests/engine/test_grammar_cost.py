"""What a grammar may cost the engine: lazy masking, and the per-token budget that ends a
constrained request before it slows the others (the real default model)."""

import asyncio
import itertools
import json

import jsonschema
import llama_cpp
import numpy as np
import pytest

from podium.engine.base import EngineRequest, SamplingParams
from podium.engine.llamacpp import sampling
from podium.engine.llamacpp.engine import LlamaCppEngine
from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
from podium.engine.llamacpp.model_files import GEMMA_MODEL, default_model_path
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


def test_a_refused_draw_masks_the_likeliest_tokens_first(default, monkeypatch):
    """Greedy output under a grammar the model keeps fighting (it wants prose; the grammar
    allows only the enum) is the same whether the mask starts with 16 tokens or all."""
    prompt = "Tell me about the weather today."
    monkeypatch.setattr(default, "_grammar_ms", 0)     # whole-vocabulary masks cost more
    outputs = []
    for first in (16, 10 ** 6):
        monkeypatch.setattr(sampling, "MASK_FIRST", first)
        outputs.append(asyncio.run(collect(default, request(default, prompt, TOOL,
                                                            max_tokens=30))))
    assert outputs[0] == outputs[1]
    json.loads(default.tokenizer.decode(outputs[0]))


def _states(sampler, pieces):
    """Walk ``sampler``'s grammar through ``pieces`` (token ids it allows), yielding before
    each."""
    for token in pieces:
        yield
        llama_cpp.llama_sampler_accept(sampler._grammar, token)
    yield


@pytest.fixture(scope="module", params=["default", "gemma3"])
def vocabulary(request, tokenizer):
    """A byte-level BPE vocabulary (the default model's) and a SentencePiece one with byte
    tokens (Gemma 3's)."""
    if request.param == "default":
        return tokenizer
    return LlamaTokenizer(LlamaModel(default_model_path(GEMMA_MODEL), vocab_only=True))


@pytest.mark.parametrize("schema, output, structured", [
    (TOOL, '{"unit": "unit_12", "days": 7}', True),
    ({"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]},
     '{"note": "Café au lait, 日本語 ✓ \\"q\\""}', False),
    (WIDE, '"customer_account_reference_identifier_0042"', True),
], ids=["enum-and-integer", "free-text", "wide-enum"])
@pytest.mark.parametrize("by", ["bytes", "tokens"])
def test_a_mask_asks_only_about_tokens_the_grammar_could_allow(vocabulary, schema, output,
                                                               structured, by):
    """Every token the grammar allows, in every state along an output (read a byte a token,
    so mid-character states too, or as the tokenizer splits it), is among those a mask
    asks about; and at the JSON's structure far fewer than the vocabulary are asked."""
    tokenizer = vocabulary
    vocab, n_vocab = tokenizer._vocab, tokenizer.vocab_size
    prefixes = sampling.Prefixes(vocab, n_vocab, tokenizer.eos_token_ids)
    byte_token = dict(zip(prefixes._one_bytes.tolist(), prefixes._ones.tolist()))
    pieces = ([byte_token[b] for b in output.encode()] if by == "bytes"
              else tokenizer.encode(output, add_special=False))
    sampler = sampling.Sampler(SamplingParams(grammar=schema_grammar(schema, PARAM)),
                               n_vocab, vocab, prefixes=prefixes)
    every = np.arange(n_vocab, dtype=np.int32)
    sizes = []
    try:
        for _ in _states(sampler, pieces):
            allowed = set(every[sampler._asks(every)].tolist())
            asked = prefixes.open(sampler._asks)
            assert allowed and allowed <= set(asked.tolist())
            sizes.append(len(asked))
    finally:
        sampler.close()
    assert sizes[-1] < 1000        # the end: the tokens that end generation, and " " ones
    if structured:              # (inside a free string nearly every token is allowed)
        assert sorted(sizes)[len(sizes) // 2] < n_vocab // 10, sizes
