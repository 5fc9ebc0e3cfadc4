"""Ollama's model routes: ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, ``HEAD /``,
``/api/embed`` and ``/api/embeddings``; the model-file routes answer that Podium serves the
models it is configured with."""

from __future__ import annotations

from fastapi import FastAPI


def routes(app: FastAPI) -> None:
    """Adds Ollama's model and embedding routes to the app."""
