"""The render contract: a request's semantic events in, its API's wire objects out.

Every API renders through one shape, driven by ``generation.drive`` (the one loop over a
request's choices, which also folds usage, sends keep-alives and ends the engine's work when
the consumer stops):

- ``open()``: the objects before any choice's (Chat's role chunks, ``response.created``,
  Anthropic's ``message_start``);
- ``event(index, event)``: the objects for choice ``index``'s event, ``Finish`` included
  (``Usage`` events are folded by the driver, once, for every API);
- ``keepalive()``: what keeps a stream that has nothing to say alive while a choice waits for
  its first token (``KEEPALIVE`` where the API has no object for it: the encoder writes the
  wire format's own idle signal);
- ``close(usage)``: the last objects, given the request's folded usage;
- ``result()`` (a ``Folding`` renderer): the object the same events describe, the
  non-stream answer.

A renderer returns plain objects; framing and encoding (SSE, and next NDJSON) happen at the
server's edge (``server/sse.py``). A per-token object may be ``Filled``, a pair of a
``Shape`` and the string that fills its hole: the encoder encodes the shape once, so the hot
path encodes the string alone. Renderers know nothing of bytes.
"""

from __future__ import annotations

import secrets
from typing import Any, Protocol, final

from podium.parsing.events import Event, Usage

# The open string of a ``Shape``: random, so no string of a wire object is ever it
HOLE = "\ue000podium-hole-" + secrets.token_hex(8)


@final
class Shape:
    """A wire object with one string left open (``HOLE``). Kept by its renderer for the
    stream's life; an encoder encodes it once (keyed by the shape itself)."""

    __slots__ = ("obj",)

    def __init__(self, obj: dict[str, Any]):
        self.obj = obj


# A ``Shape`` with its hole filled: a plain pair, the cheapest object to make per token
Filled = tuple[Shape, str]


def filled(obj: Filled) -> dict[str, Any]:
    """The whole object of a filled shape (what an encoder without templates, or a test,
    reads)."""
    shape, text = obj
    return _fill(shape.obj, text)


def _fill(obj: Any, text: str) -> Any:
    if obj is HOLE or obj == HOLE:
        return text
    if isinstance(obj, dict):
        return {k: _fill(v, text) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, text) for v in obj]
    return obj


@final
class KeepAlive:
    """``keepalive()``'s object for an API that has none of its own (Chat, Completions): a
    chunk would reach the SDKs' callers, so the encoder writes its wire format's idle signal
    (an SSE comment), which every client drops and every idle timer counts."""

    __slots__ = ()


KEEPALIVE = KeepAlive()


class Renderer(Protocol):
    def open(self) -> list[Any]: ...
    def event(self, index: int, event: Event) -> list[Any]: ...
    def keepalive(self) -> list[Any]: ...
    def close(self, usage: Usage) -> list[Any]: ...


class Folding(Renderer, Protocol):
    """A renderer whose object is built as it renders (or, for Chat and Completions, whose
    fold is a renderer of its own that sends nothing)."""

    def result(self) -> dict[str, Any]: ...


class Fold:
    """The base of a renderer that only folds (Chat's and Completions' non-stream answers):
    it sends nothing and keeps the request's usage for its ``result()``."""

    usage = Usage(0, 0)

    def open(self) -> list[Any]:
        return []

    def keepalive(self) -> list[Any]:
        return []

    def close(self, usage: Usage) -> list[Any]:
        self.usage = usage
        return []
