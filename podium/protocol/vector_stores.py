"""Vector Stores API wire shapes (``/v1/vector_stores``): the requests, the objects OpenAI
answers with, and the checks of what a client puts in them (chunking, attributes, filters).

The objects are built from store rows (``store/vector_stores.py``) by plain functions, never
re-validated. Everything a client sends is bounded here: attributes (16 keys, OpenAI's
sizes), filters (``MAX_FILTER_DEPTH`` levels, ``MAX_FILTER_NODES`` comparisons and
compounds), chunking (OpenAI's ranges), queries (``MAX_QUERY_CHARS``), results (1..50).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from podium.errors import InvalidRequestError
from podium.protocol.common import LENIENT

Obj = dict[str, Any]

MAX_ATTRIBUTES = 16              # attributes of a file, as OpenAI's
MAX_ATTRIBUTE_KEY = 64
MAX_ATTRIBUTE_VALUE = 512        # characters of a string attribute
MAX_FILTER_DEPTH = 8             # nested compound filters
MAX_FILTER_NODES = 64            # comparisons and compounds in one filter
MAX_QUERY_CHARS = 4096           # characters of one search query
MAX_QUERIES = 8                  # queries of one search (a list)
MAX_RESULTS = 50                 # max_num_results, as OpenAI bounds it
MAX_FILE_IDS = 500               # files one create or file batch attaches, as OpenAI's
DEFAULT_CHUNK, DEFAULT_OVERLAP = 800, 400    # OpenAI's "auto" chunking
COMPARISONS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin")
# OpenAI's rankers: "none" ranks by cosine alone; "auto" and "default-2024-11-15" (as an
# unset ranker) re-score with the server's reranker when it serves one. Any other name is
# Podium's: a served reranker or embedding model to re-score with.
NO_RANKER, AUTO_RANKERS = "none", ("auto", "default-2024-11-15")


class StaticChunking(BaseModel):
    model_config = LENIENT
    max_chunk_size_tokens: int = Field(ge=100, le=4096)
    chunk_overlap_tokens: int = Field(ge=0)


class ChunkingStrategy(BaseModel):
    model_config = LENIENT
    type: Literal["auto", "static"]
    static: StaticChunking | None = None


class ExpiresAfter(BaseModel):
    model_config = LENIENT
    anchor: Literal["last_active_at"]
    days: int = Field(ge=1, le=365)


class FileRef(BaseModel):
    """One of a file batch's ``files``: a file with its own attributes and chunking."""
    model_config = LENIENT
    file_id: str = Field(max_length=64)
    attributes: dict[str, Any] | None = None
    chunking_strategy: ChunkingStrategy | None = None


class VectorStoreCreate(BaseModel):
    model_config = LENIENT
    name: str | None = Field(None, max_length=256)
    file_ids: list[str] | None = Field(None, max_length=MAX_FILE_IDS)
    chunking_strategy: ChunkingStrategy | None = None
    expires_after: ExpiresAfter | None = None
    metadata: dict[str, str] | None = None
    description: str | None = Field(None, max_length=512)
    embedding_model: str | None = Field(None, max_length=256)   # Podium's: which model embeds


class VectorStoreUpdate(BaseModel):
    model_config = LENIENT
    name: str | None = Field(None, max_length=256)
    expires_after: ExpiresAfter | None = None
    metadata: dict[str, str] | None = None


class FileCreate(BaseModel):
    model_config = LENIENT
    file_id: str = Field(max_length=64)
    attributes: dict[str, Any] | None = None
    chunking_strategy: ChunkingStrategy | None = None


class FileUpdate(BaseModel):
    model_config = LENIENT
    attributes: dict[str, Any] | None


class FileBatchCreate(BaseModel):
    model_config = LENIENT
    file_ids: list[str] | None = Field(None, max_length=MAX_FILE_IDS)
    files: list[FileRef] | None = Field(None, max_length=MAX_FILE_IDS)
    attributes: dict[str, Any] | None = None
    chunking_strategy: ChunkingStrategy | None = None


