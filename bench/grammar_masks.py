"""What one grammar mask costs: asking about every token against asking by first bytes.

For each schema, a valid output is fed to the grammar token by token (the default model's
tokenizer); at each state the mask a refused draw would make is timed (CPU time of this
thread): the grammar asked about all 151,936 tokens, and about those its first bytes
allow (``sampling.Prefixes``), rounds interleaved. Prints the median and the worst step of
each, and the tokens asked.

    .venv/bin/python bench/grammar_masks.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from podium.engine.base import SamplingParams  # noqa: E402
from podium.engine.llamacpp import sampling  # noqa: E402
from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer  # noqa: E402
from podium.engine.llamacpp.model_files import default_model_path  # noqa: E402
from podium.grammar import schema_grammar  # noqa: E402

CASES = {
    "tool-typical": ({"type": "object", "properties": {
        "unit": {"type": "string", "enum": [f"unit_{i}" for i in range(40)]},
        "city": {"type": "string", "maxLength": 64},
        "days": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 7},
    }, "required": ["unit", "city", "days"]},
        '{"unit": "unit_12", "city": "Paris", "days": [1, 2, 3]}'),
    "enum-256-similar": ({"type": "string", "enum": [
        f"customer_account_reference_identifier_{i:04d}" for i in range(256)]},
        '"customer_account_reference_identifier_0042"'),
    "free-text": ({"type": "object", "properties": {"note": {"type": "string"}},
                   "required": ["note"]}, '{"note": "Café au lait, 日本語 ✓"}'),
}


class Everything:
    def __init__(self, n_vocab: int):
        self._all = np.arange(n_vocab, dtype=np.int32)

    def open(self, asks) -> np.ndarray:
        return self._all


def walk(tokenizer, schema, output, prefixes) -> tuple[list[float], list[int]]:
    vocab, n_vocab = tokenizer._vocab, tokenizer.vocab_size
    grammar = schema_grammar(schema, "response_format.json_schema.schema")
    sampler = sampling.Sampler(SamplingParams(grammar=grammar), n_vocab, vocab,
                               prefixes=prefixes)
    costs, asked = [], []
    try:
        for token in tokenizer.encode(output, add_special=False):
            start = time.thread_time()
            ids = prefixes.open(sampler._asks)
            sampler._asks(ids)
            costs.append((time.thread_time() - start) * 1000)
            asked.append(len(ids))
            llama_cpp.llama_sampler_accept(sampler._grammar, token)
    finally:
        sampler.close()
    return costs, asked


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tokenizer = LlamaTokenizer(LlamaModel(default_model_path(), vocab_only=True))
    start = time.perf_counter()
    prefixes = sampling.Prefixes(tokenizer._vocab, tokenizer.vocab_size,
                                tokenizer.eos_token_ids)
    print(f"index made in {time.perf_counter() - start:.2f} s")
    ways = {"every token": Everything(tokenizer.vocab_size), "by first bytes": prefixes}
    for name, (schema, output) in CASES.items():
        costs: dict[str, list[float]] = {way: [] for way in ways}
        asked: dict[str, list[int]] = {}
        for _ in range(args.rounds):
            for way, index in ways.items():
                spent, asked[way] = walk(tokenizer, schema, output, index)
                costs[way] += spent
        print(f"{name} ({len(asked['every token'])} states):")
        for way in ways:
            print(f"  {way:15} median {statistics.median(costs[way]):6.2f} ms, worst "
                  f"{max(costs[way]):6.2f} ms; tokens asked median "
                  f"{int(statistics.median(asked[way]))}")


if __name__ == "__main__":
    main()
