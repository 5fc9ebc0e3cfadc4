"""Wire models of Ollama's model and embedding routes (``/api/show``, ``/api/embed``,
``/api/embeddings``, ``/api/pull``), as its API reference and its clients spell them.
Unknown fields are ignored, as Ollama ignores them."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, model_validator

from podium.protocol.ollama_keepalive import KeepAlive
from podium.protocol.common import LENIENT
from podium.protocol.embeddings import MAX_INPUTS

Name = Annotated[str, Field(max_length=512)]


class _Named(BaseModel):
    """``model``, or the older ``name`` Ollama still reads in its place."""

    model_config = LENIENT
    model: Name = ""
    name: Name = ""

    @model_validator(mode="after")
    def _either(self) -> "_Named":
        self.model = self.model or self.name
        if not self.model:
            raise ValueError("model is required")
        return self


class ShowRequest(_Named):
    verbose: bool = False               # Ollama fills long arrays then; Podium keeps them []


class PullRequest(_Named):
    stream: bool = True
    insecure: bool | None = None


class EmbedRequest(BaseModel):
    model_config = LENIENT
    model: Name
    input: str | Annotated[list[str], Field(max_length=MAX_INPUTS)] = ""
    truncate: bool = True               # false: an input over the model's length is a 400
    dimensions: int | None = Field(None, ge=1)
    keep_alive: KeepAlive = None
    options: dict[str, Any] | None = None   # sampling options: nothing to an embedding


class EmbeddingsRequest(BaseModel):
    """The older ``/api/embeddings``: one ``prompt``, one ``embedding``."""

    model_config = LENIENT
    model: Name
    prompt: str = ""
    keep_alive: KeepAlive = None
    options: dict[str, Any] | None = None
