"""Semantic events to Chat Completions: stream chunks, and the folded ``chat.completion``.

The non-stream object is the fold of exactly the events the stream renders, so the two
cannot disagree. A tool call's id, type and name appear once, in its first delta; its
argument deltas concatenate to the final ``arguments``. Reasoning goes to
``reasoning_content`` (the field most clients read), ``reasoning``, or both.
"""

from __future__ import annotations

from typing import Any

import orjson

from podium.engine.base import Tokenizer
from podium.parsing.events import (Event, Finish, ReasoningDelta, TextDelta, ToolCallArgsDelta,
                                   ToolCallBegin, ToolCallEnd, Usage)
from podium.render.logprobs import chat_entry
from podium.render.usage import UsageFold


def reasoning_fields(field: str) -> tuple[str, ...]:
    return ("reasoning_content", "reasoning") if field == "both" else (field,)


class ChatChunks:
    """Builds ``chat.completion.chunk`` events, framed for SSE (``data: {...}\n\n`` bytes);
    every chunk shares id, created and model.

    The per-token chunks (a text or a reasoning delta, no logprobs) are the bytes orjson
    would make of their dict, written as a pre-encoded template around the encoded text:
    ``data: {"id":…,"model":…,"choices":[{"index":0,"delta":{"content":`` + text +
    ``},"logprobs":null,"finish_reason":null}]}``. Every other chunk is its dict, encoded.
    """

    _TAIL = b'},"logprobs":null,"finish_reason":null}]}\n\n'

    def __init__(self, completion_id: str, created: int, model: str, tokenizer: Tokenizer,
                 logprobs: bool, reasoning_field: str = "reasoning_content"):
        self._head = {"id": completion_id, "object": "chat.completion.chunk",
                      "created": created, "model": model}
        self._tokenizer = tokenizer
        self._logprobs = logprobs
        self._reasoning = reasoning_fields(reasoning_field)
        # b'data: {"id":...,"model":"..."' : the head's encoding without its closing brace
        self._open = b"data: " + orjson.dumps(self._head)[:-1]
        self._heads: dict[tuple[int, str], bytes] = {}  # (choice, delta field) -> its head

    def _delta(self, index: int, field: str, text: str) -> bytes:
        """The chunk whose delta is ``{field: text}``, from its pre-encoded template."""
        head = self._heads.get((index, field))
        if head is None:
            head = self._heads[index, field] = (
                self._open + b',"choices":[{"index":' + str(index).encode() + b',"delta":{'
                + orjson.dumps(field) + b":")
        return head + orjson.dumps(text) + self._TAIL

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None,
               logprobs: Any = None) -> bytes:
        return b"data: " + orjson.dumps({**self._head, "choices": [{
            "index": index, "delta": delta, "logprobs": logprobs,
            "finish_reason": finish}]}) + b"\n\n"

    def role(self, index: int) -> bytes:
        return self._chunk(index, {"role": "assistant", "content": ""})

    def event(self, index: int, event: Event) -> bytes | None:
        kind = type(event)
        if kind is TextDelta and not self._logprobs:       # the per-token cases first
            return self._delta(index, "content", event.text)      # type: ignore[union-attr]
        if kind is ReasoningDelta and len(self._reasoning) == 1:
            return self._delta(index, self._reasoning[0], event.text)  # type: ignore[union-attr]
        if isinstance(event, TextDelta):
            lp = None
            if self._logprobs:
                lp = {"content": [chat_entry(self._tokenizer, e) for e in event.logprobs or ()],
                      "refusal": None}
            return self._chunk(index, {"content": event.text}, logprobs=lp)
        if isinstance(event, ReasoningDelta):
            return self._chunk(index, {f: event.text for f in self._reasoning})
        if isinstance(event, ToolCallBegin):
            return self._chunk(index, {"tool_calls": [{
                "index": event.index, "id": event.id, "type": "function",
                "function": {"name": event.name, "arguments": ""}}]})
        if isinstance(event, ToolCallArgsDelta):
            return self._chunk(index, {"tool_calls": [{
                "index": event.index, "function": {"arguments": event.text}}]})
        if isinstance(event, Finish):
            return self._chunk(index, {}, event.reason)
        return None

    def usage(self, usage: UsageFold) -> bytes:
        """The last chunk (``stream_options.include_usage``): no choices, the usage."""
        return b"data: " + orjson.dumps({**self._head, "choices": [],
                                         "usage": usage.chat()}) + b"\n\n"


class _ChoiceFold:
    __slots__ = ("text", "reasoning", "calls", "logprobs", "finish")

    def __init__(self, logprobs: bool):
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.logprobs: list | None = [] if logprobs else None
        self.finish: str | None = None


class ChatFold:
    """Folds the events of every choice into one ``chat.completion`` object."""

    def __init__(self, n: int, tokenizer: Tokenizer, logprobs: bool,
                 reasoning_field: str = "reasoning_content"):
        self._choices = [_ChoiceFold(logprobs) for _ in range(n)]
        self._tokenizer = tokenizer
        self._reasoning = reasoning_fields(reasoning_field)
        self.usage = UsageFold(n, n)

    def add(self, index: int, event: Event) -> None:
        c = self._choices[index]
        if isinstance(event, TextDelta):
            c.text.append(event.text)
            if c.logprobs is not None:
                c.logprobs += [chat_entry(self._tokenizer, e) for e in event.logprobs or ()]
        elif isinstance(event, ReasoningDelta):
            c.reasoning.append(event.text)
        elif isinstance(event, ToolCallBegin):
            c.calls[event.index] = {"id": event.id, "type": "function",
                                    "function": {"name": event.name, "arguments": ""}}
        elif isinstance(event, ToolCallArgsDelta):
            c.calls[event.index]["function"]["arguments"] += event.text
        elif isinstance(event, ToolCallEnd):
            c.calls[event.index]["function"]["arguments"] = event.arguments
        elif isinstance(event, Finish):
            c.finish = event.reason
        elif isinstance(event, Usage):
            self.usage.add(index, event)

    def _message(self, c: _ChoiceFold) -> dict[str, Any]:
        text = "".join(c.text)
        message: dict[str, Any] = {"role": "assistant",
                                   "content": text if text or not c.calls else None,
                                   "refusal": None}
        if c.reasoning:
            message.update({f: "".join(c.reasoning) for f in self._reasoning})
        if c.calls:
            message["tool_calls"] = [c.calls[i] for i in sorted(c.calls)]
        return message

    def result(self, completion_id: str, created: int, model: str) -> dict[str, Any]:
        choices = [{"index": i, "message": self._message(c),
                    "logprobs": ({"content": c.logprobs, "refusal": None}
                                 if c.logprobs is not None else None),
                    "finish_reason": c.finish or "stop"}
                   for i, c in enumerate(self._choices)]
        return {"id": completion_id, "object": "chat.completion", "created": created,
                "model": model, "choices": choices,
                "usage": self.usage.chat()}
