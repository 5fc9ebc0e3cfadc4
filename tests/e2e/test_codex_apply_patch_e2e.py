"""Codex's own ``apply_patch`` custom tool against Podium on the default model (issue 40).

Codex sends ``apply_patch`` as a custom tool (a Lark grammar of its patch format) to a model
its catalog marks ``apply_patch_tool_type = "freeform"`` (README, "Custom tools"). The pinned
Codex's first request is taken from the CLI itself, through a local endpoint that keeps it
and answers 400 (about a second), so the tool and its grammar are always that version's.

- The tool, exactly as Codex sent it, forced through the ``openai`` SDK (Responses, streamed):
  the call's input parses under Codex's grammar with the ``lark`` package, and Codex's binary
  applies it (``codex --codex-run-as-apply-patch PATCH``, what its ``apply_patch`` alias runs)
  in an empty folder, leaving exactly the files the patch adds.

A whole ``codex exec`` loop that applies a call is not tested: the default 0.5B model seldom
chooses ``apply_patch`` under Codex's ``tool_choice: auto`` (it writes the call as a fenced
JSON answer), and with the tool forced on Codex's first request its patch was often cut by
any token limit short enough for CI (Codex's prompt, holding the date and folder, differs
each run, so the answer does too).

One server for the module, on its defaults (Codex's prompt needs more than 4k tokens of
context). The CLI comes from the npm registry (cached between runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

import httpx
import openai
import pytest
from lark import Lark, Tree
from lark.exceptions import LarkError

from tests.e2e.conftest import MODEL
from tests.e2e.test_codex_e2e import codex_binary, serve

TASK = "Create a file hello.txt containing the line hi."

# Codex 0.169.0's required catalog keys (README); "disabled" offers no shell tool, so a file
# edit can only be an apply_patch call, and the model runs no command on the test machine.
CATALOG_MODEL = {
    "slug": MODEL, "display_name": MODEL, "apply_patch_tool_type": "freeform",
    "base_instructions": "You are a coding agent. You edit files with the apply_patch tool.",
    "context_window": 32768, "supported_reasoning_levels": [], "shell_type": "disabled",
    "visibility": "list", "supported_in_api": True, "priority": 1, "support_verbosity": False,
    "truncation_policy": {"mode": "tokens", "limit": 10000}, "experimental_supported_tools": []}


# --- a recording endpoint between Codex and Podium ----------------------------------------

@dataclass
class Recorded:
    url: str
    requests: list[dict] = field(default_factory=list)        # each POST body, as sent
    answers: list[tuple[int, bytes]] = field(default_factory=list)   # status, body relayed


@contextlib.contextmanager
def recorder(upstream: str | None = None,
             rewrite: Callable[[dict], dict] = lambda body: body) -> Iterator[Recorded]:
    """A local endpoint that keeps each JSON body POSTed to it. With no ``upstream`` it answers
    400; else it relays the request (as ``rewrite`` makes it) and streams the answer back as
    it comes, keeping it too."""
    recorded = Recorded("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            recorded.requests.append(body)
            if upstream is None:
                return self.answer(400, b'{"error": {"message": "recorded", '
                                        b'"type": "invalid_request_error"}}')
            with httpx.stream("POST", upstream + self.path, json=rewrite(body),
                              timeout=httpx.Timeout(60, read=900)) as reply:
                self.send_response(reply.status_code)
                self.send_header("Content-Type", reply.headers.get("content-type", ""))
                self.end_headers()          # HTTP/1.0: the body ends when the socket closes
                chunks = []
                for chunk in reply.iter_raw():
                    chunks.append(chunk)
                    self.wfile.write(chunk)
                    self.wfile.flush()
            recorded.answers.append((reply.status_code, b"".join(chunks)))

        def answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recorded.url = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorded
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def codex_exec(url: str, tmp_path: Path, prompt: str) -> subprocess.CompletedProcess:
    """``codex exec PROMPT`` against ``url`` with the catalog above, in an empty folder
    ``tmp_path/work``; no retries, so one failed request ends it."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "models.json").write_text(json.dumps({"models": [CATALOG_MODEL]}))
    (home / "config.toml").write_text(f'''
model = "{MODEL}"
model_provider = "podium"
approval_policy = "never"
sandbox_mode = "workspace-write"
model_catalog_json = "{home / 'models.json'}"

[model_providers.podium]
name = "Podium"
base_url = "{url}/v1"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
''')
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    env["CODEX_HOME"] = str(home)
    return subprocess.run([str(codex_binary()), "exec", "--skip-git-repo-check", prompt],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)


