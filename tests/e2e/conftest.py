"""One real ``podium serve`` on the default model for the whole session, driven by openai."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

MODEL = "qwen2.5-coder-0.5b-instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server_url():
    port = _free_port()
    # No --model: the default model, exactly as a user starts it.
    proc = subprocess.Popen([sys.executable, "-m", "podium", "serve", "--port", str(port),
                             "--ctx-size", "4096", "--log-level", "warning"],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"podium serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("podium serve did not become healthy in 120 s")
        time.sleep(0.2)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def client(server_url) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)
    yield client
    client.close()
