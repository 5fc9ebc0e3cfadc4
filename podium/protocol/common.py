"""Request fields shared by the Chat Completions and Completions APIs."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

# OpenAI accepts and ignores fields it does not know; so does Podium.
LENIENT = ConfigDict(extra="ignore")

Stop = str | Annotated[list[str], Field(max_length=4)] | None
# vLLM's ``thinking_token_budget``: reasoning tokens, or -1 for no limit (as not given)
ThinkingTokenBudget = Annotated[StrictInt, Field(ge=-1),
                                AfterValidator(lambda n: None if n == -1 else n)] | None


class StreamOptions(BaseModel):
    model_config = LENIENT
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Sampling controls both APIs accept (OpenAI's, plus llama.cpp / vLLM extensions)."""

    model_config = LENIENT

    model: str
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    stop: Stop = None
    user: str | None = None
