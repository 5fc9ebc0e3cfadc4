"""Embeddings: inputs a second through Podium against the same model elsewhere.

    .venv/bin/python bench/embeddings.py [--rounds 3] [--seconds 10] [--batches 1,32,256]

Five systems embed the same deterministic inputs (each about 64 tokens of varied English,
made by ``texts()``), ``batch`` inputs at a time, one call after another, for ``--seconds``
per cell:

  podium         ``python -m podium serve --model all-minilm-l6-v2 --threads 2 --log-level
                 warning`` (the packaged all-MiniLM-L6-v2 GGUF); one ``POST /v1/embeddings``
                 of ``batch`` inputs at a time on one kept-alive connection of the standard
                 library's ``http.client`` (encoding_format float; the answer parsed and
                 counted). ``--client httpx`` sends them through httpx instead, which costs
                 the client 0.4-0.9 ms more a request on these machines: at batch 1 that is
                 the client's cost, not the server's.
  llama-server   llama-cpp-python's own server on the same GGUF, ``python -m
                 llama_cpp.server --model GGUF --embedding true --n_ctx 512 --n_threads 2
                 --n_threads_batch 2 --verbose false`` (from ``--llama-server-python``: a
                 venv with ``llama-cpp-python[server]`` of .venv's version, e.g.
                 ``python -m venv /tmp/llama-server-venv && /tmp/llama-server-venv/bin/pip
                 install 'llama-cpp-python[server]==0.3.36'``), the same requests.
  http-floor     the thinnest HTTP server around the bare call below: an ASGI app of a
                 few lines under uvicorn (``--serve-floor``; OpenAI's request and answer,
                 the call on a worker thread as any server must, not to stall its other
                 clients), the same requests. What HTTP costs any Python server at batch 1.
  st             sentence-transformers' ``SentenceTransformer(FOLDER, device="cpu")
                 .encode(texts, batch_size=batch)`` in a worker process of
                 ``--st-python`` (a venv with CPU torch, ``torch.set_num_threads(2)``) on the
                 model's own folder.
  bare           llama.cpp's bare embed call in a worker process: ``llama_cpp.Llama(GGUF,
                 embedding=True, n_ctx=512, n_batch=512, n_threads=2, n_threads_batch=2)
                 .embed(texts)`` (``--bare-ctx`` sets n_ctx = n_batch = n_ubatch).

Each round measures every batch size on every system in turn (podium, llama-server, st,
bare, podium, ...), after one untimed call of that batch; the servers and workers are
started once and stay up. Printed: every cell (one JSON line), then per batch the median
inputs/s of each system over the rounds, the ratios Podium / llama-server, Podium / st and
Podium / bare (and / http-floor), the issue's targets (Podium ahead of llama-server and st at batch 32 and 256;
Podium >= bare / 1.1 at batch 1), the mean tokens per input (Podium's usage, [CLS] and [SEP]
included) and the CPU time other work on the machine took during the run.

First, once: Podium's vector for one input against the bare llama.cpp one (normalized) and
sentence-transformers' (cosine similarity; the target is > 0.9999 for the bare one).

``--worker st|bare`` is the worker itself (JSON lines on stdin and stdout); it imports only
what its system needs, so it runs under another venv's interpreter. ``--serve-floor`` is the
http-floor server itself.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("podium", "llama-server", "http-floor", "st", "bare")
POOL = 1024             # distinct inputs, cycled through

_SUBJECTS = [
    "The old lighthouse keeper", "A young software engineer", "The city council",
    "Our neighbour's golden retriever", "The research team at the university",
    "A small bakery on the corner", "The orchestra's new conductor", "Every migrating swallow",
    "The night-shift nurse", "A retired geography teacher", "The village football club",
    "That stubborn vending machine", "The museum's curator", "A group of hikers",
    "The local newspaper", "My grandmother's sewing circle", "The freight train from the coast",
    "An amateur astronomer", "The hospital's finance department", "A curious toddler",
]
_VERBS = [
    "carefully examined", "quietly rebuilt", "argued about", "wrote a long report on",
    "spent the whole winter studying", "accidentally discovered", "refused to discuss",
    "painted a mural of", "organised a festival around", "kept a detailed diary about",
    "measured the temperature of", "sold tickets for", "photographed", "mapped every corner of",
    "complained loudly about", "translated an old poem about",
]
_OBJECTS = [
    "the flooded railway station", "a forgotten recipe for plum dumplings",
    "the rising price of electricity", "an abandoned copper mine", "the annual tulip harvest",
    "a broken pocket watch", "the history of the harbour", "the migration of salmon upstream",
    "a dispute over parking spaces", "the committee's unfinished budget",
    "a rare species of mountain orchid", "the school's leaking roof",
    "an unexpected snowstorm in April", "the theory of plate tectonics",
    "a collection of antique maps", "the slow decline of the textile industry",
]
_TAILS = [
    "because nobody else seemed to care", "before the autumn rains arrived",
    "while the rest of the town was asleep", "despite a severe shortage of volunteers",
    "with help from a surprisingly patient librarian", "and published the results online",
    "although the evidence remained unclear", "during a particularly noisy weekend",
    "so that future generations would remember it", "after reading a pamphlet at the market",
    "and nobody could quite explain why", "using nothing more than a notebook and a pencil",
]


def texts(n: int = POOL, words: int = 50) -> list[str]:
    """``n`` deterministic inputs of varied English, each of about ``words`` words (about
    64 WordPiece tokens with [CLS] and [SEP]; Podium's usage gives the exact mean)."""
    out = []
    for i in range(n):
        rng = random.Random(1000 + i)
        parts: list[str] = []
        count = 0
        while count < words:
            sentence = (f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
                        f"{rng.choice(_TAILS)}.")
            parts.append(sentence)
            count += len(sentence.split())
        out.append(" ".join(" ".join(parts).split(" ")[:words]) + f" (note {i}).")
    return out


def chunk(pool: list[str], k: int, batch: int) -> list[str]:
    start = (k * batch) % len(pool)
    return [pool[(start + j) % len(pool)] for j in range(batch)]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


# -- the in-process systems (worker processes) ------------------------------------------


def worker(kind: str, args: argparse.Namespace) -> None:
    pool = texts()
    if kind == "st":
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(args.threads)
        model = SentenceTransformer(args.folder, device="cpu")

        def call(batch_texts: list[str]) -> int:
            return len(model.encode(batch_texts, batch_size=len(batch_texts)))

        def vector(text: str) -> list[float]:
            return [float(x) for x in model.encode([text])[0]]
    else:
        llm = bare_llama(args)

        def call(batch_texts: list[str]) -> int:
            return len(llm.embed(batch_texts))

        def vector(text: str) -> list[float]:
            return llm.embed([text], normalize=True)[0]
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if "vector" in cmd:
            print(json.dumps({"vector": vector(cmd["vector"])}), flush=True)
            continue
        batch, seconds = cmd["batch"], cmd["seconds"]
        call(chunk(pool, 0, batch))                             # untimed
        k, done, start = 1, 0, time.perf_counter()
        while True:
            got = call(chunk(pool, k, batch))
            assert got == batch, (got, batch)
            done, k = done + got, k + 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        print(json.dumps({"inputs": done, "calls": k - 1, "seconds": elapsed}), flush=True)


def bare_llama(args: argparse.Namespace):  # noqa: ANN201 - llama_cpp.Llama
    import llama_cpp

    return llama_cpp.Llama(args.gguf, embedding=True, n_ctx=args.bare_ctx,
                           n_batch=args.bare_ctx, n_ubatch=args.bare_ctx,
                           n_threads=args.threads, n_threads_batch=args.threads, verbose=False)


def serve_floor(args: argparse.Namespace) -> None:
    """The http-floor server: the bare call behind OpenAI's embeddings route and nothing
    else (no validation, no limits, no log), on ``--port``."""
    import asyncio

    import orjson
    import uvicorn

    llm = bare_llama(args)
    models = orjson.dumps({"object": "list", "data": [{"id": "floor", "object": "model"}]})

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] == "GET":
            out = models
        else:
            req = orjson.loads(body)
            vectors = await asyncio.to_thread(llm.embed, req["input"])
            out = orjson.dumps({"object": "list", "model": req["model"], "data": [
                {"object": "embedding", "index": i, "embedding": v}
                for i, v in enumerate(vectors)]})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


