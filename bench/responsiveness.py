"""How long /health waits while the server prepares a maximal prompt.

    .venv/bin/python bench/responsiveness.py [--mb 7] [--runs 3]

Starts bench/scripted_server.py (the server class `podium serve` uses, on the scripted
engine with the default model's real tokenizer), posts a chat request whose one message is
--mb megabytes of text (rendered and tokenized: seconds of work), and meanwhile asks
/health every 20 ms. Prints, per run, how long the big request took and the slowest and
median /health answers. Target: the slowest under 100 ms.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(url: str, text: str) -> tuple[float, list[float]]:
    """The big request's time (it ends with 400 when its tokens overflow the scripted
    engine's 1M-token context: rendered and tokenized all the same) and /health's waits."""
    done = threading.Event()

    def ask() -> None:
        try:
            httpx.post(url + "/v1/chat/completions", timeout=300, json={
                "model": "scripted", "max_tokens": 1,
                "messages": [{"role": "user", "content": text}]})
        finally:
            done.set()

    asker = threading.Thread(target=ask)
    started = time.monotonic()
    asker.start()
    waits = []
    with httpx.Client(base_url=url) as client:
        while not done.is_set():
            t = time.monotonic()
            client.get("/health", timeout=60).raise_for_status()
            waits.append(time.monotonic() - t)
            time.sleep(0.02)
    asker.join()
    return time.monotonic() - started, waits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=7.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    here = Path(__file__).parent
    server = subprocess.Popen([sys.executable, str(here / "scripted_server.py"), "--port",
                               str(port), "--tokens", "4"], env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        text = "lorem ipsum dolor sit amet " * int(args.mb * 1e6 / 27)
        for run in range(1, args.runs + 1):
            took, waits = one_run(url, text)
            print(f"run {run}: {args.mb:g} MB prompt prepared in {took:.2f} s; /health "
                  f"answered {len(waits)} times meanwhile, slowest {max(waits) * 1000:.1f} ms, "
                  f"median {statistics.median(waits) * 1000:.1f} ms")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
