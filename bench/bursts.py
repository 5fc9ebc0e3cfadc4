"""Memory across repeated bursts: does the server's RSS keep growing from one burst to the next?

    .venv/bin/python bench/bursts.py [--bursts 5] [--streams 1000] [--seconds 15]
                                     [--settle 8] [--root CHECKOUT]

One scripted server (bench/scripted_server.py, the server class ``podium serve`` uses) takes
``--bursts`` bursts of ``--streams`` concurrent streaming clients (the load of
bench/load.py: 20 tokens/s per stream for ``--seconds``). ``--settle`` seconds after each
burst ends it reads the server's RSS. Prints errors and the server's CPU time per chunk in
each burst, RSS after each burst, the ratio of the last to the first, the server's wake-ups
a second once idle after the last burst, and, from a second server, memory per idle stream
(``--streams`` held open on an engine that barely moves).
``--root`` runs the server of another checkout (a worktree of an older commit) with this
checkout's client, so that two versions can be measured alternately.

Targets: RSS after the last burst within 5% of RSS after the first; at most 50 KB per idle
stream.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from pathlib import Path

from load import ROOT, Stream, cpu_seconds, free_port, idle_memory, one_stream, rss_kb, \
    run_load, start_server, wakeups


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bursts", type=int, default=5)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=15, help="length of each stream")
    parser.add_argument("--delay", type=float, default=0.05, help="seconds per token")
    parser.add_argument("--settle", type=float, default=8,
                        help="seconds after a burst before its RSS is read")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout whose server is measured")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tokens = int(args.seconds / args.delay)

    port = free_port()
    server = start_server(port, tokens, args.delay, root=args.root)
    after: list[int] = []
    errors: list[int] = []
    cost: list[float] = []                  # server CPU microseconds per chunk streamed
    try:
        asyncio.run(one_stream(port, Stream()))          # warm up
        time.sleep(args.settle)
        baseline = rss_kb(server.pid)
        for _ in range(args.bursts):
            cpu = cpu_seconds(server.pid)
            stats, _, _ = asyncio.run(run_load(port, args.streams, server.pid))
            cpu = cpu_seconds(server.pid) - cpu
            errors.append(sum(1 for s in stats if s.error))
            cost.append(cpu / max(1, sum(s.chunks for s in stats)) * 1e6)
            time.sleep(args.settle)
            after.append(rss_kb(server.pid))
        woken = wakeups(server.pid)
        time.sleep(10)
        idle_wakeups = (wakeups(server.pid) - woken) / 10
    finally:
        server.terminate()
        server.wait(30)

    port = free_port()
    server = start_server(port, 100, 30.0, root=args.root)   # a token every 30 s: idle
    try:
        time.sleep(1)
        per_stream = asyncio.run(idle_memory(port, args.streams, server.pid))
    finally:
        server.terminate()
        server.wait(30)

    print(f"# bursts: {args.bursts} x {args.streams} concurrent streams, {tokens} tokens each "
          f"at {1 / args.delay:.0f} tokens/s; server of {args.root}")
    print(f"errors per burst: {errors}; server CPU per chunk (us): "
          + ", ".join(f"{c:.1f}" for c in cost))
    print(f"server RSS (MB): baseline {baseline / 1024:.1f}; after each burst "
          + ", ".join(f"{kb / 1024:.1f}" for kb in after))
    print(f"RSS after burst {args.bursts} / after burst 1: {after[-1] / after[0]:.3f} "
          f"({(after[-1] - after[0]) / after[0] * 100:+.1f}%); "
          f"after burst 1 vs baseline: {(after[0] - baseline) / baseline * 100:+.1f}%")
    print(f"server wake-ups a second once idle: {idle_wakeups:.1f}")
    print(f"memory per idle stream ({args.streams} held open): {per_stream:.1f} KB")


if __name__ == "__main__":
    main()
