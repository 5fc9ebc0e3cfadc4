"""Batching benchmark: Podium next to llama-cpp-python's own server, in one run.

On the default model, with the same thread count, at concurrency 1, 4 and 8 (each client
streams one chat completion of --tokens tokens, end-of-turn tokens banned so every stream runs
to the limit): aggregate tokens/s, time to first token p50 / max, and failed or cut-short
streams (errors summed over the runs, other figures from the median run of --repeat).
Also a raw llama-cpp-python decode loop (Llama.eval, one token at a time) as the
single-stream floor. llama-cpp-python's server is installed with its ``server`` extra into
a separate venv (~/.cache/podium-bench/llama-server; the wheel comes from pip's cache).

    .venv/bin/python bench/batching.py [--tokens 128] [--threads 2] [--fast]
                                       [--skip-llama-server]

Also the ceiling: the bare batched llama_decode's tokens/s at each level on the engine's
own context (the same weights, attention and row groups as each Podium mode), and Podium's
aggregate as a ratio to it: over the whole run (prefills included, which the ceiling has
not), and while every stream decodes (from the last stream's first token to the first
stream's end: like with like).

Targets: Podium's aggregate >= 0.95 of the bare decode's ceiling at 4 and 8 streams; single
stream >= 95% of the raw loop; no failed or interrupted request at any concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import NO_END, ROOT, free_port, raw_decode_rate  # noqa: E402

TOPICS = ["a lighthouse keeper", "the history of bridges", "a robot learning to paint",
          "the life of bees", "a journey across the desert", "how compilers work",
          "a city under the sea", "the first day of school"]
LLAMA_VENV = Path.home() / ".cache" / "podium-bench" / "llama-server"


@dataclass
class Stream:
    tokens: int = 0
    ttft: float | None = None
    start: float = 0.0
    end: float = 0.0
    error: str | None = None
    stamps: list[float] = field(default_factory=list)


async def one_stream(client: httpx.AsyncClient, url: str, model: str, topic: str,
                     tokens: int) -> Stream:
    s = Stream(start=time.perf_counter())
    body = {"model": model, "messages": [{"role": "user",
                                          "content": f"Write a long story about {topic}."}],
            "max_tokens": tokens, "temperature": 0, "stream": True, "logit_bias": NO_END}
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                s.error = f"HTTP {r.status_code}"
                await r.aread()
                return s
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = orjson.loads(line[6:])
                if "error" in chunk:
                    s.error = str(chunk["error"])
                    continue
                for choice in chunk.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        s.tokens += 1
                        s.stamps.append(time.perf_counter())
                        if s.ttft is None:
                            s.ttft = time.perf_counter() - s.start
    except httpx.HTTPError as exc:
        s.error = type(exc).__name__
    s.end = time.perf_counter()
    if s.error is None and s.tokens < tokens * 0.9:
        s.error = f"cut short at {s.tokens} tokens"
    return s


async def run_level(port: int, model: str, streams: int, tokens: int) -> list[Stream]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        return await asyncio.gather(*(one_stream(client, url, model, TOPICS[i % len(TOPICS)],
                                                 tokens) for i in range(streams)))


def summary(results: list[Stream]) -> dict:
    wall = max(s.end for s in results) - min(s.start for s in results)
    ttfts = [s.ttft for s in results if s.ttft is not None]
    decode = [(s.tokens - 1) / (s.end - s.start - s.ttft) for s in results
              if s.ttft is not None and s.tokens > 1]
    # every stream decoding at once: from the last first token to the first stream's end
    first = max((s.stamps[0] if s.stamps else math.inf) for s in results)
    last = min((s.stamps[-1] if s.stamps else -math.inf) for s in results)
    inside = sum(first < t <= last for s in results for t in s.stamps)
    return {"tok_s": sum(s.tokens for s in results) / wall,
            "steady": inside / (last - first) if last > first else float("nan"),
            "decode": statistics.median(decode) if decode else float("nan"),
            "ttft_p50": statistics.median(ttfts) if ttfts else float("nan"),
            "ttft_max": max(ttfts) if ttfts else float("nan"),
            "errors": sum(s.error is not None for s in results),
            "why": sorted({s.error for s in results if s.error})}


def wait_ready(proc: subprocess.Popen, port: int, path: str) -> None:
    for _ in range(900):
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start")


def llama_server_python() -> Path:
    python = LLAMA_VENV / "bin" / "python"
    import llama_cpp

    want = llama_cpp.__version__
    ok = python.exists() and subprocess.run(
        [python, "-c", f"import llama_cpp.server, llama_cpp; assert llama_cpp.__version__ == "
                       f"{want!r}"], capture_output=True).returncode == 0
    if not ok:
        print(f"installing llama-cpp-python[server]=={want} into {LLAMA_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(LLAMA_VENV)], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet",
                        f"llama-cpp-python[server]=={want}"], check=True)
    return python


async def short_request_ttft(port: int, model: str, tokens: int) -> tuple[float, float]:
    """TTFT of a short request alone, then while three long generations run."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=900) as client:
        idle = statistics.median([(await one_stream(client, url, model, f"a cat named {i}", 4))
                                  .ttft for i in range(3)])
        longs = [asyncio.create_task(one_stream(client, url, model, TOPICS[i + 1], tokens * 2))
                 for i in range(3)]
        await asyncio.sleep(2.0)
        crowded = (await one_stream(client, url, model, "a cat named Tom", 4)).ttft
        await asyncio.gather(*longs)
    return idle, crowded


