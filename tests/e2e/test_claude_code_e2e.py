"""A real agent client: Claude Code completes turns against Podium on the default model.

Claude Code (``claude -p``) speaks the Messages API: one streamed ``POST /v1/messages?beta=true``
per turn with ``claude-opus-5-5`` as the model (served through ``--model-alias 'claude-*=...'``),
a 7k-character system prompt, an inline ``system`` message after the user's, and 12 tools
(about 11.7k tokens in all), with ``thinking``, ``context_management`` and ``output_config``;
tests/data/claude_code/ holds what it sends. The first turn's prefill takes minutes on two
cores, longer than the 300 s Claude Code waits for a byte, so Podium's pings keep the stream
alive. Its debug file (``--debug-file``) reports retries, the non-streaming fallback and idle
streams; none may appear. Both tests share one home and working directory, so the second
reuses the first's prefill of the system prompt and tools. The CLI comes from the npm
registry (cached between runs): a native binary in a platform package.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import MODEL, _free_port, npm_package

CLAUDE_CODE_VERSION = "2.1.330"
TURN_SECONDS = 900

# Both runs: temperature 0 (through CLAUDE_CODE_EXTRA_BODY; Claude Code sends none, so 1
# applied, and the first run's "hello" once rambled for 2,123 tokens: 375 s at 11.7k tokens of
# context), and the event-level idle watchdog at its longest, 30 min: on a CPU where the first
# prefill passes 150 s (531 s on this project's 2-core AVX2 machine) Claude Code warns that
# no chunk came (pings are bytes, not events, to that watchdog). Its byte watchdog (300 s),
# which Podium's pings feed, keeps its default.
PATIENT = {"CLAUDE_CODE_EXTRA_BODY": '{"temperature": 0}',
           "CLAUDE_STREAM_IDLE_TIMEOUT_MS": "1800000"}

# Debug-file lines that mean a request was retried, fell back to a non-streamed request, or a
# stream was abandoned (tests/data/claude_code/requests.md has their full wording).
TROUBLE = ("API error (attempt", "falling back to non-streaming", "non-streaming fallback",
           "Streaming idle timeout", "Streaming idle warning", "stream_idle_partial",
           "Stream ended before the response was complete", "Error in API request")


def claude_binary() -> Path:
    root = npm_package(f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}",
                       f"claude-code-{CLAUDE_CODE_VERSION}", "Claude Code")
    return root / "node_modules" / ".bin" / "claude"


@pytest.fixture(scope="module")
def claude_server(tmp_path_factory):
    """``podium serve`` as a user starts it for Claude Code: defaults plus the claude-* alias."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("claude-server") / "server.log"
    env = {**os.environ, "PODIUM_DATA_DIR": str(log_path.parent)}
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "podium", "serve", "--port", str(port),
                                 "--model-alias", f"claude-*={MODEL}"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            pytest.fail(f"podium serve exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    yield url, log_path
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def claude_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """A throwaway home and a working directory with hello.txt, shared by the module's runs:
    the system prompt names both, so sharing them lets later runs reuse the first prefill."""
    root = tmp_path_factory.mktemp("claude")
    home, work = root / "home", root / "work"
    home.mkdir()
    work.mkdir()
    (work / "hello.txt").write_text("The secret word is pineapple.\n")
    return home, work


def run_claude(url: str, dirs: tuple[Path, Path], debug: Path, prompt: str, *args: str,
               timeout: float, env: dict | None = None) -> tuple[subprocess.CompletedProcess,
                                                                   list[dict], str]:
    """``claude -p PROMPT --output-format stream-json`` in the shared working directory: its
    exit, its messages (the last is the result) and its debug file."""
    home, work = dirs
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("ANTHROPIC", "CLAUDE", "OPENAI"))}
    clean.update(HOME=str(home), CLAUDE_CONFIG_DIR=str(home / ".claude"), TERM="dumb",
                 ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="unused",
                 DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
                 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", **(env or {}))
    result = subprocess.run([str(claude_binary()), "-p", prompt, "--output-format",
                             "stream-json", "--verbose", "--debug-file", str(debug), *args],
                            cwd=work, env=clean, capture_output=True, text=True,
                            timeout=timeout, stdin=subprocess.DEVNULL)
    messages = []
    for line in result.stdout.splitlines():
        try:
            messages.append(json.loads(line))
        except ValueError:
            pass
    return result, messages, debug.read_text() if debug.exists() else ""


def messages_requests(log_path: Path) -> list[str]:
    return [line for line in log_path.read_text().splitlines()
            if "podium.access" in line and 'endpoint="/v1/messages"' in line]


def blocks(messages: list[dict], role: str, kind: str) -> list[dict]:
    """The content blocks of one kind in the run's messages of one role."""
    return [block for m in messages if m.get("type") == role
            for block in m["message"]["content"]
            if isinstance(block, dict) and block.get("type") == kind]


def explain(result, debug: str, log_path: Path) -> str:
    lines = [line for line in debug.splitlines()
             if "[ERROR]" in line or "[WARN]" in line or "API" in line or "turn " in line
             or "tool_dispatch" in line]
    return (f"exit {result.returncode}\nstdout: {result.stdout[-4000:]}\nstderr: "
            f"{result.stderr[-3000:]}\ndebug:\n" + "\n".join(lines[-40:])
            + "\nserver:\n" + "\n".join(log_path.read_text().splitlines()[-20:]))


def test_claude_print_completes_a_turn(claude_server, claude_dirs, tmp_path):
    url, log_path = claude_server
    before = len(messages_requests(log_path))
    result, messages, debug = run_claude(url, claude_dirs, tmp_path / "debug.log",
                                         "Say hello in one short sentence.", "--max-turns", "2",
                                         timeout=2 * TURN_SECONDS, env=PATIENT)
    why = explain(result, debug, log_path)
    outcome = messages[-1] if messages else {}
    assert result.returncode == 0, why
    assert outcome.get("type") == "result" and outcome.get("subtype") == "success", why
    assert outcome["is_error"] is False and outcome.get("api_error_status") is None, why
    assert outcome["result"].strip(), why                       # the agent's final message
    assert "API Error" not in result.stdout + result.stderr, why
    for trouble in TROUBLE:                                     # nothing retried or refetched
        assert trouble not in debug, why
    requests = messages_requests(log_path)[before:]
    assert len(requests) == outcome["num_turns"], why           # one request per turn
    assert all("status=200" in line for line in requests), why


def test_claude_reads_a_file_with_a_tool(claude_server, claude_dirs, tmp_path):
    """A turn where the model calls Read, Claude Code runs it and sends the tool_result.

    The 0.5B model at Claude Code's temperature (1, as it sends none) rarely calls a tool in
    so long a prompt, and mangles names and paths when it does; at temperature 0 (set through
    CLAUDE_CODE_EXTRA_BODY) and with the call spelled out it calls Read on hello.txt every time,
    then calls it again after the result, so the run stops at --max-turns 2."""
    url, log_path = claude_server
    before = len(messages_requests(log_path))
    result, messages, debug = run_claude(
        url, claude_dirs, tmp_path / "debug.log",
        'Read the file hello.txt. Reply with exactly this and nothing else: <tool_call>'
        '{"name": "Read", "arguments": {"file_path": "hello.txt"}}</tool_call>',
        "--max-turns", "2", timeout=2 * TURN_SECONDS, env=PATIENT)
    why = explain(result, debug, log_path)
    outcome = messages[-1] if messages else {}
    uses = blocks(messages, "assistant", "tool_use")
    assert uses and uses[0]["name"] == "Read", why              # Podium answered a tool_use
    assert "tool_dispatch_start tool=Read" in debug, why        # ... that Claude Code ran
    results = blocks(messages, "user", "tool_result")
    assert results and results[0]["tool_use_id"] == uses[0]["id"], why
    assert "pineapple" in str(results[0]["content"]), why       # the file, read
    requests = messages_requests(log_path)[before:]
    assert len(requests) >= 2, why                              # the tool_result turn followed
    assert all("status=200" in line for line in requests), why
    assert outcome.get("type") == "result", why
    assert outcome.get("subtype") in ("success", "error_max_turns"), why
    assert outcome.get("api_error_status") is None, why
    assert result.returncode == (0 if outcome["subtype"] == "success" else 1), why
    for trouble in TROUBLE:
        assert trouble not in debug, why
