"""Ollama's embeddings: ``POST /api/embed`` (``input``: a string or strings; ``embeddings``)
and the older ``POST /api/embeddings`` (``prompt``; ``embedding``), over the embeddings
service every API shares (podium/api/embeddings.py): its engine path, its bounds and its
rule for ``dimensions`` (the same answer as ``/v1/embeddings`` gives).

Truncation is Ollama's: ``truncate`` (the default) cuts the end of an input longer than the
model takes, keeping the token the tokenizer closes every input with (BERT's ``[SEP]``), as
sentence-transformers cuts; ``truncate: false`` makes such an input a 400 naming it.
An empty ``input`` (or ``prompt``) only loads the model, as in Ollama. A request's tokens
together are bounded as ``/v1/embeddings``' are (--max-embedding-tokens).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from podium.engine.base import Tokenizer
from podium.errors import InvalidRequestError
from podium.generation import off_loop
from podium.protocol.embeddings import EmbeddingsRequest as OpenAIEmbeddings
from podium.protocol.ollama_models import EmbeddingsRequest, EmbedRequest
from podium.server.served import Served


def ns(seconds: float) -> int:
    return int(seconds * 1e9)


async def embed(served: Served, req: EmbedRequest, *, started: float, loaded: float,
                small: bool = False) -> dict[str, Any]:
    """``/api/embed``'s answer: one vector per input, Ollama's counters (nanoseconds from
    ``started``; the load: until ``loaded``, both ``time.monotonic()``)."""
    texts = [req.input] if isinstance(req.input, str) else list(req.input)
    vectors: list[list[float]] = []
    used = 0
    if texts and texts != [""]:
        vectors, used = await _vectors(served, req.model, texts, req.truncate,
                                       req.dimensions, small)
    return {"model": req.model, "embeddings": vectors,
            "total_duration": ns(time.monotonic() - started),
            "load_duration": ns(loaded - started), "prompt_eval_count": used}


async def embedding(served: Served, req: EmbeddingsRequest, *, small: bool = False
                    ) -> dict[str, Any]:
    """``/api/embeddings``'s answer: the prompt's vector (none for an empty prompt)."""
    if not req.prompt:
        return {"embedding": []}
    vectors, _ = await _vectors(served, req.model, [req.prompt], True, None, small)
    return {"embedding": vectors[0]}


async def _vectors(served: Served, model: str, texts: list[str], truncate: bool,
                   dimensions: int | None, small: bool) -> tuple[list[list[float]], int]:
    ids = await off_loop(_tokens, served.engine.tokenizer, texts,
                         served.engine.info.context_length, truncate,
                         served.embeddings.check_total, inline=small)
    wire = OpenAIEmbeddings.model_construct(
        model=model, input=ids, encoding_format="float", dimensions=dimensions, user=None,
        truncate_prompt_tokens=None)
    answer = await served.embeddings.create(wire, small=small)
    return [d["embedding"] for d in answer["data"]], answer["usage"]["prompt_tokens"]


def _tokens(tokenizer: Tokenizer, texts: list[str], limit: int, truncate: bool,
            check_total: Callable[[int], None]) -> list[list[int]]:
    """Each text's tokens, cut to ``limit`` (keeping the closing token the tokenizer adds)
    or refused when ``truncate`` is off; ``check_total`` refuses a request whose tokens
    pass the service's bound as soon as they do (the service counts them again)."""
    added = tokenizer.encode("")            # what the tokenizer puts around every input
    closing = added[-1] if len(added) >= 2 else None
    out: list[list[int]] = []
    total = 0
    for i, text in enumerate(texts):
        if not text:
            raise InvalidRequestError("an input is empty", param=f"input[{i}]")
        ids = tokenizer.encode(text)
        if len(ids) > limit:
            if not truncate:
                raise InvalidRequestError(
                    f"input {i} has {len(ids)} tokens, more than this model's {limit}: "
                    f"shorten it, or leave truncate on (the default) to cut its end",
                    param=f"input[{i}]")
            end = [closing] if closing is not None and ids[-1] == closing else []
            ids = ids[:limit - len(end)] + end
        total += len(ids)
        check_total(total)
        out.append(ids)
    return out
