"""``POST /v1/embeddings`` request model (OpenAI's shape, plus vLLM's truncation)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictInt, ValidationError
from pydantic import ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError

from podium.protocol.common import LENIENT

MAX_INPUTS = 2048

Strings = Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)]
# strict: JSON's true is not token id 1, nor 1.0 token id 1
Ids = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
IdLists = Annotated[list[Ids], Field(min_length=1, max_length=MAX_INPUTS)]


def _one_sentence(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A malformed ``input`` said once, plainly, instead of once per member of the union."""
    try:
        return handler(value)
    except ValidationError:
        if isinstance(value, list) and len(value) > MAX_INPUTS:
            said = f"{len(value)} items, more than the {MAX_INPUTS} a request may hold"
        elif value == [] or (isinstance(value, list) and [] in value):
            said = "an input is empty: each needs at least one token"
        else:
            said = ("give a string, an array of strings, an array of token ids (integers "
                    "from 0) or an array of arrays of token ids")
        raise PydanticCustomError("input", said) from None


class EmbeddingsRequest(BaseModel):
    model_config = LENIENT
    model: str
    input: Annotated[str | Strings | Ids | IdLists, WrapValidator(_one_sentence)]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    # vLLM's: keep only the last k tokens of each input (-1: as many as the model takes)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)


class Document(BaseModel):
    model_config = LENIENT
    text: str


class RerankRequest(BaseModel):
    """Cohere's and Jina's rerank shape (vLLM's too)."""

    model_config = LENIENT
    model: str
    query: str = Field(min_length=1)
    documents: Annotated[list[str | Document], Field(min_length=1, max_length=1000)]
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