# --- Codex's grammar, read with lark ------------------------------------------------------

def apply_patch_tool(request: dict) -> dict:
    [tool] = [t for t in request["tools"] if t.get("name") == "apply_patch"]
    return tool


def patch_parser(tool: dict) -> Lark:
    """Codex's patch grammar as the tool carries it. lark's Earley lexer refuses a terminal
    that can match nothing, so a line's text ``/(.*)/`` is written ``/(.+)/?``: the same
    language."""
    definition = tool["format"]["definition"]
    assert "/(.*)/" in definition, definition     # else Codex changed it: look again
    return Lark(definition.replace("/(.*)/", "/(.+)/?"))


def added_files(tree: Tree) -> dict[str, str]:
    """The files a parsed patch adds, by name, with the text it gives them (each ``+`` line's
    text and its newline). Any other hunk (update, delete) is refused: the folder is empty."""
    kinds = [hunk.children[0].data for hunk in tree.find_data("hunk")]
    assert kinds and all(kind == "add_hunk" for kind in kinds), tree.pretty()
    files = {}
    for hunk in tree.find_data("add_hunk"):
        [name] = next(hunk.find_data("filename")).children
        files[str(name)] = "".join(str(token) for line in hunk.find_data("line")
                                   for token in line.children)
    return files


def output_items(sse: bytes) -> list[dict]:
    """The finished output items of a Responses event stream."""
    items = []
    for line in sse.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            event = json.loads(line[len("data: "):])
            if event.get("type") == "response.output_item.done":
                items.append(event["item"])
    return items


# --- fixtures -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def codex_request(tmp_path_factory) -> dict:
    """The first request the pinned Codex sends with the catalog above (about a second)."""
    with recorder() as recorded:
        result = codex_exec(recorded.url, tmp_path_factory.mktemp("codex-request"), TASK)
    assert recorded.requests, result.stdout + result.stderr
    return recorded.requests[0]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """``podium serve`` on its defaults; its URL and log."""
    log_path = tmp_path_factory.mktemp("codex-patch-server") / "server.log"
    with serve(log_path) as url:
        yield url, log_path


# --- tests ------------------------------------------------------------------------------------

def test_codex_sends_apply_patch_as_a_lark_custom_tool(codex_request):
    tool = apply_patch_tool(codex_request)
    assert tool["type"] == "custom" and tool["format"]["type"] == "grammar"
    assert tool["format"]["syntax"] == "lark"
    assert codex_request["tool_choice"] == "auto" and codex_request["stream"] is True
    parser = patch_parser(tool)             # lark reads it, and it has teeth
    parser.parse("*** Begin Patch\n*** Add File: a.txt\n+a\n*** End Patch\n")
    with pytest.raises(LarkError):
        parser.parse("*** Begin Patch\na\n*** End Patch\n")


def test_a_forced_apply_patch_parses_and_codex_applies_it(codex_request, server, tmp_path):
    url, _ = server
    tool = apply_patch_tool(codex_request)
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        with client.responses.stream(model=MODEL, input=TASK, tools=[tool], temperature=0,
                                     tool_choice={"type": "custom", "name": "apply_patch"},
                                     max_output_tokens=400) as stream:
            events = list(stream)
            final = stream.get_final_response()
    [call] = [item for item in final.output if item.type == "custom_tool_call"]
    deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    assert call.name == "apply_patch" and call.call_id and deltas == call.input
    files = added_files(patch_parser(tool).parse(call.input))
    for name in files:         # Codex would write outside the folder otherwise
        assert not PurePosixPath(name).is_absolute() and ".." not in PurePosixPath(name).parts

    work = tmp_path / "work"
    work.mkdir()
    applied = subprocess.run([str(codex_binary()), "--codex-run-as-apply-patch", call.input],
                             cwd=work, capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, applied.stdout + applied.stderr + call.input
    written = {str(p.relative_to(work)): p.read_text() for p in work.rglob("*") if p.is_file()}
    assert written == files, call.input
