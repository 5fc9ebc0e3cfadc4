"""Semantic events to Completions: ``text_completion`` chunks and the folded object.

With ``echo`` a choice's text begins with its prompt (and, when logprobs are asked, the
prompt tokens' logprobs, the first of which is null).
"""

from __future__ import annotations

from typing import Any, Protocol

from podium.engine.base import Tokenizer
from podium.parsing.events import Event, Finish, PromptLogprobs, TextDelta, Usage
from podium.render.base import HOLE, Fold, Shape
from podium.render.chat import UsageChunk, chat_usage
from podium.render.logprobs import LegacyLogprobs


class Echo(Protocol):
    text: str
    token_ids: list[int]


class _Choices:
    """Per-choice state both renderings need: pending echo and running logprobs."""

    def __init__(self, head: dict[str, Any], tokenizer: Tokenizer, logprobs: int | None,
                 echoes: list[Echo | None]):
        self._head = head
        self._echoes = list(echoes)
        self._logprobs = ([LegacyLogprobs(tokenizer) for _ in echoes]
                          if logprobs is not None else None)

    def echo(self, index: int, event: Event) -> str | None:
        """The prompt text to put before this choice's first output (once); the prompt's
        logprobs, when asked, are the choice's first event."""
        echo = self._echoes[index]
        if echo is None:
            return None
        self._echoes[index] = None
        if self._logprobs is not None:
            scores = (event.logprobs if isinstance(event, PromptLogprobs)
                      else [None] * len(echo.token_ids))
            for token_id, lp in zip(echo.token_ids, scores):
                self._logprobs[index].add(token_id, lp)
        return echo.text

    def add_logprobs(self, index: int, event: TextDelta) -> None:
        if self._logprobs is not None:
            for lp in event.logprobs or ():
                self._logprobs[index].add(lp.token_id, lp)

    def take_logprobs(self, index: int) -> dict[str, Any] | None:
        return self._logprobs[index].take() if self._logprobs is not None else None


class CompletionChunks(_Choices, UsageChunk):
    """The stream's renderer: ``text_completion`` chunks. A per-token chunk without logprobs
    is ``Filled`` (its choice's shape and the text), written by the encoder from a template."""

    def __init__(self, completion_id: str, created: int, model: str, tokenizer: Tokenizer,
                 logprobs: int | None, echoes: list[Echo | None], *,
                 include_usage: bool = False):
        super().__init__({"id": completion_id, "object": "text_completion",
                          "created": created, "model": model}, tokenizer, logprobs, echoes)
        self._include_usage = include_usage
        self._shapes: dict[int, Shape] = {}

    def _chunk(self, index: int, text: str, finish: str | None) -> dict[str, Any]:
        return {**self._head, "choices": [{"index": index, "text": text,
                                           "logprobs": self.take_logprobs(index),
                                           "finish_reason": finish}]}

    def open(self) -> list[Any]:
        return []

    def event(self, index: int, event: Event) -> list[Any]:
        if type(event) is TextDelta and self._logprobs is None and self._echoes[index] is None:
            shape = self._shapes.get(index)       # the per-token case first
            if shape is None:
                shape = self._shapes[index] = Shape(self._chunk(index, HOLE, None))
            return [(shape, event.text)]
        out = []
        echo = self.echo(index, event)
        if echo is not None:
            out.append(self._chunk(index, echo, None))
        if isinstance(event, TextDelta):
            self.add_logprobs(index, event)
            out.append(self._chunk(index, event.text, None))
        elif isinstance(event, Finish):
            out.append(self._chunk(index, "", event.reason))
        return out


class CompletionFold(_Choices, Fold):
    """The non-stream renderer: every choice's text folded into one ``text_completion``."""

    def __init__(self, completion_id: str, created: int, model: str, tokenizer: Tokenizer,
                 logprobs: int | None, echoes: list[Echo | None]):
        super().__init__({"id": completion_id, "object": "text_completion",
                          "created": created, "model": model}, tokenizer, logprobs, echoes)
        self._text: list[list[str]] = [[] for _ in echoes]
        self._finish: list[str | None] = [None] * len(echoes)

    def event(self, index: int, event: Event) -> list[Any]:
        echo = self.echo(index, event)
        if echo is not None:
            self._text[index].append(echo)
        if isinstance(event, TextDelta):
            self._text[index].append(event.text)
            self.add_logprobs(index, event)
        elif isinstance(event, Finish):
            self._finish[index] = event.reason
        return []

    def result(self) -> dict[str, Any]:
        choices = [{"index": i, "text": "".join(self._text[i]),
                    "logprobs": self.take_logprobs(i),
                    "finish_reason": self._finish[i] or "stop"}
                   for i in range(len(self._text))]
        return {**self._head, "choices": choices, "usage": chat_usage(self.usage)}
