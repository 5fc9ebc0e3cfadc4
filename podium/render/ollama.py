"""Semantic events to Ollama's ``/api/chat`` and ``/api/generate`` objects.

Two renderers (``render.base``): ``OllamaChunks`` for a stream (NDJSON lines at the edge),
``OllamaFold`` for the answer with ``stream: false``; the answer is the fold of exactly the
events the stream renders. Chat's objects carry the text in ``message`` (``role``,
``content``, ``thinking``, ``tool_calls``), generate's in ``response`` and ``thinking``.

- A text or thinking chunk is ``Filled`` (one shape each, encoded once per stream), so its
  ``created_at`` is the time the answer began; the last object's is the time it ended.
- A tool call is sent whole, in one chunk, when it is complete (as Ollama does), with its
  arguments as an object; a call cut short by the token limit is not sent.
- The last object has ``done: true``, ``done_reason`` (``stop``, ``length``; a turn that
  ends in tool calls is ``stop``, as in Ollama) and the counters the service measured
  (``counters(usage)``: durations in nanoseconds, prompt and completion tokens).
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Callable

import orjson

from podium.parsing.events import (Event, Finish, ReasoningDelta, TextDelta, ToolCallBegin,
                                   ToolCallEnd, Usage)
from podium.parsing.scan import json_text
from podium.render.base import HOLE, Shape

Obj = dict[str, Any]
Counters = Callable[[Usage], Obj]

# Ollama's words for why an answer ended
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}


def created_at() -> str:
    """Now, as Ollama writes its timestamps (RFC 3339, UTC)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def tool_call(call_id: str, index: int, name: str, arguments: str) -> Obj:
    """A complete call in Ollama's shape: its arguments as the object they are."""
    return {"id": call_id, "function": {"index": index, "name": name,
                                        "arguments": _arguments(arguments)}}


def _arguments(text: str) -> Any:
    """The arguments' JSON text as an object (Ollama's clients read a mapping: anything
    else is wrapped as ``{"value": ...}``)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:        # a lone surrogate escape (orjson refuses it): U+FFFD in its place
            value = json.loads(json_text(json.loads(text)))
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {"value": value}


class _Wire:
    """How an answer's parts sit in one of the two routes' objects."""

    def __init__(self, model: str, chat: bool, counters: Counters):
        self._model = model
        self._chat = chat
        self._counters = counters
        self._begun = created_at()
        self._finish = "stop"

    def obj(self, content: Any, thinking: Any = None, calls: list[Obj] | None = None, *,
            done: bool = False, at: str | None = None) -> Obj:
        out: Obj = {"model": self._model, "created_at": at or self._begun}
        if self._chat:
            message: Obj = {"role": "assistant", "content": content}
            if thinking is not None:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["response"] = content
            if thinking is not None:
                out["thinking"] = thinking
        out["done"] = done
        return out

    def last(self, content: str, thinking: str | None, calls: list[Obj], usage: Usage) -> Obj:
        return {**self.obj(content, thinking, calls, done=True, at=created_at()),
                "done_reason": DONE_REASONS.get(self._finish, self._finish),
                **self._counters(usage)}


class OllamaChunks(_Wire):
    """The stream's renderer: one object per text or thinking delta, one per tool call, and
    the last (``done: true``) with the counters."""

    def __init__(self, model: str, chat: bool, counters: Counters):
        super().__init__(model, chat, counters)
        self._text = Shape(self.obj(HOLE))
        self._thought = Shape(self.obj("", HOLE))
        self._calls: dict[int, tuple[str, str]] = {}

    def open(self) -> list[Any]:
        return []

    def keepalive(self) -> list[Any]:
        # NDJSON has no comment: an empty chunk, which Ollama's clients take as nothing said
        return [(self._text, "")]

    def event(self, index: int, event: Event) -> list[Any]:
        kind = type(event)
        if kind is TextDelta:                               # the per-token cases first
            return [(self._text, event.text)]               # type: ignore[union-attr]
        if kind is ReasoningDelta:
            return [(self._thought, event.text)]            # type: ignore[union-attr]
        if isinstance(event, ToolCallBegin):
            self._calls[event.index] = (event.id, event.name)
        elif isinstance(event, ToolCallEnd):
            call_id, name = self._calls[event.index]
            return [self.obj("", calls=[tool_call(call_id, event.index, name, event.arguments)])]
        elif isinstance(event, Finish):
            self._finish = event.reason
        return []

    def close(self, usage: Usage) -> list[Any]:
        return [self.last("", None, [], usage)]


class OllamaFold(_Wire):
    """The non-stream renderer: the same events folded into one object; sends nothing."""

    def __init__(self, model: str, chat: bool, counters: Counters):
        super().__init__(model, chat, counters)
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._begun_calls: dict[int, tuple[str, str]] = {}
        self._calls: list[Obj] = []
        self._result: Obj | None = None

    def open(self) -> list[Any]:
        return []

    def keepalive(self) -> list[Any]:
        return []

    def event(self, index: int, event: Event) -> list[Any]:
        if isinstance(event, TextDelta):
            self._text.append(event.text)
        elif isinstance(event, ReasoningDelta):
            self._thinking.append(event.text)
        elif isinstance(event, ToolCallBegin):
            self._begun_calls[event.index] = (event.id, event.name)
        elif isinstance(event, ToolCallEnd):
            call_id, name = self._begun_calls[event.index]
            self._calls.append(tool_call(call_id, event.index, name, event.arguments))
        elif isinstance(event, Finish):
            self._finish = event.reason
        return []

    def close(self, usage: Usage) -> list[Any]:
        thinking = "".join(self._thinking) if self._thinking else None
        self._result = self.last("".join(self._text), thinking, self._calls, usage)
        return []

    def result(self) -> Obj:
        assert self._result is not None, "result() follows close()"
        return self._result
