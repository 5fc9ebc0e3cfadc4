"""What turning flash attention off costs the embedded engine (``--deterministic`` does, so a
request answers the same alone or crowded past 256 cached tokens).

For each setting, interleaved over ``--rounds``: one engine on the default model
(``--deterministic``, flash attention on or off), then
- decode tok/s of 1 and of 4 streams after a short prompt (``--tokens`` each),
- prefill tok/s of a long prompt (``--long`` tokens) and decode tok/s of 1 and 4 streams
  with that many tokens cached,
and the process's peak resident memory. Prints each figure's median and the ratio off / on.

    .venv/bin/python bench/attention.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import time

_ids = itertools.count()


def _one(flash: bool, tokens: int, long: int) -> dict[str, float]:
    """One engine's figures (run in a fresh process, so peak memory is its own)."""
    import resource

    from podium.engine.base import EngineRequest, SamplingParams
    from podium.engine.llamacpp import model as model_module
    from podium.engine.llamacpp.engine import LlamaCppEngine
    from podium.engine.llamacpp.model_files import default_model_path

    real = model_module.LlamaModel.__init__

    def init(self, *args, **kwargs):
        if not kwargs.get("vocab_only"):
            kwargs["flash_attention"] = flash
        real(self, *args, **kwargs)
    model_module.LlamaModel.__init__ = init          # the engine asks for it off: choose
    engine = LlamaCppEngine(default_model_path(), served_name="m", n_ctx=long + tokens + 64,
                            n_batch=128, max_num_seqs=4, deterministic=True)
    tok = engine.tokenizer

    def request(text: str, n: int) -> EngineRequest:
        ids = tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        return EngineRequest(f"a{next(_ids)}", ids, SamplingParams(
            temperature=0.0, max_tokens=n, ignore_eos=True))

    async def run(reqs: list[EngineRequest]) -> float:
        async def drain(r: EngineRequest) -> None:
            async for _ in engine.generate(r):
                pass
        began = time.perf_counter()
        await asyncio.gather(*(drain(r) for r in reqs))
        return time.perf_counter() - began

    out: dict[str, float] = {}
    filler = "The quick brown fox jumps over the lazy dog near the river bank. "
    for streams in (1, 4):
        reqs = [request(f"Count to a hundred, run {i}.", tokens) for i in range(streams)]
        out[f"decode_{streams}"] = streams * tokens / asyncio.run(run(reqs))
    text = filler * max(1, long // 14)
    prompt = request(text, 1)
    out["prefill"] = len(prompt.prompt_token_ids) / asyncio.run(run([prompt]))
    for streams in (1, 4):
        # the same long prompt (cached after the first), then decode with it all attended
        reqs = [request(text + f" Now run {i}.", tokens) for i in range(streams)]
        asyncio.run(run([request(text + f" Now run {i}.", 1) for i in range(streams)]))
        out[f"long_decode_{streams}"] = streams * tokens / asyncio.run(run(reqs))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    asyncio.run(engine.aclose())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--long", type=int, default=2000)
    parser.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_one(args.child == "on", args.tokens, args.long)))
        return
    figures: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for setting in ("on", "off") if r % 2 == 0 else ("off", "on"):
            done = subprocess.run([sys.executable, __file__, "--child", setting, "--tokens",
                                   str(args.tokens), "--long", str(args.long)],
                                  capture_output=True, text=True, check=True)
            figures[setting].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} flash attention {setting}: {figures[setting][-1]}",
                  flush=True)
    print(f"\nmedians of {args.rounds} rounds (tok/s; peak RSS in MB):")
    print(f"{'figure':<16}{'on':>10}{'off':>10}{'off/on':>8}")
    for key in figures["on"][0]:
        on = statistics.median(f[key] for f in figures["on"])
        off = statistics.median(f[key] for f in figures["off"])
        print(f"{key:<16}{on:>10.1f}{off:>10.1f}{off / on:>8.3f}")


if __name__ == "__main__":
    main()
