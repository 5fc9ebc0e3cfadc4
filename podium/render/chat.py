"""Semantic events to Chat Completions: stream chunks, and the folded ``chat.completion``.

Two renderers (``render.base``): ``ChatChunks`` for a stream, ``ChatFold`` for the object;
the object is the fold of exactly the events the stream renders, so the two cannot
disagree. A tool call's id, type and name appear once, in its first delta; its
argument deltas concatenate to the final ``arguments``. A custom tool's call (its name in
``custom``) is ``type: "custom"`` with ``custom: {"name", "input"}``, the input decoded from
the arguments the model wrote (``render.custom_input``) and streamed as it decodes. Reasoning
goes to
``reasoning_content`` (the field most clients read), ``reasoning``, or both.
"""

from __future__ import annotations

from typing import Any

from podium.engine.base import Tokenizer
from podium.parsing.events import (Event, Finish, ReasoningDelta, TextDelta, ToolCallArgsDelta,
                                   ToolCallBegin, ToolCallEnd, Usage)
from podium.render.custom_input import CustomInput
from podium.render.logprobs import chat_entry
from podium.render.base import HOLE, KEEPALIVE, Fold, Shape


def reasoning_fields(field: str) -> tuple[str, ...]:
    return ("reasoning_content", "reasoning") if field == "both" else (field,)


def chat_usage(u: Usage) -> dict[str, Any]:
    """The usage object of Chat Completions and Completions; the prediction's figures
    always, 0 without one, as OpenAI writes them; ``cache_write_tokens``: the prompt's
    tokens the engine added to its prompt cache (a breakpoint's prefix, a long prompt)."""
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens,
                                      "cache_write_tokens": u.cache_written},
            "completion_tokens_details": {
                "reasoning_tokens": u.reasoning_tokens,
                "accepted_prediction_tokens": u.accepted_prediction_tokens,
                "rejected_prediction_tokens": u.rejected_prediction_tokens}}


class UsageChunk:
    """What Chat's and Completions' streams end alike: the usage chunk (no choices), when
    ``stream_options.include_usage`` asks for it; a keep-alive is the wire's own."""

    _head: dict[str, Any]
    _include_usage: bool

    def keepalive(self) -> list[Any]:
        return [KEEPALIVE]

    def close(self, usage: Usage) -> list[Any]:
        if not self._include_usage:
            return []
        return [{**self._head, "choices": [], "usage": chat_usage(usage)}]


