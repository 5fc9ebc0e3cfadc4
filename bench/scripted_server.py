"""Serve Podium's app on the scripted engine (benchmark harness, not a product path).

    python bench/scripted_server.py --port 8123 --tokens 512 [--delay 0.0]

Every request gets the same reply of about --tokens tokens, replayed through the default
model's real tokenizer; --delay paces it (seconds per token; 0 is as fast as possible). The
app runs in the server class ``podium serve`` uses. PODIUM_BENCH_LOOP=asyncio runs it on
asyncio's own loop instead of uvloop.
"""

from __future__ import annotations

import argparse
import os

import uvicorn

from podium.engine.llamacpp.model_files import default_model_path
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
from podium.server.http import HTTPLimits, guarded_http
from podium.server.lifecycle import Server
from podium.settings import Settings

SERVED = "scripted"


def reply_of(tokens: int) -> str:
    words = ("the quick brown fox jumps over the lazy dog while a streaming server "
             "sends one token after another to many clients at once").split()
    return " ".join(words[i % len(words)] for i in range(tokens))


def raise_fd_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    raise_fd_limit()
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--census", action="store_true",
                        help="SIGUSR1 notes pymalloc's arenas, SIGUSR2 lists what pins new ones "
                             "(bench/pool_census.py)")
    args = parser.parse_args()
    if args.census:
        import pool_census

        pool_census.install()
    engine = ScriptedEngine.from_gguf(default_model_path(), [reply_of(args.tokens)],
                                      served_name=SERVED, delay=args.delay,
                                      context_length=1 << 20, keep_requests=0)
    app = create_app(Settings(max_concurrent_requests=0), engine)
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning",
                            access_log=False, backlog=4096,
                            loop=os.environ.get("PODIUM_BENCH_LOOP", "auto"),
                            http=guarded_http(HTTPLimits()))    # as `podium serve` runs
    Server(config, app.state.drain, grace=20).run()


if __name__ == "__main__":
    main()
