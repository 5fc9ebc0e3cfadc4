"""The prompt cache on Claude Code's first request (issue 43): time to the first delta cold,
after the model was unloaded, and after the server restarted, on the same cache folder.

    .venv/bin/python bench/prompt_cache.py [--request tests/data/claude_code/main_request.json]

Starts ``podium serve`` on the default model (default settings, ``--model-alias claude-*``,
a fresh ``--prompt-cache-dir``), sends the captured request (streamed, as Claude Code does)
and prints the seconds to the first content delta and ``cache_read_input_tokens``:

1. cold (nothing cached anywhere);
2. after ``POST /v1/models/{model}/unload`` (what an idle keep-alive, an eviction by another
   model or Ollama's ``keep_alive: 0`` does): the next request loads the model and restores;
3. after the server is stopped and started again on the same folder.

Then the cache's own figures: bytes a cached token costs, and reading the entry with the
page cache dropped against this disk's sequential read (a file just written, dropped from
the page cache, read once): what a restore after a reboot can hope for here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from messages_prefill import MODEL, ROOT, stop, stream, with_cch  # noqa: E402
from messages_prefill import start as serve  # noqa: E402


def start(cache: Path) -> tuple[subprocess.Popen, str]:
    return serve("--prompt-cache-dir", str(cache))


def disk_read_speed(folder: Path, size: int = 256 << 20) -> float:
    """MB/s reading a file of ``size`` bytes written and flushed out of the page cache."""
    path = folder / "read-speed.bin"
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20) * (size >> 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    seconds = time.perf_counter() - start
    path.unlink()
    return size / seconds / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--request", default=str(ROOT / "tests/data/claude_code/main_request.json"))
    ap.add_argument("--max-tokens", type=int, default=8)
    args = ap.parse_args()
    body = json.loads(Path(args.request).read_text())
    body["max_tokens"] = args.max_tokens
    cache = Path(tempfile.mkdtemp(prefix="podium-prompt-cache-"))
    print(f"# Claude Code's first request; {os.cpu_count()} cores; load average "
          f"{os.getloadavg()}")
    proc, url = start(cache)
    try:
        cold = stream(url, with_cch(body, "20001"))
        print(f"1 cold: first delta {cold['first_delta']:.1f} s, usage {cold['usage']}")
        httpx.post(f"{url}/v1/models/{MODEL}/unload", timeout=120)
        unloaded = stream(url, with_cch(body, "20002"))
        print(f"2 after an unload: first delta {unloaded['first_delta']:.2f} s "
              f"({unloaded['first_delta'] / cold['first_delta']:.3f} of cold), "
              f"cache_read_input_tokens {unloaded['usage']['cache_read_input_tokens']:,}")
        figures = httpx.get(f"{url}/health").json()["models"][MODEL].get("prompt_cache", {})
    finally:
        stop(proc)
    proc, url = start(cache)
    try:
        restarted = stream(url, with_cch(body, "20003"))
        print(f"3 after a restart: first delta {restarted['first_delta']:.2f} s "
              f"({restarted['first_delta'] / cold['first_delta']:.3f} of cold), "
              f"cache_read_input_tokens {restarted['usage']['cache_read_input_tokens']:,}")
    finally:
        stop(proc)
    entries = sorted(cache.rglob("*.kv"), key=lambda p: p.stat().st_size)
    if entries:
        biggest = entries[-1]
        tokens = restarted["usage"]["cache_read_input_tokens"] or 1
        print(f"cache: {len(entries)} entries, {figures}; largest {biggest.stat().st_size:,} "
              f"bytes, about {biggest.stat().st_size / tokens:,.0f} bytes a cached token")
        with open(biggest, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        start_read = time.perf_counter()
        size = len(biggest.read_bytes())
        read = size / (time.perf_counter() - start_read) / 1e6
        print(f"reading the entry cold: {read:,.0f} MB/s; this disk's sequential read: "
              f"{disk_read_speed(cache):,.0f} MB/s")


if __name__ == "__main__":
    main()
