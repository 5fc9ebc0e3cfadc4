"""What MCP tools can cost the server: RSS and /health latency under the issue-26 attacks.

    .venv/bin/python bench/mcp_fanout.py [--tools 1000 3000] [--concurrent 16]

Starts a real MCP server (the ``mcp`` SDK's, streamable HTTP), a hostile one (plain
Starlette: a tool listing and a call result just under ``--mcp-max-bytes``, the result in
tens of thousands of parts) and Podium (the app ``podium serve`` runs, on the scripted engine
with the default model's tokenizer, ``--mcp-allow`` both), each in its own process. Then,
asking /health every 20 ms throughout, and reading Podium's RSS from /proc:

- one Responses request naming N ``mcp`` tools (distinct labels, one allowed URL);
- --concurrent requests at once, each naming ``--mcp-max-servers`` (8) servers: more
  sessions than ``--mcp-max-sessions`` (64) allows;
- one request to the hostile server: its listing, then one call of its tool.

Prints, per case, the answers' statuses, how long they took, the slowest and median /health
and Podium's RSS before, at its peak, and after.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CALL = '<tool_call>\n{"name": "many", "arguments": {}}\n</tool_call>'
BYTES = 256 * 1024          # Podium's default --mcp-max-bytes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the three servers (each run as `python bench/mcp_fanout.py --serve-... PORT`) --------


def serve_mcp(port: int) -> None:
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench")

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        return text

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="error")


def serve_hostile(port: int) -> None:
    """A listing and a call result in many small parts, each about 95% of the byte cap, so
    Podium parses them (about the worst an allowed server can send)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    tools = [{"name": f"t{i}", "description": "d" * 40, "inputSchema": {"type": "object"}}
             for i in range(int(0.95 * BYTES / 106))]
    tools.append({"name": "many", "inputSchema": {"type": "object"}})
    parts = [{"type": "text", "text": "p"}] * int(0.95 * BYTES / 28)

    async def endpoint(request: Any) -> Response:
        message = await request.json()
        if "id" not in message:
            return Response(status_code=202)
        method, result = message["method"], None
        if method == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"],
                      "capabilities": {"tools": {}}, "serverInfo": {"name": "h", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": tools}
        elif method == "tools/call":
            result = {"content": parts}
        if result is None:
            return JSONResponse({"jsonrpc": "2.0", "id": message["id"],
                                 "error": {"code": -32601, "message": "no"}})
        return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "result": result})

    app = Starlette(routes=[Route("/mcp", endpoint, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


def serve_podium(port: int, allow: list[str], sessions: int) -> None:
    sys.path.insert(0, ROOT)
    import uvicorn

    from podium.engine.llamacpp.model_files import default_model_path
    from podium.engine.scripted import ScriptedEngine
    from podium.server.app import create_app
    from podium.server.http import HTTPLimits, guarded_http
    from podium.server.lifecycle import Server
    from podium.settings import Settings

    def reply(request: Any) -> str:     # call the hostile tool once, then answer
        prompt = engine.tokenizer.decode(request.prompt_token_ids)
        return "done" if "tool_response" in prompt or '"many"' not in prompt else CALL

    engine = ScriptedEngine.from_gguf(default_model_path(), reply, served_name="scripted",
                                      context_length=32768, keep_requests=0)
    store = os.path.join(tempfile.mkdtemp(), "r.db")
    app = create_app(Settings(max_concurrent_requests=0, mcp_allow=allow,
                              mcp_max_sessions=sessions,
                              store_url=f"sqlite:///{store}"), engine)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                            access_log=False, http=guarded_http(HTTPLimits()))
    Server(config, app.state.drain, grace=5).run()


# -- measuring ---------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def during(url: str, pid: int, work: Callable[[], list[str]]) -> dict[str, Any]:
    """``work()`` while /health is asked every 20 ms and RSS sampled."""
    done = threading.Event()
    outcome: list[str] = []

    def run() -> None:
        try:
            outcome.extend(work())
        finally:
            done.set()

    before = rss_mb(pid)
    peak = before
    waits = []
    started = time.monotonic()
    threading.Thread(target=run).start()
    with httpx.Client(base_url=url) as client:
        while not waits or not done.is_set():      # at least one, however quick the work
            t = time.monotonic()
            try:
                client.get("/health", timeout=60).raise_for_status()
            except httpx.HTTPError:
                pass
            waits.append(time.monotonic() - t)
            peak = max(peak, rss_mb(pid))
            time.sleep(0.02)
    took = time.monotonic() - started
    time.sleep(0.5)
    return {"took": took, "outcome": outcome, "before": before, "peak": peak,
            "after": rss_mb(pid), "slowest": max(waits), "median": statistics.median(waits),
            "polls": len(waits)}


def report(name: str, r: dict[str, Any]) -> None:
    print(f"{name}: {', '.join(r['outcome'])} in {r['took']:.2f} s; /health slowest "
          f"{r['slowest'] * 1000:.1f} ms, median {r['median'] * 1000:.1f} ms "
          f"({r['polls']} polls); RSS {r['before']:.0f} -> peak {r['peak']:.0f} -> after "
          f"{r['after']:.0f} MB")


def mcp_tool(url: str, label: str, **extra: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": label, "server_url": url,
            "require_approval": "never", **extra}


def post(url: str, tools: list[dict[str, Any]]) -> str:
    r = httpx.post(url + "/v1/responses", timeout=300, json={
        "model": "scripted", "input": "hi", "tools": tools, "store": False})
    if r.status_code != 200:
        return f"{r.status_code} {r.json()['error'].get('param')}"
    output = r.json()["output"]
    errors = [i.get("error") for i in output if i["type"] in ("mcp_list_tools", "mcp_call")]
    failed = [e if isinstance(e, str) else (e or {}).get("message") for e in errors if e]
    return f"200 ({len(errors) - len(failed)} ok, {len(failed)} failed" + (
        f": {failed[0][:90]!r}" if failed else "") + ")"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, nargs="*", default=[1000, 3000])
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--serve-mcp", type=int)
    parser.add_argument("--serve-hostile", type=int)
    parser.add_argument("--serve-podium", type=int)
    parser.add_argument("--allow", nargs="*", default=[])
    parser.add_argument("--sessions", type=int, default=64, help="--mcp-max-sessions")
    args = parser.parse_args()
    if args.serve_mcp:
        return serve_mcp(args.serve_mcp)
    if args.serve_hostile:
        return serve_hostile(args.serve_hostile)
    if args.serve_podium:
        return serve_podium(args.serve_podium, args.allow, args.sessions)

    ports = [free_port() for _ in range(3)]
    mcp_url = f"http://127.0.0.1:{ports[0]}/mcp"
    hostile_url = f"http://127.0.0.1:{ports[1]}/mcp"
    url = f"http://127.0.0.1:{ports[2]}"
    me = [sys.executable, os.path.abspath(__file__)]
    procs = [subprocess.Popen(me + ["--serve-mcp", str(ports[0])]),
             subprocess.Popen(me + ["--serve-hostile", str(ports[1])]),
             subprocess.Popen(me + ["--serve-podium", str(ports[2]), "--sessions",
                                    str(args.sessions), "--allow", mcp_url, hostile_url])]
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        time.sleep(1)
        pid = procs[2].pid
        for n in args.tools:
            tools = [mcp_tool(mcp_url, f"s{i}") for i in range(n)]
            size = len(json.dumps(tools)) // 1024
            report(f"{n} mcp tools in one request ({size} KB)",
                   during(url, pid, lambda: [post(url, tools)]))
        # one server offers its tool, seven list it too (allowed_tools [] keeps names apart)
        eight = [mcp_tool(mcp_url, f"s{i}", allowed_tools=[] if i else ["echo"])
                 for i in range(8)]
        with ThreadPoolExecutor(args.concurrent) as pool:
            report(f"{args.concurrent} concurrent requests x 8 servers",
                   during(url, pid, lambda: sorted(set(pool.map(
                       lambda _: post(url, eight), range(args.concurrent))))))
        report(f"hostile server: a listing of {int(0.95 * BYTES / 106)} tools, then a result of "
               f"{int(0.95 * BYTES / 28)} parts, each about 95% of {BYTES // 1024} KiB",
               during(url, pid, lambda: [post(url, [mcp_tool(hostile_url, "h",
                                                              allowed_tools=["many"])])]))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


if __name__ == "__main__":
    main()
