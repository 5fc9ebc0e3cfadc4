"""The semantic events every API renders: one stream per choice, folded for non-stream answers.

The output-parsing pipeline adds reasoning and tool-call events beside these.
"""

from __future__ import annotations

from dataclasses import dataclass

from podium.engine.base import TokenLogprob


@dataclass(slots=True)
class TextDelta:
    """Visible text, with the logprobs of the tokens that completed it (when asked)."""

    text: str
    logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class Finish:
    """The choice ended: ``reason`` is stop / length (abort never reaches a client)."""

    reason: str
    completion_tokens: int


Event = TextDelta | Finish
