"""Front-end CPU per streamed token: Podium against vLLM's serving layer and the HTTP floor.

The workload is the peer harness's (../shared/peer-vllm/bench_vllm_frontend.py, mode
``parsers``): a tool-calling chat request (one ``get_current_weather`` tool), and a reply of
256 engine tokens, one token per chunk: ``<think>`` + reasoning + ``</think>`` + content +
a ``<tool_call>{json}</tool_call>`` (Podium's tokenizer has no ``<think>`` token, so the tags
are a few tokens each; the reply is 255 tokens and the end-of-sequence token). Parsers: hermes
tool calls and ``<think>`` reasoning (``--no-parsers``: a plain paragraph, no tools). The
scripted engine yields each token after ``await asyncio.sleep(0)``, as the harness's fake
engine does, and (in-process) starts stepping once all c requests of a round have reached it.
c = 1/64/256; each cell streams --total-tokens (65,536) per repeat: c=1 256 sequential
requests, c=64 4 rounds, c=256 one; one warm-up round, then --repeats (3) timed repeats,
median reported; precomputed objects gc.freeze()d before timing. Metric: CPU µs per streamed
token, time.process_time() (all threads) in-process, the server process's utime+stime through
HTTP.

    # in-process through Podium's ASGI app (FastAPI routing, body parsing, middlewares, SSE)
    .venv/bin/python bench/frontend.py inproc [--conc 1,64,256] [--no-parsers] [--check]
    # through HTTP on loopback: Podium's server and the floor (a bare ASGI app under the
    # same uvicorn set-up emitting as many chunks), interleaved; server-process CPU
    .venv/bin/python bench/frontend.py http [--conc 1,64,256] [--runs 3] [--root DIR]
    # everything in one run, interleaved, ratios printed: vLLM's harness (parsers mode, its
    # own venv), Podium in-process, Podium and the floor through HTTP
    .venv/bin/python bench/frontend.py compare --vllm-python .venv-vllm/bin/python \\
        [--peer ../shared/peer-vllm] [--runs 3] [--root DIR ...]
    # the servers alone
    .venv/bin/python bench/frontend.py serve --app podium|floor --port 8123

vLLM's harness needs ``.venv-vllm`` (``./dev test-vllm --co -q`` makes it) and its tokenizer
folders, made once from the default model's GGUF: ``.venv-vllm/bin/python
../shared/peer-vllm/make_tokenizer.py --gguf ~/.cache/podium/<model>.gguf --out /tmp``.

``--root DIR`` (repeatable in compare) measures the code of another checkout (a worktree of
an older commit) with this driver, next to this one.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
MODEL = "qwen2.5-coder-0.5b-instruct"

# -- the workload: the peer harness's texts -------------------------------------------------

PARAGRAPH = (
    "The history of the printing press is often told as a story about a single machine, "
    "but it is better understood as the meeting point of several older crafts. Goldsmiths "
    "already knew how to cut hard metal punches and strike them into softer copper, paper "
    "makers had spread from Spain and Italy into the German lands, and wine presses had "
    "been squeezing grapes along the Rhine for centuries. What Johannes Gutenberg added, "
    "around 1450 in Mainz, was a way to cast large numbers of identical letters quickly, "
    "an oil-based ink that would cling to metal, and the patience to combine these pieces "
    "into a workshop that could produce hundreds of copies of a long book. The results "
    "were not instantly revolutionary: early printed books imitated manuscripts so closely "
    "that buyers sometimes had them decorated by hand. Yet within fifty years there were "
    "presses in more than two hundred European towns, prices had fallen sharply, and "
    "scholars could compare the same page in Venice, Paris and Basel. That simple ability "
    "to refer to an identical text, page by page and line by line, changed how arguments "
    "were made, how errors were corrected, and how quickly new ideas could travel."
)
REASONING = (
    "The user wants the current weather in Dallas, Texas. I should check whether a tool "
    "is available for this. There is a function called get_current_weather that takes a "
    "city, a state and a unit. Dallas is the city and the state is TX. The user did not "
    "say which unit they prefer, but people in the United States usually use fahrenheit, "
    "so I will choose that. I do not need to ask a follow-up question because all of the "
    "required arguments can be filled in from the question itself. "
)
CONTENT = "I'll look up the current weather in Dallas, Texas for you.\n\n"
TOOL_CALL = (
    '<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Dallas", '
    '"state": "TX", "unit": "fahrenheit"}}\n</tool_call>'
)
TOOLS = [{"type": "function", "function": {
    "name": "get_current_weather",
    "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "state": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "state", "unit"]}}}]
USER_PLAIN = "Tell me about the history of the printing press."
USER_TOOLS = "What is the weather in Dallas, TX?"


def request_body(parsers: bool, tokens: int) -> bytes:
    if parsers:
        body = {"model": MODEL, "messages": [{"role": "user", "content": USER_TOOLS}],
                "tools": TOOLS, "tool_choice": "auto", "stream": True, "max_tokens": tokens}
    else:
        body = {"model": MODEL, "messages": [{"role": "user", "content": USER_PLAIN}],
                "stream": True, "max_tokens": tokens}
    return orjson.dumps(body)


def token_ids(tokenizer: Any, parsers: bool, tokens: int) -> list[int]:
    """``tokens`` engine tokens, the last one end-of-sequence (it ends the stream)."""
    n = tokens - 1
    enc = lambda text: list(tokenizer.encode(text, add_special=False))  # noqa: E731
    if parsers:
        head, reason = enc("<think>\n"), enc(REASONING)
        tail = enc("</think>\n\n" + CONTENT + TOOL_CALL)
        body = [reason[i % len(reason)] for i in range(n - len(head) - len(tail))]
        ids = head + body + tail
    else:
        para = enc(PARAGRAPH)
        ids = [para[i % len(para)] for i in range(n)]
    assert len(ids) == n
    return ids + [min(tokenizer.eos_token_ids)]


def build_app(parsers: bool, tokens: int) -> tuple[Any, Any]:
    """Podium's app on the scripted engine replaying the workload (``podium serve``'s
    settings otherwise; the store in a throwaway directory)."""
    import tempfile

    os.environ.setdefault("PODIUM_DATA_DIR", tempfile.mkdtemp(prefix="podium-bench-"))
    from podium.engine.llamacpp.model_files import default_model_path
    from podium.engine.scripted import ScriptedEngine
    from podium.server.app import create_app
    from podium.settings import Settings

    engine = ScriptedEngine.from_gguf(default_model_path(), [[0]], served_name=MODEL,
                                      context_length=32768, keep_requests=0)
    ids = token_ids(engine.tokenizer, parsers, tokens)
    engine._reply = lambda _request: ids
    settings = Settings(max_concurrent_requests=0,
                        tool_parser="hermes" if parsers else "none",
                        reasoning_parser="think" if parsers else "none")
    return create_app(settings, engine), engine


# -- in-process: the ASGI app driven directly ------------------------------------------------

class Sink:
    __slots__ = ("sends", "nbytes", "kept")

    def __init__(self) -> None:
        self.sends = 0
        self.nbytes = 0
        self.kept: list[bytes] | None = None


def scope_for(body: bytes) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
            "query_string": b"", "root_path": "",
            "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {}}


async def asgi_request(app: Any, body: bytes, sink: Sink, keep: bool) -> None:
    ended = asyncio.Event()
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await ended.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            if message["status"] != 200:
                raise SystemExit(f"status {message['status']}")
            return
        chunk = message.get("body", b"")
        if chunk:
            sink.sends += 1
            sink.nbytes += len(chunk)
            if keep and sink.kept is not None:
                sink.kept.append(chunk)
        if not message.get("more_body", False):
            ended.set()

    await app(scope_for(body), receive, send)


class Barrier:
    """The harness's barrier: the engine steps once every request of the round is in."""

    def __init__(self, n: int):
        self.n, self.k, self.event = n, 0, asyncio.Event()

    async def wait(self) -> None:
        self.k += 1
        if self.k >= self.n:
            self.event.set()
        await self.event.wait()