class RankingOptions(BaseModel):
    model_config = LENIENT
    ranker: str | None = Field(None, max_length=256)
    score_threshold: float | None = Field(None, ge=0, le=1)
    # OpenAI's reciprocal rank fusion of embedding and keyword matches: Podium has no
    # keyword index, so it is refused rather than ignored
    hybrid_search: Any = None

    @field_validator("hybrid_search")
    @classmethod
    def _no_hybrid(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("hybrid search is not supported: Podium ranks by the embedding's "
                             "cosine and the server's reranker; leave hybrid_search out")
        return value


class SearchRequest(BaseModel):
    model_config = LENIENT
    query: str | list[str]
    filters: dict[str, Any] | None = None
    max_num_results: int = Field(10, ge=1, le=MAX_RESULTS)
    ranking_options: RankingOptions | None = None
    rewrite_query: bool = False


# -- checks ---------------------------------------------------------------------------------

def chunking(strategy: ChunkingStrategy | None, param: str = "chunking_strategy"
             ) -> tuple[int, int]:
    """(max_chunk_size_tokens, chunk_overlap_tokens) as asked; ``auto`` is OpenAI's 800 /
    400 (the service cuts them to what the embedding model reads: ``fitted``)."""
    if strategy is None or strategy.type == "auto":
        return DEFAULT_CHUNK, DEFAULT_OVERLAP
    if strategy.static is None:
        raise InvalidRequestError("A static chunking_strategy needs its 'static' object",
                                  param=f"{param}.static")
    size, overlap = strategy.static.max_chunk_size_tokens, strategy.static.chunk_overlap_tokens
    if overlap > size // 2:
        raise InvalidRequestError(
            f"chunk_overlap_tokens ({overlap}) must be at most half of max_chunk_size_tokens "
            f"({size})", param=f"{param}.static.chunk_overlap_tokens")
    return size, overlap


def chunking_object(size: int, overlap: int) -> Obj:
    return {"type": "static", "static": {"max_chunk_size_tokens": size,
                                         "chunk_overlap_tokens": overlap}}


def attributes(value: dict[str, Any] | None, param: str = "attributes") -> Obj:
    """OpenAI's limits: 16 keys of at most 64 characters; values strings (512 characters),
    numbers or booleans."""
    value = value or {}
    if len(value) > MAX_ATTRIBUTES:
        raise InvalidRequestError(f"A file has at most {MAX_ATTRIBUTES} attributes, not "
                                  f"{len(value)}", param=param)
    for key, item in value.items():
        if len(key) > MAX_ATTRIBUTE_KEY:
            raise InvalidRequestError(f"Attribute keys are at most {MAX_ATTRIBUTE_KEY} "
                                      "characters", param=param)
        if isinstance(item, str):
            if len(item) > MAX_ATTRIBUTE_VALUE:
                raise InvalidRequestError(f"String attributes are at most "
                                          f"{MAX_ATTRIBUTE_VALUE} characters",
                                          param=f"{param}.{key}")
        elif not isinstance(item, (bool, int, float)):
            raise InvalidRequestError("Attribute values are strings, numbers or booleans",
                                      param=f"{param}.{key}")
    return value


def check_filter(node: Any, param: str = "filters") -> Obj:
    """A filter (a comparison ``{type, key, value}`` or a compound ``{type: and|or,
    filters}``), checked whole and bounded before it is used."""
    count = [0]
    _check_node(node, param, 1, count)
    return node


def _check_node(node: Any, param: str, depth: int, count: list[int]) -> None:
    count[0] += 1
    if count[0] > MAX_FILTER_NODES:
        raise InvalidRequestError(f"A filter holds at most {MAX_FILTER_NODES} comparisons and "
                                  "compounds", param=param)
    if depth > MAX_FILTER_DEPTH:
        raise InvalidRequestError(f"Filters nest at most {MAX_FILTER_DEPTH} deep",
                                  param=param)
    if not isinstance(node, dict):
        raise InvalidRequestError("A filter is an object", param=param)
    kind = node.get("type")
    if kind in ("and", "or"):
        inner = node.get("filters")
        if not isinstance(inner, list) or not inner:
            raise InvalidRequestError(f"An {kind!r} filter needs a list of filters",
                                      param=f"{param}.filters")
        for i, child in enumerate(inner):
            _check_node(child, f"{param}.filters[{i}]", depth + 1, count)
        return
    if kind not in COMPARISONS:
        raise InvalidRequestError(
            f"Invalid filter type {kind!r}: one of {', '.join(COMPARISONS + ('and', 'or'))}",
            param=f"{param}.type")
    if not isinstance(node.get("key"), str):
        raise InvalidRequestError("A comparison filter needs a string 'key'",
                                  param=f"{param}.key")
    value = node.get("value")
    scalars = (str, int, float, bool)
    if kind in ("in", "nin"):
        if not isinstance(value, list) or len(value) > MAX_FILTER_NODES or not all(
                isinstance(v, scalars) for v in value):
            raise InvalidRequestError(f"An {kind!r} filter's value is a list of at most "
                                      f"{MAX_FILTER_NODES} strings, numbers or booleans",
                                      param=f"{param}.value")
    elif not isinstance(value, scalars):
        raise InvalidRequestError("A comparison's value is a string, number or boolean",
                                  param=f"{param}.value")


def queries(query: str | list[str]) -> list[str]:
    """A search's queries: one or several non-empty strings, each bounded."""
    found = [query] if isinstance(query, str) else list(query)
    if not found or len(found) > MAX_QUERIES:
        raise InvalidRequestError(f"query is a string or a list of 1 to {MAX_QUERIES} strings",
                                  param="query")
    for i, text in enumerate(found):
        where = "query" if isinstance(query, str) else f"query[{i}]"
        if not text.strip():
            raise InvalidRequestError("The query is empty", param=where)
        if len(text) > MAX_QUERY_CHARS:
            raise InvalidRequestError(f"A query is at most {MAX_QUERY_CHARS} characters",
                                      param=where)
    return found


def ranking(options: RankingOptions | None) -> tuple[str | None, float]:
    """``ranking_options`` as a search uses them: the ranker asked for (None for OpenAI's
    ``auto`` / ``default-2024-11-15`` or none given: the server's choice; ``"none"``; or a
    model's name, checked by the service) and the score threshold (-1 when none is given:
    cosine similarity may be below 0)."""
    if options is None:
        return None, -1.0
    asked = None if options.ranker in AUTO_RANKERS else options.ranker
    return asked, -1.0 if options.score_threshold is None else options.score_threshold


# -- objects --------------------------------------------------------------------------------

def counts_object(counts: dict[str, int]) -> Obj:
    out = {k: counts.get(k, 0) for k in ("in_progress", "completed", "failed", "cancelled")}
    out["total"] = sum(out.values())
    return out


def store_object(row: Obj, counts: dict[str, int], usage: int, now: float) -> Obj:
    expired = row["expires_at"] is not None and row["expires_at"] <= now
    status = ("expired" if expired else "in_progress" if counts.get("in_progress")
              else "completed")
    expires = row["expires_days"]
    return {"id": row["id"], "object": "vector_store", "created_at": row["created_at"],
            "name": row["name"], "description": row["description"], "usage_bytes": usage,
            "file_counts": counts_object(counts), "status": status,
            "expires_after": None if expires is None else {"anchor": "last_active_at",
                                                           "days": expires},
            "expires_at": row["expires_at"], "last_active_at": row["last_active_at"],
            "metadata": row["meta"] or {}, "embedding_model": row["embedding_model"]}


def file_object(row: Obj) -> Obj:
    return {"id": row["file_id"], "object": "vector_store.file",
            "usage_bytes": row["usage_bytes"], "created_at": row["created_at"],
            "vector_store_id": row["store_id"], "status": row["status"],
            "last_error": row["last_error"],
            "chunking_strategy": chunking_object(row["chunk_size"], row["chunk_overlap"]),
            "attributes": row["attributes"] or {}}


def batch_object(row: Obj, counts: dict[str, int]) -> Obj:
    status = row["status"]
    if status == "in_progress" and not counts.get("in_progress"):
        status = "completed"        # every file done (some may have failed, as at OpenAI)
    return {"id": row["id"], "object": "vector_store.files_batch",
            "created_at": row["created_at"], "vector_store_id": row["store_id"],
            "status": status, "file_counts": counts_object(counts)}


def page(data: list[Obj], more: bool) -> Obj:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


class FileSearchTool(BaseModel):
    """A Responses ``file_search`` tool: the stores it searches and how."""
    model_config = LENIENT
    type: Literal["file_search"]
    vector_store_ids: list[str] = Field(min_length=1, max_length=MAX_QUERIES)
    max_num_results: int = Field(10, ge=1, le=MAX_RESULTS)
    filters: dict[str, Any] | None = None
    ranking_options: RankingOptions | None = None
