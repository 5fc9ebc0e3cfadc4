"""One real ``podium serve`` on the default model for the whole session, driven by openai."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

MODEL = "qwen2.5-coder-0.5b-instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def podium_serve(*args: str, timeout: float = 120) -> Iterator[str]:
    """``podium serve ARGS`` on a free port until healthy (its URL), stopped afterwards."""
    with podium_process(*args, timeout=timeout) as (url, _):
        yield url


@contextlib.contextmanager
def podium_process(*args: str, timeout: float = 120
                   ) -> Iterator[tuple[str, subprocess.Popen]]:
    """``podium_serve``, giving its process too (to kill it)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "podium", "serve", "--port", str(port),
                             *args], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"podium serve {' '.join(args)} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"podium serve {' '.join(args)} did not become healthy in {timeout} s")
        time.sleep(0.2)
    try:
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def server_url():
    # No --model: the default model, exactly as a user starts it.
    with podium_serve("--ctx-size", "4096", "--log-level", "warning") as url:
        yield url


@pytest.fixture(scope="session")
def client(server_url) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)
    yield client
    client.close()


def npm_package(spec: str, folder: str, what: str) -> Path:
    """An npm package (``spec``: name@version, pinned) installed once into the tests' cache
    folder ``folder`` (kept between runs); that folder. ``what`` names the test that needs npm."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "podium-tests" / folder
    name = spec.rsplit("@", 1)[0]
    if not (root / "node_modules" / name / "package.json").exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail(f"The {what} test needs npm (Debian: apt-get install npm)")
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(root), spec],
                       check=True, timeout=600, capture_output=True)
    return root
