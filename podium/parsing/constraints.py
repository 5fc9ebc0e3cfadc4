"""Grammars that constrain decoding: structured output, and forced tool calls.

``tool_choice: "required"`` (or a named function) constrains the model to write at least one
call to a declared tool, with arguments valid against that tool's schema, in a shape the
family's parser reads: Hermes models write their own ``<tool_call>`` markup; every other
family writes the bare JSON the fallback parser accepts. ``response_format`` constrains the
answer to a JSON object, or to a given JSON schema. Schemas become GBNF through
llama-cpp-python's port of llama.cpp's converter.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llama_cpp.llama_grammar import json_schema_to_gbnf

from podium.errors import InvalidRequestError


def schema_grammar(schema: dict[str, Any], param: str) -> str:
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # noqa: BLE001 - the converter raises several kinds
        raise InvalidRequestError(f"Unsupported JSON schema: {exc}", param=param) from exc


def json_object_grammar() -> str:
    return schema_grammar({"type": "object"}, "response_format")


def tool_call_grammar(schemas: dict[str, dict[str, Any]], family: str, parallel: bool) -> str:
    """At least one call (several when ``parallel``) to one of ``schemas``' functions."""
    alternatives = [{
        "type": "object",
        "properties": {"name": {"const": name},
                       "arguments": parameters or {"type": "object"}},
        "required": ["name", "arguments"],
    } for name, parameters in schemas.items()]
    schema = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    rules = re.sub(r"^root ::=", "call ::=", schema_grammar(schema, "tools"), count=1,
                   flags=re.MULTILINE)
    if family == "hermes":
        one = r'"<tool_call>\n" call "\n</tool_call>"'
        root = f"root ::= {one}" + (rf' ("\n" {one})*' if parallel else "")
    else:
        root = 'root ::= "[" call ("," " "? call)* "]"' if parallel else "root ::= call"
    return root + "\n" + rules
