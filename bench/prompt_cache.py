"""The prompt cache on Claude Code's first request (issue 43): time to the first delta cold,
after the model was unloaded, after a swap to another model, and after the server
restarted, on the same cache folder.

    .venv/bin/python bench/prompt_cache.py [--request tests/data/claude_code/main_request.json]
                                           [--tools N]

Starts ``podium serve`` with two models, the default one (``--model-alias claude-*``) and
Gemma 3 270M (the GGUF the tests use), one loaded at a time (``--max-loaded-models 1``), on a
fresh ``--prompt-cache-dir``; sends the captured request (streamed, as Claude Code does) and
prints the seconds to the first content delta and ``cache_read_input_tokens``:

1. cold (nothing cached anywhere);
2. after ``POST /v1/models/{model}/unload`` (what an idle keep-alive or Ollama's
   ``keep_alive: 0`` does): the next request loads the model and restores;
3. after a swap: a request to Gemma evicts the default model, then the captured request
   loads it back (evicting Gemma) and restores;
4. after the server is stopped and started again on the same folder, the cache's entries
   dropped from the page cache first (as after a reboot: the restore reads the disk).

After 2, 3 and 4 the same request goes once more, its prefix now in a slot: it prefills the
same tail as the restored one did. The restore's own seconds are the first delta minus that
repeat's and minus the model's load (``/health``'s ``load_seconds``, before and after; after
a swap that also holds Gemma's unload, which no figure counts, so no speed is given); its
bytes are the entry it read (the smallest in the folder: every entry holds this one prompt's
prefix). After 2 and 3 that file is likely still in the page cache; after 4 it comes from
the disk, whose speed is measured in the same run: the entry read once more with the page
cache dropped, and a 256 MB file just written, dropped and read once.
``--tools N`` keeps the request's first N tools (a shorter prompt for a quick check; it
must stay over ``--prompt-cache-min-tokens``, 1,024 by default).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from messages_prefill import MODEL, ROOT, stop, stream, with_cch  # noqa: E402
from messages_prefill import start as serve  # noqa: E402

OTHER = "gemma-3-270m"          # the tests' second model: a packaged name podium resolves


def start(cache: Path) -> tuple[subprocess.Popen, str]:
    return serve("--model", MODEL, "--model", OTHER, "--max-loaded-models", "1",
                 "--prompt-cache-dir", str(cache))


def load_seconds(url: str) -> float:
    return httpx.get(f"{url}/health", timeout=60).json()["models"][MODEL]["load_seconds"]


def drop_from_page_cache(path: Path) -> None:
    """Ask the kernel to forget ``path``'s pages (clean ones go: the cache fsyncs its files)."""
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def read_speed(path: Path) -> float:
    """MB/s reading ``path`` once, from the disk (dropped from the page cache first)."""
    drop_from_page_cache(path)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    return path.stat().st_size / (time.perf_counter() - started) / 1e6


def disk_read_speed(folder: Path, size: int = 256 << 20) -> float:
    """MB/s reading a file of ``size`` bytes written, fsynced and dropped from the page cache."""
    path = folder / "read-speed.bin"
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20) * (size >> 20))
        f.flush()
        os.fsync(f.fileno())
    try:
        return read_speed(path)
    finally:
        path.unlink()


def smallest_entry(cache: Path, timeout: float = 60) -> Path | None:
    """The smallest entry in ``cache`` (waited for: they are written behind), or None. Every
    entry here holds the one request's prefix, so it is the one a restore reads (the cache
    reads the smallest entry holding the longest prefix)."""
    deadline = time.monotonic() + timeout
    while True:
        entries = sorted(cache.rglob("*.kv"), key=lambda p: p.stat().st_size)
        if entries or time.monotonic() > deadline:
            return entries[0] if entries else None
        time.sleep(0.2)


