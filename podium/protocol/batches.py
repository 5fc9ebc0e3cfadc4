"""The Batch API's wire shapes (``/v1/batches``): the create request, the batch object, the
input file's lines and the output and error files' lines, as OpenAI writes them."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field

from podium.protocol.common import LENIENT
from podium.protocol.files import EXPIRES_MAX, EXPIRES_MIN

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")
WINDOWS = {"24h": 86400}
MAX_REQUESTS = 50_000           # lines of one batch (OpenAI's limit)
MAX_ERRORS = 100                # format errors a failed batch lists
Obj = dict[str, Any]


class ExpiresAfter(BaseModel):
    model_config = LENIENT
    anchor: Literal["created_at"]
    seconds: int = Field(ge=EXPIRES_MIN, le=EXPIRES_MAX)


class BatchCreateRequest(BaseModel):
    model_config = LENIENT
    input_file_id: str = Field(max_length=64)
    endpoint: str = Field(max_length=64)
    completion_window: str = Field(max_length=16)
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None


def batch_object(row: Obj) -> Obj:
    """OpenAI's batch object from its row (``store/batches.py``)."""
    usage = {"input_tokens": row["input_tokens"],
             "input_tokens_details": {"cached_tokens": row["cached_tokens"]},
             "output_tokens": row["output_tokens"],
             "output_tokens_details": {"reasoning_tokens": row["reasoning_tokens"]},
             "total_tokens": row["input_tokens"] + row["output_tokens"]}
    return {
        "id": row["id"], "object": "batch", "endpoint": row["endpoint"],
        "model": row["model"],
        "errors": orjson.loads(row["errors"]) if row["errors"] else None,
        "input_file_id": row["input_file_id"],
        "completion_window": row["completion_window"], "status": row["status"],
        "output_file_id": row["output_file_id"], "error_file_id": row["error_file_id"],
        "created_at": row["created_at"], "in_progress_at": row["in_progress_at"],
        "expires_at": row["expires_at"], "finalizing_at": row["finalizing_at"],
        "completed_at": row["completed_at"], "failed_at": row["failed_at"],
        "expired_at": row["expired_at"], "cancelling_at": row["cancelling_at"],
        "cancelled_at": row["cancelled_at"],
        "request_counts": {"total": row["total"], "completed": row["completed"],
                           "failed": row["failed"]},
        "usage": usage,
        "metadata": orjson.loads(row["meta"]) if row["meta"] else None}


class LineError(Exception):
    """A line of the input file breaks the format: the batch fails, listing these."""

    def __init__(self, code: str, message: str, line: int | None, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.line, self.param = code, message, line, param

    def to_obj(self) -> Obj:
        return {"code": self.code, "message": self.message, "param": self.param,
                "line": self.line}


def read_line(text: bytes, line: int, endpoint: str) -> tuple[str, Obj, str | None]:
    """A line of the input file checked as OpenAI checks it: a JSON object with a string
    ``custom_id``, ``method`` POST, ``url`` the batch's endpoint and an object ``body``;
    its custom_id, body and the body's model (a string, or None when it names none)."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise LineError("invalid_json_line", f"Line {line} is not valid JSON.", line) from None
    if not isinstance(obj, dict):
        raise LineError("invalid_json_line", f"Line {line} is not a JSON object.", line)
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError("missing_custom_id",
                        f"Line {line} has no custom_id: each request needs a unique string "
                        "custom_id.", line, "custom_id")
    if len(custom_id) > 512:
        raise LineError("invalid_custom_id",
                        f"Line {line}'s custom_id is longer than 512 characters.", line,
                        "custom_id")
    if obj.get("method") != "POST":
        raise LineError("invalid_method",
                        f"Line {line}'s method must be 'POST', not {obj.get('method')!r:.40}.",
                        line, "method")
    if obj.get("url") != endpoint:
        raise LineError("invalid_url",
                        f"Line {line}'s url {obj.get('url')!r:.80} is not the batch's "
                        f"endpoint {endpoint!r}.", line, "url")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_body", f"Line {line} has no body object.", line, "body")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise LineError("invalid_body", f"Line {line}'s body.model is not a string.", line,
                        "body.model")
    return custom_id, body, model


def output_line(line_id: str, custom_id: str, status: int, request_id: str,
                body: Obj) -> Obj:
    """A line of the output file (status 200) or the error file (an endpoint's error):
    the endpoint's answer as its HTTP response would have carried it."""
    return {"id": line_id, "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": None}


def error_line(line_id: str, custom_id: str, code: str, message: str) -> Obj:
    """A line of the error file for a request the batch never ran (``batch_expired``,
    ``batch_cancelled``)."""
    return {"id": line_id, "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}
