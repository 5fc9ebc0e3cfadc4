"""Ollama's generation requests (``POST /api/chat``, ``POST /api/generate``), as Ollama's API
reference and its ``ollama`` clients send them.

Fields Ollama ignores stay ignored (``LENIENT``), and so do the ``options`` it knows but
Podium does not use (``num_keep``, ``mirostat``, ``num_gpu`` ...), as Ollama ignores an
option it does not know. The options Podium uses are validated by type and range: a bad
one is a 400 naming ``options.<name>``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool

from podium.protocol.ollama_keepalive import KeepAlive
from podium.protocol.chat import FunctionDefinition
from podium.protocol.common import LENIENT

# Ollama's effort levels ("max" is its highest; Harmony has three)
Think = StrictBool | Literal["low", "medium", "high", "max"] | None
# "json", a JSON schema, or nothing ("" and null: plain text)
Format = Literal["", "json"] | dict[str, Any] | None


class Options(BaseModel):
    """The sampling options Podium honours, in Ollama's names."""

    model_config = LENIENT
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    num_predict: int | None = None          # < 1 (Ollama's -1, -2): as long as room allows
    num_ctx: int | None = Field(None, ge=1)
    stop: str | Annotated[list[str], Field(max_length=16)] | None = None
    seed: int | None = None
    repeat_penalty: float | None = Field(None, gt=0, le=10)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)


class Tool(BaseModel):
    model_config = LENIENT
    type: Literal["function"] = "function"
    function: FunctionDefinition


class CallFunction(BaseModel):
    model_config = LENIENT
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)   # an object, not JSON text
    index: int | None = None


class ToolCall(BaseModel):
    model_config = LENIENT
    id: str | None = None
    function: CallFunction


class Message(BaseModel):
    model_config = LENIENT
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class Generation(BaseModel):
    """What both routes take."""

    model_config = LENIENT
    model: str = Field(min_length=1)
    stream: StrictBool | None = True       # null: as absent (streamed)
    format: Format = None
    options: Options | None = None
    think: Think = None
    keep_alive: KeepAlive = None
    logprobs: StrictBool = False


class ChatRequest(Generation):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = None


class GenerateRequest(Generation):
    prompt: str = ""
    suffix: str = ""
    system: str = ""
    template: str = ""
    context: list[int] | None = None
    raw: StrictBool = False
    images: list[Any] | None = None
