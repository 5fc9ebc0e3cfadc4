"""The semantic events every API renders: one stream per choice, folded for non-stream answers.

A choice's raw text becomes, through the output parsers, a sequence of these; the chat
renderer, the completions renderer and the Responses renderer only ever see events; usage and
prompt logprobs travel as events too, folded like the rest.
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
class ReasoningDelta:
    """Text the model wrote while thinking (``<think>`` ... ``</think>`` and the like)."""

    text: str


@dataclass(slots=True)
class ToolCallBegin:
    """A tool call starts: its id and function name are known, arguments will follow."""

    index: int
    id: str
    name: str


@dataclass(slots=True)
class ToolCallArgsDelta:
    """More of a call's arguments; a call's deltas concatenate to its final arguments."""

    index: int
    text: str


@dataclass(slots=True)
class ToolCallEnd:
    """The call is complete; ``arguments`` is the whole JSON text (valid JSON)."""

    index: int
    arguments: str


@dataclass(slots=True)
class Finish:
    """The choice ended: ``reason`` is stop / length / tool_calls (abort never reaches a client);
    ``stop_sequence`` is the stop string that ended it, if one did."""

    reason: str
    completion_tokens: int
    stop_sequence: str | None = None


@dataclass(slots=True)
class Usage:
    """What the choice cost, counted from tokens: it follows the choice's ``Finish`` (or, for
    a choice cut short, comes from ``ChoiceStream.finish()``). ``reasoning_tokens`` are the
    generated tokens spent thinking, for every family; the prediction's are its tokens the
    engine verified as drafts (Predicted Outputs), accepted into the output or rejected."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0          # prompt tokens the engine reused from its cache
    reasoning_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    cache_written: int = 0          # prompt tokens the engine added to its prompt cache


@dataclass(slots=True)
class PromptLogprobs:
    """The prompt tokens' logprobs (Completions' ``echo``): before the choice's first text;
    the first token has none."""

    logprobs: list[TokenLogprob | None]


Event = (TextDelta | ReasoningDelta | ToolCallBegin | ToolCallArgsDelta | ToolCallEnd | Finish
         | Usage | PromptLogprobs)
