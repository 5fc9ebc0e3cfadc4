"""Claude Code's first request on this machine: how long until the first token, and what a
retry after an abandoned stream costs.

    .venv/bin/python bench/messages_prefill.py [--request tests/data/claude_code/main_request.json]

Starts ``podium serve`` on the default model (default settings, ``--model-alias claude-*``),
sends the captured request (streamed, ``POST /v1/messages?beta=true``) and prints:

1. cold: seconds to ``message_start`` and to the first content delta, prompt tokens;
2. the same request again (its billing header's ``cch=`` changed, as Claude Code does):
   seconds to the first delta and ``cache_read_input_tokens``;
3. on a fresh server: the request abandoned halfway through its prefill (the client drops
   the stream), then sent again at once: seconds to the retry's first delta and its
   ``cache_read_input_tokens`` (what the abandoned one had prefilled, kept).

Claude Code drops a stream that has shown no content for 300 s, so (1) must stay under it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
MODEL = "qwen2.5-coder-0.5b-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*extra: str) -> tuple[subprocess.Popen, str]:
    """``podium serve`` on the default model (``extra``: more of its flags), healthy."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "podium", "serve", "--port", str(port),
                             "--model-alias", f"claude-*={MODEL}", "--log-level", "warning",
                             *extra],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def with_cch(body: dict, value: str) -> dict:
    body = json.loads(json.dumps(body))
    system = body.get("system")
    if isinstance(system, list) and system and "cch=" in system[0].get("text", ""):
        head, _, rest = system[0]["text"].partition("cch=")
        system[0]["text"] = head + "cch=" + value + ";" + rest.partition(";")[2]
    return body


def stream(url: str, body: dict, give_up_after: float | None = None) -> dict:
    """Send ``body`` streamed; the times of message_start and of the first content delta,
    and the final usage (or, given ``give_up_after``, drop the stream then)."""
    sent = time.monotonic()
    out: dict = {"start": None, "first_delta": None, "usage": None}
    timeout = httpx.Timeout(900, read=give_up_after or 900)
    try:
        with httpx.stream("POST", f"{url}/v1/messages?beta=true", json={**body, "stream": True},
                          headers={"x-api-key": "unused", "anthropic-version": "2023-06-01"},
                          timeout=timeout) as r:
            for line in r.iter_lines():
                if give_up_after is not None and time.monotonic() - sent > give_up_after:
                    break
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                now = time.monotonic() - sent
                if event["type"] == "message_start" and out["start"] is None:
                    out["start"] = now
                elif event["type"] == "content_block_delta" and out["first_delta"] is None:
                    out["first_delta"] = now
                elif event["type"] == "message_delta":
                    out["usage"] = event["usage"]
    except httpx.ReadTimeout:
        pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--request", default=str(ROOT / "tests/data/claude_code/main_request.json"))
    ap.add_argument("--max-tokens", type=int, default=8, help="output tokens per request")
    args = ap.parse_args()
    body = json.loads(Path(args.request).read_text())
    body["max_tokens"] = args.max_tokens
    print(f"# request: {len(json.dumps(body)):,} characters, {len(body.get('tools') or [])} "
          f"tools; {os.cpu_count()} cores")
    proc, url = start()
    try:
        count = httpx.post(f"{url}/v1/messages/count_tokens", json=body, timeout=120).json()
        print(f"prompt tokens (count_tokens): {count['input_tokens']:,}")
        cold = stream(url, with_cch(body, "10001"))
        print(f"1 cold: message_start {cold['start']:.2f} s, first delta "
              f"{cold['first_delta']:.1f} s, usage {cold['usage']}")
        warm = stream(url, with_cch(body, "10002"))
        print(f"2 again (new cch): first delta {warm['first_delta']:.2f} s, "
              f"cache_read_input_tokens {warm['usage']['cache_read_input_tokens']:,}")
        half = cold["first_delta"] / 2
    finally:
        stop(proc)
    proc, url = start()
    try:
        stream(url, with_cch(body, "10003"), give_up_after=half)
        retry = stream(url, with_cch(body, "10004"))
        print(f"3 abandoned after {half:.1f} s, retried: first delta "
              f"{retry['first_delta']:.1f} s, cache_read_input_tokens "
              f"{retry['usage']['cache_read_input_tokens']:,}")
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
