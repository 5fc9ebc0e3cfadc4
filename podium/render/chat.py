"""Semantic events to Chat Completions: stream chunks, and the folded ``chat.completion``.

The non-stream object is the fold of exactly the events the stream renders, so the two
cannot disagree.
"""

from __future__ import annotations

from typing import Any

from podium.engine.base import Tokenizer
from podium.parsing.events import Event, Finish, TextDelta
from podium.render.logprobs import chat_entry


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class ChatChunks:
    """Builds ``chat.completion.chunk`` objects; every chunk shares id, created and model."""

    def __init__(self, completion_id: str, created: int, model: str, tokenizer: Tokenizer,
                 logprobs: bool):
        self._head = {"id": completion_id, "object": "chat.completion.chunk",
                      "created": created, "model": model}
        self._tokenizer = tokenizer
        self._logprobs = logprobs

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        return {**self._head, "choices": [choice]}

    def role(self, index: int) -> dict[str, Any]:
        return self._chunk({"index": index, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None})

    def event(self, index: int, event: Event) -> dict[str, Any] | None:
        if isinstance(event, TextDelta):
            lp = None
            if self._logprobs:
                lp = {"content": [chat_entry(self._tokenizer, e) for e in event.logprobs or ()],
                      "refusal": None}
            return self._chunk({"index": index, "delta": {"content": event.text},
                                "logprobs": lp, "finish_reason": None})
        if isinstance(event, Finish):
            return self._chunk({"index": index, "delta": {}, "logprobs": None,
                                "finish_reason": event.reason})
        return None

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return {**self._head, "choices": [], "usage": usage(prompt_tokens, completion_tokens)}


class ChatFold:
    """Folds the events of every choice into one ``chat.completion`` object."""

    def __init__(self, n: int, tokenizer: Tokenizer, logprobs: bool):
        self._text: list[list[str]] = [[] for _ in range(n)]
        self._logprobs = [[] for _ in range(n)] if logprobs else None
        self._finish: list[str | None] = [None] * n
        self._tokenizer = tokenizer
        self.completion_tokens = 0

    def add(self, index: int, event: Event) -> None:
        if isinstance(event, TextDelta):
            self._text[index].append(event.text)
            if self._logprobs is not None:
                self._logprobs[index] += [chat_entry(self._tokenizer, e)
                                          for e in event.logprobs or ()]
        elif isinstance(event, Finish):
            self._finish[index] = event.reason
            self.completion_tokens += event.completion_tokens

    def result(self, completion_id: str, created: int, model: str,
               prompt_tokens: int) -> dict[str, Any]:
        choices = [{
            "index": i,
            "message": {"role": "assistant", "content": "".join(self._text[i]),
                        "refusal": None},
            "logprobs": ({"content": self._logprobs[i], "refusal": None}
                         if self._logprobs is not None else None),
            "finish_reason": self._finish[i] or "stop",
        } for i in range(len(self._text))]
        return {"id": completion_id, "object": "chat.completion", "created": created,
                "model": model, "choices": choices,
                "usage": usage(prompt_tokens, self.completion_tokens)}
