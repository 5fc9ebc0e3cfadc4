"""Models on a server: what they hold in memory.

    .venv/bin/python bench/models.py estimate [--model PATH ...] [--setting N_CTX:N_SEQ ...]
    .venv/bin/python bench/models.py measure PATH --n-ctx N --n-seq N [--n-batch N]
    .venv/bin/python bench/models.py unload [--model PATH] [--cycles 3] [--runs 2]

``estimate``: for each model (default: the default model and Gemma 3 270M) and setting
(default: 4096:1 and the server's defaults, 0:4), the estimate (podium/engine/llamacpp/
estimate.py) next to the resident memory a fresh process gains loading it as the engine does
(``measure``, run as a subprocess), after the load and after a warm-up. Target: the estimate
within 15% of the warm figure.

``measure`` (one JSON line): RSS before the load, after it, and after a warm-up (one
``--n-batch`` prompt chunk on sequence 0, one 64-token chunk scored whole as for prompt
logprobs, then a decode step on every sequence: what a serving engine touches), the model's
shape as llama.cpp reports it after the real load, and llama.cpp's own log lines about its
buffers.

``unload``: what closing an engine gives back. Fresh processes (``--runs``), each loading the
model as the server does (its default settings unless ``--ctx-size`` / ``--max-num-seqs``),
generating a few tokens, closing the engine and collecting it, ``--cycles`` times over; per
cycle the resident memory (VmRSS, and PSS from smaps_rollup) before the load, loaded, and
after the close. Target (issue 28): back within 10% of before, and nothing growing from one
cycle to the next. ``unload-measure`` is one such process (one JSON line).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCORED = 64                     # the engine's prefill chunk when a request scores its prompt


def rss() -> dict[str, int]:
    """VmRSS and its anonymous and file-backed parts, in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def measure(path: Path, n_ctx: int, n_seq: int, n_batch: int, swa_full: bool = True,
            deterministic: bool = True) -> dict:
    import llama_cpp

    from podium.engine.llamacpp.model import LlamaModel, _init_backend

    logging.getLogger("llama-cpp-python").setLevel(logging.DEBUG)
    _init_backend()
    defaults = llama_cpp.llama_context_default_params

    def context_params():       # the engine's context, with the setting measured
        params = defaults()
        params.swa_full = swa_full
        return params

    llama_cpp.llama_context_default_params = context_params
    captured, sys.stderr = io.StringIO(), io.StringIO()     # llama.cpp's log lines
    try:
        before = rss()
        model = LlamaModel(path, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq,
                           n_threads=os.cpu_count() or 1, extra_buffers=not deterministic)
        loaded = rss()
        _warm_up(model, n_batch, n_seq)
        warm = rss()
    finally:
        captured, sys.stderr = sys.stderr, sys.__stderr__
    m, ctx = model.model, model.ctx
    reported = {
        "n_layer": llama_cpp.llama_model_n_layer(m), "n_head": llama_cpp.llama_model_n_head(m),
        "n_head_kv": llama_cpp.llama_model_n_head_kv(m),
        "n_embd": llama_cpp.llama_model_n_embd(m), "n_swa": llama_cpp.llama_model_n_swa(m),
        "n_ctx_train": llama_cpp.llama_model_n_ctx_train(m),
        "n_vocab": llama_cpp.llama_vocab_n_tokens(model.vocab),
        "n_ctx": llama_cpp.llama_n_ctx(ctx), "n_ctx_seq": llama_cpp.llama_n_ctx_seq(ctx),
        "tensor_bytes": llama_cpp.llama_model_size(m),
    }
    log = [line.strip() for line in captured.getvalue().splitlines()
           if any(k in line for k in ("buffer size", "KV cache", "kv_cache", "flash_attn",
                                      "n_ctx", "swa", "SWA"))]
    model.close()
    return {"before": before, "loaded": loaded, "warm": warm, "reported": reported,
            "metadata": model.metadata, "log": log}


