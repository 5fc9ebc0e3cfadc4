"""A reasoning budget, kept by the engine token by token (issue 41).

A choice whose request carries a ``ReasoningBudget`` counts the tokens it writes inside
reasoning: from the start when the prompt opened it (a template that ends its generation
prompt in ``<think>``), or from the model's own opening sequence (``open``). The model's own
end of reasoning (``ends``: ``</think>``, Harmony's ``<|end|>`` of the analysis message) stops
the count. When the count reaches the budget, the engine writes ``close`` itself, a token a
step in place of a sampled one (the family's exact end of reasoning: ``\\n</think>\\n\\n``, or
Harmony's end of analysis and the start of the final message), and the model goes on to its
answer. The forced tokens reach the client like any others, so the parsers see what the model
would have written, and ``max_tokens`` still bounds the whole output.

Budget 0 closes reasoning at once: before the first token when the prompt opened it, right
after the model's opening sequence otherwise. A forced token a grammar refuses (a constrained
span the close cannot enter) is not written: the count goes on and the close is tried again
after the next token, so the grammar's structure always wins.
"""

from __future__ import annotations

from podium.engine.base import ReasoningBudget


class BudgetKeeper:
    """One choice's reasoning count, and the tokens the engine must write next."""

    __slots__ = ("budget", "inside", "spent", "reached", "_recent", "_forcing", "_keep")

    def __init__(self, budget: ReasoningBudget):
        self.budget = budget
        self.inside = budget.inside
        self.spent = 0                  # reasoning tokens written (the model's, inside)
        self.reached = False            # the budget ended reasoning at least once
        self._recent: list[int] = []    # the last tokens, to find ``open`` and ``ends``
        self._keep = max(len(budget.open), len(budget.ends), 1)
        self._forcing: list[int] = []   # the close still to write
        if self.inside and budget.tokens <= 0:
            self._start_close()

    def forced(self) -> int | None:
        """The token the engine writes now instead of sampling one, if any."""
        return self._forcing[0] if self._forcing else None

    @property
    def forcing(self) -> list[int]:
        """The close still to write (the next ``forced`` tokens)."""
        return list(self._forcing)

    def refused(self) -> None:
        """The forced token was refused (by a grammar): drop the close, try again later."""
        self._forcing = []

    def feed(self, token: int) -> None:
        """``token`` was written (sampled, or the forced one)."""
        if self._forcing and token == self._forcing[0]:
            del self._forcing[0]
            if not self._forcing:
                self.inside = False
            return
        recent = self._recent
        recent.append(token)
        del recent[:-self._keep]
        if self.inside:
            if _ends_with(recent, self.budget.ends):
                self.inside = False
                return
            self.spent += 1
            if self.spent >= self.budget.tokens:
                self._start_close()
        elif self.budget.open and _ends_with(recent, self.budget.open):
            self.inside = True
            if self.budget.tokens <= 0:
                self._start_close()

    def _start_close(self) -> None:
        self.reached = True
        self._forcing = list(self.budget.close)


def _ends_with(recent: list[int], tail: tuple[int, ...]) -> bool:
    return bool(tail) and len(recent) >= len(tail) and tuple(recent[-len(tail):]) == tail
