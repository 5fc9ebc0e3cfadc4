"""The Files API's routes (``/v1/files``): a few lines each; ``api/files.py`` does the work.

An upload's body is handed to the service as it arrives (``request.stream()``), never read
whole: the JSON body limit (``--max-body-bytes``, ``BodyLimitMiddleware``) leaves this route
to ``--max-file-bytes``, which the service applies while it reads.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Literal

from fastapi import FastAPI, Query, Request
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse

from podium.api.files import FilesService
from podium.errors import InvalidRequestError
from podium.server.edge import ERRORS, json_response, owner_of
from podium.store.files import FileStore

UPLOAD_PATH = "/v1/files"
_UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {
    "schema": {"type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary"},
        "purpose": {"type": "string", "enum": ["batch", "user_data"]},
        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
        "expires_after[seconds]": {"type": "integer", "minimum": 3600,
                                   "maximum": 2592000}}}}}}}
_CONTENT: dict[int | str, dict[str, Any]] = {
    **ERRORS, 200: {"description": "The file's bytes",
                     "content": {"application/octet-stream": {}}}}


async def _body(request: Request) -> AsyncIterator[bytes]:
    """The request's body as it arrives; a client that leaves mid-upload is a 400 (no one
    reads it; the upload is removed)."""
    try:
        async for piece in request.stream():
            if piece:
                yield piece
    except ClientDisconnect:
        raise InvalidRequestError("The client closed the connection before the upload "
                                  "ended", param="file") from None


def routes(app: FastAPI) -> None:
    """Adds the Files API's routes (its service on the app's store) to the app."""
    app.state.file_store = store = FileStore(app.state.store.engine)
    app.state.files = FilesService(store, app.state.settings)

    @app.post(UPLOAD_PATH, responses=ERRORS, openapi_extra=_UPLOAD_BODY)
    async def create_file(request: Request):
        """Upload a file (multipart: ``file``, ``purpose``, optional ``expires_after``)."""
        return json_response(await request.app.state.files.create(
            owner_of(request), request.headers.get("content-type"),
            request.headers.get("content-length"), _body(request)))

    @app.get("/v1/files", responses=ERRORS)
    async def list_files(request: Request, purpose: str | None = None,
                         after: str | None = None, limit: int = Query(10_000, ge=1, le=10_000),
                         order: Literal["asc", "desc"] = "desc"):
        return json_response(await request.app.state.files.list(
            owner_of(request), purpose=purpose, after=after, limit=limit, order=order))

    @app.get("/v1/files/{file_id}", responses=ERRORS)
    async def retrieve_file(file_id: str, request: Request):
        return json_response(await request.app.state.files.retrieve(file_id,
                                                                    owner_of(request)))

    @app.get("/v1/files/{file_id}/content", responses=_CONTENT)
    async def file_content(file_id: str, request: Request):
        """The file's bytes, read from the database a chunk at a time as they are sent."""
        found, chunks = await request.app.state.files.content(file_id, owner_of(request))
        return StreamingResponse(chunks, media_type="application/octet-stream", headers={
            "content-length": str(found["bytes"])})

    @app.delete("/v1/files/{file_id}", responses=ERRORS)
    async def delete_file(file_id: str, request: Request):
        return json_response(await request.app.state.files.delete(file_id, owner_of(request)))