async def inproc_cell(app: Any, engine: Any, body: bytes, conc: int, rounds: int,
                      sink: Sink) -> None:
    for r in range(rounds):
        engine.start_gate = Barrier(conc).wait
        await asyncio.gather(*(asgi_request(app, body, sink, r == 0 and i == 0)
                               for i in range(conc)))


def summarize(raw: bytes) -> dict[str, Any]:
    content = reasoning = args = ""
    names: list[str] = []
    finish = None
    events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    for e in events:
        p = e[6:]
        if p == b"[DONE]":
            continue
        d = orjson.loads(p)
        for ch in d.get("choices", []):
            de = ch.get("delta", {})
            content += de.get("content") or ""
            reasoning += de.get("reasoning_content") or de.get("reasoning") or ""
            for tc in de.get("tool_calls") or []:
                f = tc.get("function") or {}
                if f.get("name"):
                    names.append(f["name"])
                args += f.get("arguments") or ""
            finish = ch.get("finish_reason") or finish
    return {"events": len(events), "content": content, "reasoning": reasoning[:80] + "...",
            "tool_names": names, "tool_args": args, "finish_reason": finish}


def run_inproc(a: argparse.Namespace) -> list[dict[str, Any]]:
    import uvloop

    app, engine = build_app(not a.no_parsers, a.tokens)
    body = request_body(not a.no_parsers, a.tokens)
    label = "podium-inproc" + ("" if a.no_parsers else "[hermes+think]")
    rows = []
    for conc in [int(x) for x in a.conc.split(",")]:
        rounds = max(1, a.total_tokens // (conc * a.tokens))
        cpu: list[float] = []
        for rep in range(a.repeats + 1):            # the first is the warm-up round
            nr = 1 if rep == 0 else rounds
            sink = Sink()
            if rep == 0:
                sink.kept = []
            gc.collect()
            gc.freeze()
            c0 = time.process_time()
            uvloop.run(inproc_cell(app, engine, body, conc, nr, sink))
            c1 = time.process_time()
            gc.unfreeze()
            if rep == 0:
                if a.check and sink.kept is not None:
                    print(json.dumps(summarize(b"".join(sink.kept)), indent=1))
                continue
            cpu.append((c1 - c0) * 1e6 / (nr * conc * a.tokens))
        rows.append(row(label, conc, cpu, rounds * conc * a.tokens))
    return rows


def row(label: str, conc: int, cpu: list[float], tokens: int) -> dict[str, Any]:
    out = {"mode": label, "conc": conc, "tokens_per_rep": tokens,
           "cpu_us_per_token_median": round(statistics.median(cpu), 2),
           "cpu_us_per_token_runs": [round(x, 2) for x in cpu]}
    print(json.dumps(out), flush=True)
    return out


# -- the servers -----------------------------------------------------------------------------

def floor_app(parsers: bool, tokens: int) -> Any:
    """A bare ASGI app: reads the body, then per token one ``chat.completion.chunk``-shaped
    dict through orjson, framed as SSE, with the role chunk first and ``[DONE]`` last (as
    many events as Podium's plain stream), the delta texts from Podium's detokenizer, one
    ``await asyncio.sleep(0)`` per token from an async generator (the engine)."""
    from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
    from podium.engine.llamacpp.model_files import default_model_path
    from podium.text.detokenizer import Detokenizer

    tokenizer = LlamaTokenizer(LlamaModel(default_model_path(), vocab_only=True))
    ids = token_ids(tokenizer, parsers, tokens)[:-1]
    detok = Detokenizer(tokenizer.piece)
    texts = [detok.feed(t) for t in ids]
    headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
               (b"cache-control", b"no-cache")]
    dumps = orjson.dumps

    async def engine() -> Any:
        for text in texts:
            await asyncio.sleep(0)
            yield text

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        rid = "chatcmpl-" + os.urandom(12).hex()
        created = int(time.time())
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "more_body": True, "body": b"data: " + dumps({
            "id": rid, "object": "chat.completion.chunk", "created": created, "model": MODEL,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "logprobs": None, "finish_reason": None}]}) + b"\n\n"})
        k = 0
        async for text in engine():
            k += 1
            await send({"type": "http.response.body", "more_body": True,
                        "body": b"data: " + dumps({
                            "id": rid, "object": "chat.completion.chunk", "created": created,
                            "model": MODEL, "choices": [{
                                "index": 0, "delta": {"content": text}, "logprobs": None,
                                "finish_reason": "stop" if k == len(texts) else None}]})
                        + b"\n\n"})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                    "more_body": False})

    return app


