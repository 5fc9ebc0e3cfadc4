"""vLLM's ``structured_outputs`` (Chat Completions and Completions) as one grammar.

Each kind becomes an llguidance grammar (``podium.grammar``), checked here, on the request's
worker thread; the engine compiles it against the vocabulary (``Engine.check_grammar``).
"""

from __future__ import annotations

import json
from collections.abc import Collection

from podium.errors import InvalidRequestError
from podium.grammar.build import (Grammar, choice_grammar, lark_grammar,
                                  options_schema_grammar, regex_grammar,
                                  structural_tag_grammar)
from podium.protocol.structured import StructuredOutputs

PARAM = "structured_outputs"


def structured_grammar(so: StructuredOutputs, specials: Collection[str] = ()) -> Grammar:
    """The grammar of ``so``'s one constraint; a 400 naming ``structured_outputs.<kind>``
    when it cannot be made. ``specials``: the model's grammar specials (structural tags'
    ``<...>`` triggers)."""
    kind = so.kind
    param = f"{PARAM}.{kind}"
    if so.disable_any_whitespace and so.whitespace_pattern is not None:
        raise InvalidRequestError("disable_any_whitespace and whitespace_pattern contradict "
                                  "each other; give one", param=f"{PARAM}.whitespace_pattern")
    if kind == "regex":
        return regex_grammar(so.regex or "", param)
    if kind == "choice":
        return choice_grammar(so.choice or [], param)
    if kind == "grammar":
        return lark_grammar(so.grammar or "", param)
    if kind == "structural_tag":
        return structural_tag_grammar(so.structural_tag or "", param, specials,
                                      so.disable_any_whitespace,
                                      so.disable_additional_properties)
    schema = {"type": "object"} if kind == "json_object" else _schema(so.json_, param)
    return options_schema_grammar(schema, param, so.disable_any_whitespace,
                                  so.whitespace_pattern, so.disable_additional_properties)


def _schema(raw: object, param: str) -> object:
    """``json`` as vLLM takes it: a schema, or a JSON string of one."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise InvalidRequestError(f"json: a JSON string that does not parse ({exc})",
                                  param=param) from None
