"""Responses API request models (``POST /v1/responses``) and its input items."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from podium.protocol.chat import (CacheBreakpoint, CacheKey, GrammarDefinition,
                                  PromptCacheOptions)
from podium.protocol.common import LENIENT, ThinkingTokenBudget


class TextContent(BaseModel):
    model_config = LENIENT
    type: Literal["input_text", "output_text", "text", "summary_text", "reasoning_text"]
    text: str
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class OtherContent(BaseModel):
    """Images, files, audio, refusals: named so the error can say what was refused."""

    model_config = LENIENT
    type: Literal["input_image", "input_file", "input_audio", "refusal"]


Content = Annotated[TextContent | OtherContent, Field(discriminator="type")]


class MessageItem(BaseModel):
    model_config = LENIENT
    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Content]
    status: str | None = None


class FunctionCallItem(BaseModel):
    model_config = LENIENT
    type: Literal["function_call"]
    id: str | None = None
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None
    status: str | None = None


class FunctionCallOutputItem(BaseModel):
    model_config = LENIENT
    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str
    output: str | list[Content]
    status: str | None = None


class CustomToolCallItem(BaseModel):
    model_config = LENIENT
    type: Literal["custom_tool_call"]
    id: str | None = None
    call_id: str
    name: str
    input: str
    namespace: str | None = None


class CustomToolCallOutputItem(BaseModel):
    model_config = LENIENT
    type: Literal["custom_tool_call_output"]
    id: str | None = None
    call_id: str
    output: str | list[Content]


class CustomToolFormat(BaseModel):
    """``{"type": "text"}``, or ``{"type": "grammar", "syntax", "definition"}``."""

    model_config = LENIENT
    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: GrammarDefinition | None = None

    @model_validator(mode="after")
    def _whole(self) -> CustomToolFormat:
        if self.type == "grammar" and (self.syntax is None or self.definition is None):
            raise ValueError("a format of type 'grammar' needs its 'syntax' and 'definition'")
        return self


class CustomTool(BaseModel):
    """A custom tool's fields beyond its name (which the tool map checks, as every tool's)."""

    model_config = LENIENT
    type: Literal["custom"]
    description: str | None = None
    format: CustomToolFormat | None = None

    @property
    def grammar(self) -> tuple[str, str] | None:
        """(syntax, definition), or None for free text."""
        fmt = self.format
        if fmt is None or fmt.type == "text":
            return None
        assert fmt.syntax is not None and fmt.definition is not None      # (_whole)
        return fmt.syntax, fmt.definition


class ReasoningItem(BaseModel):
    model_config = LENIENT
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[TextContent] = Field(default_factory=list)
    content: list[TextContent] | None = None
    encrypted_content: str | None = None


class McpListToolsItem(BaseModel):
    model_config = LENIENT
    type: Literal["mcp_list_tools"]
    id: str | None = None
    server_label: str
    tools: list[dict[str, Any]]
    error: str | None = None


class McpCallItem(BaseModel):
    model_config = LENIENT
    type: Literal["mcp_call"]
    id: str | None = None
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: dict[str, Any] | str | None = None
    status: str | None = None
    approval_request_id: str | None = None


class McpApprovalRequestItem(BaseModel):
    model_config = LENIENT
    type: Literal["mcp_approval_request"]
    id: str | None = None
    server_label: str
    name: str
    arguments: str


class McpApprovalResponseItem(BaseModel):
    model_config = LENIENT
    type: Literal["mcp_approval_response"]
    id: str | None = None
    approval_request_id: str
    approve: bool
    reason: str | None = None


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | CustomToolCallItem
    | CustomToolCallOutputItem | ReasoningItem | McpListToolsItem | McpCallItem
    | McpApprovalRequestItem | McpApprovalResponseItem, Field(discriminator="type")]


class ResponsesCacheOptions(PromptCacheOptions):
    """Chat's ``prompt_cache_options`` and Responses' own: ``prewarm`` (a prefill without
    an answer, which Podium refuses) and ``comparison_response_id`` (a request for
    diagnostics, which Podium does not make: the response says ``unavailable``)."""

    prewarm: bool = False
    comparison_response_id: str | None = Field(None, max_length=64)


class ResponsesRequest(BaseModel):
    model_config = LENIENT

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    max_tool_calls: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    seed: int | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    thinking_token_budget: ThinkingTokenBudget = None      # vLLM's Chat extension, here too
    metadata: dict[str, str] | None = None
    store: bool = True
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None     # an id, or {"id": ...}
    background: bool = False
    stream: bool = False
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    prompt_cache_key: CacheKey | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: ResponsesCacheOptions | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    client_metadata: dict[str, Any] | None = None
