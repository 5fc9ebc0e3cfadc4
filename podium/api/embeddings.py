"""The Embeddings adapter: inputs in, one vector each out (``POST /v1/embeddings``).

Text is tokenized with the model's own tokenizer (special tokens as the model adds them);
token ids are taken as they are. The engine embeds every input of every request in shared
batches, at the caller's ``PRIORITY`` (the batch worker's inputs wait behind interactive
ones); the answer is OpenAI's list of embeddings, as floats or as base64 of little-endian
float32 (what the SDKs decode).

A request's tokens together are bounded (``--max-embedding-tokens``, OpenAI's 300,000 by
default), counted as they are tokenized so a refused request costs no more than the tokens
up to the bound; every engine, ``/api/embed`` and ``/v1/rerank`` pass through here. The
engine shares its decodes fairly between requests; the bound keeps one request's hold on
memory and on the engine (seconds to minutes of a CPU) within what real use needs.
"""

from __future__ import annotations

import base64
import math
import sys
from array import array
from typing import Any, cast

from podium.engine.base import Embedder, Engine, Reranker
from podium.errors import InvalidRequestError
from podium.generation import PRIORITY, new_id, off_loop
from podium.protocol.embeddings import EmbeddingsRequest, RerankRequest


def matryoshka(setting: str | None, declared: str | None = None) -> tuple[int, ...] | None:
    """The lengths a model's vectors may be shortened to: the --matryoshka-dimensions
    setting, else what its files declare (``declared``, the same spelling); ``()`` for any
    length, None when the model is not trained to be shortened. A bad value: ValueError."""
    text = setting if setting is not None else declared
    if text is None or not text.strip():
        return None
    if text.strip().lower() == "any":
        return ()
    try:
        lengths = tuple(sorted({int(part) for part in text.split(",")}, reverse=True))
    except ValueError:
        raise ValueError(f"matryoshka-dimensions is {text!r}: comma-separated lengths or "
                         f"'any'") from None
    if not lengths or lengths[-1] < 1:
        raise ValueError(f"matryoshka-dimensions is {text!r}: lengths must be positive")
    return lengths