def serve(a: argparse.Namespace) -> None:
    import resource

    import uvicorn

    from podium.server.http import HTTPLimits, guarded_http
    from podium.server.lifecycle import Drain, Server

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    parsers = not a.no_parsers
    if a.app == "podium":
        app, _ = build_app(parsers, a.tokens)
        drain = app.state.drain
    else:
        app, drain = floor_app(parsers, a.tokens), Drain()
    config = uvicorn.Config(app, host="127.0.0.1", port=a.port, log_level="warning",
                            access_log=False, backlog=4096, loop="auto",
                            http=guarded_http(HTTPLimits()))     # as `podium serve` runs
    Server(config, drain, grace=20).run()


# -- through HTTP ----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(app: str, parsers: bool, tokens: int, root: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(root))
    cmd = [sys.executable, str(ROOT / "bench" / "frontend.py"), "serve", "--app", app,
           "--port", str(port), "--tokens", str(tokens)] + ["--no-parsers"] * (not parsers)
    proc = subprocess.Popen(cmd, cwd=root, env=env)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"server did not start: {cmd}")


async def http_stream(port: int, request: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    total = 0
    while True:
        data = await reader.read(65536)
        if not data:
            break
        total += len(data)
    writer.close()
    return total


async def http_cell(port: int, request: bytes, conc: int, rounds: int) -> int:
    total = 0
    for _ in range(rounds):
        total += sum(await asyncio.gather(*(http_stream(port, request) for _ in range(conc))))
    return total


def http_request(parsers: bool, tokens: int) -> bytes:
    body = request_body(parsers, tokens)
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\n"
            b"content-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def http_cells(label: str, port: int, pid: int, a: argparse.Namespace) -> list[dict[str, Any]]:
    import uvloop

    request = http_request(not a.no_parsers, a.tokens)
    rows = []
    for conc in [int(x) for x in a.conc.split(",")]:
        rounds = max(1, a.total_tokens // (conc * a.tokens))
        cpu = []
        for rep in range(a.repeats + 1):
            nr = 1 if rep == 0 else rounds
            c0 = cpu_seconds(pid)
            uvloop.run(http_cell(port, request, conc, nr))
            c1 = cpu_seconds(pid)
            if rep:
                cpu.append((c1 - c0) * 1e6 / (nr * conc * a.tokens))
        rows.append(row(label, conc, cpu, rounds * conc * a.tokens))
    return rows


def run_http(a: argparse.Namespace, app: str, root: Path, label: str) -> list[dict[str, Any]]:
    proc, port = start_server(app, not a.no_parsers, a.tokens, root)
    try:
        return http_cells(label, port, proc.pid, a)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- everything, interleaved -----------------------------------------------------------------

def subprocess_rows(cmd: list[str], cwd: Path, env: dict[str, str] | None = None
                    ) -> list[dict[str, Any]]:
    out = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def passthrough(a: argparse.Namespace) -> list[str]:
    return ["--conc", a.conc, "--tokens", str(a.tokens), "--total-tokens",
            str(a.total_tokens), "--repeats", str(a.repeats)] + ["--no-parsers"] * a.no_parsers


def compare(a: argparse.Namespace) -> None:
    roots = [Path(r).resolve() for r in a.root] or [ROOT]
    names = [("podium" if r == ROOT else r.name) for r in roots]
    peer = Path(a.peer).resolve()
    results: dict[tuple[str, int], list[float]] = {}

    def add(name: str, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            results.setdefault((name, r["conc"]), []).append(r["cpu_us_per_token_median"])

    concs = [int(x) for x in a.conc.split(",")]
    for run in range(a.runs):
        print(f"# run {run + 1}/{a.runs}, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
        if a.vllm_python:
            mode = ["--mode", "plain"] if a.no_parsers else ["--mode", "parsers", "--reasoning",
                                                             "qwen3"]
            add("vllm", subprocess_rows(
                [os.path.abspath(a.vllm_python), str(peer / "bench_vllm_frontend.py"), *mode, "--conc", a.conc,
                 "--tokens", str(a.tokens), "--total-tokens", str(a.total_tokens),
                 "--repeats", str(a.repeats)], peer))
        for name, root in zip(names, roots):
            env = dict(os.environ, PYTHONPATH=str(root))
            add(f"{name} in-process", subprocess_rows(
                [sys.executable, str(ROOT / "bench" / "frontend.py"), "inproc",
                 *passthrough(a)], root, env))
        if not a.no_http:
            for name, root in zip(names, roots):
                add(f"{name} HTTP", run_http(a, "podium", root, f"{name}-http"))
            add("floor HTTP", run_http(a, "floor", ROOT, "floor-http"))
    print(f"\nCPU µs per streamed token, median of {a.runs} processes [min-max] "
          f"({'plain' if a.no_parsers else 'hermes + <think> parsers'}, {a.tokens}-token "
          f"streams, one token per chunk); load average now {os.getloadavg()}")
    med = {k: statistics.median(v) for k, v in results.items()}
    print("| | " + " | ".join(f"c={c}" for c in concs) + " |")
    print("|---" * (len(concs) + 1) + "|")
    for name in dict.fromkeys(k[0] for k in results):
        cells = [f"{med[(name, c)]:.2f} [{min(results[(name, c)]):.2f}-"
                 f"{max(results[(name, c)]):.2f}]" for c in concs]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for name in names:
        if ("vllm", concs[0]) in med:
            print(f"| {name} in-process / vLLM | " + " | ".join(
                f"{med[(f'{name} in-process', c)] / med[('vllm', c)]:.3f}" for c in concs) + " |")
        if ("floor HTTP", concs[0]) in med:
            print(f"| {name} HTTP / floor | " + " | ".join(
                f"{med[(f'{name} HTTP', c)] / med[('floor HTTP', c)]:.2f}" for c in concs) + " |")
            print(f"| {name} HTTP / its c={concs[0]} | " + " | ".join(
                f"{med[(f'{name} HTTP', c)] / med[(f'{name} HTTP', concs[0])]:.2f}"
                for c in concs) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["inproc", "http", "compare", "serve"])
    p.add_argument("--conc", default="1,64,256")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--total-tokens", type=int, default=65536)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-parsers", action="store_true")
    p.add_argument("--check", action="store_true", help="inproc: print one decoded stream")
    p.add_argument("--runs", type=int, default=3, help="http/compare: processes per cell")
    p.add_argument("--root", action="append", default=[],
                   help="http/compare: measure this checkout's code (repeatable)")
    p.add_argument("--vllm-python", default=None, help="compare: the vLLM venv's python")
    p.add_argument("--peer", default=str(ROOT.parent / "shared" / "peer-vllm"))
    p.add_argument("--no-http", action="store_true", help="compare: in-process rows only")
    p.add_argument("--app", choices=["podium", "floor"], default="podium")
    p.add_argument("--port", type=int, default=8123)
    a = p.parse_args()
    if a.what == "inproc":
        run_inproc(a)
    elif a.what == "serve":
        serve(a)
    elif a.what == "http":
        roots = [Path(r).resolve() for r in a.root] or [ROOT]
        for _ in range(a.runs):
            for root in roots:
                run_http(a, "podium", root, f"{root.name}-http")
            run_http(a, "floor", ROOT, "floor-http")
    else:
        compare(a)


if __name__ == "__main__":
    main()
