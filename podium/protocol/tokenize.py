"""``POST /tokenize`` and ``POST /detokenize`` request models (vLLM's shapes)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from podium.protocol.chat import Message, Tool
from podium.protocol.common import LENIENT


class TokenizeRequest(BaseModel):
    """A ``prompt`` as it is, or ``messages`` rendered with the model's chat template (and
    ``tools``), exactly as a chat request would be."""

    model_config = LENIENT
    model: str
    prompt: str | None = None
    messages: list[Message] | None = Field(None, min_length=1)
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None     # default: a prompt's yes; the template's own
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(BaseModel):
    model_config = LENIENT
    model: str
    tokens: list[int]
