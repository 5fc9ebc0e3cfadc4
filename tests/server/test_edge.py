"""The layers import downward only: the protocol layer (wire models) nothing of the
adapters (podium.api) or the edge (podium.server), and the edge's route modules the shared
helpers (podium/server/edge.py), never the app factory: no import circle through the edge.

Each check imports in a fresh interpreter, so what the test session imported already does
not hide an import."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import podium.protocol

PROTOCOL = sorted(f"podium.protocol.{m.name}" for m in pkgutil.iter_modules(
    podium.protocol.__path__))


def imported_by(*modules: str) -> list[str]:
    """The podium modules a fresh interpreter holds after importing ``modules``."""
    code = ("import importlib, json, sys\n"
            f"for name in {list(modules)!r}: importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('podium'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout)


def test_the_protocol_layer_imports_nothing_above_it():
    assert "podium.protocol.ollama" in PROTOCOL and len(PROTOCOL) > 10
    loaded = imported_by(*PROTOCOL)
    assert set(PROTOCOL) <= set(loaded)
    above = [m for m in loaded if m.startswith(("podium.server", "podium.api"))]
    assert above == [], above


def test_route_modules_share_the_edge_not_the_app():
    routes = [f"podium.server.{m}" for m in ("batches", "files", "ollama_chat",
                                              "ollama_models", "ops")]
    loaded = imported_by(*routes)
    assert "podium.server.edge" in loaded and "podium.server.app" not in loaded