def restored(url: str, body: dict, cch: str, cold: float, label: str,
             entry: Path | None, evicts: str | None = None) -> dict:
    """The request after ``label`` (its model not loaded; ``entry``: what it will restore),
    then once more from its slot: the first delta as a share of ``cold``, and the restore's
    seconds and MB/s (``evicts``: a model the request unloads first, whose unload no figure
    counts: the rest is that and the restore)."""
    size = entry.stat().st_size if entry is not None else 0
    loaded = load_seconds(url)
    out = stream(url, with_cch(body, cch))
    load = load_seconds(url) - loaded
    # the server's own figures (a new cache came with the load: these are this restore's)
    own = httpx.get(f"{url}/health", timeout=60).json()["models"][MODEL].get("prompt_cache", {})
    repeat = stream(url, with_cch(body, cch + "1"))
    seconds = out["first_delta"] - load - repeat["first_delta"]
    if evicts is not None:
        rest = f"unloading {evicts} and the restore {seconds:.2f} s"
    elif size and seconds > 0:
        rest = f"the restore {seconds:.2f} s ({size / seconds / 1e6:,.0f} MB/s of {size:,} bytes)"
    else:
        rest = f"the restore {seconds:.2f} s"
    print(f"{label}: first delta {out['first_delta']:.2f} s "
          f"({out['first_delta'] / cold:.3f} of cold), cache_read_input_tokens "
          f"{out['usage']['cache_read_input_tokens']:,}; load {load:.2f} s, the tail from a "
          f"slot {repeat['first_delta']:.2f} s, so {rest}")
    read, into = own.get("read_seconds", 0.0), own.get("restore_seconds", 0.0)
    if read and size:
        print(f"  the server's figures: entry read and checked {read:.3f} s "
              f"({size / read / 1e6:,.0f} MB/s), copied into llama.cpp {into:.3f} s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--request", default=str(ROOT / "tests/data/claude_code/main_request.json"))
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--tools", type=int, default=None,
                    help="keep the request's first N tools (default: all)")
    args = ap.parse_args()
    body = json.loads(Path(args.request).read_text())
    body["max_tokens"] = args.max_tokens
    if args.tools is not None:
        body["tools"] = body.get("tools", [])[:args.tools]
    print(f"# Claude Code's first request ({len(body.get('tools') or [])} tools); "
          f"{os.cpu_count()} cores; load average {os.getloadavg()}")
    cache = Path(tempfile.mkdtemp(prefix="podium-prompt-cache-"))
    try:
        run(body, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def run(body: dict, cache: Path) -> None:
    proc, url = start(cache)
    try:
        cold = stream(url, with_cch(body, "20001"))
        print(f"1 cold: first delta {cold['first_delta']:.1f} s, usage {cold['usage']}")
        smallest_entry(cache)                   # the cold prefill's, written behind
        httpx.post(f"{url}/v1/models/{MODEL}/unload", timeout=120)
        restored(url, body, "20002", cold["first_delta"], "2 after an unload",
                 smallest_entry(cache))
        sent = time.monotonic()
        httpx.post(f"{url}/v1/completions", json={
            "model": OTHER, "prompt": "Hello", "max_tokens": 1}, timeout=300).raise_for_status()
        print(f"  {OTHER} answered in {time.monotonic() - sent:.2f} s, evicting {MODEL}")
        restored(url, body, "20003", cold["first_delta"], "3 after a swap",
                 smallest_entry(cache), evicts=OTHER)
        figures = httpx.get(f"{url}/health").json()["models"][MODEL].get("prompt_cache", {})
    finally:
        stop(proc)
    entries = list(cache.rglob("*.kv"))
    for path in entries:
        drop_from_page_cache(path)
    entry = smallest_entry(cache)
    proc, url = start(cache)
    try:
        last = restored(url, body, "20004", cold["first_delta"],
                        "4 after a restart (entries dropped from the page cache)", entry)
    finally:
        stop(proc)
    if entry is None or not entry.exists():
        print("cache: no entry was written")
        return
    tokens = last["usage"]["cache_read_input_tokens"] or 1
    print(f"cache: {len(entries)} entries, {figures}; the smallest {entry.stat().st_size:,} "
          f"bytes, about {entry.stat().st_size / tokens:,.0f} bytes a cached token")
    print(f"this disk: the entry read with the page cache dropped {read_speed(entry):,.0f} "
          f"MB/s; sequential read of a 256 MB file {disk_read_speed(cache):,.0f} MB/s")


if __name__ == "__main__":
    main()
