"""A dialect: how one model is spoken to and how what it writes is read.

Chosen once, when the model loads (``select``), from the model's chat template and the
server's settings: the model's Jinja template with the reasoning and tool-call families it
implies (``TemplateDialect``), or Harmony for gpt-oss (``HarmonyDialect``). A dialect owns
everything family-specific, so the services hold no family branches:

- ``prompt``: a ``Conversation`` and its ``Options`` rendered and tokenized;
- ``constraint``: the grammar a forced tool call or a response format puts on decoding;
- ``sampling``: what the dialect adds to every request's sampling (stop tokens);
- ``reasoning``: a request's reasoning budget in the family's own tokens;
- ``stream``: one choice's ``ChoiceStream`` (engine outputs in, semantic events out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from podium.conversation import Conversation, Options
from podium.engine.base import ReasoningBudget, SamplingParams
from podium.stream import ChoiceStream


@dataclass(slots=True)
class Prompt:
    token_ids: list[int]
    text: str = ""              # the rendered text (template dialects; the parsers look at it)


class Dialect(Protocol):
    name: str                   # "template" or "harmony", shown in logs and /health

    def prompt(self, conversation: Conversation, options: Options) -> Prompt:
        """Rendered and tokenized; ``InvalidRequestError`` naming the caller's parameter
        for anything this model cannot be asked."""

    def constraint(self, options: Options) -> str | None:
        """The llguidance grammar decoding must follow, or None."""

    def reasoning(self, prompt: Prompt, options: Options) -> ReasoningBudget | None:
        """``options.reasoning_budget`` as the engine keeps it (the family's open, end and
        close sequences), or None: no budget, or a model that does not reason."""

    def sampling(self, params: SamplingParams) -> None:
        """Add what every choice of this dialect needs (stop tokens) to ``params``."""

    def stream(self, prompt: Prompt, options: Options) -> ChoiceStream:
        """A fresh per-choice stream."""
