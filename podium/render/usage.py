"""The ``Usage`` events of a request's choices, folded into the request's usage.

Choices come in groups that share one prompt (``n`` per prompt: Chat has one prompt,
Completions one per prompt in its list). A prompt's tokens count once per group, and its
cached tokens are the most any choice of the group reused; completion and reasoning tokens
add up over every choice.
"""

from __future__ import annotations

from typing import Any

from podium.parsing.events import Usage


class UsageFold:
    __slots__ = ("_n", "_usages")

    def __init__(self, choices: int, n: int = 1):
        self._n = n
        self._usages: list[Usage | None] = [None] * choices

    def add(self, index: int, usage: Usage) -> None:
        self._usages[index] = usage

    def totals(self) -> Usage:
        total = Usage(0, 0)
        n = self._n
        for start in range(0, len(self._usages), n):
            group = [u for u in self._usages[start:start + n] if u is not None]
            if not group:
                continue
            total.prompt_tokens += group[0].prompt_tokens
            total.cached_tokens += max(u.cached_tokens for u in group)
            total.completion_tokens += sum(u.completion_tokens for u in group)
            total.reasoning_tokens += sum(u.reasoning_tokens for u in group)
        return total

    def chat(self) -> dict[str, Any]:
        """The usage object of Chat Completions and Completions."""
        u = self.totals()
        return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                "total_tokens": u.prompt_tokens + u.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}
