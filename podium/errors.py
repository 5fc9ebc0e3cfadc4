"""Podium's exceptions, and how each becomes an OpenAI (Anthropic, Ollama) error body.

Every error a client can see is one of these, raised where it is found and turned into
``{"error": {"message", "type", "param", "code"}}`` in exactly one handler
(``podium.server.errors``)::

    PodiumError                      500 server_error
    ├── InvalidRequestError          400 invalid_request_error
    │   └── ContextLengthExceeded    400 invalid_request_error / context_length_exceeded
    ├── AuthenticationError          401 invalid_request_error / invalid_api_key
    ├── PermissionDenied             403 permission_error / admin_key_required
    ├── NotFoundError                404 invalid_request_error
    │   └── ModelNotFound            404 invalid_request_error / model_not_found
    ├── PayloadTooLarge              413 invalid_request_error / payload_too_large
    ├── RateLimited                  429 rate_limit_error / rate_limit_exceeded (Retry-After)
    │   └── Overloaded               429 the engine's queue is full (Anthropic: 529)
    ├── EngineError                  500 server_error (the engine failed mid-request)
    ├── ModelUnloaded                503 server_error / model_unloaded (its engine closed
    │                                    under a running request: an operator's unload)
    ├── StoreUnavailable             503 server_error / store_unavailable (full, unreachable)
    └── ModelFilesError              (start-up only: the model file cannot be had)
"""

from __future__ import annotations

from typing import Any


class PodiumError(Exception):
    """Base of every Podium error; unexpected failures map to 500 ``server_error``."""

    status_code = 500
    error_type = "server_error"
    default_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers = headers

    def to_body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.param, self.code)


class InvalidRequestError(PodiumError):
    """The request is malformed or asks for something Podium cannot do (400)."""

    status_code = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequestError):
    """Prompt plus requested output do not fit the model's context window (400). ``tokens``
    and ``limit``, when set, are the prompt's length and the context's (the prompt alone is
    too long)."""

    default_code = "context_length_exceeded"
    tokens: int | None = None
    limit: int | None = None


class AuthenticationError(PodiumError):
    """API keys are configured and the request's key is missing or wrong (401)."""

    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDenied(PodiumError):
    """The request's key is valid but may not do this (403): loading and unloading models is
    the operator's, so with keys configured it takes an admin key (``--admin-key``)."""

    status_code = 403
    error_type = "permission_error"
    default_code = "admin_key_required"


class NotFoundError(PodiumError):
    """The route or object does not exist (404)."""

    status_code = 404
    error_type = "invalid_request_error"


class ModelNotFound(NotFoundError):
    """The request names a model this server does not serve (404). ``model``, when the
    raiser knows it, is the name asked for (Ollama's clients read it in their own words)."""

    default_code = "model_not_found"
    model: str | None = None


class PayloadTooLarge(PodiumError):
    """The request body is over the configured limit (413)."""

    status_code = 413
    error_type = "invalid_request_error"
    default_code = "payload_too_large"


class RateLimited(PodiumError):
    """Too many requests (concurrently, or for this key per minute): retry later (429)."""

    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: int = 1):
        super().__init__(message, headers={"retry-after": str(retry_after)})


class Overloaded(RateLimited):
    """The engine cannot queue more work now (429; Anthropic's API says 529 overloaded)."""


class EngineError(PodiumError):
    """The inference engine failed while serving a request (500)."""


class ModelUnloaded(PodiumError):
    """The model's engine ended a request it had not finished (503): the model was unloaded
    under it (its operator's unload, once the grace period was over). Said to the client in
    the API's own shape, in-band after a stream's first byte, never as a finish reason: the
    request may simply be sent again (its model loads anew)."""

    status_code = 503
    default_code = "model_unloaded"


class StoreUnavailable(PodiumError):
    """The response store cannot be written or reached (disk full, database down): 503.

    Raised by the store for its driver's operational errors, so a request that must store
    fails cleanly, before anything is generated or streamed, and ``/ready`` says why."""

    status_code = 503
    default_code = "store_unavailable"


class ModelFilesError(PodiumError):
    """The model file cannot be found, assembled or downloaded (raised at start-up)."""


def error_body(message: str, error_type: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object, used for HTTP bodies and in-band stream errors alike."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


# Anthropic's error types by status (its Messages API answers in its own shape).
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                   429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def anthropic_error(status: int, message: str) -> tuple[int, dict[str, Any]]:
    """Anthropic's status and error object for an error of ``status``."""
    kind = ANTHROPIC_TYPES.get(status) or ("invalid_request_error" if status < 500
                                           else "api_error")
    return status, {"type": "error", "error": {"type": kind, "message": message}}


def ollama_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Ollama's status and error object, ``{"error": "message"}``. An unknown model is
    said in Ollama's own words, which its clients match on."""
    if not isinstance(exc, PodiumError):
        return 500, {"error": "The server had an error while processing your request."}
    message = exc.message
    if isinstance(exc, ModelNotFound) and exc.model is not None:
        message = f'model "{exc.model}" not found, try pulling it first ({exc.message})'
    return exc.status_code, {"error": message}


def anthropic_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    if not isinstance(exc, PodiumError):
        return anthropic_error(500, "The server had an error while processing your request.")
    return anthropic_error(529 if isinstance(exc, Overloaded) else exc.status_code,
                           exc.message)