def _warm_up(model, n_batch: int, n_seq: int) -> None:
    """What a serving engine touches: a prompt chunk, a scored chunk, a step on every seq."""
    import llama_cpp

    batch = llama_cpp.llama_batch_init(max(n_batch, SCORED, n_seq), 0, 1)
    try:
        token = llama_cpp.llama_vocab_bos(model.vocab)
        token = token if token >= 0 else 0
        _decode(model.ctx, batch, [(0, p, p == n_batch - 1) for p in range(n_batch)], token)
        _decode(model.ctx, batch, [(0, n_batch + p, True) for p in range(SCORED)], token)
        _decode(model.ctx, batch, [(s, n_batch + SCORED if s == 0 else 0, True)
                                   for s in range(n_seq)], token)
    finally:
        llama_cpp.llama_batch_free(batch)


def _decode(ctx, batch, rows: list[tuple[int, int, bool]], token: int) -> None:
    import llama_cpp

    for i, (seq, pos, logits) in enumerate(rows):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, logits
    batch.n_tokens = len(rows)
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")


def measure_in_subprocess(path: Path, n_ctx: int, n_seq: int, n_batch: int = 128,
                          swa_full: bool = True) -> dict:
    """``measure`` in a fresh interpreter, so that nothing loaded before counts."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "measure", str(path),
           "--n-ctx", str(n_ctx), "--n-seq", str(n_seq), "--n-batch", str(n_batch)]
    if not swa_full:
        cmd.append("--no-swa-full")
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"measure failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _mib(n: int) -> str:
    return f"{n / 2**20:8.1f}"


def estimate_table(models: list[Path], settings: list[tuple[int, int]],
                   n_batch: int) -> None:
    from podium.engine.llamacpp.estimate import estimate, read_shape

    print(f"{'model':<44}{'n_ctx':>6}{'seqs':>5} {'weights':>8} {'kv':>8} {'buffers':>8}"
          f" {'total':>8} | {'loaded':>8} {'warm':>8} {'est/warm':>8}   (MiB)")
    for path in models:
        shape = read_shape(path)
        for n_ctx, n_seq in settings:
            est = estimate(path, n_ctx=n_ctx, n_seq=n_seq, n_batch=n_batch, shape=shape)
            got = measure_in_subprocess(path, n_ctx, n_seq, n_batch)
            loaded = got["loaded"]["VmRSS"] - got["before"]["VmRSS"]
            warm = got["warm"]["VmRSS"] - got["before"]["VmRSS"]
            print(f"{path.name[:43]:<44}{n_ctx:>6}{n_seq:>5} {_mib(est.weights)} "
                  f"{_mib(est.kv_cache)} {_mib(est.buffers)} {_mib(est.total)} | "
                  f"{_mib(loaded)} {_mib(warm)} {est.total / warm:8.3f}", flush=True)


def memory() -> dict[str, int]:
    """``rss()`` and, where the kernel has smaps_rollup, PSS, in bytes."""
    out = rss()
    rollup = Path("/proc/self/smaps_rollup")
    if rollup.exists():
        for line in rollup.read_text().splitlines():
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1]) * 1024
    return out


async def unload_cycles(path: Path, cycles: int, n_ctx: int | None = None,
                        n_seq: int | None = None, tokens: int = 8) -> list[dict]:
    """Load, generate ``tokens``, close, ``cycles`` times in this process; memory at each."""
    import gc
    import weakref

    from podium.engine.base import EngineRequest, SamplingParams
    from podium.engine.llamacpp.engine import LlamaCppEngine
    from podium.settings import Settings

    s = Settings()
    out = []
    for i in range(cycles):
        before = memory()
        engine = LlamaCppEngine(
            path, served_name="bench", n_ctx=s.ctx_size if n_ctx is None else n_ctx,
            n_batch=s.batch_size, n_threads=s.threads,
            max_num_seqs=s.max_num_seqs if n_seq is None else n_seq,
            max_queued=s.max_queued_requests, deterministic=s.deterministic,
            grammar_ms_per_token=s.grammar_ms_per_token)
        prompt = engine.tokenizer.encode("Say hello in three languages.")
        request = EngineRequest(f"unload-{i}", prompt,
                                SamplingParams(max_tokens=tokens, temperature=0.0))
        generated = 0
        async for output in engine.generate(request):
            generated += len(output.token_ids)
        loaded = memory()
        await engine.aclose()
        await engine.aclose()           # a server may: an unload, then its shutdown
        gone = weakref.ref(engine)
        del engine
        gc.collect()
        out.append({"before": before, "loaded": loaded, "after": memory(),
                    "generated": generated, "collected": gone() is None})
    return out


def unload_in_subprocess(path: Path, cycles: int, n_ctx: int | None = None,
                         n_seq: int | None = None) -> list[dict]:
    """``unload_cycles`` in a fresh interpreter (the caller's heap does not count)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "unload-measure", str(path),
           "--cycles", str(cycles)]
    cmd += ["--ctx-size", str(n_ctx)] if n_ctx is not None else []
    cmd += ["--max-num-seqs", str(n_seq)] if n_seq is not None else []
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"unload-measure failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def unload_table(path: Path, runs: int, cycles: int, n_ctx: int | None,
                 n_seq: int | None) -> None:
    print(f"{path.name}: VmRSS (PSS) in MiB, one fresh process a run")
    print(f"{'run':>3} {'cycle':>5} {'before':>16} {'loaded':>18} {'after close':>16}"
          f" {'after - before':>16}")
    for run in range(runs):
        for i, c in enumerate(unload_in_subprocess(path, cycles, n_ctx, n_seq)):
            b, lo, a = c["before"], c["loaded"], c["after"]
            pss = "Pss" in b
            cell = (lambda m: f"{_mib(m['VmRSS'])} ({_mib(m['Pss']).strip():>6})" if pss
                    else f"{_mib(m['VmRSS'])}")
            grew = a["VmRSS"] - b["VmRSS"]
            print(f"{run:>3} {i:>5} {cell(b):>16} {cell(lo):>18} {cell(a):>16} "
                  f"{_mib(grew)} {100 * grew / b['VmRSS']:+5.1f}%"
                  + ("" if c["collected"] else "  engine NOT collected"), flush=True)


