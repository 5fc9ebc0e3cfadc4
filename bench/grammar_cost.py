"""Grammar cost benchmark: how much one constrained request slows everyone else.

The embedded llama.cpp engine on the default model, in this process. A victim stream
(unconstrained, greedy, end-of-turn ignored) is timed alone, then beside each grammar,
which is resubmitted as soon as it ends so it is there for the victim's whole run. For each:
the victim's tokens/s and its ratio to alone, and what the constrained requests got
(tokens, seconds per token, how they ended); first beside a second stream with no grammar,
which is what sharing the batch costs by itself (on 2 cores about half). The victim's rate alone is measured again
before each grammar, as other work on the machine comes and goes. Grammars are built as the server builds them
(``schema_grammar``); a schema the converter refuses is reported as refused, and the victim
then runs alone. Runs against any tree with the same engine API, so the same script
measures before and after a change (from a worktree of the old commit).

    .venv/bin/python bench/grammar_cost.py [--tokens 64] [--threads 2] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(os.environ.get("PODIUM_TREE", Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(ROOT))

from podium.engine.base import EngineRequest, SamplingParams  # noqa: E402
from podium.engine.llamacpp.engine import LlamaCppEngine  # noqa: E402
from podium.engine.llamacpp.model_files import default_model_path  # noqa: E402
from podium.errors import PodiumError  # noqa: E402
from podium.grammar import schema_grammar  # noqa: E402

_ids = itertools.count()


def nested_arrays(depth: int, min_items: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema, "minItems": min_items}
    return schema


SCHEMAS: dict[str, dict | None] = {
    # a second stream with no grammar: what sharing the batch costs by itself
    "no-grammar": None,
    # the campaign's two: 1,000 strings sharing a long prefix (47 KB), and minItems 1000
    # arrays nested 3 deep (a few hundred bytes)
    "enum-1000-similar": {"type": "string", "enum": [
        f"customer_account_reference_identifier_{i:04d}" for i in range(1000)]},
    "minItems-1000-x3": nested_arrays(3, 1000),
    # the widest enum a bound on open alternatives may let through
    "enum-256-similar": {"type": "string", "enum": [
        f"customer_account_reference_identifier_{i:04d}" for i in range(256)]},
    # what real tools send: must stay cheap
    "tool-typical": {"type": "object", "properties": {
        "unit": {"type": "string", "enum": [f"unit_{i}" for i in range(40)]},
        "city": {"type": "string", "maxLength": 64},
        "days": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 7},
    }, "required": ["unit", "city", "days"]},
}
PROMPTS = {
    "no-grammar": "Write a long story about the sea.",
    "enum-1000-similar": "Pick the customer reference for the account we spoke about.",
    "minItems-1000-x3": "Give me a nested list of words.",
    "enum-256-similar": "Pick the customer reference for the account we spoke about.",
    "tool-typical": "Call the weather tool for Paris for the next three days.",
}


def prompt(engine: LlamaCppEngine, text: str) -> list[int]:
    return engine.tokenizer.encode(
        f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


async def victim(engine: LlamaCppEngine, tokens: int) -> float:
    """Tokens/s of an unconstrained stream, from its first token to its last."""
    req = EngineRequest(f"v{next(_ids)}", prompt(engine, "Write a long story about bees."),
                        SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    first = last = None
    n = 0
    async for out in engine.generate(req):
        last = time.perf_counter()
        first = first or last
        n += len(out.token_ids)
    assert first is not None and last is not None and n == tokens
    return (n - 1) / (last - first)


async def hostile(engine: LlamaCppEngine, name: str, grammar: str | None, stop: asyncio.Event,
                  results: list[tuple[int, float, str]]) -> None:
    """Constrained requests back to back until ``stop``: (tokens, seconds, ending) each."""
    while not stop.is_set():
        req = EngineRequest(f"h{next(_ids)}", prompt(engine, PROMPTS[name]),
                            SamplingParams(temperature=0.0, max_tokens=64, grammar=grammar))
        start, n, ending = time.perf_counter(), 0, "?"
        gen = engine.generate(req)
        try:
            async for out in gen:
                n += len(out.token_ids)
                ending = out.finish_reason or ending
                if stop.is_set():
                    ending = "cut by the bench"
                    break
        except PodiumError as exc:
            ending = f"error: {exc}"[:160]
        finally:
            await gen.aclose()
        results.append((n, time.perf_counter() - start, ending))


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=list(SCHEMAS))
    args = ap.parse_args()
    engine = LlamaCppEngine(default_model_path(), served_name="m", n_ctx=2048,
                            n_threads=args.threads, max_num_seqs=4)
    print(f"tree: {ROOT}")
    try:
        await victim(engine, 8)                     # warm up
        alone = await victim(engine, args.tokens)
        print(f"victim alone: {alone:.1f} tokens/s ({args.tokens} tokens)")
        for name in args.only:
            schema = SCHEMAS[name]
            size = len(json.dumps(schema)) if schema is not None else 0
            try:
                grammar = (schema_grammar(schema, "response_format.json_schema.schema")
                           if schema is not None else None)
                if grammar is not None and hasattr(engine, "check_grammar"):
                    engine.check_grammar(grammar)     # compiled as a request's worker would
            except PodiumError as exc:
                print(f"{name} ({size} B): refused with {exc.status_code}: "
                      f"{str(exc)[:140]}")
                continue
            alone = await victim(engine, args.tokens)    # again: the machine's load drifts
            stop, results = asyncio.Event(), []
            task = asyncio.create_task(hostile(engine, name, grammar, stop, results))
            await asyncio.sleep(0.5)                # the grammar request is admitted
            rate = await victim(engine, args.tokens)
            stop.set()
            await task
            tokens = sum(n for n, _, _ in results)
            seconds = sum(s for _, s, _ in results)
            endings = sorted({e for _, _, e in results})
            per = f"{seconds / tokens:.2f} s/token" if tokens else "no token"
            print(f"{name} ({size} B): victim {rate:.1f} tokens/s = {rate / alone:.2f} of "
                  f"alone ({alone:.1f} just before); grammar requests: {len(results)}, {tokens} tokens, {per}, "
                  f"ended: {'; '.join(endings)}")
    finally:
        await engine.aclose()


if __name__ == "__main__":
    asyncio.run(main())
