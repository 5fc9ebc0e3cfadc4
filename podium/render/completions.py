"""Semantic events to Completions: ``text_completion`` chunks and the folded object.

With ``echo`` a choice's text begins with its prompt (and, when logprobs are asked, the
prompt tokens' logprobs, the first of which is null).
"""

from __future__ import annotations

from typing import Any, Protocol

from podium.engine.base import Tokenizer
from podium.parsing.events import Event, Finish, PromptLogprobs, TextDelta, Usage
from podium.render.logprobs import LegacyLogprobs
from podium.render.usage import UsageFold


class Echo(Protocol):
    text: str
    token_ids: list[int]


class _Choices:
    """Per-choice state both renderings need: pending echo and running logprobs."""

    def __init__(self, tokenizer: Tokenizer, logprobs: int | None, echoes: list[Echo | None],
                 n: int = 1):
        self._echoes = list(echoes)
        self._logprobs = ([LegacyLogprobs(tokenizer) for _ in echoes]
                          if logprobs is not None else None)
        self.usage = UsageFold(len(echoes), n)

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


class CompletionChunks(_Choices):
    def __init__(self, completion_id: str, created: int, model: str, tokenizer: Tokenizer,
                 logprobs: int | None, echoes: list[Echo | None], n: int = 1):
        super().__init__(tokenizer, logprobs, echoes, n)
        self._head = {"id": completion_id, "object": "text_completion", "created": created,
                      "model": model}

    def _chunk(self, index: int, text: str, finish: str | None) -> dict[str, Any]:
        return {**self._head, "choices": [{"index": index, "text": text,
                                           "logprobs": self.take_logprobs(index),
                                           "finish_reason": finish}]}

    def event(self, index: int, event: Event) -> list[dict[str, Any]]:
        out = []
        echo = self.echo(index, event)
        if echo is not None:
            out.append(self._chunk(index, echo, None))
        if isinstance(event, TextDelta):
            self.add_logprobs(index, event)
            out.append(self._chunk(index, event.text, None))
        elif isinstance(event, Finish):
            out.append(self._chunk(index, "", event.reason))
        elif isinstance(event, Usage):
            self.usage.add(index, event)
        return out

    def usage_chunk(self) -> dict[str, Any]:
        return {**self._head, "choices": [], "usage": self.usage.chat()}


class CompletionFold(_Choices):
    def __init__(self, tokenizer: Tokenizer, logprobs: int | None, echoes: list[Echo | None],
                 n: int = 1):
        super().__init__(tokenizer, logprobs, echoes, n)
        self._text: list[list[str]] = [[] for _ in echoes]
        self._finish: list[str | None] = [None] * len(echoes)

    def add(self, index: int, event: Event) -> None:
        echo = self.echo(index, event)
        if echo is not None:
            self._text[index].append(echo)
        if isinstance(event, TextDelta):
            self._text[index].append(event.text)
            self.add_logprobs(index, event)
        elif isinstance(event, Finish):
            self._finish[index] = event.reason
        elif isinstance(event, Usage):
            self.usage.add(index, event)

    def result(self, completion_id: str, created: int, model: str) -> dict[str, Any]:
        choices = [{"index": i, "text": "".join(self._text[i]),
                    "logprobs": self.take_logprobs(i),
                    "finish_reason": self._finish[i] or "stop"}
                   for i in range(len(self._text))]
        return {"id": completion_id, "object": "text_completion", "created": created,
                "model": model, "choices": choices,
                "usage": self.usage.chat()}
