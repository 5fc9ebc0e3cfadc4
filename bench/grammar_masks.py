"""What one grammar mask costs on the default model's vocabulary (151,936 tokens).

For each schema, a valid output is fed token by token (the default model's tokenizer) to the
matcher the engine would use (``podium.engine.llamacpp.constraint.Grammars``: llguidance,
Podium's limits); at each state the step the sampler takes is timed, CPU time of this
thread: the mask computed (llguidance), and the mask applied to a row of logits (disallowed
tokens to -inf, numpy). Prints the median and the worst of each, per schema, over
``--rounds`` walks, and the time to compile the grammar.

    .venv/bin/python bench/grammar_masks.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from podium.engine.llamacpp.constraint import Grammars  # noqa: E402
from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer  # noqa: E402
from podium.engine.llamacpp.model_files import default_model_path  # noqa: E402
from podium.grammar import schema_grammar, tool_call_grammar  # noqa: E402

SHARED = "p" * 45
TOOL = {"type": "object", "properties": {
    "unit": {"type": "string", "enum": [f"unit_{i}" for i in range(40)]},
    "city": {"type": "string", "maxLength": 64},
    "days": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 7},
}, "required": ["unit", "city", "days"]}


def nested(depth: int, min_items: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema, "minItems": min_items}
    return schema


CASES = {       # name: (schema, or a tool-call grammar's tools, and a valid output)
    "tool-typical": (TOOL, '{"unit": "unit_12", "city": "Paris", "days": [1, 2, 3]}'),
    "tool-call-hermes": ({"get_weather": TOOL},
                         '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "unit_1", '
                         '"city": "Oslo", "days": [4, 5]}}\n</tool_call>'),
    "enum-256-similar": ({"type": "string", "enum": [
        f"customer_account_reference_identifier_{i:04d}" for i in range(256)]},
        '"customer_account_reference_identifier_0042"'),
    "enum-1000-shared-45": ({"enum": [f"{SHARED}{i}" for i in range(1000)]},
                            f'"{SHARED}417"'),
    "minItems-1000-x3": (nested(3, 1000), "[[[" + ", ".join(["1"] * 40)),
    "patternProperties": ({"type": "object", "patternProperties": {
        "^x_[a-z]+$": {"type": "integer"}}, "additionalProperties": False},
        '{"x_alpha": 1, "x_beta": 22}'),
    "number-minimum": ({"type": "object", "properties": {"t": {"type": "number",
                                                               "minimum": 2.5}}},
                       '{"t": 36.6}'),
    "free-text": ({"type": "object", "properties": {"note": {"type": "string"}},
                   "required": ["note"]}, '{"note": "Café au lait, 日本語 ✓"}'),
}


def grammar_of(name: str, schema: dict, specials) -> str:
    if name.startswith("tool-call"):
        return tool_call_grammar(schema, "hermes", False, specials)
    return schema_grammar(schema, "response_format.json_schema.schema")


def walk(grammars: Grammars, grammar: str, tokens: list[int], n_vocab: int
         ) -> tuple[list[float], list[float]]:
    """The mask's cost and the apply's at each state of ``tokens``, in µs."""
    matcher = grammars.matcher(grammar)
    mask = allocate_token_bitmask(1, n_vocab)
    logits = np.zeros(n_vocab, np.float32)
    masks, applies = [], []
    for token in tokens:
        start = time.thread_time()
        fill_next_token_bitmask(matcher, mask)
        masked = time.thread_time()
        refused = np.unpackbits((~mask).view(np.uint8), count=n_vocab,
                                bitorder="little").view(bool)
        np.copyto(logits, -np.inf, where=refused)
        masks.append((masked - start) * 1e6)
        applies.append((time.thread_time() - masked) * 1e6)
        assert not refused[token], (token, matcher.get_error())
        assert matcher.consume_token(token), matcher.get_error()
    return masks, applies


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tokenizer = LlamaTokenizer(LlamaModel(default_model_path(), vocab_only=True))
    n_vocab = tokenizer.vocab_size
    grammars = Grammars(tokenizer._vocab, n_vocab, tokenizer.eos_token_ids)
    start = time.perf_counter()
    grammars.check(schema_grammar({"type": "object"}, "x"))
    print(f"llguidance's tokenizer made in {time.perf_counter() - start:.2f} s "
          f"({n_vocab} tokens)")
    for name, (schema, output) in CASES.items():
        grammar = grammar_of(name, schema, tokenizer.grammar_specials)
        start = time.perf_counter()
        grammars.check(grammar)
        compiled = (time.perf_counter() - start) * 1000
        tokens = tokenizer.encode(output, add_special=True)
        masks: list[float] = []
        applies: list[float] = []
        for _ in range(args.rounds):
            one, two = walk(grammars, grammar, tokens, n_vocab)
            masks += one
            applies += two
        print(f"{name:20} {len(tokens):3} states: mask median {statistics.median(masks):4.0f} "
              f"µs, worst {max(masks):4.0f} µs; applied to the logits median "
              f"{statistics.median(applies):3.0f} µs, worst {max(applies):4.0f} µs; "
              f"compiled in {compiled:.1f} ms")


if __name__ == "__main__":
    main()
