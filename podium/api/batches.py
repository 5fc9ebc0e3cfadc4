"""The Batch API (``/v1/batches``): create, retrieve, list and cancel batches; the work
itself is ``api/batch_worker.py``'s, on whichever replica claims it.

A batch belongs to the API key that made it, and so do its output and error files: another
key's batch is a 404, as a missing one is. Creating checks what can be checked at once (the
endpoint, the window, the metadata, the input file: the caller's, ``batch`` purpose) and
stores the batch ``validating``; the file's lines are read by the worker that claims it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import orjson

from podium.api.conversations import check_metadata
from podium.errors import InvalidRequestError, NotFoundError
from podium.protocol.batches import ENDPOINTS, WINDOWS, BatchCreateRequest, batch_object
from podium.store.batches import ID_PREFIX, BatchStore
from podium.store.files import FileStore, id_time, new_id

log = logging.getLogger(__name__)
Obj = dict[str, Any]

MAX_OPEN = 1_000                # batches one API key may have validating or running


class BatchesService:
    def __init__(self, store: BatchStore, files: FileStore,
                 poke: Callable[[], None] | None = None):
        self._store = store
        self._files = files
        self._poke = poke or (lambda: None)     # wakes this replica's worker

    @staticmethod
    def _missing(batch_id: str) -> NotFoundError:
        return NotFoundError(f"No batch found with id '{batch_id[:80]}'.", param="batch_id")

    async def create(self, req: BatchCreateRequest, owner: str) -> Obj:
        if req.endpoint not in ENDPOINTS:
            raise InvalidRequestError(
                f"Invalid value for endpoint: {req.endpoint!r}. Supported values are: "
                + ", ".join(f"'{e}'" for e in ENDPOINTS) + ".", param="endpoint")
        if req.completion_window not in WINDOWS:
            raise InvalidRequestError(
                f"Invalid value for completion_window: {req.completion_window!r}. Supported "
                "values are: '24h'.", param="completion_window")
        metadata = check_metadata(req.metadata)
        now = time.time()
        found = await self._files.get(req.input_file_id, owner, now)
        if found is None:
            raise InvalidRequestError(f"No such File object: {req.input_file_id}",
                                      param="input_file_id")
        if found.purpose != "batch":
            raise InvalidRequestError(
                f"The input file {req.input_file_id} has purpose {found.purpose!r}; a batch "
                "needs a file uploaded with purpose 'batch'.", param="input_file_id")
        if await self._store.count(owner) >= MAX_OPEN:
            raise InvalidRequestError(f"An API key may have at most {MAX_OPEN} batches "
                                      "validating or running at once", param="input_file_id")
        batch_id = new_id(prefix=ID_PREFIX)
        created = (id_time(batch_id, ID_PREFIX) or 0) // 1000
        values = dict(
            id=batch_id, owner=owner, status="validating", endpoint=req.endpoint,
            input_file_id=req.input_file_id, completion_window=req.completion_window,
            meta=orjson.dumps(metadata).decode() if req.metadata is not None else None,
            output_expires=(req.output_expires_after.seconds
                            if req.output_expires_after else None),
            created_at=created, expires_at=created + WINDOWS[req.completion_window])
        await self._store.create(values)
        log.info("batch %s: validating (%s, file %s)", batch_id, req.endpoint,
                 req.input_file_id)
        self._poke()
        return await self.retrieve(batch_id, owner)

    async def retrieve(self, batch_id: str, owner: str) -> Obj:
        row = await self._store.get(batch_id, owner)
        if row is None:
            raise self._missing(batch_id)
        return batch_object(row)

    async def list(self, owner: str, after: str | None, limit: int) -> Obj:
        rows, more = await self._store.page(owner, after, limit)
        data = [batch_object(r) for r in rows]
        return {"object": "list", "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": more}

    async def cancel(self, batch_id: str, owner: str) -> Obj:
        """Stop the batch: no request starts from now, the running ones stop (on any
        replica: its worker looks at its batches' statuses within a second), and it ends
        ``cancelled`` with what finished in its output file."""
        row = await self._store.cancel(batch_id, owner, int(time.time()))
        if row is None:
            raise self._missing(batch_id)
        if row["status"] not in ("cancelling", "cancelled"):
            raise InvalidRequestError(f"Cannot cancel a batch with status {row['status']!r}.",
                                      param="batch_id")
        log.info("batch %s: cancelling", batch_id)
        self._poke()
        return batch_object(row)
