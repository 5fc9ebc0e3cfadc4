"""Completions request model (``POST /v1/completions``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from podium.protocol.common import SamplingFields
from podium.protocol.structured import StructuredOutputs

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Prompt = str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[
    list[TokenIds], Field(min_length=1)]


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: int | None = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)
    structured_outputs: StructuredOutputs | None = None     # vLLM's extension
