"""Serve Podium's app on the scripted engine (benchmark harness, not a product path).

    python bench/scripted_server.py --port 8123 --tokens 512 [--delay 0.0]

Every request gets the same reply of about --tokens tokens, replayed through the default
model's real tokenizer; --delay paces it (seconds per token; 0 is as fast as possible). PODIUM_BENCH_LOOP=asyncio
runs it on asyncio's own loop instead of uvloop.
"""

from __future__ import annotations

import argparse
import os

import uvicorn

from podium.engine.llamacpp.model_files import default_model_path
from podium.engine.scripted import ScriptedEngine
from podium.server.app import create_app
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
    args = parser.parse_args()
    engine = ScriptedEngine.from_gguf(default_model_path(), [reply_of(args.tokens)],
                                      served_name=SERVED, delay=args.delay,
                                      context_length=1 << 20, keep_requests=0)
    app = create_app(Settings(max_concurrent_requests=0), engine)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                backlog=4096, loop=os.environ.get("PODIUM_BENCH_LOOP", "auto"))


if __name__ == "__main__":
    main()
