"""Constraints on decoding as llguidance grammars: JSON schemas, JSON objects, forced tool
calls and custom tools' inputs, and the parser limits that bound what one may cost
(``build.py``)."""

from podium.grammar.build import (JSON_OPTIONS, LIMITS, Grammar, check_schema,
                                  custom_input, json_object_grammar, limits, schema_grammar,
                                  tool_call_grammar)

__all__ = ["JSON_OPTIONS", "LIMITS", "Grammar", "check_schema", "custom_input", "json_object_grammar",
           "limits", "schema_grammar", "tool_call_grammar"]
