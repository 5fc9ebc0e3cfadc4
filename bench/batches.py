"""Batch API benchmark: a chat batch's throughput against the same requests sent by concurrent
clients, and an interactive client's time to first token while a batch runs.

One ``podium serve`` on the default model (``--ctx-size 2048``, its other settings the
defaults: --max-num-seqs 4, --batch-max-in-flight 0, i.e. 4 batch requests in flight), its
store in a throwaway data directory. The workload: --requests (500) chat requests, short
distinct prompts ("Write one sentence about the number i."), --max-tokens (32), temperature 0;
the same bodies in both modes:

- clients: --clients (4) threads send them, non-streaming; requests/s = N / wall time.
- batch: the N lines uploaded as a .jsonl (purpose ``batch``), ``POST /v1/batches``, polled
  every 0.2 s until ``completed``; requests/s = N / (the create call to the poll that sees
  it completed), client side (the upload not counted). Also printed: the server's
  ``completed_at - in_progress_at`` (whole seconds), and a check that the output file holds
  N lines answered 200 and there is no error file.

--rounds R interleaves them (clients, batch, clients, batch, ...); medians are reported (a
noisy 2-core machine). Target: batch / clients >= 0.95.

Time to first token (skipped with --skip-ttft): --ttft-probes K (10) streamed chat requests
(max_tokens 8) one after another on the idle server, time to the first content chunk each;
then a batch of --ttft-batch-requests (default --requests) is created and, once it is
in_progress and has answered a request (so its requests are running), the same K probes are
sent again; the batch is cancelled afterwards. Target: median under the batch <= 1.5x idle.
A batch that ended before the last probe is reported (the probes then measured less load).

    .venv/bin/python bench/batches.py [--requests 500] [--max-tokens 32] [--clients 4]
        [--rounds 1] [--ttft-probes 10] [--ttft-batch-requests N] [--skip-ttft]
        [--server-arg=--threads=2 ...]

Time on this 2-core machine, quiet: about 0.6 s a request in either mode (answers of ~11
tokens), so a round of 500 requests takes ~10 minutes (5 per mode), the probes ~1 more; the
smoke run ``--requests 40 --max-tokens 16 --ttft-probes 5`` about 70 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
POLL_SECONDS = 0.2
Obj = dict[str, Any]


# -- the server -------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``podium serve`` on the default model, its data in a temporary directory, its log
    kept there (its tail printed if it dies)."""

    def __init__(self, extra: list[str], timeout: float = 600):
        self.dir = tempfile.TemporaryDirectory(prefix="podium-bench-batches-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "podium", "serve", "--port", str(self.port),
                    "--ctx-size", "2048", "--log-level", "warning", *extra]
        self.log = Path(self.dir.name) / "server.log"
        env = dict(os.environ, PODIUM_DATA_DIR=self.dir.name)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.client = httpx.Client(base_url=self.url, timeout=600,
                                   limits=httpx.Limits(max_connections=64))
        self.model = self._wait(timeout)

    def _wait(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            try:
                if self.client.get("/health", timeout=2).status_code == 200:
                    return self.client.get("/v1/models").json()["data"][0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the server did not answer in {timeout} s")
            time.sleep(0.3)

    def check(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"the server exited with {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.dir.cleanup()


# -- the workload -----------------------------------------------------------------------------

def chat_body(model: str, prompt: str, max_tokens: int, stream: bool = False) -> Obj:
    body: Obj = {"model": model, "messages": [{"role": "user", "content": prompt}],
                 "max_tokens": max_tokens, "temperature": 0}
    if stream:
        body["stream"] = True
    return body


def bodies(model: str, n: int, max_tokens: int) -> list[Obj]:
    return [chat_body(model, f"Write one sentence about the number {i}.", max_tokens)
            for i in range(n)]


def probe_prompts(k: int) -> list[str]:
    return [f"Name a colour and a fruit (probe {i})." for i in range(k)]


# -- mode clients -----------------------------------------------------------------------------

def run_clients(server: Server, work: list[Obj], clients: int) -> Obj:
    """The requests sent by ``clients`` threads, each taking the next one when its last is
    answered."""
    def send(body: Obj) -> int:
        r = server.client.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            raise SystemExit(f"clients: HTTP {r.status_code}: {r.text[:300]}")
        return r.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(send, work))
    wall = time.perf_counter() - start
    return {"mode": "clients", "requests": len(work), "clients": clients,
            "seconds": round(wall, 2), "rps": round(len(work) / wall, 3),
            "completion_tokens": tokens, "tok_s": round(tokens / wall, 1)}


# -- mode batch -------------------------------------------------------------------------------

def upload(server: Server, work: list[Obj]) -> str:
    lines = "".join(json.dumps({"custom_id": f"req-{i}", "method": "POST",
                                "url": "/v1/chat/completions", "body": body}) + "\n"
                    for i, body in enumerate(work))
    r = server.client.post("/v1/files", data={"purpose": "batch"},
                           files={"file": ("bench.jsonl", lines.encode(),
                                           "application/jsonl")})
    r.raise_for_status()
    return r.json()["id"]


def create_batch(server: Server, file_id: str) -> Obj:
    r = server.client.post("/v1/batches", json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions",
        "completion_window": "24h"})
    r.raise_for_status()
    return r.json()


def retrieve(server: Server, batch_id: str) -> Obj:
    r = server.client.get(f"/v1/batches/{batch_id}")
    r.raise_for_status()
    return r.json()


def check_output(server: Server, batch: Obj, n: int) -> int:
    """The output file's completion tokens; exits unless it holds n lines answered 200 and
    there is no error file."""
    if batch["error_file_id"] is not None or batch["output_file_id"] is None:
        raise SystemExit(f"batch {batch['id']}: error file {batch['error_file_id']}, output "
                         f"file {batch['output_file_id']}, counts {batch['request_counts']}")
    r = server.client.get(f"/v1/files/{batch['output_file_id']}/content")
    r.raise_for_status()
    lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
    ok = [line for line in lines if line["response"]["status_code"] == 200]
    if len(lines) != n or len(ok) != n:
        raise SystemExit(f"batch {batch['id']}: {len(lines)} output lines, {len(ok)} "
                         f"answered 200, {n} expected")
    return sum(line["response"]["body"]["usage"]["completion_tokens"] for line in ok)


def run_batch(server: Server, work: list[Obj]) -> Obj:
    """The requests as one batch, timed from the create call to the poll that sees it
    completed."""
    t_up = time.perf_counter()
    file_id = upload(server, work)
    start = time.perf_counter()
    batch = create_batch(server, file_id)
    seen_running = None
    while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(POLL_SECONDS)
        server.check()
        batch = retrieve(server, batch["id"])
        if seen_running is None and batch["status"] != "validating":
            seen_running = time.perf_counter() - start
    wall = time.perf_counter() - start
    if batch["status"] != "completed":
        raise SystemExit(f"batch {batch['id']} ended {batch['status']}: {batch['errors']}")
    tokens = check_output(server, batch, len(work))
    return {"mode": "batch", "requests": len(work), "upload_s": round(start - t_up, 3),
            "seconds": round(wall, 2), "rps": round(len(work) / wall, 3),
            "validated_s": None if seen_running is None else round(seen_running, 2),
            "server_run_s": batch["completed_at"] - batch["in_progress_at"],
            "completion_tokens": tokens, "tok_s": round(tokens / wall, 1)}


# -- time to first token ----------------------------------------------------------------------

def ttft(server: Server, body: Obj) -> float:
    """Seconds from sending a streamed request to its first chunk with content (the stream
    then read to its end)."""
    first = None
    start = time.perf_counter()
    with server.client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"probe: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                    first = time.perf_counter() - start
    if first is None:
        raise SystemExit("probe: a stream with no content")
    return first


def probes(server: Server, k: int) -> list[float]:
    return [ttft(server, chat_body(server.model, p, 8, stream=True)) for p in probe_prompts(k)]


def probes_under_batch(server: Server, work: list[Obj], k: int) -> tuple[list[float], Obj]:
    """The probes sent while a batch of ``work`` runs: after it is in_progress with a request
    answered; the batch cancelled afterwards."""
    batch = create_batch(server, upload(server, work))
    deadline = time.monotonic() + 300
    while not (batch["status"] == "in_progress" and batch["request_counts"]["completed"] >= 1):
        if batch["status"] not in ("validating", "in_progress") or time.monotonic() > deadline:
            raise SystemExit(f"the load batch did not start running: {batch['status']}")
        time.sleep(POLL_SECONDS)
        server.check()
        batch = retrieve(server, batch["id"])
    before = batch["request_counts"]["completed"]
    times = probes(server, k)
    batch = retrieve(server, batch["id"])
    state = {"batch_status_after_probes": batch["status"],
             "batch_answered_during_probes": batch["request_counts"]["completed"] - before,
             "batch_requests": len(work)}
    if batch["status"] == "in_progress":
        server.client.post(f"/v1/batches/{batch['id']}/cancel").raise_for_status()
        while batch["status"] not in ("cancelled", "completed", "failed", "expired"):
            time.sleep(POLL_SECONDS)
            server.check()
            batch = retrieve(server, batch["id"])
    return times, state


# -- figures ----------------------------------------------------------------------------------

def p90(xs: list[float]) -> float:
    """The nearest-rank 90th percentile."""
    s = sorted(xs)
    return s[max(0, -(-9 * len(s) // 10) - 1)]


def ms(xs: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(xs) * 1000, 1),
            "p90_ms": round(p90(xs) * 1000, 1)}


def emit(row: Obj) -> None:
    print(json.dumps(row), flush=True)


def throughput(server: Server, args: argparse.Namespace) -> Obj:
    work = bodies(server.model, args.requests, args.max_tokens)
    runs: dict[str, list[Obj]] = {"clients": [], "batch": []}
    for r in range(args.rounds):
        for mode in ("clients", "batch"):
            row = (run_clients(server, work, args.clients) if mode == "clients"
                   else run_batch(server, work))
            runs[mode].append(row)
            emit({"round": r + 1, **row})
    clients = statistics.median(x["rps"] for x in runs["clients"])
    batch = statistics.median(x["rps"] for x in runs["batch"])
    ratios = [b["rps"] / c["rps"] for c, b in zip(runs["clients"], runs["batch"])]
    return {"clients_rps": clients, "batch_rps": batch, "ratio": batch / clients,
            "ratio_per_round": [round(x, 3) for x in ratios],
            "server_run_s": [x["server_run_s"] for x in runs["batch"]],
            "clients_s": [x["seconds"] for x in runs["clients"]],
            "batch_s": [x["seconds"] for x in runs["batch"]],
            "tokens": (runs["clients"][0]["completion_tokens"],
                       runs["batch"][0]["completion_tokens"])}


def latency(server: Server, args: argparse.Namespace) -> Obj:
    idle = probes(server, args.ttft_probes)
    emit({"ttft": "idle", **ms(idle), "runs_ms": [round(x * 1000, 1) for x in idle]})
    n = args.ttft_batch_requests or args.requests
    loaded, state = probes_under_batch(server, bodies(server.model, n, args.max_tokens),
                                       args.ttft_probes)
    emit({"ttft": "under_batch", **ms(loaded), "runs_ms": [round(x * 1000, 1) for x in loaded],
          **state})
    return {"idle": ms(idle), "loaded": ms(loaded), "state": state,
            "ratio": statistics.median(loaded) / statistics.median(idle)}


def summary(args: argparse.Namespace, server: Server, tp: Obj | None, lat: Obj | None,
            elapsed: float) -> None:
    print("\n== summary ==")
    print("command: " + shlex.join([sys.executable, *sys.argv]))
    print("server:  " + shlex.join(server.cmd[1:]) + f"  (model {server.model}, "
          f"{os.cpu_count()} cores)")
    if tp is not None:
        print(f"throughput ({args.requests} requests, max_tokens {args.max_tokens}, "
              f"{args.rounds} round(s), medians):")
        print(f"  {args.clients} clients   {tp['clients_rps']:8.3f} req/s   "
              f"runs {tp['clients_s']} s")
        print(f"  batch       {tp['batch_rps']:8.3f} req/s   runs {tp['batch_s']} s "
              f"(server in_progress -> completed {tp['server_run_s']} s)")
        print(f"  completion tokens, first round: clients {tp['tokens'][0]}, "
              f"batch {tp['tokens'][1]}")
        verdict = "met" if tp["ratio"] >= 0.95 else "NOT met"
        print(f"  batch / clients = {tp['ratio']:.3f}  per round {tp['ratio_per_round']}  "
              f"(target >= 0.95: {verdict})")
    if lat is not None:
        print(f"time to first token ({args.ttft_probes} probes, max_tokens 8):")
        print(f"  idle          median {lat['idle']['median_ms']:7.1f} ms  "
              f"p90 {lat['idle']['p90_ms']:7.1f} ms")
        print(f"  under batch   median {lat['loaded']['median_ms']:7.1f} ms  "
              f"p90 {lat['loaded']['p90_ms']:7.1f} ms  "
              f"({lat['state']['batch_answered_during_probes']} batch requests answered "
              f"meanwhile, batch {lat['state']['batch_status_after_probes']} after the probes)")
        verdict = "met" if lat["ratio"] <= 1.5 else "NOT met"
        print(f"  under batch / idle = {lat['ratio']:.2f}  (target <= 1.5: {verdict})")
        if lat["state"]["batch_status_after_probes"] != "in_progress":
            print("  WARNING: the batch ended before the last probe; raise "
                  "--ttft-batch-requests")
    print(f"elapsed {elapsed:.0f} s; load average (1 min) at start {args.load_start}, "
          f"at end {os.getloadavg()[0]:.2f} (another busy process skews every figure)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=500, help="chat requests per run")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--clients", type=int, default=4,
                    help="concurrent clients (the server's --max-num-seqs is 4)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="interleaved clients/batch rounds (medians reported)")
    ap.add_argument("--ttft-probes", type=int, default=10)
    ap.add_argument("--ttft-batch-requests", type=int, default=0,
                    help="requests of the batch the probes run under (0: --requests)")
    ap.add_argument("--skip-ttft", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="an extra `podium serve` argument (repeat), e.g. --server-arg=--threads=2")
    args = ap.parse_args()

    started = time.perf_counter()
    args.load_start = f"{os.getloadavg()[0]:.2f}"
    server = Server(args.server_arg)
    try:
        warm = bodies(server.model, 4, args.max_tokens)
        run_clients(server, warm, args.clients)            # the model loaded, caches warm
        tp = None if args.skip_throughput else throughput(server, args)
        lat = None if args.skip_ttft else latency(server, args)
        summary(args, server, tp, lat, time.perf_counter() - started)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
