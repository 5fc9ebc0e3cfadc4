"""The operator's routes: the models (list, card, load, unload), health, readiness, metrics.

Listing models and reading health are every client's; loading and unloading are the
operator's (``edge.require_operator``: an admin key when keys are set), since every key's
requests share a model. ``gauges`` are the per-model figures ``/metrics`` reads at scrape
time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import PlainTextResponse, Response

from podium.engine.draft import SOURCES as DRAFT_SOURCES
from podium.models import Entry, Models
from podium.server.edge import (ERRORS, OPERATOR, json_response, json_response_status,
                                models_of, require_operator)
from podium.server.served import Served
from podium.server.watch import unless_gone
from podium.store.batches import STATUSES as BATCH_STATUSES, BatchStore
from podium.store.sql import SQLStore
from podium.telemetry import Labelled, ModelLabelled

_STARTED = int(time.time())


def gauges(models: Models, store: SQLStore, batches: BatchStore) -> dict[str, Any]:
    """Per model (labelled), read at scrape time: its engine's load, its loads, its draft
    tokens by source (where its engine drafts); batches by status and their requests
    queued (on every replica: the database's)."""
    by: dict[str, dict[str, float]] = {name: {} for name in (
        "running_sequences", "queued_sequences", "kv_cache_usage_ratio", "model_loaded",
        "model_active_requests", "model_loads_total", "model_unloads_total",
        "model_load_seconds_total", *(f"prompt_cache_{name}" for name in PROMPT_CACHE))}
    drafted: dict[str, dict[str, float]] = {}
    accepted: dict[str, dict[str, float]] = {}
    rejected: dict[str, dict[str, float]] = {}
    for entry in models.entries():
        stats = entry.engine.engine.stats if entry.state == "loaded" else {}
        for source, (made, kept) in _drafts(stats).items():
            drafted.setdefault(entry.name, {})[source] = made
            accepted.setdefault(entry.name, {})[source] = kept
            rejected.setdefault(entry.name, {})[source] = made - kept
        for name, value in (
                ("running_sequences", stats.get("running", 0)),
                ("queued_sequences", stats.get("waiting", 0)),
                ("kv_cache_usage_ratio", stats.get("kv_tokens", 0)
                 / max(1, stats.get("kv_capacity", 1))),
                ("model_loaded", float(entry.state == "loaded")),
                ("model_active_requests", entry.active), ("model_loads_total", entry.loads),
                ("model_unloads_total", entry.unloads),
                ("model_load_seconds_total", entry.load_seconds)):
            by[name][entry.name] = value
        cache = _prompt_cache(entry)
        for name, stat in PROMPT_CACHE.items():
            by[f"prompt_cache_{name}"][entry.name] = cache.get(stat, 0)
    by_status, queued = batches.figures()
    return {**by, "draft_tokens_drafted_total": ModelLabelled("source", drafted),
            "draft_tokens_accepted_total": ModelLabelled("source", accepted),
            "draft_tokens_rejected_total": ModelLabelled("source", rejected),
            "stored_responses": store.count(),
            "batches": Labelled("status", {s: by_status.get(s, 0) for s in BATCH_STATUSES}),
            "batch_requests_queued": queued}


# the prompt cache's figures /metrics reads, by the names it gives them: the disk tier's
# (hits: loads read from a file), the memory tier's (memory_*), loads neither tier served
# (misses) and tokens restored from either; seconds spent reading entries (either tier) and
# writing files (the cache's threads), and copying states into llama.cpp (restore) and out
# of it (copy: on the decode thread)
PROMPT_CACHE = {"bytes": "bytes", "entries": "entries", "hits_total": "hits",
                "memory_bytes": "memory_bytes", "memory_entries": "memory_entries",
                "memory_hits_total": "memory_hits", "misses_total": "misses",
                "restored_tokens_total": "restored_tokens",
                "read_seconds_total": "read_seconds", "write_seconds_total": "write_seconds",
                "restore_seconds_total": "restore_seconds",
                "copy_seconds_total": "copy_seconds"}


def _prompt_cache(entry: Entry) -> dict[str, float]:
    """A loaded llama.cpp model's prompt cache figures (per tier, disk and memory_*: bytes,
    entries, hits; misses, tokens restored instead of prefilled); {} for others."""
    if entry.state != "loaded":
        return {}
    engine = entry.engine.engine
    cache = getattr(engine, "prompt_cache", None)
    if cache is None:
        return {}
    stats = {**cache.stats, "restored_tokens": engine.stats["restored_tokens"],
             "restore_us": engine.stats.get("restore_us", 0),
             "copy_us": engine.stats.get("copy_us", 0)}
    return {(name[:-3] + "_seconds" if name.endswith("_us") else name):
            (value / 1e6 if name.endswith("_us") else value) for name, value in stats.items()}


def _drafts(stats: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """Speculative decoding's draft tokens since the load, (drafted, accepted) by source,
    from an engine that counts them (the llama.cpp engine's; others: none)."""
    return {source: (stats[f"drafted_{source}"], stats[f"accepted_{source}"])
            for source in DRAFT_SOURCES if f"drafted_{source}" in stats}


def _draft_acceptance(stats: Mapping[str, int]) -> float | None:
    """The share of draft tokens accepted, every source together; None: none drafted."""
    counts = _drafts(stats).values()
    made = sum(made for made, _ in counts)
    return round(sum(kept for _, kept in counts) / made, 3) if made else None


def model_card(entry: Entry, asked: str | None = None) -> dict[str, Any]:
    """OpenAI's model object (``asked``: the name or alias the client used) plus what
    Podium knows of it: state, kind, memory, how far a load under way is
    (``load_progress``, 0..1; null where its engine does not say), and why its last load
    failed."""
    served: Served | None = entry.engine if entry.state == "loaded" else None
    card = {"id": asked or entry.name, "object": "model",
            "created": served.engine.info.created if served else _STARTED,
            "owned_by": "podium", "state": entry.state, "kind": entry.config.kind,
            "memory_estimate": entry.config.estimate or None,
            "resident_memory": served.resident if served else None}
    if entry.state == "loading":
        progress = entry.progress
        card["load_progress"] = None if progress is None else round(progress, 3)
    if served is not None:
        card["max_model_len"] = served.engine.info.context_length
    if entry.config.kind in ("embedding", "rerank"):
        # how /v1/rerank scores: an embedding model by its vectors' cosine similarity, a
        # reranker by its own head
        card["rerank"] = "cosine" if entry.config.kind == "embedding" else "model"
    if entry.config.aliases:
        card["aliases"] = list(entry.config.aliases)
    if entry.error is not None:
        card["error"] = entry.error
    return card


def _stats(entry: Entry) -> dict[str, Any]:
    out: dict[str, Any] = {"state": entry.state, "active_requests": entry.active,
                           "loads": entry.loads, "unloads": entry.unloads,
                           "load_seconds": round(entry.load_seconds, 3)}
    if entry.state == "loaded":
        stats = entry.engine.engine.stats
        out["engine"] = dict(stats)
        out["draft_acceptance"] = _draft_acceptance(stats)
        cache = _prompt_cache(entry)
        if cache:
            out["prompt_cache"] = cache
    if entry.error is not None:
        out["error"] = entry.error
    return out


def routes(app: FastAPI) -> None:
    """Adds the model routes and the health, readiness and metrics routes."""
    _model_routes(app)
    _health_routes(app)


def _model_routes(app: FastAPI) -> None:
    @app.get("/v1/models")
    async def list_models(request: Request):
        """Every model this server serves, loaded or not."""
        return json_response({"object": "list", "data": [
            model_card(e) for e in models_of(request).entries()]})

    @app.post("/v1/models/{model_id:path}/load", responses=OPERATOR)
    async def load_model(model_id: str, request: Request):
        """Load the model now (waiting for it); its card. It stays loaded for its
        keep-alive, like one a request loaded. The operator's (403 for a tenant's key)."""
        require_operator(request)
        models = models_of(request)
        await unless_gone(request, models.load(model_id))
        return json_response(model_card(models.entry(model_id), model_id))

    @app.post("/v1/models/{model_id:path}/unload", responses=OPERATOR)
    async def unload_model(model_id: str, request: Request):
        """Unload the model: its new requests wait for a new load (up to the load
        timeout); its running ones get the shutdown grace to finish, and those still running
        then end with an error saying so (``model_unloaded``); then its memory is freed. Its
        card. The operator's (403 for a tenant's key): every key's requests share a model."""
        require_operator(request)
        models = models_of(request)
        await models.unload(model_id)
        return json_response(model_card(models.entry(model_id), model_id))

    @app.get("/v1/models/{model_id:path}", responses=ERRORS)
    async def get_model(model_id: str, request: Request):
        # an alias: answered as asked
        return json_response(model_card(models_of(request).entry(model_id), model_id))


def _health_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request):
        """Alive (the process answers), with the memory budget (bytes; null: none), each
        model's state and counters, a loaded one's with ``draft_acceptance`` (the share of
        draft tokens accepted; null: none drafted) and, with a prompt cache, its figures
        (``prompt_cache``: entries, bytes and hits on disk and in memory, misses, tokens
        restored); a server of one model: its engine's counters as ``engine`` too."""
        models = models_of(request)
        entries = models.entries()
        body: dict[str, Any] = {"status": "ok", "memory_budget": models.budget or None,
                                "models": {e.name: _stats(e) for e in entries}}
        if len(entries) == 1 and entries[0].state == "loaded":
            body["engine"] = dict(entries[0].engine.engine.stats)
        return json_response(body)

    @app.get("/ready", responses={503: {"description": "Not ready"}})
    async def ready(request: Request):
        """Ready: the models loaded at start are loaded, and the store takes a write (a
        small probe). Models loaded on demand do not count."""
        try:
            await request.app.state.store.ping()
        except Exception as exc:  # noqa: BLE001 - any store failure means not ready
            return json_response_status({"status": "not ready", "store": str(exc)}, 503)
        entries = models_of(request).entries()
        return json_response({"status": "ready", "models": [
            e.name for e in entries if e.state == "loaded"]})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request):
        body = await asyncio.to_thread(generate_latest, request.app.state.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
