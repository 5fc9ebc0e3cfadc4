"""Anthropic Messages request models (``POST /v1/messages``, ``/v1/messages/count_tokens``).

Content blocks stay plain objects here, each checked for its own fields by the adapter
(``api/messages.py``): Claude Code and the SDKs send block types this server does not know
yet (server tool results, documents, search results), and each of those gets a clear 400
naming its place (``messages[3].content[1]``), never a wall of union-validation errors.
Unknown top-level fields are ignored, as Anthropic does. ``cache_control`` (on tools, on
blocks, and the request's own for automatic caching) stays a plain object too: the adapter
checks it with Anthropic's wording.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from podium.protocol.chat import TOOL_NAME_PATTERN
from podium.protocol.common import LENIENT


class MessageParam(BaseModel):
    model_config = LENIENT
    role: Literal["user", "assistant", "system"]     # Claude Code sends inline system turns
    content: str | list[dict[str, Any]]


class ToolParam(BaseModel):
    """A client tool (``input_schema``) or a typed server tool (``type`` and no schema)."""

    model_config = LENIENT
    name: str = Field(min_length=1, max_length=128, pattern=TOOL_NAME_PATTERN)   # as Chat's
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    strict: bool | None = None      # every schema keyword enforced, or a 400
    cache_control: Any = None       # a prompt-cache breakpoint after this tool


class ToolChoice(BaseModel):
    model_config = LENIENT
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(BaseModel):
    model_config = LENIENT
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None
    display: str | None = None      # "omitted": thinking blocks carry only their signature


class _Common(BaseModel):
    model_config = LENIENT
    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: dict[str, Any] | None = None
    cache_control: Any = None       # automatic caching: a breakpoint on the last block


class MessagesRequest(_Common):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=16)
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    stream: bool = False


class CountTokensRequest(_Common):
    pass
