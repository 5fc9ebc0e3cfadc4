"""Logprobs in the two shapes the APIs use: chat's per-token objects and the legacy lists."""

from __future__ import annotations

from typing import Any

from podium.engine.base import TokenLogprob, Tokenizer

# OpenAI reports impossible tokens as -9999.0; JSON has no -inf.
FLOOR = -9999.0


def _lp(value: float) -> float:
    return value if value > FLOOR else FLOOR


def chat_entry(tokenizer: Tokenizer, lp: TokenLogprob) -> dict[str, Any]:
    piece = tokenizer.piece(lp.token_id)
    return {
        "token": piece.decode("utf-8", "replace"), "logprob": _lp(lp.logprob),
        "bytes": list(piece),
        "top_logprobs": [_top_entry(tokenizer, t, v) for t, v in lp.top],
    }


def _top_entry(tokenizer: Tokenizer, token_id: int, value: float) -> dict[str, Any]:
    piece = tokenizer.piece(token_id)
    return {"token": piece.decode("utf-8", "replace"), "logprob": _lp(value),
            "bytes": list(piece)}


class LegacyLogprobs:
    """The Completions ``logprobs`` object, built up token by token."""

    def __init__(self, tokenizer: Tokenizer, offset: int = 0):
        self._tokenizer = tokenizer
        self._offset = offset
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []

    def add(self, token_id: int, lp: TokenLogprob | None) -> None:
        token = self._tokenizer.piece(token_id).decode("utf-8", "replace")
        self.tokens.append(token)
        self.text_offset.append(self._offset)
        self._offset += len(token)
        if lp is None:
            self.token_logprobs.append(None)
            self.top_logprobs.append(None)
            return
        self.token_logprobs.append(_lp(lp.logprob))
        self.top_logprobs.append({self._tokenizer.piece(t).decode("utf-8", "replace"): _lp(v)
                                  for t, v in lp.top})

    def take(self) -> dict[str, Any]:
        """The entries added since the last ``take`` (each stream chunk carries its own)."""
        out = {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
               "top_logprobs": self.top_logprobs, "text_offset": self.text_offset}
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        return out
