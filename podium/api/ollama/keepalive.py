"""Ollama's ``keep_alive``: how long a request's model stays loaded after the request.

The values, as Ollama reads them (its ``api.Duration``; strings by Go's
``time.ParseDuration``):

- absent or ``null``: the model's own keep-alive stands (its ``[[models]]`` table's
  ``keep-alive``, else the server's ``--keep-alive``; a pinned model: never unloaded);
- a duration string: ``"5m"``, ``"1h30m"``, ``"300ms"``, ``"1.5h"``, ``"-1m"``, ``"0"``
  (units ``ns``, ``us``/``µs``, ``ms``, ``s``, ``m``, ``h``; a number without a unit, such
  as ``"300"``, is refused, as Ollama refuses it);
- a number: seconds (``300``, ``0.5``);
- ``0`` (or ``"0"``, ``"0s"``): unload the model once this request ends and no other
  request holds it;
- negative: keep the model loaded (no idle unload);
- anything else (a boolean, an object, ``"5 minutes"``, longer than Go's longest duration,
  about 292 years): a 400 naming ``keep_alive``.

How a value applies (podium/models.py ``Models.keep_alive``): the last request to give one
sets the model's idle deadline, counted from the moment the model next goes idle (its last
request ends), and it lasts until the model is unloaded; the next load starts from the
model's own keep-alive again. A pinned model (a server of one model, or ``pinned = true``)
has no idle deadline: durations and negative values leave it loaded, as its operator asked
(a client asking to keep it 5 minutes gets at least that). ``0`` is an explicit unload and
unloads any model, pinned ones included, exactly as ``POST /v1/models/{model}/unload``
does: the next request loads it again.

The interface the Ollama routes use (``/api/chat``, ``/api/generate``, ``/api/embed``):

- ``KeepAlive``: the type of a wire model's ``keep_alive`` field; pydantic parses it to
  seconds (``float``; ``math.inf`` for negative values; ``None`` when absent), and a bad
  value is the route's 400 naming ``keep_alive`` before any model loads.
- ``parse(value)``: the same, for a value read by hand (``InvalidRequestError``).
- ``apply(request, name, seconds)``: after ``model_of(request, name)``, the request's value
  for its model (``None``: nothing to do).
- ``await load(request, name, seconds)``: a request with an empty prompt loads the model
  (waiting for it) and sets its keep-alive (Ollama answers ``done_reason: "load"``);
  ``seconds == 0`` unloads instead.
- ``await unload(request, name)``: an empty prompt with ``keep_alive: 0`` (Ollama answers
  ``done_reason: "unload"``): the model is unloaded before the answer (at once when idle;
  otherwise when its other requests end), having let go of it first if this request holds
  it.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from fastapi import Request
from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from podium.errors import InvalidRequestError, ModelNotFound
from podium.models import Entry, Models

FOREVER = math.inf
# Go's time.Duration is int64 nanoseconds: Ollama refuses a longer string
LONGEST = (2**63 - 1) / 1e9
MAX_CHARS = 64

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0,
          "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(rf"[+-]?(?:{_PART.pattern})+")


def seconds_of(text: str) -> float:
    """Go's ``time.ParseDuration`` in seconds; ValueError saying what is wrong."""
    if len(text) > MAX_CHARS:
        raise ValueError(f"a duration is at most {MAX_CHARS} characters")
    body = text.lstrip("+-")
    sign = -1.0 if text.startswith("-") else 1.0
    if body == "0":
        return 0.0
    if not _DURATION.fullmatch(text):
        raise ValueError(f"{text!r} is not a duration (such as \"5m\", \"1h30m\", \"300ms\"; "
                         f"or a number of seconds)")
    total = sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(body))
    if total > LONGEST:
        raise ValueError(f"{text!r} is longer than the longest duration (about 292 years; "
                         f"a negative keep_alive keeps the model loaded)")
    return sign * total


def _seconds(value: Any) -> float | None:
    """The value in seconds (``FOREVER`` for negative ones), None when absent; ValueError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("keep_alive is a duration (\"5m\") or a number of seconds")
    if isinstance(value, str):
        seconds = seconds_of(value)
    else:
        seconds = float(value)
        if math.isnan(seconds) or seconds > LONGEST:
            raise ValueError(f"{value} seconds is longer than the longest duration (about "
                             f"292 years; a negative keep_alive keeps the model loaded)")
    return FOREVER if seconds < 0 else seconds


def _field(value: Any) -> float | None:
    try:
        return _seconds(value)
    except ValueError as exc:       # said as it stands (not "Value error, ...")
        raise PydanticCustomError("keep_alive", str(exc)) from None


def parse(value: Any, param: str = "keep_alive") -> float | None:
    """``value`` (a duration string, a number of seconds, None) in seconds: ``FOREVER`` for
    a negative one, None when absent; ``InvalidRequestError`` naming ``param``."""
    try:
        return _seconds(value)
    except ValueError as exc:
        raise InvalidRequestError(str(exc), param=param) from None


# a wire model's keep_alive field, parsed to seconds as ``parse`` does
KeepAlive = Annotated[float | None, BeforeValidator(_field)]


def _models(request: Request) -> Models:
    return request.app.state.models


def _entry(models: Models, name: str) -> Entry:
    try:
        return models.entry(name)
    except ModelNotFound as exc:
        exc.model = name            # said in Ollama's words on its routes
        raise


def apply(request: Request, name: str, seconds: float | None) -> None:
    """The request's ``keep_alive`` (as parsed) for the model ``name`` (which the request
    holds: after ``model_of``): its idle deadline once its last request ends; 0 unloads it
    then. None: the model's own keep-alive stands."""
    if seconds is not None:
        _models(request).keep_alive(_entry(_models(request), name).name, seconds)


async def load(request: Request, name: str, seconds: float | None) -> None:
    """An empty prompt's request: the model ``name`` loaded (waiting for its load), then
    kept for ``seconds`` from now (None: its own keep-alive); ``seconds == 0`` unloads it."""
    if seconds == 0:
        await unload(request, name)
        return
    models = _models(request)
    entry = _entry(models, name)
    await models.load(entry.name)
    if seconds is not None:
        models.keep_alive(entry.name, seconds)


async def unload(request: Request, name: str) -> None:
    """``keep_alive: 0`` with an empty prompt: the model ``name`` unloaded before the
    answer (when idle; else as soon as its other requests end). A request that holds the
    model (``model_of``) lets go of it first."""
    from podium.server.app import HELD

    models = _models(request)
    entry = _entry(models, name)
    held: list[Entry] = request.scope.get(HELD, [])
    if entry in held:
        held.remove(entry)
        models.release(entry)
    await models.unload_when_idle(entry.name)
