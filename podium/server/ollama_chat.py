"""Ollama's generation routes: ``POST /api/chat`` and ``POST /api/generate`` (NDJSON streams)."""

from __future__ import annotations

from fastapi import FastAPI


def routes(app: FastAPI) -> None:
    """Adds Ollama's generation routes to the app."""
