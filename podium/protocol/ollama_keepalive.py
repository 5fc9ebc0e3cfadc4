"""Ollama's ``keep_alive`` values as its clients send them, parsed to seconds.

The values, as Ollama reads them (its ``api.Duration``; strings by Go's
``time.ParseDuration``):

- absent or ``null``: None (the model's own keep-alive stands);
- a duration string: ``"5m"``, ``"1h30m"``, ``"300ms"``, ``"1.5h"``, ``"-1m"``, ``"0"``
  (units ``ns``, ``us``/``µs``, ``ms``, ``s``, ``m``, ``h``; a number without a unit, such
  as ``"300"``, is refused, as Ollama refuses it);
- a number: seconds (``300``, ``0.5``);
- ``0`` (or ``"0"``, ``"0s"``): 0, an unload once the request ends;
- negative: ``FOREVER`` (``math.inf``: no idle unload);
- anything else (a boolean, an object, ``"5 minutes"``, longer than Go's longest duration,
  about 292 years): a 400 naming ``keep_alive``.

``KeepAlive`` is the type of a wire model's ``keep_alive`` field (a bad value is the
route's 400 before any model loads); ``parse`` does the same for a value read by hand. How
a value applies to a model, and whose may unload one, is api/ollama/keepalive.py's.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from podium.errors import InvalidRequestError

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
