"""A real agent client: the Codex CLI completes a turn against Podium on the default model.

Codex speaks the Responses API with ``stream: true`` and ``store: false``, sends about 8k
tokens of instructions and a dozen tools (about 10k tokens in all: more than an 8k context) (``web_search`` among them, which Podium leaves out).
The first turn gives Codex an idle limit far shorter than that prompt's cold prefill:
Podium's keepalive events must carry the stream; the second, Codex's own defaults.
The CLI comes from the npm registry (cached between runs); this machine kind has npm.
"""

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.e2e.conftest import MODEL, _free_port, npm_package

CODEX_VERSION = "0.169.0"


def codex_binary() -> Path:
    root = npm_package(f"@openai/codex@{CODEX_VERSION}", f"codex-{CODEX_VERSION}", "Codex")
    return root / "node_modules" / ".bin" / "codex"


@contextlib.contextmanager
def serve(log_path: Path, *args: str) -> Iterator[str]:
    """``podium serve ARGS`` on a free port, its output in ``log_path``; its URL."""
    port = _free_port()
    env = {**os.environ, "PODIUM_DATA_DIR": str(log_path.parent)}
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "podium", "serve", "--port", str(port),
                                 *args], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    """``podium serve`` exactly as a user starts it: default model, default settings."""
    log_path = tmp_path_factory.mktemp("codex-server") / "server.log"
    with serve(log_path) as url:
        yield url, log_path


def codex_turn(url: str, tmp_path: Path, provider: str = "") -> str:
    """``codex exec`` of one short task against ``url`` (``provider``: more lines of its
    model provider's config); its output, once it has exited 0 with an answer and without
    a stream error, a context-window complaint or a retry."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(f'''
model = "{MODEL}"
model_provider = "podium"
approval_policy = "never"
sandbox_mode = "read-only"

[model_providers.podium]
name = "Podium"
base_url = "{url}/v1"
wire_api = "responses"
{provider}
''')
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    env["CODEX_HOME"] = str(home)
    result = subprocess.run([str(codex_binary()), "exec", "--skip-git-repo-check",
                             "Say hello in one short sentence."], cwd=work, env=env,
                            capture_output=True, text=True, timeout=900,
                            stdin=subprocess.DEVNULL)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "tokens used" in output
    assert "stream error" not in output.lower() and "unexpected status" not in output.lower()
    assert "context window" not in output.lower()           # the defaults hold its prompt
    assert "reconnecting" not in output.lower()             # nothing was retried
    assert result.stdout.strip()            # the agent's final message
    return output


def access_lines(log_path: Path) -> list[str]:
    """Podium's access-log lines for Codex's requests; each one a 200."""
    requests = [line for line in log_path.read_text().splitlines()
                if "podium.access" in line and 'endpoint="/v1/responses"' in line]
    assert requests and all("status=200" in line for line in requests), requests
    return requests


def test_a_prefill_longer_than_codexs_idle_limit_is_kept_alive(default_server, tmp_path):
    """Codex drops a stream that sends no SSE event for ``stream_idle_timeout_ms`` (300 s by
    default; comments do not count) and sends the request again. Its first request (about
    10k tokens) on a fresh server takes minutes to prefill on two cores, far longer than the
    30 s given here; keepalive events (every 10 s by default) carry it through: answered, no
    reconnect. It runs first in this module, so its prefill is the cold one; the next test
    reuses it from the server's cache (one cold prefill of Codex's prompt per CI run)."""
    url, log_path = default_server
    try:
        codex_turn(url, tmp_path, "stream_idle_timeout_ms = 30000")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n-- podium serve:\n{log_path.read_text()[-4000:]}")
    first = access_lines(log_path)[0]         # the module's first request
    ttft = float(re.search(r"ttft_ms=([0-9.]+)", first).group(1))
    assert ttft > 30_000, first     # the first token came after Codex's idle limit


def test_codex_exec_completes_a_turn_on_the_defaults(default_server, tmp_path):
    url, log_path = default_server
    codex_turn(url, tmp_path)
    access_lines(log_path)
