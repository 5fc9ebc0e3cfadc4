"""The semantic events every API renders: one stream per choice, folded for non-stream answers.

A choice's raw text becomes, through the output parsers, a sequence of these; the chat
renderer, the completions renderer and (later) the Responses renderer only ever see events.
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
    """The choice ended: ``reason`` is stop / length / tool_calls (abort never reaches a client)."""

    reason: str
    completion_tokens: int


Event = TextDelta | ReasoningDelta | ToolCallBegin | ToolCallArgsDelta | ToolCallEnd | Finish
