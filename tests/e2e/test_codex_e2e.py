"""A real agent client: the Codex CLI completes a turn against Podium on the default model.

Codex speaks the Responses API with ``stream: true`` and ``store: false``, sends about 8k
tokens of instructions and a dozen tools (about 10k tokens in all: more than an 8k context) (``web_search`` among them, which Podium leaves out).
The CLI comes from the npm registry (cached between runs); this machine kind has npm.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import MODEL, _free_port

CODEX_VERSION = "0.169.0"


def codex_binary() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "podium-tests" / f"codex-{CODEX_VERSION}"
    binary = root / "node_modules" / ".bin" / "codex"
    if not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("The Codex test needs npm (Debian: apt-get install npm)")
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(root),
                        f"@openai/codex@{CODEX_VERSION}"], check=True, timeout=600,
                       capture_output=True)
    return binary


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    """``podium serve`` exactly as a user starts it: default model, default settings."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("codex-server") / "server.log"
    env = {**os.environ, "PODIUM_DATA_DIR": str(log_path.parent)}
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "podium", "serve", "--port", str(port)],
                                env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    yield url, log_path
    proc.terminate()
    proc.wait(timeout=30)


def test_codex_exec_completes_a_turn_on_the_defaults(default_server, tmp_path):
    url, log_path = default_server
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
    requests = [line for line in log_path.read_text().splitlines()
                if "podium.access" in line and 'endpoint="/v1/responses"' in line]
    assert requests and all("status=200" in line for line in requests), requests
    assert result.stdout.strip()            # the agent's final message
