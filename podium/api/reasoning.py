"""A request's reasoning budget: the reasoning tokens its model may write before the engine
ends the reasoning, from whichever field the request's API uses.

One rule for every adapter: thinking turned off (Chat's ``enable_thinking: false``,
Anthropic's ``thinking: disabled``, Ollama's ``think: false``) is a budget of 0; else an
explicit count wins (Anthropic's ``budget_tokens``, vLLM's ``thinking_token_budget``); else
an effort maps through the model's table (``--reasoning-budgets``), an effort of 0 tokens
turning thinking off too; nothing given is no limit. Off also asks the chat template not to
think (``enable_thinking: false``), where the template has that switch; where it has none,
the budget of 0 is what holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from podium.conversation import Options
from podium.settings import REASONING_BUDGETS, effort_budgets

# the table of a model without settings of its own (a caller outside a served model's)
DEFAULT_BUDGETS: Mapping[str, int] = effort_budgets(REASONING_BUDGETS)


@dataclass(frozen=True, slots=True)
class Budget:
    tokens: int | None              # None: no limit
    param: str | None = None        # the caller's parameter it came from
    thinking: bool = True           # False: the model is asked not to think


NO_LIMIT = Budget(None)


def off(param: str) -> Budget:
    """Thinking turned off by ``param``."""
    return Budget(0, param, thinking=False)


def of_effort(effort: str, budgets: Mapping[str, int], param: str) -> Budget:
    """An effort through the model's table; one of 0 tokens turns thinking off."""
    tokens = budgets[effort]
    return Budget(tokens, param, thinking=tokens > 0)


def applied(options: Options, budget: Budget) -> Options:
    """``options`` under ``budget``: off also sets the template's switch, beside the
    caller's own template arguments."""
    if budget.thinking:
        return dataclasses.replace(options, reasoning_budget=budget.tokens,
                                   reasoning_budget_param=budget.param)
    kwargs = {**(options.chat_template_kwargs or {}), "enable_thinking": False}
    return dataclasses.replace(options, reasoning_budget=budget.tokens,
                               reasoning_budget_param=budget.param, thinking=False,
                               chat_template_kwargs=kwargs)
