"""Load: many concurrent streaming clients against the scripted engine, paced like a model.

    .venv/bin/python bench/load.py [--streams 1000] [--seconds 15] [--delay 0.05] [--root DIR]

Prints, in one run: throughput (chunks/s), p50 / p99 time to first token and gap between
chunks, errors, the server's RSS before, during and after, and how often its threads wake
once it is idle again; then, separately, memory per idle stream (streams held open while the
engine is paced far slower than the test). ``--census`` has the server list what keeps
pymalloc arenas alive after the load (bench/pool_census.py). ``--root`` runs the server of
another checkout (a worktree of an older commit) with this client.
Targets: 1,000 concurrent streams with zero errors; under 50 KB per idle stream. RSS after
the load is printed for information: what matters to operators is that it does not keep
growing from one burst to the next (bench/bursts.py, which uses this script's client). The
client uses raw asyncio sockets so that it, not the server, is the light side of the
measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BODY = json.dumps({"model": "scripted", "stream": True,
                   "messages": [{"role": "user", "content": "go"}]}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wakeups(pid: int) -> int:
    """Context switches of every thread of ``pid`` so far (a sleeping thread that wakes
    up switches in once)."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        for line in status.read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def start_server(port: int, tokens: int, delay: float, allocator: str = "pymalloc",
                 census: bool = False, root: Path = ROOT) -> subprocess.Popen:
    """The scripted server of the checkout at ``root`` (another worktree's code can be
    measured with this checkout's client)."""
    env = dict(os.environ, PYTHONPATH=str(root))
    if allocator == "malloc":
        env["PYTHONMALLOC"] = "malloc"     # glibc's allocator: freed memory can go back
    proc = subprocess.Popen([sys.executable, str(root / "bench" / "scripted_server.py"),
                             "--port", str(port), "--tokens", str(tokens),
                             "--delay", str(delay)] + ["--census"] * census, cwd=root, env=env)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start")


class Stream:
    __slots__ = ("start", "first", "gaps", "chunks", "error", "done")

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.first: float | None = None
        self.gaps: list[float] = []
        self.chunks = 0
        self.error: str | None = None
        self.done = False


async def one_stream(port: int, stats: Stream, opened: asyncio.Event | None = None) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\ncontent-length: "
                     + str(len(BODY)).encode() + b"\r\nconnection: close\r\n\r\n" + BODY)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            stats.error = head.split(b"\r\n", 1)[0].decode()
            return
        last = None
        while True:
            block = await reader.read(65536)
            if not block:
                break
            now = time.monotonic()
            count = block.count(b"data: {")
            if count:
                if stats.first is None:
                    stats.first = now
                    if opened is not None:
                        opened.set()
                elif last is not None:
                    stats.gaps.append(now - last)
                last = now
                stats.chunks += count
            if b"data: [DONE]" in block:
                stats.done = True
        writer.close()
        if not stats.done:
            stats.error = "stream ended without [DONE]"
    except Exception as exc:  # noqa: BLE001 - every failure counts as an error
        stats.error = repr(exc)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def run_load(port: int, streams: int, pid: int) -> tuple[list[Stream], int, float]:
    stats = [Stream() for _ in range(streams)]
    tasks = []
    start = time.monotonic()
    for s in stats:                         # open connections at a steady clip
        s.start = time.monotonic()
        tasks.append(asyncio.create_task(one_stream(port, s)))
        await asyncio.sleep(0.002)
    await asyncio.sleep(2)
    during = rss_kb(pid)
    await asyncio.gather(*tasks)
    return stats, during, time.monotonic() - start


async def idle_memory(port: int, streams: int, pid: int) -> float:
    """RSS per stream held open (each has its first chunk) while the engine barely moves."""
    before = rss_kb(pid)
    opened = [asyncio.Event() for _ in range(streams)]
    tasks = [asyncio.create_task(one_stream(port, Stream(), e)) for e in opened]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in opened)), 120)
    await asyncio.sleep(1)
    during = rss_kb(pid)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return (during - before) / streams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds per token")
    parser.add_argument("--allocator", choices=["pymalloc", "malloc"], default="pymalloc",
                        help="the server's Python allocator (PYTHONMALLOC)")
    parser.add_argument("--census", action="store_true",
                        help="have the server list what pins pymalloc arenas after the load")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout whose server is measured (e.g. an older worktree)")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tokens = int(args.seconds / args.delay)

    port = free_port()
    server = start_server(port, tokens, args.delay, args.allocator, args.census,
                          args.root)
    try:
        asyncio.run(one_stream(port, Stream()))          # warm up
        time.sleep(5)                 # the server settles after the warm-up
        baseline = rss_kb(server.pid)
        if args.census:
            server.send_signal(signal.SIGUSR1)
        cpu = cpu_seconds(server.pid)
        stats, during, elapsed = asyncio.run(run_load(port, args.streams, server.pid))
        cpu = cpu_seconds(server.pid) - cpu
        time.sleep(12)
        after = rss_kb(server.pid)
        woken = wakeups(server.pid)
        time.sleep(10)
        idle_wakeups = (wakeups(server.pid) - woken) / 10
        if args.census:
            server.send_signal(signal.SIGUSR2)
            time.sleep(30)            # the census takes a while; let it finish
    finally:
        server.terminate()
        server.wait(30)
    errors = [s.error for s in stats if s.error]
    chunks = sum(s.chunks for s in stats)
    ttft = [s.first - s.start for s in stats if s.first is not None]
    gaps = [g for s in stats for g in s.gaps]
    print(f"# load: {args.streams} concurrent streams, {tokens} tokens each at "
          f"{1 / args.delay:.0f} tokens/s per stream; server allocator {args.allocator}")
    print(f"throughput: {chunks / elapsed:.0f} chunks/s over {elapsed:.1f} s; errors: "
          f"{len(errors)}{' (' + errors[0] + ')' if errors else ''}")
    print(f"server CPU: {cpu / max(chunks, 1) * 1e6:.1f} us per chunk ({cpu:.1f} s)")
    print(f"time to first token: p50 {pct(ttft, 50) * 1000:.0f} ms, p99 {pct(ttft, 99) * 1000:.0f}"
          f" ms; gap between chunks: p50 {pct(gaps, 50) * 1000:.1f} ms, "
          f"p99 {pct(gaps, 99) * 1000:.1f} ms (paced at {args.delay * 1000:.0f} ms)")
    print(f"server RSS: before {baseline / 1024:.1f} MB, during {during / 1024:.1f} MB, "
          f"after {after / 1024:.1f} MB ({(after - baseline) / baseline * 100:+.1f}% vs before)")
    print(f"server wake-ups once idle: {idle_wakeups:.1f} per second")

    port = free_port()
    server = start_server(port, 100, 30.0, args.allocator, root=args.root)   # idle
    try:
        time.sleep(1)
        per_stream = asyncio.run(idle_memory(port, args.streams, server.pid))
    finally:
        server.terminate()
        server.wait(30)
    print(f"memory per idle stream ({args.streams} held open): {per_stream:.1f} KB")


if __name__ == "__main__":
    main()
