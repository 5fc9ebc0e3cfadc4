"""The engine's step alone: the llama.cpp engine in this process decoding greedy tokens for
one stream, end of turn ignored, so a change on the step's path is measured before and after.

    .venv/bin/python bench/engine_step.py [--root DIR ...] [--rounds 8] [--tokens 200]

Each ``--root`` is a checkout (a worktree of the commit before, and this one: the default);
every round runs each root once, in turn, in a fresh process that imports that root's
``podium``, and prints its decode rate (tokens after the first over the seconds after the
first, median of 3 requests after a warm-up). The medians of the rounds and their ratio to
the first root's come last. Default model, default settings (``--deterministic``), 2 threads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r'''
import asyncio, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from podium.engine.base import EngineRequest, SamplingParams
from podium.engine.llamacpp.engine import LlamaCppEngine
from podium.engine.llamacpp.model_files import default_model_path

tokens = int(sys.argv[2])
engine = LlamaCppEngine(default_model_path(), served_name="m", n_ctx=2048, n_threads=2)
prompt = engine.tokenizer.encode("<|im_start|>user\nWrite a long story about a lighthouse."
                                 "<|im_end|>\n<|im_start|>assistant\n")

async def once(i):
    req = EngineRequest(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=tokens,
                                                        ignore_eos=True))
    first = n = None
    async for out in engine.generate(req):
        if first is None:
            first, n = time.perf_counter(), 0
        n += len(out.token_ids)
    return (n - 1) / (time.perf_counter() - first)

async def main():
    await once(-1)
    rates = [await once(i) for i in range(3)]
    await engine.aclose()
    print(statistics.median(rates))

asyncio.run(main())
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", action="append", default=None)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()
    roots = args.root or [str(ROOT)]
    rates: dict[str, list[float]] = {r: [] for r in roots}
    print(f"# {os.cpu_count()} cores, load average {os.getloadavg()}")
    for i in range(args.rounds):
        for root in roots:
            out = subprocess.run([sys.executable, "-c", CHILD, root, str(args.tokens)],
                                 capture_output=True, text=True, check=True)
            rates[root].append(float(out.stdout.strip().splitlines()[-1]))
        print(f"round {i + 1}: " + ", ".join(f"{rates[r][-1]:.1f}" for r in roots), flush=True)
    base = statistics.median(rates[roots[0]])
    for root in roots:
        median = statistics.median(rates[root])
        print(f"{root}: median {median:.1f} tok/s ({median / base:.2f} of the first), "
              f"runs {min(rates[root]):.1f}-{max(rates[root]):.1f}")


if __name__ == "__main__":
    main()
