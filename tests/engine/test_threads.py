"""How llama.cpp's threads wait reaches the OpenMP runtime llama.cpp loads: read back from
libgomp itself (``omp_display_env``), in fresh processes, so a dependency upgrade or an
import moved above the setting cannot silently undo it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from podium.engine.llamacpp import threads
from podium.settings import THREAD_WAITS, Settings

SHOW = ("import ctypes; ctypes.CDLL('libgomp.so.1').omp_display_env(1)")


def openmp(code: str, **env: str) -> dict[str, str]:
    """OpenMP's settings as libgomp reports them after ``code`` ran in a fresh process with
    ``env`` (the runner's own OpenMP and Podium variables removed first)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", threads.ENV, threads.MARK)}
    done = subprocess.run([sys.executable, "-c", f"{code}\n{SHOW}"], env={**base, **env},
                          capture_output=True, text=True, timeout=120)
    assert "OPENMP DISPLAY ENVIRONMENT" in done.stderr, done.stderr[-2000:]
    out = {}
    for line in done.stderr.splitlines():
        name, eq, value = line.strip().partition(" = ")
        if eq:
            out[name] = value.strip("'")
    return out


ENGINE = "import podium.engine.llamacpp.model, llama_cpp; llama_cpp.llama_backend_init()"


def test_the_default_wait_reaches_llama_cpps_openmp():
    shown = openmp(ENGINE)
    assert shown["GOMP_SPINCOUNT"] == threads.BRIEF_SPINS == "300"
    assert threads.DEFAULT == Settings().thread_wait == "brief"


@pytest.mark.parametrize("wait, policy, spins", [
    ("sleep", "PASSIVE", "0"), ("brief", "PASSIVE", "300"), ("openmp", "PASSIVE", "300000")])
def test_each_wait_reaches_it(wait, policy, spins):
    # (libgomp shows PASSIVE for any wait that is not ACTIVE; the spins tell them apart)
    shown = openmp(ENGINE, PODIUM_THREAD_WAIT=wait)
    assert (shown["OMP_WAIT_POLICY"], shown["GOMP_SPINCOUNT"]) == (policy, spins)


def test_spin_reaches_it():
    assert openmp(ENGINE, PODIUM_THREAD_WAIT="spin")["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_users_own_openmp_variables_win():
    shown = openmp(ENGINE, OMP_WAIT_POLICY="ACTIVE", PODIUM_THREAD_WAIT="sleep")
    assert shown["OMP_WAIT_POLICY"] == "ACTIVE"
    assert openmp(ENGINE, GOMP_SPINCOUNT="1234")["GOMP_SPINCOUNT"] == "1234"


def test_podium_serve_sets_it_before_llama_cpp_loads(tmp_path):
    """``--thread-wait`` is applied by the serve path before anything loads llama.cpp (the
    model here does not exist: the start fails before a model loads, and llama.cpp, with
    its OpenMP, is loaded after it, as a model's load would)."""
    code = ("import sys\nfrom podium.cli import main\n"
            f"main(['serve', '--thread-wait', 'sleep', '--model', '{tmp_path}/none.gguf'])\n"
            "assert 'llama_cpp' not in sys.modules\nimport llama_cpp")
    assert openmp(code)["GOMP_SPINCOUNT"] == "0"


def test_a_second_choice_replaces_podiums_first(monkeypatch):
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", threads.ENV, threads.MARK):
        monkeypatch.delenv(name, raising=False)
    assert threads.configure() == {"GOMP_SPINCOUNT": "300"}
    assert threads.configure("spin") == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.setenv("GOMP_SPINCOUNT", "77")            # the user's, beside Podium's
    assert threads.configure("sleep") == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "77"}


def test_the_settings_waits_are_the_engines():
    assert set(THREAD_WAITS) == set(threads.WAITS)
    with pytest.raises(ValueError, match="thread-wait"):
        Settings(thread_wait="nap")
    with pytest.raises(ValueError, match="thread-wait"):
        threads.configure("nap")
