"""The Batch API's routes (``/v1/batches``) and how a batch's line runs: by the endpoint's
own service, as the same body sent to that route would (its model found, loaded and held
the same way, its errors the same statuses and bodies), at the batch priority."""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel, ValidationError

from podium.api.batch_worker import BATCH_PRIORITY, Outcome, Worker
from podium.api.batches import BatchesService
from podium.errors import (InvalidRequestError, PodiumError, RateLimited, StoreUnavailable,
                           error_body)
from podium.generation import PRIORITY
from podium.models import ModelUnavailable, Models
from podium.protocol.batches import BatchCreateRequest
from podium.protocol.chat import ChatCompletionRequest
from podium.protocol.completions import CompletionRequest
from podium.protocol.embeddings import EmbeddingsRequest
from podium.protocol.responses import ResponsesRequest
from podium.server.edge import ERRORS, check_kind, json_response, owner_of
from podium.server.errors import validation_body
from podium.server.served import Served
from podium.settings import Settings
from podium.store.batches import BatchStore, Usage
from podium.store.files import FileStore

log = logging.getLogger(__name__)
Obj = dict[str, Any]
Call = Callable[[FastAPI, Served, Any, str, Callable[[], Callable[[], None]]], Awaitable[Any]]


def _usage(result: Obj) -> Usage:
    """A batch's usage from an answer's: Chat and Completions count prompt and completion
    tokens, Responses input and output tokens, embeddings prompt tokens."""
    u = result.get("usage") or {}
    if "input_tokens" in u:
        return Usage(u.get("input_tokens") or 0,
                     (u.get("input_tokens_details") or {}).get("cached_tokens") or 0,
                     u.get("output_tokens") or 0,
                     (u.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)
    return Usage(u.get("prompt_tokens") or 0,
                 (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
                 u.get("completion_tokens") or 0,
                 (u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)


async def _chat(app: FastAPI, served: Served, body: Any, owner: str, hold: Any) -> Any:
    return await served.chat.create(body)


async def _completions(app: FastAPI, served: Served, body: Any, owner: str, hold: Any) -> Any:
    return await served.completions.create(body)


async def _responses(app: FastAPI, served: Served, body: Any, owner: str, hold: Any) -> Any:
    if body.background:
        raise InvalidRequestError("background is not supported in a batch (a batch's "
                                  "requests already run in the background)",
                                  param="background")
    return await app.state.responses.create(body, owner, served.planner, hold=hold)


async def _embeddings(app: FastAPI, served: Served, body: Any, owner: str, hold: Any) -> Any:
    return await served.embeddings.create(body)


# endpoint -> its body's model, the model kinds it takes, the service call
ENDPOINTS: dict[str, tuple[type[BaseModel], str, Call]] = {
    "/v1/chat/completions": (ChatCompletionRequest, "chat", _chat),
    "/v1/completions": (CompletionRequest, "chat", _completions),
    "/v1/responses": (ResponsesRequest, "chat", _responses),
    "/v1/embeddings": (EmbeddingsRequest, "embedding", _embeddings),
}


class Executor:
    """Runs a batch's lines in this app (the worker's ``execute`` and ``check_model``)."""

    def __init__(self, app: FastAPI):
        self._app = app

    def check_model(self, model: str, endpoint: str) -> None:
        """404 for a model this server does not serve, 400 for one of another kind."""
        models: Models = self._app.state.models
        check_kind(models.entry(model), model, ENDPOINTS[endpoint][1])

    async def execute(self, endpoint: str, body: Obj, owner: str) -> Outcome:
        PRIORITY.set(BATCH_PRIORITY)        # this task's requests queue behind interactive
        try:
            return await self._execute(endpoint, body, owner)
        except (RateLimited, ModelUnavailable, StoreUnavailable) as exc:    # no room now
            return Outcome(exc.status_code, exc.to_body(), Usage(), retry=True)
        except PodiumError as exc:
            return Outcome(exc.status_code, exc.to_body(), Usage())
        except Exception:  # noqa: BLE001 - as the HTTP route would: a 500 for this line
            log.exception("batch request to %s failed", endpoint)
            return Outcome(500, error_body("The server had an error while processing your "
                                           "request.", "server_error"), Usage())

    async def _execute(self, endpoint: str, body: Obj, owner: str) -> Outcome:
        wire, kind, call = ENDPOINTS[endpoint]
        if body.get("stream"):
            raise InvalidRequestError("stream is not supported in a batch: its answers are "
                                      "written to the output file whole", param="stream")
        try:
            request = wire.model_validate(body)
        except ValidationError as exc:
            return Outcome(400, validation_body(exc.errors()), Usage())
        models: Models = self._app.state.models
        name = request.model            # type: ignore[attr-defined]
        check_kind(models.entry(name), name, kind)
        entry = await models.acquire(name)
        try:
            result = await call(self._app, entry.engine, request, owner,
                                lambda: models.hold(entry))
        finally:
            models.release(entry)
        return Outcome(200, result, _usage(result))


def routes(app: FastAPI) -> None:
    """Adds the Batch API's routes, its service and this replica's worker (started and
    stopped with the app: ``start`` / ``stop``) to the app."""
    settings: Settings = app.state.settings
    store = BatchStore(app.state.store.engine)
    files: FileStore = app.state.file_store
    executor = Executor(app)
    metrics = app.state.metrics
    app.state.batch_store = store
    app.state.batch_worker = worker = Worker(
        store, files, execute=executor.execute, check_model=executor.check_model,
        in_flight=in_flight(settings), lease_seconds=settings.response_lease_seconds,
        max_line_bytes=settings.max_body_bytes,
        on_result=lambda error: metrics.batch_requests.labels(
            "failed" if error else "completed").inc())
    app.state.batches = BatchesService(store, files, worker.poke)

    @app.post("/v1/batches", responses=ERRORS)
    async def create_batch(body: BatchCreateRequest, request: Request):
        """Create a batch from an uploaded ``.jsonl`` file (purpose ``batch``)."""
        return json_response(await request.app.state.batches.create(body, owner_of(request)))

    @app.get("/v1/batches", responses=ERRORS)
    async def list_batches(request: Request, after: str | None = None,
                           limit: int = Query(20, ge=1, le=100)):
        return json_response(await request.app.state.batches.list(owner_of(request), after,
                                                                  limit))

    @app.get("/v1/batches/{batch_id}", responses=ERRORS)
    async def retrieve_batch(batch_id: str, request: Request):
        return json_response(await request.app.state.batches.retrieve(batch_id,
                                                                      owner_of(request)))

    @app.post("/v1/batches/{batch_id}/cancel", responses=ERRORS)
    async def cancel_batch(batch_id: str, request: Request):
        """Cancel the batch: it ends ``cancelled``, with what finished in its output."""
        return json_response(await request.app.state.batches.cancel(batch_id,
                                                                    owner_of(request)))


def in_flight(settings: Settings) -> int:
    """``--batch-max-in-flight``, or by default every sequence where interactive requests
    preempt batch work (llama.cpp), all but one where they wait for one to free (vLLM)."""
    if settings.batch_max_in_flight > 0:
        return settings.batch_max_in_flight
    return max(1, settings.max_num_seqs - (settings.engine == "vllm"))