def measure(name: str, cmd: list[str], port: int, ready: str, model: str, tokens: int,
            levels: list[int], repeat: int, crowd: bool = False) -> dict[int, dict]:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(proc, port, ready)
        asyncio.run(run_level(port, model, 1, 8))          # warm up
        out = {}
        if crowd:
            idle, crowded = asyncio.run(short_request_ttft(port, model, tokens))
            print(f"{name:>18} short request TTFT idle {idle * 1000:.0f} ms, with 3 long "
                  f"streams running {crowded * 1000:.0f} ms ({crowded / idle:.2f}x)", flush=True)
        for n in levels:
            runs = [summary(asyncio.run(run_level(port, model, n, tokens)))
                    for _ in range(repeat)]
            out[n] = sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]   # the median run
            out[n]["errors"] = sum(r["errors"] for r in runs)
            out[n]["why"] = sorted({w for r in runs for w in r["why"]})
            print(f"{name:>18} c={n}: {out[n]['tok_s']:6.1f} tok/s  ttft p50 "
                  f"{out[n]['ttft_p50'] * 1000:6.0f} ms  max {out[n]['ttft_max'] * 1000:6.0f} ms"
                  f"  errors {out[n]['errors']} {out[n]['why'] or ''}", flush=True)
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def ceiling(rows: int, tokens: int, threads: int, deterministic: bool) -> float:
    """The bare batched decode's tokens/s at ``rows`` sequences: llama_decode alone (no
    sampling, no server), one token a sequence a step, on the engine's own context (Podium's
    LlamaModel with the engine's weights and attention for the mode; the deterministic
    mode's steps cut into groups of at most ``INVARIANT_ROWS`` rows, as the engine cuts
    them). What batching can reach on this machine: Podium's aggregate is measured against
    it."""
    import llama_cpp

    from podium.engine.llamacpp.engine import INVARIANT_ROWS
    from podium.engine.llamacpp.model import LlamaModel
    from podium.engine.llamacpp.model_files import default_model_path

    model = LlamaModel(default_model_path(), n_ctx=1024, n_batch=128, n_threads=threads,
                       n_seq_max=rows, extra_buffers=not deterministic,
                       flash_attention=not deterministic)
    prompt = list(range(1000, 1032))
    batch = llama_cpp.llama_batch_init(max(128, rows), 0, 1)

    def decode(entries: list[tuple[int, int, int]]) -> None:
        for n, (token, pos, seq) in enumerate(entries):
            batch.token[n], batch.pos[n], batch.n_seq_id[n] = token, pos, 1
            batch.seq_id[n][0], batch.logits[n] = seq, True
        batch.n_tokens = len(entries)
        if llama_cpp.llama_decode(model.ctx, batch) != 0:
            raise SystemExit("llama_decode failed")

    try:
        for seq in range(rows):                         # each sequence's prompt
            decode([(t, i, seq) for i, t in enumerate(prompt)])
        group = INVARIANT_ROWS if deterministic else rows
        start = time.perf_counter()
        for step in range(tokens):
            pos = len(prompt) + step
            for first in range(0, rows, group):
                decode([(1000 + step % 500, pos, seq)
                        for seq in range(first, min(rows, first + group))])
        return rows * tokens / (time.perf_counter() - start)
    finally:
        llama_cpp.llama_batch_free(batch)
        model.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--fast", action="store_true", help="also Podium --no-deterministic")
    ap.add_argument("--skip-llama-server", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="runs per level (median shown)")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    from podium.engine.llamacpp.model_files import default_model_path

    model_path = default_model_path()
    raw = statistics.median(raw_decode_rate(args.tokens, args.threads)
                            for _ in range(args.repeat))
    print(f"{'raw Llama.eval':>18} c=1: {raw:6.1f} tok/s", flush=True)
    results = {}
    variants = [("podium", [])] + ([("podium --no-determ", ["--no-deterministic"])]
                                   if args.fast else [])
    for name, extra in variants:
        port = free_port()
        results[name] = measure(name, [sys.executable, "-m", "podium", "serve", "--port",
                                       str(port), "--threads", str(args.threads), "--ctx-size",
                                       "1024", "--max-num-seqs", str(max(levels)),
                                       "--log-level", "warning", *extra],
                                port, "/health", "qwen2.5-coder-0.5b-instruct", args.tokens,
                                levels, args.repeat, crowd=True)
    if not args.skip_llama_server:
        python, port = llama_server_python(), free_port()
        results["llama_cpp.server"] = measure(
            "llama_cpp.server", [str(python), "-m", "llama_cpp.server", "--model",
                                 str(model_path), "--n_threads", str(args.threads),
                                 "--n_threads_batch", str(args.threads), "--n_ctx", "2048",
                                 "--host", "127.0.0.1", "--port", str(port)],
            port, "/v1/models", str(model_path), args.tokens, levels, args.repeat)
    ceilings = {(mode, n): statistics.median(
        ceiling(n, args.tokens, args.threads, mode == "podium") for _ in range(args.repeat))
        for mode in results if mode.startswith("podium") for n in levels}
    print()
    for (mode, n), rate in ceilings.items():
        print(f"{'ceiling ' + ('deterministic' if mode == 'podium' else 'fast'):>24} "
              f"c={n}: {rate:6.1f} tok/s (bare batched llama_decode)")
    for name, res in results.items():
        single = res[levels[0]]["tok_s"]
        print(f"{name}: single stream decodes at {res[levels[0]]['decode']:.1f} tok/s after its "
              f"first token, {res[levels[0]]['decode'] / raw:.2f} of raw; " + ", ".join(
            f"c={n} {res[n]['tok_s'] / single:.2f}x single" for n in levels[1:]))
        if (name, levels[0]) in ceilings:
            print(f"{'':>{len(name) + 2}}aggregate / the bare decode's ceiling: " + ", ".join(
                f"c={n} {res[n]['tok_s'] / ceilings[(name, n)]:.2f}" for n in levels)
                + "; while every stream decodes (no prefill): " + ", ".join(
                f"c={n} {res[n]['steady']:.1f} tok/s, {res[n]['steady'] / ceilings[(name, n)]:.2f}"
                for n in levels))


if __name__ == "__main__":
    main()