class ChatChunks(UsageChunk):
    """The stream's renderer: ``chat.completion.chunk`` objects sharing id, created and
    model. A per-token chunk (a text or a reasoning delta, no logprobs) is ``Filled``: its
    choice's text or reasoning shape and the text, which the encoder writes from a
    template."""

    def __init__(self, completion_id: str, created: int, model: str, tokenizer: Tokenizer,
                 logprobs: bool, reasoning_field: str = "reasoning_content", *, n: int = 1,
                 include_usage: bool = False, custom: frozenset[str] = frozenset()):
        self._head = {"id": completion_id, "object": "chat.completion.chunk",
                      "created": created, "model": model}
        self._custom = custom
        self._inputs: dict[tuple[int, int], CustomInput] = {}   # open custom calls
        self._tokenizer = tokenizer
        self._logprobs = logprobs
        self._reasoning = reasoning_fields(reasoning_field)
        self._n = n
        self._include_usage = include_usage
        # per choice, the shapes of its text and reasoning chunks
        self._text = [Shape(self._chunk(i, {"content": HOLE})) for i in range(n)]
        self._thought = [Shape(self._chunk(i, {self._reasoning[0]: HOLE})) for i in range(n)]

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None,
               logprobs: Any = None) -> dict[str, Any]:
        return {**self._head, "choices": [{
            "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    def open(self) -> list[Any]:
        return [self._chunk(i, {"role": "assistant", "content": ""}) for i in range(self._n)]

    def event(self, index: int, event: Event) -> list[Any]:
        kind = type(event)
        if kind is TextDelta and not self._logprobs:       # the per-token cases first
            return [(self._text[index], event.text)]       # type: ignore[union-attr]
        if kind is ReasoningDelta and len(self._reasoning) == 1:
            return [(self._thought[index], event.text)]    # type: ignore[union-attr]
        if isinstance(event, TextDelta):
            lp = None
            if self._logprobs:
                lp = {"content": [chat_entry(self._tokenizer, e) for e in event.logprobs or ()],
                      "refusal": None}
            return [self._chunk(index, {"content": event.text}, logprobs=lp)]
        if isinstance(event, ReasoningDelta):
            return [self._chunk(index, {f: event.text for f in self._reasoning})]
        if isinstance(event, ToolCallBegin):
            if event.name in self._custom:
                self._inputs[index, event.index] = CustomInput()
                return [self._call(index, event.index, event.id, "custom",
                                   {"name": event.name, "input": ""})]
            return [self._call(index, event.index, event.id, "function",
                               {"name": event.name, "arguments": ""})]
        if isinstance(event, ToolCallArgsDelta):
            decoder = self._inputs.get((index, event.index))
            if decoder is None:
                return [self._call(index, event.index, None, "function",
                                   {"arguments": event.text})]
            return self._input(index, event.index, decoder.feed(event.text))
        if isinstance(event, ToolCallEnd):
            decoder = self._inputs.pop((index, event.index), None)
            if decoder is None:
                return []
            return self._input(index, event.index,
                               decoder.rest(decoder.result(event.arguments)))
        if isinstance(event, Finish):
            return [self._chunk(index, {}, event.reason)]
        return []


    def _call(self, index: int, call: int, call_id: str | None, kind: str,
              body: dict[str, Any]) -> dict[str, Any]:
        """A chunk of one tool call: its id and type in the first (``call_id``), then the
        ``function`` or ``custom`` part alone."""
        head = {"index": call, "id": call_id, "type": kind} if call_id else {"index": call}
        return self._chunk(index, {"tool_calls": [{**head, kind: body}]})

    def _input(self, index: int, call: int, text: str) -> list[Any]:
        return [self._call(index, call, None, "custom", {"input": text})] if text else []


class _ChoiceFold:
    __slots__ = ("text", "reasoning", "calls", "inputs", "logprobs", "finish")

    def __init__(self, logprobs: bool):
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.inputs: dict[int, CustomInput] = {}        # custom calls
        self.logprobs: list | None = [] if logprobs else None
        self.finish: str | None = None


class ChatFold(Fold):
    """The non-stream renderer: folds the events of every choice into one
    ``chat.completion`` object, and sends nothing."""

    def __init__(self, completion_id: str, created: int, model: str, tokenizer: Tokenizer,
                 logprobs: bool, reasoning_field: str = "reasoning_content", *, n: int = 1,
                 custom: frozenset[str] = frozenset()):
        self._head = {"id": completion_id, "object": "chat.completion", "created": created,
                      "model": model}
        self._custom = custom
        self._choices = [_ChoiceFold(logprobs) for _ in range(n)]
        self._tokenizer = tokenizer
        self._reasoning = reasoning_fields(reasoning_field)

    def event(self, index: int, event: Event) -> list[Any]:
        self._add(index, event)
        return []

    def _add(self, index: int, event: Event) -> None:
        c = self._choices[index]
        if isinstance(event, TextDelta):
            c.text.append(event.text)
            if c.logprobs is not None:
                c.logprobs += [chat_entry(self._tokenizer, e) for e in event.logprobs or ()]
        elif isinstance(event, ReasoningDelta):
            c.reasoning.append(event.text)
        elif isinstance(event, ToolCallBegin):
            if event.name in self._custom:
                c.inputs[event.index] = CustomInput()
                c.calls[event.index] = {"id": event.id, "type": "custom",
                                        "custom": {"name": event.name, "input": ""}}
            else:
                c.calls[event.index] = {"id": event.id, "type": "function",
                                        "function": {"name": event.name, "arguments": ""}}
        elif isinstance(event, ToolCallArgsDelta):
            decoder = c.inputs.get(event.index)
            if decoder is None:
                c.calls[event.index]["function"]["arguments"] += event.text
            else:
                c.calls[event.index]["custom"]["input"] += decoder.feed(event.text)
        elif isinstance(event, ToolCallEnd):
            decoder = c.inputs.pop(event.index, None)
            if decoder is None:
                c.calls[event.index]["function"]["arguments"] = event.arguments
            else:
                c.calls[event.index]["custom"]["input"] = decoder.result(event.arguments)
        elif isinstance(event, Finish):
            c.finish = event.reason

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

    def result(self) -> dict[str, Any]:
        choices = [{"index": i, "message": self._message(c),
                    "logprobs": ({"content": c.logprobs, "refusal": None}
                                 if c.logprobs is not None else None),
                    "finish_reason": c.finish or "stop"}
                   for i, c in enumerate(self._choices)]
        return {**self._head, "choices": choices, "usage": chat_usage(self.usage)}
