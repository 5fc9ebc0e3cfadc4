"""Models on a server: what they hold in memory, how fast they load and swap.

    .venv/bin/python bench/models.py estimate [--model PATH ...] [--setting N_CTX:N_SEQ ...]
    .venv/bin/python bench/models.py measure PATH --n-ctx N --n-seq N [--n-batch N]
    .venv/bin/python bench/models.py unload [--model PATH] [--cycles 3] [--runs 2]
    .venv/bin/python bench/models.py cold-load [--runs 5] [--ctx-size 2048]
    .venv/bin/python bench/models.py swap [--seconds 120] [--clients 8]

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

``cold-load``: a cold load to the first token through Podium against a raw llama-cpp-python
load of the same file. One server (``--max-loaded-models 1``, both models in a config, the
model under test with ``max-num-seqs = 1`` so that it, like a raw ``Llama``, holds one
sequence of ``--ctx-size`` tokens of KV cache), started once and not counted, and one
untimed first load (the server's first request also estimates the model). Then, alternated
``--runs`` times: Podium: unload the model (``POST /v1/models/NAME/unload``, its state
checked), then the time from sending a streamed chat request (max_tokens 1, temperature 0)
to the first chunk carrying content; the load happens inside it. Raw: a fresh process
(``cold-load-raw``) timing ``llama_cpp.Llama(path, n_ctx, n_batch=128, n_threads)`` and a
streamed ``create_chat_completion`` to its first chunk, from just before the ``Llama`` is
made (the interpreter's start and imports excluded); both use every core (``Llama``'s own
default is half). The OS page cache holds the file for both. Prints each run, the medians,
their ratio and the CPU time other work on the machine took meanwhile. Target (issue 28):
Podium's median within 1.1x the raw one.

``swap``: swapping under load. One server of both models with ``--max-loaded-models 1``;
``--clients`` threads (8) each alternate between the two models (client i's turn t asks for
the first model when i + t is even), each request a short chat completion (max_tokens 8,
temperature 0; every fourth streamed), for ``--seconds``. Prints the requests, the failures
by status or error (every non-200 answer and every stream that ends without ``[DONE]`` or
with an error event; the first five bodies), the swaps (the models' loads over the
run, from /health), the latency p50 / p90 / max and the CPU time other work took
meanwhile. Target (issue 28): no failed request. Both serve ``--model`` (default: the
default model) as qwen and ``--second`` (default: Gemma 3 270M, with tests/data/gemma3.jinja)
as gemma.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

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

    lines: list[str] = []               # llama.cpp's log lines (model.py sends them here)

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
    llama_log = logging.getLogger("podium.llamacpp")
    llama_log.addHandler(Keep())
    llama_log.setLevel(logging.DEBUG)
    _init_backend()
    defaults = llama_cpp.llama_context_default_params

    def context_params():       # the engine's context, with the setting measured
        params = defaults()
        params.swa_full = swa_full
        return params

    llama_cpp.llama_context_default_params = context_params
    before = rss()
    model = LlamaModel(path, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq,
                       n_threads=os.cpu_count() or 1, extra_buffers=not deterministic)
    loaded = rss()
    _warm_up(model, n_batch, n_seq)
    warm = rss()
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
    log = [line.strip() for line in lines
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


# -- several models on a server: cold load and swaps -----------------------------------------

PROMPT = [{"role": "user", "content": "Say hello."}]
GEMMA_TEMPLATE = ROOT / "tests" / "data" / "gemma3.jinja"
LLAMA_NOTES = ("load:", "llama_", "print_info:", "load_tensors:", "ggml_")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(first: Path, second: Path, ctx: int, seqs: int | None) -> str:
    """Both models (the first called qwen, the second gemma, Gemma's template given), the
    first with ``max-num-seqs = seqs`` when given."""
    out = [f"ctx-size = {ctx}", "", "[[models]]", 'name = "qwen"',
           f"model = {json.dumps(str(first))}"]
    if seqs is not None:
        out.append(f"max-num-seqs = {seqs}")
    out += ["", "[[models]]", 'name = "gemma"', f"model = {json.dumps(str(second))}"]
    if "gemma" in second.name.lower():
        out.append(f"chat-template-file = {json.dumps(str(GEMMA_TEMPLATE))}")
    return "\n".join(out) + "\n"


@contextmanager
def podium_server(config: str, max_loaded: int = 1,
                  timeout: float = 120.0) -> Iterator[tuple[str, int]]:
    """A Podium server of ``config`` (TOML) on a free port, answering /health; its URL and
    process id. Terminated at the end, whatever happens."""
    import httpx

    with tempfile.TemporaryDirectory(prefix="podium-bench-") as tmp:
        path = Path(tmp) / "models.toml"
        path.write_text(config)
        port = free_port()
        log = open(Path(tmp) / "server.log", "w+")
        proc = subprocess.Popen(
            [sys.executable, "-m", "podium", "serve", "--config", str(path), "--host",
             "127.0.0.1", "--port", str(port), "--max-loaded-models", str(max_loaded),
             "--log-level", "warning"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"the server exited ({proc.returncode}): "
                                       f"{log.read()[-3000:]}")
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not answer /health in {timeout} s")
                time.sleep(0.2)
            yield url, proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.seek(0)
            tail = [line for line in log.read().splitlines()     # less llama.cpp's notes
                    if line.strip() and not line.startswith(LLAMA_NOTES)]
            log.close()
            if tail:
                print(f"server log (last {min(len(tail), 20)} of {len(tail)} lines, "
                      f"llama.cpp's load notes left out):")
                for line in tail[-20:]:
                    print(f"  {line[:300]}")


def _health(client, url: str) -> dict:
    got = client.get(f"{url}/health", timeout=30)
    got.raise_for_status()
    return got.json()["models"]


def first_token_podium(client, url: str, model: str) -> float:
    """Seconds from sending a streamed chat request (max_tokens 1) to the first chunk with
    content; the rest of the stream is read and checked."""
    body = {"model": model, "messages": PROMPT, "max_tokens": 1, "temperature": 0,
            "stream": True}
    started = time.perf_counter()
    first = None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as got:
        if got.status_code != 200:
            raise RuntimeError(f"{got.status_code}: {got.read().decode()[:500]}")
        done = False
        for line in got.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            if first is None:
                choices = json.loads(data).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    first = time.perf_counter() - started
    if first is None or not done:
        raise RuntimeError(f"the stream had no content or no [DONE] (done {done})")
    return first


def first_token_raw(path: Path, n_ctx: int, n_threads: int) -> dict:
    """In this (fresh) process: a ``Llama`` of ``path`` and a streamed chat completion of one
    token, timed from just before the ``Llama`` is made to the first chunk."""
    import llama_cpp

    started = time.perf_counter()
    llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=128, n_threads=n_threads,
                          verbose=False)
    loaded = time.perf_counter() - started
    stream = llm.create_chat_completion(PROMPT, max_tokens=1, temperature=0, stream=True)
    next(stream)            # (its first chunk comes with the first token's)
    first = time.perf_counter() - started
    for _ in stream:
        pass
    llm.close()
    return {"loaded": loaded, "first": first}


def first_token_raw_in_subprocess(path: Path, n_ctx: int, n_threads: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "cold-load-raw", str(path),
           "--ctx-size", str(n_ctx), "--threads", str(n_threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"cold-load-raw failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def cold_load(first: Path, second: Path, runs: int, ctx: int) -> None:
    import httpx

    threads = os.cpu_count() or 1
    print(f"{first.name}: cold load to the first token, n_ctx {ctx}, one sequence of KV cache "
          f"on both sides (Podium: max-num-seqs = 1 in the model's table), {threads} threads "
          f"both; the OS page cache holds the file for both (warm); load average "
          f"{_loadavg()}")
    with podium_server(_config(first, second, ctx, seqs=1)) as (url, pid), \
            httpx.Client() as client:
        warm = first_token_podium(client, url, "qwen")
        busy = Busy(pid)
        print(f"untimed first load through Podium (estimate, first imports): {warm:.3f} s")
        podium, raw, loads = [], [], []
        print(f"{'run':>3} {'podium s':>9} {'(load s)':>9} {'raw s':>9} {'(Llama() s)':>12}")
        for run in range(runs):
            card = client.post(f"{url}/v1/models/qwen/unload", timeout=120)
            card.raise_for_status()
            if card.json()["state"] != "unloaded":
                raise RuntimeError(f"after the unload: {card.json()}")
            if _health(client, url)["qwen"]["state"] != "unloaded":
                raise RuntimeError("qwen is not unloaded")
            before = _health(client, url)["qwen"]["load_seconds"]
            podium.append(first_token_podium(client, url, "qwen"))
            loads.append(_health(client, url)["qwen"]["load_seconds"] - before)
            got = first_token_raw_in_subprocess(first, ctx, threads)
            raw.append(got["first"])
            print(f"{run:>3} {podium[-1]:9.3f} {loads[-1]:9.3f} {raw[-1]:9.3f} "
                  f"{got['loaded']:12.3f}", flush=True)
        print(busy.report())
    p, r = statistics.median(podium), statistics.median(raw)
    print(f"median: Podium {p:.3f} s (request sent to first content chunk; the server's own "
          f"load {statistics.median(loads):.3f} s), raw {r:.3f} s (Llama() to first chunk)")
    verdict = "met" if p / r <= 1.1 else "NOT met"
    print(f"ratio Podium / raw: {p / r:.3f} (target <= 1.1: {verdict}); load average "
          f"{_loadavg()}")


class SwapClient(threading.Thread):
    """One client: its turns alternate between the two models until the deadline."""

    def __init__(self, i: int, url: str, models: tuple[str, str], deadline: float,
                 tokens: int, stream_every: int):
        super().__init__(name=f"swap-client-{i}", daemon=True)
        self.i, self.url, self.models, self.deadline = i, url, models, deadline
        self.tokens, self.stream_every = tokens, stream_every
        self.results: list[dict] = []   # model, streamed, seconds, ok, failure, body

    def run(self) -> None:
        import httpx

        with httpx.Client(timeout=httpx.Timeout(600, connect=30)) as client:
            turn = 0
            while time.monotonic() < self.deadline:
                model = self.models[(self.i + turn) % 2]
                streamed = turn % self.stream_every == self.stream_every - 1
                self.results.append(self._one(client, model, streamed))
                turn += 1

    def _one(self, client, model: str, streamed: bool) -> dict:
        body = {"model": model, "messages": PROMPT, "max_tokens": self.tokens,
                "temperature": 0, "stream": streamed}
        out = {"model": model, "streamed": streamed, "ok": False, "failure": None,
               "body": None}
        started = time.perf_counter()
        try:
            if streamed:
                self._streamed(client, body, out)
            else:
                got = client.post(f"{self.url}/v1/chat/completions", json=body)
                text = got.text
                if got.status_code != 200:
                    out["failure"], out["body"] = f"HTTP {got.status_code}", text
                elif not json.loads(text).get("choices"):
                    out["failure"], out["body"] = "no choices", text
                else:
                    out["ok"] = True
        except Exception as exc:  # noqa: BLE001 - a failure to count, by its kind
            out["failure"], out["body"] = type(exc).__name__, str(exc)
        out["seconds"] = time.perf_counter() - started
        return out

    def _streamed(self, client, body: dict, out: dict) -> None:
        with client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as got:
            if got.status_code != 200:
                out["failure"] = f"HTTP {got.status_code}"
                out["body"] = got.read().decode(errors="replace")
                return
            lines, done = [], False
            for line in got.iter_lines():
                lines.append(line)
                if line.startswith("event: error") or line.startswith('data: {"error"'):
                    out["failure"] = "error event in stream"
                if line == "data: [DONE]":
                    done = True
            if out["failure"] is None and not done:
                out["failure"] = "stream without [DONE]"
            if out["failure"] is not None:
                out["body"] = "\n".join(lines)[-2000:]
            else:
                out["ok"] = True


class Busy:
    """The machine's CPU time from now on: the server's, this process's and its finished
    children's, and everything else's (other work on the machine slows a llama.cpp engine
    whose threads take every core far more than its share: a run it crowded says so)."""

    def __init__(self, server: int):
        self.server = server
        self.start = self._now()

    def _now(self) -> tuple[float, float, float, float]:
        tick = os.sysconf("SC_CLK_TCK")
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
        machine = (user + nice + system + irq + softirq + steal) / tick
        stat = Path(f"/proc/{self.server}/stat").read_text().rsplit(")", 1)[1].split()
        server = (int(stat[11]) + int(stat[12])) / tick         # utime, stime
        t = os.times()
        mine = t.user + t.system + t.children_user + t.children_system
        return time.monotonic(), machine, server, mine

    def report(self) -> str:
        (t0, m0, s0, o0), (t1, m1, s1, o1) = self.start, self._now()
        wall, server, mine = t1 - t0, s1 - s0, o1 - o0
        others = max(0.0, (m1 - m0) - server - mine)
        return (f"CPU over {wall:.1f} s: server {server:.1f} s, this benchmark and its "
                f"subprocesses {mine:.1f} s, other work on the machine {others:.1f} s "
                f"({others / wall:.2f} of {os.cpu_count()} cores)")


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def swap(first: Path, second: Path, seconds: float, clients: int, tokens: int,
         ctx: int, show: int = 5) -> None:
    import httpx

    models = ("qwen", "gemma")
    print(f"swap: {clients} clients alternating {first.name} (qwen) and {second.name} (gemma), "
          f"--max-loaded-models 1, max_tokens {tokens}, every 4th request streamed, "
          f"{seconds:g} s, ctx-size {ctx}, the server's default max-num-seqs; load average "
          f"{_loadavg()}")
    with podium_server(_config(first, second, ctx, seqs=None)) as (url, pid), \
            httpx.Client() as client:
        before = _health(client, url)
        busy = Busy(pid)
        deadline = time.monotonic() + seconds
        started = time.monotonic()
        workers = [SwapClient(i, url, models, deadline, tokens, 4) for i in range(clients)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.monotonic() - started
        after = _health(client, url)
        print(busy.report())
    results = [r for w in workers for r in w.results]
    failed = [r for r in results if not r["ok"]]
    loads = {m: after[m]["loads"] - before[m]["loads"] for m in models}
    unloads = {m: after[m]["unloads"] - before[m]["unloads"] for m in models}
    print(f"load average at the end {_loadavg()}")
    print(f"requests: {len(results)} in {elapsed:.1f} s ({sum(r['streamed'] for r in results)} "
          f"streamed), failed: {len(failed)} (target 0)")
    kinds: dict[str, int] = {}
    for r in failed:
        kinds[r["failure"]] = kinds.get(r["failure"], 0) + 1
    for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {kind}: {n}")
    spent = {m: after[m]["load_seconds"] - before[m]["load_seconds"] for m in models}
    print(f"swaps (model loads during the run): {sum(loads.values())} "
          f"({', '.join(f'{m} {n}' for m, n in loads.items())}); unloads "
          f"{', '.join(f'{m} {n}' for m, n in unloads.items())}; seconds loading "
          f"{', '.join(f'{m} {t:.1f}' for m, t in spent.items())}")
    for label, rows in (("all", results), *((m, [r for r in results if r["model"] == m])
                                            for m in models)):
        secs = [r["seconds"] for r in rows]
        if secs:
            print(f"latency {label:<6} n={len(secs):<5} p50 {_pct(secs, 0.5):7.3f} s  "
                  f"p90 {_pct(secs, 0.9):7.3f} s  max {max(secs):7.3f} s")
    for r in failed[:show]:
        print(f"failure ({r['model']}, {'streamed' if r['streamed'] else 'plain'}, "
              f"{r['seconds']:.1f} s): {r['failure']}: {(r['body'] or '')[:1500]}")


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
    cold = sub.add_parser("cold-load", help="cold load to the first token: Podium and raw")
    cold.add_argument("--runs", type=int, default=5)
    raw = sub.add_parser("cold-load-raw", help="one raw load to the first token; prints JSON")
    raw.add_argument("path", type=Path)
    raw.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    sw = sub.add_parser("swap", help="clients alternating between two models, one loaded")
    sw.add_argument("--seconds", type=float, default=120)
    sw.add_argument("--clients", type=int, default=8)
    sw.add_argument("--max-tokens", type=int, default=8)
    for p in (cold, raw, sw):
        p.add_argument("--ctx-size", type=int, default=2048)
    for p in (cold, sw):
        p.add_argument("--model", type=Path, help="the model asked for first (default: the "
                       "default model), served as qwen")
        p.add_argument("--second", type=Path, help="the other model (default: Gemma 3 "
                       "270M), served as gemma")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.command == "cold-load-raw":
        print(json.dumps(first_token_raw(args.path, args.ctx_size, args.threads)))
        return
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

    if args.command in ("cold-load", "swap"):
        first = args.model or default_model_path()
        second = args.second or default_model_path(GEMMA_MODEL)
        if args.command == "cold-load":
            cold_load(first, second, args.runs, args.ctx_size)
        else:
            swap(first, second, args.seconds, args.clients, args.max_tokens, args.ctx_size)
        return
    if args.command == "unload":
        unload_table(args.model or default_model_path(), args.runs, args.cycles,
                     args.ctx_size, args.max_num_seqs)
        return
    models = args.model or [default_model_path(), default_model_path(GEMMA_MODEL)]
    estimate_table(models, args.setting or [(4096, 1), (0, 4)], args.n_batch)


if __name__ == "__main__":
    main()