class Worker:
    def __init__(self, python: str, kind: str, args: argparse.Namespace):
        cmd = [python, str(Path(__file__).resolve()), "--worker", kind, "--gguf", args.gguf,
               "--folder", args.folder, "--threads", str(args.threads),
               "--bare-ctx", str(args.bare_ctx)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True,
                                     start_new_session=True)
        self.pid = self.proc.pid
        if "ready" not in self._read():
            raise SystemExit(f"the {kind} worker did not start")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a worker exited ({self.proc.poll()})")
        return json.loads(line)

    def ask(self, cmd: dict) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def measure(self, batch: int, seconds: float) -> dict:
        return self.ask({"batch": batch, "seconds": seconds})

    def vector(self, text: str) -> list[float]:
        return self.ask({"vector": text})["vector"]

    def stop(self) -> None:
        stop(self.proc)


# -- the servers -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Server:
    def __init__(self, cmd: list[str], label: str, client: str = "stdlib",
                 timeout: float = 300):
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.label = label
        self.proc = subprocess.Popen(cmd + ["--port", str(self.port)], cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.client = httpx.Client(timeout=600)
        self.post = self._httpx if client == "httpx" else self._stdlib
        self.conn: http.client.HTTPConnection | None = None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{label} exited with {self.proc.returncode}")
            try:
                self.model = self.client.get(f"{self.url}/v1/models").json()["data"][0]["id"]
                break
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                if time.monotonic() > deadline:
                    raise SystemExit(f"{label} did not answer in {timeout} s") from None
                time.sleep(0.3)

    def _httpx(self, payload: dict) -> dict:
        r = self.client.post(f"{self.url}/v1/embeddings", json=payload)
        r.raise_for_status()
        return r.json()

    def _stdlib(self, payload: dict) -> dict:
        for attempt in (1, 2):      # the server closes a connection idle past its keep-alive
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
            try:
                self.conn.request("POST", "/v1/embeddings", body=json.dumps(payload),
                                  headers={"content-type": "application/json"})
                r = self.conn.getresponse()
                data = r.read()
                break
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
        if r.status != 200:
            raise SystemExit(f"{self.label} answered {r.status}: {data[:300]!r}")
        return json.loads(data)

    def embed(self, batch_texts: list[str]) -> dict:
        body = self.post({"model": self.model, "input": batch_texts,
                          "encoding_format": "float"})
        assert len(body["data"]) == len(batch_texts), (self.label, len(body["data"]))
        return body

    def measure(self, pool: list[str], batch: int, seconds: float) -> dict:
        self.embed(chunk(pool, 0, batch))                       # untimed
        k, done, tokens, start = 1, 0, 0, time.perf_counter()
        while True:
            body = self.embed(chunk(pool, k, batch))
            done, k = done + len(body["data"]), k + 1
            tokens += (body.get("usage") or {}).get("prompt_tokens", 0)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        return {"inputs": done, "calls": k - 1, "seconds": elapsed, "tokens": tokens}

    def stop(self) -> None:
        self.client.close()
        if self.conn is not None:
            self.conn.close()
        stop(self.proc)


# -- the machine's CPU -------------------------------------------------------------------


def _machine_cpu() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def _ours(pids: list[int]) -> float:
    return sum(_process_cpu(p) for p in [os.getpid(), *pids])


# -- main --------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="per cell")
    parser.add_argument("--batches", default="1,32,256")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gguf", default=None, help="default: the packaged model's file")
    parser.add_argument("--folder", default=str(Path.home() / ".cache/podium/all-MiniLM-L6-v2"))
    parser.add_argument("--bare-ctx", type=int, default=512,
                        help="the bare Llama's n_ctx = n_batch = n_ubatch")
    parser.add_argument("--st-python", default="/tmp/embed-work/venv-probe/bin/python")
    parser.add_argument("--llama-server-python", default="/tmp/llama-server-venv/bin/python")
    parser.add_argument("--client", choices=("stdlib", "httpx"), default="stdlib",
                        help="the servers' HTTP client")
    parser.add_argument("--worker", choices=("st", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args)
    if args.serve_floor:
        return serve_floor(args)
    if args.gguf is None:
        sys.path.insert(0, str(ROOT))
        from podium.engine.llamacpp.model_files import EMBED_MODEL, default_model_path
        args.gguf = str(default_model_path(EMBED_MODEL))
    systems = [s for s in args.systems.split(",") if s]
    batches = [int(b) for b in args.batches.split(",")]
    pool = texts()
    print(f"# {len(pool)} inputs, e.g. {pool[0]!r}; batches {batches}, {args.rounds} rounds of "
          f"{args.seconds:g} s cells, {args.threads} threads, {args.client} client, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    running: dict[str, object] = {}
    try:
        started = time.monotonic()
        if "podium" in systems:
            running["podium"] = Server(
                [sys.executable, "-m", "podium", "serve", "--model", "all-minilm-l6-v2",
                 "--threads", str(args.threads), "--log-level", "warning"], "podium",
                args.client)
        if "llama-server" in systems:
            running["llama-server"] = Server(
                [args.llama_server_python, "-m", "llama_cpp.server", "--model", args.gguf,
                 "--embedding", "true", "--n_ctx", "512", "--n_threads", str(args.threads),
                 "--n_threads_batch", str(args.threads), "--verbose", "false"],
                "llama-server", args.client)
        if "http-floor" in systems:
            running["http-floor"] = Server(
                [sys.executable, str(Path(__file__).resolve()), "--serve-floor", "--gguf",
                 args.gguf, "--threads", str(args.threads), "--bare-ctx", str(args.bare_ctx)],
                "http-floor", args.client)
        if "st" in systems:
            running["st"] = Worker(args.st_python, "st", args)
        if "bare" in systems:
            running["bare"] = Worker(sys.executable, "bare", args)
        print(f"# started in {time.monotonic() - started:.1f} s", flush=True)

        # correctness, once: one input's vector from each
        probe = pool[0]
        vectors = {}
        for name, system in running.items():
            if isinstance(system, Server):
                vectors[name] = system.embed([probe])["data"][0]["embedding"]
            else:
                vectors[name] = system.vector(probe)
        if "podium" in vectors:
            norm = math.sqrt(sum(x * x for x in vectors["podium"]))
            print(json.dumps({"check": "podium vector", "dims": len(vectors["podium"]),
                              "norm": round(norm, 6)}))
            for name, v in vectors.items():
                if name != "podium":
                    c = cosine(vectors["podium"], v)
                    print(json.dumps({"check": f"cosine podium / {name}", "cosine": round(c, 7),
                                      **({"target": "> 0.9999", "met": c > 0.9999}
                                         if name == "bare" else {})}), flush=True)

        cells: dict[tuple[str, int], list[float]] = {}
        tokens = {}
        pids = [s.pid for s in running.values()]
        cpu0, ours0, t0 = _machine_cpu(), _ours(pids), time.monotonic()
        for rnd in range(args.rounds):
            for batch in batches:
                for name in systems:
                    system = running[name]
                    if isinstance(system, Server):
                        row = system.measure(pool, batch, args.seconds)
                    else:
                        row = system.measure(batch, args.seconds)
                    rate = row["inputs"] / row["seconds"]
                    cells.setdefault((name, batch), []).append(rate)
                    if name == "podium" and row.get("tokens"):
                        tokens[batch] = row["tokens"] / row["inputs"]
                    print(json.dumps({"round": rnd, "system": name, "batch": batch,
                                      "inputs_per_s": round(rate, 1), "calls": row["calls"],
                                      "seconds": round(row["seconds"], 2)}), flush=True)
        wall = time.monotonic() - t0
        others = max(0.0, (_machine_cpu() - cpu0) - (_ours(pids) - ours0))
    finally:
        for system in running.values():
            system.stop()

    print(f"\n# medians over {args.rounds} rounds, inputs/s (CPU over the {wall:.0f} s run: "
          f"other work on the machine {others:.1f} s, {others / wall:.2f} of "
          f"{os.cpu_count()} cores)")
    header = ["batch", *systems]
    ratios = [f"podium/{s}" for s in systems if s != "podium" and "podium" in systems]
    print("| " + " | ".join(header + ratios + ["tokens/input"]) + " |")
    print("|" + "---|" * (len(header) + len(ratios) + 1))
    medians = {key: statistics.median(v) for key, v in cells.items()}
    verdicts = []
    for batch in batches:
        row = [str(batch)] + [f"{medians[(s, batch)]:.1f}" for s in systems]
        for s in systems:
            if s != "podium" and "podium" in systems:
                row.append(f"{medians[('podium', batch)] / medians[(s, batch)]:.3f}")
        row.append(f"{tokens.get(batch, float('nan')):.1f}")
        print("| " + " | ".join(row) + " |")
        if "podium" not in systems:
            continue
        p = medians[("podium", batch)]
        if batch == 1 and "bare" in systems:
            b = medians[("bare", batch)]
            verdicts.append(f"batch 1: podium {p:.1f} >= bare / 1.1 = {b / 1.1:.1f}: "
                            f"{'met' if p >= b / 1.1 else 'MISSED'}")
            if "http-floor" in systems:
                f = medians[("http-floor", batch)]
                verdicts.append(f"batch 1, for scale: http-floor / bare = {f / b:.3f} (HTTP "
                                f"alone), podium / http-floor = {p / f:.3f}")
        if batch in (32, 256):
            for s in ("llama-server", "st"):
                if s in systems:
                    o = medians[(s, batch)]
                    verdicts.append(f"batch {batch}: podium {p:.1f} > {s} {o:.1f}: "
                                    f"{'met' if p > o else 'MISSED'}")
    for v in verdicts:
        print("# target " + v)


if __name__ == "__main__":
    sys.exit(main())
