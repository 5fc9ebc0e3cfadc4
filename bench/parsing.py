"""Output-parser cost per token on a long tool-call stream, and whether it stays flat.

    .venv/bin/python bench/parsing.py

The stream is a Hermes answer (reasoning, text, then tool calls whose arguments hold long
strings) cut into the default model's real tokens; the parser gets one token's text at a time.
Targets: <= 2 us per token; 16k-token streams within 10% of 1k-token streams per token.
Both sizes parse the same number of tokens (16 streams of 1k, one of 16k); the minimum of
several runs is the figure least disturbed by other work on the machine.
"""

from __future__ import annotations

import json
import logging
import statistics
import time

from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
from podium.engine.llamacpp.model_files import default_model_path
from podium.parsing.events import Finish, TextDelta
from podium.parsing.pipeline import OutputParser
from podium.parsing.registry import build_reasoning_parser, build_tool_parser
from podium.parsing.tools.base import ToolSet

SCHEMAS = {"write_file": {"type": "object", "properties": {"path": {"type": "string"},
                                                           "content": {"type": "string"}}}}


def stream_text(tokens_wanted: int, tokenizer: LlamaTokenizer) -> list[str]:
    line = "    total = compute(values, weights) + offset  # keep it simple\n"
    calls, text = 0, "<think>Write the files.</think>\nWriting them now.\n"
    while True:
        body = json.dumps({"path": f"src/m{calls}.py", "content": line * 40})
        text += f'<tool_call>\n{{"name": "write_file", "arguments": {body}}}\n</tool_call>\n'
        calls += 1
        ids = tokenizer.encode(text, add_special=False)
        if len(ids) >= tokens_wanted:
            break
    ids = ids[:tokens_wanted]
    return [tokenizer.piece(t).decode("utf-8", "replace") for t in ids]


def cost_per_token(pieces: list[str], streams: int) -> float:
    """Parse ``streams`` streams of ``pieces`` (so short and long runs see as many tokens)."""
    deltas = [[TextDelta(p)] for p in pieces]
    start = time.perf_counter()
    for _ in range(streams):
        parser = OutputParser(build_reasoning_parser("think", ""),
                              build_tool_parser("hermes", ToolSet(SCHEMAS)))
        for delta in deltas:
            parser.feed(delta)
        parser.feed([Finish("stop", len(pieces))])
    return (time.perf_counter() - start) * 1e6 / (len(pieces) * streams)


def main() -> None:
    tokenizer = LlamaTokenizer(LlamaModel(default_model_path(), vocab_only=True))
    logging.getLogger("podium").setLevel(logging.ERROR)   # cut-short calls are expected here
    results = {}
    streams = {1_000: 16, 16_000: 1}
    for n in (1_000, 16_000):
        pieces = stream_text(n, tokenizer)
        cost_per_token(pieces, streams[n])                   # warm up
        runs = [cost_per_token(pieces, streams[n]) for _ in range(9)]
        results[n] = min(runs)
        print(f"parser cost, {n:>6}-token streams: {min(runs):.2f} us per token "
              f"(min of 9; median {statistics.median(runs):.2f})")
    print(f"16k / 1k per-token ratio (min): {results[16_000] / results[1_000]:.3f}")


if __name__ == "__main__":
    main()
