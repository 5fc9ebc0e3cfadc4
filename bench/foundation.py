"""Foundation benchmark: prints, in one run,

(a) decode tokens/s of Podium's streaming chat on the default model, next to a raw
    llama-cpp-python decode loop on the same prompt and thread count (target >= 95%);
(b) front-end CPU microseconds per streamed token with the scripted instant engine at
    1, 64 and 256 concurrent streams (target <= 20 us).

    .venv/bin/python bench/foundation.py [--tokens 256] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
MODEL = "qwen2.5-coder-0.5b-instruct"
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
NO_END = {"151645": -100, "151643": -100}     # keep both sides generating to the limit
CLK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK      # utime + stime


def start(cmd: list[str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"server did not start: {cmd}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


# -- (a) the real model --------------------------------------------------------------------

def raw_decode_rate(tokens: int, threads: int) -> float:
    """The floor: llama-cpp-python's Llama.eval one token at a time, greedy argmax in numpy."""
    import llama_cpp
    import numpy as np

    from podium.engine.llamacpp.model_files import default_model_path
    from podium.text.template import ChatTemplate

    llm = llama_cpp.Llama(str(default_model_path()), n_ctx=4096, n_threads=threads,
                          n_threads_batch=threads, n_batch=512, verbose=False)
    template = ChatTemplate(llm.metadata["tokenizer.chat_template"])
    prompt = llm.tokenize(template.render(PROMPT).encode(), add_bos=False, special=True)
    banned = [int(k) for k in NO_END]
    llm.eval(prompt)
    stamps = []
    for _ in range(tokens):
        logits = llm.scores[llm.n_tokens - 1]
        logits[banned] = -np.inf
        llm.eval([int(np.argmax(logits))])
        stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def podium_decode_rate(tokens: int, threads: int) -> float:
    port = free_port()
    proc = start([sys.executable, "-m", "podium", "serve", "--port", str(port), "--threads",
                  str(threads), "--ctx-size", "4096", "--log-level", "warning"], port)
    try:
        body = {"model": MODEL, "messages": PROMPT, "max_tokens": tokens, "temperature": 0,
                "stream": True, "logit_bias": NO_END}
        stamps = []
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                          timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content":"' in line and '"role"' not in line:
                    stamps.append(time.perf_counter())
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])
    finally:
        stop(proc)


# -- (b) the front-end on the scripted engine ----------------------------------------------

async def one_stream(client: httpx.AsyncClient, url: str) -> int:
    body = {"model": "scripted", "messages": [{"role": "user", "content": "go"}],
            "stream": True}
    chunks = 0
    async with client.stream("POST", url, json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunks += 1
    return chunks - 2            # minus the role chunk and the finish chunk


async def drive(port: int, streams: int) -> int:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    limits = httpx.Limits(max_connections=streams + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        counts = await asyncio.gather(*(one_stream(client, url) for _ in range(streams)))
    return sum(counts)


def frontend_cost(streams: int, reply_tokens: int, repeats: int) -> tuple[list[float], int]:
    """Server CPU (user + system) per streamed token, once per repeat, on one server."""
    port = free_port()
    proc = start([sys.executable, str(ROOT / "bench" / "scripted_server.py"), "--port",
                  str(port), "--tokens", str(reply_tokens)], port)
    try:
        asyncio.run(drive(port, 1))                     # warm up
        figures = []
        for _ in range(repeats):
            before = cpu_seconds(proc.pid)
            tokens = asyncio.run(drive(port, streams))
            figures.append((cpu_seconds(proc.pid) - before) * 1e6 / tokens)
        return figures, tokens
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256, help="tokens per real-model stream")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--skip-model", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"# Podium foundation benchmark ({os.cpu_count()} cores, threads={args.threads})")
    if not args.skip_model:
        raw = raw_decode_rate(args.tokens, args.threads)
        ours = podium_decode_rate(args.tokens, args.threads)
        print(f"(a) decode tokens/s, {args.tokens} tokens, greedy: raw llama-cpp-python "
              f"{raw:.1f} | Podium streaming chat {ours:.1f} | ratio {ours / raw:.3f}")
    for streams, reply in ((1, 50_000), (64, 2000), (256, 1000)):
        figures, tokens = frontend_cost(streams, reply, args.repeats)
        print(f"(b) front-end CPU per streamed token, {streams:>3} streams ({tokens} tokens, "
              f"{args.repeats} runs): median {statistics.median(figures):.1f} us "
              f"(min {min(figures):.1f}, max {max(figures):.1f})")


if __name__ == "__main__":
    main()