def _setting(text: str) -> tuple[int, int]:
    n_ctx, _, n_seq = text.partition(":")
    return int(n_ctx), int(n_seq or 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    est = sub.add_parser("estimate", help="estimated memory next to the measured")
    est.add_argument("--model", type=Path, action="append", help="a GGUF file (repeatable)")
    est.add_argument("--setting", type=_setting, action="append",
                     help="N_CTX:N_SEQ (repeatable; default 4096:1 and 0:4)")
    est.add_argument("--n-batch", type=int, default=128)
    one = sub.add_parser("measure", help="one load in this process; prints JSON")
    one.add_argument("path", type=Path)
    one.add_argument("--n-ctx", type=int, default=0)
    one.add_argument("--n-seq", type=int, default=1)
    one.add_argument("--n-batch", type=int, default=128)
    one.add_argument("--no-swa-full", dest="swa_full", action="store_false")
    for name, text in (("unload", "memory before a load, loaded, after the close"),
                       ("unload-measure", "unload's cycles in this process; prints JSON")):
        un = sub.add_parser(name, help=text)
        if name == "unload":
            un.add_argument("--model", type=Path, help="a GGUF file (default: the default "
                            "model)")
            un.add_argument("--runs", type=int, default=2, help="fresh processes")
        else:
            un.add_argument("path", type=Path)
        un.add_argument("--cycles", type=int, default=3, help="load/close cycles a process")
        un.add_argument("--ctx-size", type=int, help="default: the server's")
        un.add_argument("--max-num-seqs", type=int, help="default: the server's")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.command == "unload-measure":
        import asyncio

        print(json.dumps(asyncio.run(unload_cycles(args.path, args.cycles, args.ctx_size,
                                                   args.max_num_seqs))))
        return
    if args.command == "measure":
        print(json.dumps(measure(args.path, args.n_ctx, args.n_seq, args.n_batch,
                                 args.swa_full)))
        return
    from podium.engine.llamacpp.model_files import GEMMA_MODEL, default_model_path

    if args.command == "unload":
        unload_table(args.model or default_model_path(), args.runs, args.cycles,
                     args.ctx_size, args.max_num_seqs)
        return
    models = args.model or [default_model_path(), default_model_path(GEMMA_MODEL)]
    estimate_table(models, args.setting or [(4096, 1), (0, 4)], args.n_batch)


if __name__ == "__main__":
    main()
