"""Stopping the real server: streams end properly, no traceback, state left for the next start."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.e2e.conftest import MODEL, _free_port


def start(tmp_path, *extra):
    port = _free_port()
    env = {**os.environ, "PODIUM_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "podium", "serve", "--port", str(port),
                             "--ctx-size", "2048", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    pytest.fail("server did not start")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_ends_streams_in_band_and_exits_cleanly(tmp_path, sig):
    proc, url = start(tmp_path, "--shutdown-grace", "1")
    lines, first = [], threading.Event()
    body = {"model": MODEL, "stream": True, "max_tokens": 1500,
            "logit_bias": {"151645": -100, "151643": -100},
            "messages": [{"role": "user", "content": "Write a very long essay."}]}

    def stream():
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    first.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert first.wait(60)
    proc.send_signal(sig)
    reader.join(60)
    output, _ = proc.communicate(timeout=60)
    # uvicorn re-raises a captured SIGTERM after its clean shutdown (the conventional exit
    # status of a terminated process); Ctrl-C ends with status 0
    assert proc.returncode in (0, -sig), output
    assert "Traceback" not in output
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][len("data: "):])["error"]
    assert error["code"] == "server_shutting_down"


def test_stop_signal_ends_a_non_streamed_request_after_the_grace_period(tmp_path):
    """A non-streamed request still generating when SIGTERM comes is ended with a 503 once
    the grace period is over (not generated to max_tokens while the server waits)."""
    proc, url = start(tmp_path, "--shutdown-grace", "1")
    answer, asked = {}, threading.Event()
    body = {"model": MODEL, "max_tokens": 1500, "logit_bias": {"151645": -100, "151643": -100},
            "messages": [{"role": "user", "content": "Write a very long essay."}]}

    def ask():
        asked.set()
        answer["r"] = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)

    asker = threading.Thread(target=ask)
    asker.start()
    assert asked.wait(5)
    for _ in range(100):                       # until the engine is generating for it
        if httpx.get(f"{url}/health").json()["engine"]["running"] == 1:
            break
        time.sleep(0.1)
    time.sleep(0.5)
    begun = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    asker.join(60)
    output, _ = proc.communicate(timeout=60)
    assert time.monotonic() - begun < 10, output        # 1,500 tokens would take ~40 s
    assert proc.returncode in (0, -signal.SIGTERM), output
    assert "Traceback" not in output
    r = answer["r"]
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down"


def test_stop_signal_while_idle_exits_promptly(tmp_path):
    """A stop signal ends an idle server at once, both right after traffic and once it has
    been idle a while."""
    for wait in (0.5, 4.0):
        proc, url = start(tmp_path)
        assert httpx.get(f"{url}/v1/models").status_code == 200
        time.sleep(wait)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
        assert time.monotonic() - started < 5, output
        assert proc.returncode in (0, -signal.SIGTERM), output
        assert "Traceback" not in output
