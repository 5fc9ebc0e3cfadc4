"""The test suite itself: it never writes into the user's data directory, not even while
collecting (tests/server/test_fuzz.py builds its app when its module is imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_collecting_writes_nothing_in_the_users_data_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PODIUM_DATA_DIR"}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")   # where the user's podium.db would go
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "tests/server/test_fuzz.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert not (tmp_path / "data").exists(), sorted(p.name for p in (tmp_path / "data").rglob("*"))
