"""The ``file_search`` tool as the model sees it, and its results as the model and the client
see them.

The model is offered one function, ``file_search`` with a list of ``queries``; Podium runs
the search over the tool's vector stores (``api/vector_stores.py``) and hands the model the
results as a tool message (``results_text``: each result's file and text, at most
``MAX_RESULT_CHARS`` in all). The answer's ``output_text`` cites the files the model was
given (``citations``): at the place the answer names a file, else the best-scored file at
the end of the text, as OpenAI's ``file_citation`` annotations (``file_id``, ``filename``,
``index``).
"""

from __future__ import annotations

import json
from typing import Any

Obj = dict[str, Any]

NAME = "file_search"
PARAMETERS: Obj = {"type": "object", "properties": {"queries": {
    "type": "array", "items": {"type": "string", "maxLength": 200},
    "minItems": 1, "maxItems": 3,
    "description": "One to three search queries, each a short phrase"}},
    "required": ["queries"]}
DESCRIPTION = ("Search the user's uploaded files for passages relevant to the question. "
               "Call it before answering questions about their content.")
MAX_RESULT_CHARS = 8000          # results text given to the model per search
MAX_QUERIES = 8


def queries(arguments: str) -> list[str]:
    """The queries a model's call asks for: its ``queries`` (or a lone ``query``); the whole
    argument text when it is not such an object."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    found: Any = None
    if isinstance(value, dict):
        found = value.get("queries", value.get("query"))
    if isinstance(found, str):
        found = [found]
    if not isinstance(found, list):
        found = [arguments]
    return [str(q)[:4096] for q in found if str(q).strip()][:MAX_QUERIES]


def arguments(item: Obj) -> str:
    """A ``file_search_call`` item as the model's call (the next round's history)."""
    return json.dumps({"queries": item.get("queries") or []}, ensure_ascii=False)


def results_text(results: list[Obj] | None) -> str:
    """What the model reads of a search: each result's file name and text, best first,
    cut at ``MAX_RESULT_CHARS``; a note when there is none (or when a stored call kept no
    results: they were not included)."""
    if results is None:
        return "(The search results are not available.)"
    if not results:
        return "No passage in the files matches the search."
    out, used = [], 0
    for i, result in enumerate(results):
        entry = f"[{i + 1}] {result['filename']}\n{result['text']}\n"
        if used + len(entry) > MAX_RESULT_CHARS:
            out.append(entry[:max(0, MAX_RESULT_CHARS - used)])
            break
        out.append(entry)
        used += len(entry)
    return ("Passages found in the user's files, best first. Answer the user's question "
            "from them in plain sentences, naming the file you use:\n\n" + "\n".join(out))


def citations(text: str, sources: list[Obj]) -> list[Obj]:
    """``file_citation`` annotations for an answer: each file it names (by file name, or the
    name without its extension), at the end of its first mention; if it names none, the
    best-scored file, at the end of the text."""
    found: list[Obj] = []
    seen: set[str] = set()
    lowered = text.lower()
    for source in sources:
        if source["file_id"] in seen:
            continue
        name = source["filename"]
        stem = name.rsplit(".", 1)[0]
        for needle in (name.lower(), stem.lower()):
            at = lowered.find(needle) if len(needle) >= 3 else -1
            if at >= 0:
                seen.add(source["file_id"])
                found.append(_citation(source, at + len(needle)))
                break
    if not found and sources:
        best = max(sources, key=lambda s: s.get("score") or 0.0)
        found.append(_citation(best, len(text)))
    return sorted(found, key=lambda a: a["index"])


def _citation(source: Obj, index: int) -> Obj:
    return {"type": "file_citation", "file_id": source["file_id"],
            "filename": source["filename"], "index": index}
