"""Decode speed when the CPU is shared: the cases side by side, for each way threads can wait.

llama.cpp's worker threads wait for each other between the pieces of a decode; in the build
``./dev`` makes they wait as OpenMP says (``OMP_WAIT_POLICY``: spin, sleep, or spin
``GOMP_SPINCOUNT`` times then sleep; podium/engine/llamacpp/threads.py). A spinning thread
whose partner was descheduled burns its time slice, so when anything else wants the cores a
decode can slow far more than in proportion. Each case below is a streamed chat request of
--tokens tokens (temperature 0, the end of turn never drawn) on ``podium serve`` with the
default model; the figure is the decode rate, tokens after the first over the time after
the first:

- alone: one server, one stream, nothing else running;
- two servers: two servers, one stream each, started together (each's rate, and the
  aggregate over alone);
- beside a hog: one server, one stream, beside ``python -c "while True: pass"`` (one thread);
- with embeddings: one server serving the chat model and all-MiniLM-L6-v2 (two engines in
  one process), one stream while another client sends embedding batches of 32 inputs back
  to back.

Each wait (--waits, comma-separated names of WAITS: ``default`` is Podium's own,
``--thread-wait``'s default; the others set OpenMP's variables, which win over it) runs
every case with its environment given to the servers; the ratio is to that wait's alone.
--rounds R repeats the whole set (medians). The servers are started once per wait and case,
their data in a throwaway directory.

    .venv/bin/python bench/contention.py [--tokens 150] [--rounds 1]
        [--waits openmp,default,passive] [--cases alone,...] [--server-arg=--threads=2 ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batches import Server  # noqa: E402  (bench/ is a folder of scripts, not a package)

# how threads wait: the environment a server is started with
WAITS: dict[str, dict[str, str]] = {
    "default": {},                                  # Podium's --thread-wait default
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
    "openmp": {"GOMP_SPINCOUNT": "300000"},         # OpenMP's default (Podium's before)
    "spin-short": {"GOMP_SPINCOUNT": "10000"},
    "spin-1k": {"GOMP_SPINCOUNT": "1000"},
    "spin-500": {"GOMP_SPINCOUNT": "500"},
    "spin-300": {"GOMP_SPINCOUNT": "300"},
    "spin-100": {"GOMP_SPINCOUNT": "100"},
}
PROMPT = "Count from 1 to 500, one number a line."
# the default model's end of turn and end of text, never drawn: every stream is --tokens long
NO_END = {"151645": -100, "151643": -100}
EMBED_MODEL = "all-minilm-l6-v2"


@contextlib.contextmanager
def server(env: dict[str, str], extra: list[str]) -> Iterator[Server]:
    """A server started with ``env`` added to this process's environment."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        srv = Server(extra)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        yield srv
    finally:
        srv.stop()


def stream_rate(srv: Server, model: str, tokens: int) -> float:
    """Decode tokens/s of one streamed request: chunks after the first over the time after
    the first."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens, "temperature": 0, "logit_bias": NO_END, "stream": True}
    first = None
    n = 0
    with srv.client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                n += 1
                if first is None:
                    first = time.perf_counter()
    if first is None or n < 2:
        raise SystemExit(f"the stream gave {n} chunks")
    return (n - 1) / (time.perf_counter() - first)


def together(calls: list[Any]) -> list[float]:
    """The calls run at once, on threads released together; their results in order."""
    results: list[Any] = [None] * len(calls)
    gate = threading.Barrier(len(calls))

    def run(i: int) -> None:
        gate.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def case_alone(env: dict[str, str], extra: list[str], tokens: int) -> list[float]:
    with server(env, extra) as srv:
        stream_rate(srv, srv.model, 8)                      # warm
        return [stream_rate(srv, srv.model, tokens)]


def case_two(env: dict[str, str], extra: list[str], tokens: int) -> list[float]:
    with server(env, extra) as a, server(env, extra) as b:
        stream_rate(a, a.model, 8)
        stream_rate(b, b.model, 8)
        return together([lambda: stream_rate(a, a.model, tokens),
                         lambda: stream_rate(b, b.model, tokens)])


def case_hog(env: dict[str, str], extra: list[str], tokens: int) -> list[float]:
    with server(env, extra) as srv:
        stream_rate(srv, srv.model, 8)
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.5)
            return [stream_rate(srv, srv.model, tokens)]
        finally:
            hog.kill()
            hog.wait()


def case_embeddings(env: dict[str, str], extra: list[str], tokens: int) -> list[float]:
    chat = "qwen2.5-coder-0.5b-instruct"
    with server(env, ["--model", chat, "--model", f"minilm={EMBED_MODEL}",
                      "--preload", "all", *extra]) as srv:
        stream_rate(srv, chat, 8)
        stop = threading.Event()
        texts = [f"sentence number {i} about the weather and the sea" for i in range(32)]

        def embed_loop() -> None:
            while not stop.is_set():
                srv.client.post("/v1/embeddings", json={"model": "minilm", "input": texts})

        loader = threading.Thread(target=embed_loop)
        loader.start()
        try:
            time.sleep(0.5)
            return [stream_rate(srv, chat, tokens)]
        finally:
            stop.set()
            loader.join()


CASES = {"alone": case_alone, "two servers": case_two, "beside a hog": case_hog,
         "with embeddings": case_embeddings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--waits", default="openmp,default,passive")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--server-arg", action="append", default=[],
                        help="an extra `podium serve` argument (repeat)")
    args = parser.parse_args()
    waits = args.waits.split(",")
    cases = args.cases.split(",")
    extra = [a for arg in args.server_arg for a in shlex.split(arg)]
    rates: dict[tuple[str, str], list[list[float]]] = {}
    for _ in range(args.rounds):
        for wait in waits:                                 # interleaved: wait by wait
            for name in cases:
                got = CASES[name](WAITS[wait], extra, args.tokens)
                rates.setdefault((wait, name), []).append(got)
                print(f"  {wait:10} {name:16} " + " / ".join(f"{r:.1f}" for r in got),
                      flush=True)
    print(f"\n| wait | case | tok/s (each) | aggregate / alone |")
    print("|---|---|---|---|")
    for wait in waits:
        alone = statistics.median(sum(r) for r in rates.get((wait, "alone"), [[0.0]]))
        for name in cases:
            runs = rates[(wait, name)]
            each = [statistics.median(run[i] for run in runs) for i in range(len(runs[0]))]
            ratio = sum(each) / alone if alone else float("nan")
            print(f"| {wait} ({' '.join(f'{k}={v}' for k, v in WAITS[wait].items()) or 'as built'})"
                  f" | {name} | {' / '.join(f'{r:.1f}' for r in each)} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