class EmbeddingService:
    def __init__(self, engine: Engine, matryoshka: tuple[int, ...] | None = None,
                 max_tokens: int = 300_000):
        """``matryoshka``: the lengths vectors may be shortened to (``matryoshka()``);
        ``max_tokens``: the most tokens one request may hold (0: no limit)."""
        if max_tokens < 0:
            raise ValueError(f"--max-embedding-tokens must be 0 (no limit) or more, not "
                             f"{max_tokens}")
        self._engine = engine
        self._matryoshka = matryoshka
        self.max_tokens = max_tokens

    def check_total(self, total: int, param: str = "input") -> None:
        """A 400 naming ``param`` when the request's tokens so far (``total``) pass
        ``max_tokens``: checked as each input is tokenized, not once all of them are."""
        if self.max_tokens and total > self.max_tokens:
            what = "inputs" if param == "input" else "query and documents"
            raise InvalidRequestError(
                f"the {what} come to more than {self.max_tokens} tokens together, the most "
                f"one request may hold (the server's --max-embedding-tokens); send them in "
                f"several requests", param=param)

    async def create(self, req: EmbeddingsRequest, *, small: bool = False) -> dict[str, Any]:
        engine = self._embedder(req.model, "serve embeddings")
        dims = engine.dimensions
        shorten = req.dimensions if req.dimensions != dims else None
        if shorten is not None:
            self._check_dimensions(req.model, shorten, dims)
        inputs = await off_loop(self._inputs, req, inline=small)
        vectors = await engine.embed(inputs, PRIORITY.get())
        if shorten is not None:
            vectors = [_shortened(v, shorten) for v in vectors]
        data = [{"object": "embedding", "index": i,
                 "embedding": _base64(v) if req.encoding_format == "base64" else v}
                for i, v in enumerate(vectors)]
        used = sum(len(ids) for ids in inputs)
        return {"object": "list", "data": data, "model": req.model,
                "usage": {"prompt_tokens": used, "total_tokens": used}}

    async def rerank(self, req: RerankRequest, *, small: bool = False) -> dict[str, Any]:
        """The documents by relevance to the query: a reranker's own score (its head's
        output, as a probability), or with an embedding model the cosine similarity of
        their vectors."""
        texts = [req.query] + [d if isinstance(d, str) else d.text for d in req.documents]
        engine = self._engine
        if isinstance(engine, Reranker) and engine.kind == "rerank":
            ids = await off_loop(self._pairs, texts, req.truncate_prompt_tokens, inline=small)
            scores = await engine.score(ids[0], ids[1:], PRIORITY.get())
            # what the model read: the query with each document, and the model's markers
            used = sum(len(ids[0]) + len(d) + engine.pair_overhead for d in ids[1:])
        else:
            wire = EmbeddingsRequest.model_construct(
                model=req.model, input=texts, encoding_format="float", dimensions=None,
                truncate_prompt_tokens=req.truncate_prompt_tokens)
            try:
                inputs = await off_loop(self._inputs, wire, inline=small)
            except InvalidRequestError as exc:      # input[0] is the query, the rest docs
                exc.param = _rerank_param(exc.param)
                raise
            embedder = self._embedder(req.model, "rerank")
            query, *docs = await embedder.embed(inputs, PRIORITY.get())
            scores = [_cosine(query, d) for d in docs]
            used = sum(len(ids) for ids in inputs)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:req.top_n]
        results = []
        for i in order:
            result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
            if req.return_documents:
                result["document"] = {"text": texts[i + 1]}
            results.append(result)
        return {"id": new_id("rerank"), "model": req.model, "results": results,
                "usage": {"total_tokens": used}}

    def _check_dimensions(self, model: str, asked: int, dims: int | None) -> None:
        lengths = self._matryoshka
        if lengths is None:
            raise InvalidRequestError(
                f"'{model}' gives {dims}-dimensional embeddings and is not trained to be "
                f"shortened; leave dimensions out (or give {dims})", param="dimensions")
        if dims is not None and asked > dims:
            raise InvalidRequestError(
                f"'{model}' gives {dims}-dimensional embeddings; dimensions must be at most "
                f"{dims}", param="dimensions")
        if lengths and asked not in lengths:
            raise InvalidRequestError(
                f"'{model}' is trained to be shortened to {', '.join(map(str, lengths))} "
                f"dimensions, not {asked}", param="dimensions")

    def _embedder(self, model: str, what: str) -> Embedder:
        engine = self._engine
        if not isinstance(engine, Embedder) or engine.kind != "embedding":
            which = "a reranker" if getattr(engine, "kind", "") == "rerank" else "a chat model"
            raise InvalidRequestError(f"'{model}' is {which}: it does not {what}",
                                      param="model")
        return engine

    def _pairs(self, texts: list[str], keep: int | None) -> list[list[int]]:
        """A reranker's query and documents as token ids without special tokens (the engine
        puts the model's own around each pair). A pair longer than the model's context is a
        400 naming the document, unless ``truncate_prompt_tokens`` asks to cut it (the
        document's end goes)."""
        engine = self._engine
        tokenizer, limit = engine.tokenizer, engine.info.context_length
        overhead = cast(Reranker, engine).pair_overhead
        room = limit - overhead
        out: list[list[int]] = []
        total = 0
        for i, text in enumerate(texts):
            where = "query" if i == 0 else f"documents[{i - 1}]"
            if not text:
                raise InvalidRequestError(f"the {'query' if i == 0 else 'document'} is empty",
                                          param=where)
            ids = tokenizer.encode(text, add_special=False)
            if i == 0 and len(ids) >= room:
                raise InvalidRequestError(
                    f"the query is {len(ids)} tokens; this model reads at most {limit}, "
                    f"query and document together", param=where)
            if i and len(out[0]) + len(ids) > room:
                if keep is None:
                    raise InvalidRequestError(
                        f"the query and this document are {len(out[0]) + len(ids) + limit - room}"
                        f" tokens with the model's markers, more than its {limit}; shorten "
                        f"it, or set truncate_prompt_tokens to cut it", param=where)
                ids = ids[:room - len(out[0])]
            if i:                                   # what the model reads: the whole pair
                total += len(out[0]) + len(ids) + overhead
                self.check_total(total, "documents")
            out.append(ids)
        return out

    def _inputs(self, req: EmbeddingsRequest) -> list[list[int]]:
        raw: Any = req.input
        tokenizer = self._engine.tokenizer
        if isinstance(raw, str):
            raw = [raw]
        if raw and isinstance(raw[0], int):
            raw = [raw]                                 # one input of token ids
        limit = self._engine.info.context_length
        keep = req.truncate_prompt_tokens
        keep = limit if keep == -1 else keep
        out: list[list[int]] = []
        total = 0
        for i, item in enumerate(raw):
            if isinstance(item, str):
                if not item:
                    raise InvalidRequestError("an input is empty", param=f"input[{i}]")
                ids = tokenizer.encode(item)
            else:
                ids = list(item)
                for j, token in enumerate(ids):
                    if token >= tokenizer.vocab_size:
                        raise InvalidRequestError(
                            f"token {token} is not in the model's vocabulary",
                            param=f"input[{i}][{j}]")
            if keep is not None:
                ids = ids[-min(keep, limit):]
            if len(ids) > limit:
                raise InvalidRequestError(
                    f"input {i} has {len(ids)} tokens, more than this model's {limit}; "
                    f"shorten it, or set truncate_prompt_tokens", param=f"input[{i}]")
            total += len(ids)
            self.check_total(total)
            out.append(ids)
        return out


def _rerank_param(param: str | None) -> str:
    """Where an error about the embeddings of ``[query, *documents]`` is in the rerank
    request: ``input[0]`` is the query, ``input[k]`` document k - 1, ``input`` them all."""
    if not param or "[" not in param:
        return "documents"
    index = int(param.split("[")[1].split("]")[0])
    return "query" if index == 0 else f"documents[{index - 1}]"


def _shortened(vector: list[float], n: int) -> list[float]:
    """A Matryoshka vector's first ``n`` dimensions, normalized again."""
    head = vector[:n]
    norm = math.sqrt(sum(x * x for x in head)) or 1.0
    return [x / norm for x in head]


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    norms = math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    return dot / norms if norms else 0.0


def _base64(vector: list[float]) -> str:
    packed = array("f", vector)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()
