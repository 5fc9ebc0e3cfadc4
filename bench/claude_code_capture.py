"""Capture server: records every request Claude Code makes and answers like the Messages API.

    .venv/bin/python bench/claude_code_capture.py --port 8765 --out /tmp/cc-capture \
        [--tool-file PATH] [--delay S [--ping S]]
    .venv/bin/python bench/claude_code_capture.py --sanitize CAPTURE.json --cwd DIR \
        --home DIR > OUT.json

Each request is written to OUT/NNN.json (method, path with query string, headers, JSON body).
``POST /v1/messages`` gets a minimal valid Message (SSE when the body asks for ``stream``,
JSON otherwise) saying "Hello."; with ``--tool-file`` a request that offers the ``Read``
tool and carries no ``tool_result`` yet is answered with a ``tool_use`` of ``Read`` on that
path instead; ``--delay S`` waits S seconds after ``message_start`` (a long prefill), silent or
with a ``ping`` every ``--ping`` seconds. ``POST /v1/messages/count_tokens`` answers
``{"input_tokens": chars // 4}``.
Anything else is recorded and answered 404. ``--sanitize`` prints one captured request with
its device and session ids replaced by fixed fake values and the run's cwd and home directory
by /tmp/claude-work and /tmp/claude-home. tests/data/claude_code/ holds what it captured
(tests/data/claude_code/requests.md: the command and environment used).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _has_tool_result(body: dict) -> bool:
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            return True
    return False


def make_app(out: Path, tool_file: str | None, delay: float = 0.0,
             ping: float = 0.0) -> Starlette:
    counter = itertools.count(1)
    ids = itertools.count(1)

    async def record(request: Request) -> tuple[int, dict | None]:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        n = next(counter)
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        (out / f"{n:03d}.json").write_text(json.dumps({
            "method": request.method, "path": path, "headers": dict(request.headers),
            "body_chars": len(raw), "body": body}, indent=2))
        return n, body

    async def messages(request: Request) -> Response:
        _, body = await record(request)
        body = body or {}
        model = body.get("model", "unknown")
        message_id = f"msg_capture{next(ids):04d}"
        tools = {t.get("name") for t in body.get("tools", [])}
        if tool_file and "Read" in tools and not _has_tool_result(body):
            block = {"type": "tool_use", "id": f"toolu_capture{next(ids):04d}", "name": "Read",
                     "input": {"file_path": tool_file}}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": "Hello."}
            stop = "end_turn"
        usage = {"input_tokens": 10, "output_tokens": 3}
        if not body.get("stream"):
            return JSONResponse({"id": message_id, "type": "message", "role": "assistant",
                                 "model": model, "content": [block], "stop_reason": stop,
                                 "stop_sequence": None, "usage": usage})

        async def events():
            yield _sse("message_start", {"type": "message_start", "message": {
                "id": message_id, "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 1}}})
            waited = 0.0
            while waited < delay:                   # a long prefill: silence, or pings
                step = min(ping or delay, delay - waited)
                await asyncio.sleep(step)
                waited += step
                if ping:
                    yield _sse("ping", {"type": "ping"})
            if block["type"] == "text":
                yield _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                   "content_block": {"type": "text", "text": ""}})
                yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "text_delta",
                                                             "text": block["text"]}})
            else:
                yield _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                   "content_block": {**block, "input": {}}})
                yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "input_json_delta",
                                                             "partial_json": json.dumps(
                                                                 block["input"])}})
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield _sse("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": stop, "stop_sequence": None},
                                         "usage": {"output_tokens": 3}})
            yield _sse("message_stop", {"type": "message_stop"})

        return StreamingResponse(events(), media_type="text/event-stream")

    async def count_tokens(request: Request) -> Response:
        n, body = await record(request)
        return JSONResponse({"input_tokens": len(json.dumps(body)) // 4})

    async def other(request: Request) -> Response:
        await record(request)
        return JSONResponse({"type": "error", "error": {"type": "not_found_error",
                                                        "message": "not captured"}},
                            status_code=404)

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    return Starlette(routes=[
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/{path:path}", other, methods=methods),
    ])


FAKE_DEVICE_ID = "0123456789abcdef" * 4
FAKE_SESSION_ID = "00000000-0000-4000-8000-000000000000"


def sanitize(record: dict, cwd: str, home: str) -> dict:
    """The captured request with ids, cwd and home replaced by fixed values."""
    text = json.dumps(record)
    user_id = (record.get("body") or {}).get("metadata", {}).get("user_id")
    if user_id:
        ids = json.loads(user_id)
        if ids.get("device_id"):
            text = text.replace(ids["device_id"], FAKE_DEVICE_ID)
        if ids.get("session_id"):
            text = text.replace(ids["session_id"], FAKE_SESSION_ID)
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                  FAKE_SESSION_ID, text)
    for real, fake in ((home, "/tmp/claude-home"), (cwd, "/tmp/claude-work")):
        text = text.replace(real, fake).replace(real.replace("/", "-"), fake.replace("/", "-"))
    clean = json.loads(text)
    clean["headers"].pop("content-length", None)
    clean["body_chars"] = len(json.dumps(clean["body"], ensure_ascii=False,
                                         separators=(",", ":")))
    return clean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tool-file", help="answer the first turn with Read on this path")
    parser.add_argument("--delay", type=float, default=0.0,
                        help="seconds between message_start and the first block (a prefill)")
    parser.add_argument("--ping", type=float, default=0.0,
                        help="send a ping every this many seconds during --delay (0: none)")
    parser.add_argument("--sanitize", type=Path, help="print this capture sanitized")
    parser.add_argument("--cwd", help="the captured run's working directory (--sanitize)")
    parser.add_argument("--home", help="the captured run's HOME (--sanitize)")
    args = parser.parse_args()
    if args.sanitize:
        print(json.dumps(sanitize(json.loads(args.sanitize.read_text()), args.cwd, args.home),
                         indent=2, ensure_ascii=False))
        return
    if args.out is None:
        parser.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    uvicorn.run(make_app(args.out, args.tool_file, args.delay, args.ping), host="127.0.0.1",
                port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
