"""Grammars that constrain decoding (GBNF for llama.cpp): JSON schemas, JSON objects, forced
tool calls, and the bounds that keep llama.cpp's grammar code safe (``schema.py``)."""

from podium.grammar.schema import (LLAMA_REPETITION_THRESHOLD, MAX_ENUM, MAX_FIRSTS,
                                   MAX_GRAMMAR_CHARS, MAX_LEFT_CHAIN, MAX_LEFT_PATHS,
                                   MAX_NESTING, MAX_OPEN_ALTERNATIVES, MAX_OPTIONAL_PROPERTIES,
                                   MAX_PATTERN_CHARS, MAX_REPETITION, MAX_SCHEMA_DEPTH,
                                   MAX_SCHEMA_NODES, CheckedGrammar, GrammarError, check_grammar,
                                   check_strict, checked, integer_bounds, json_object_grammar,
                                   schema_grammar, tool_call_grammar, unenforced)

__all__ = [
    "LLAMA_REPETITION_THRESHOLD", "MAX_ENUM", "MAX_FIRSTS", "MAX_GRAMMAR_CHARS", "MAX_LEFT_CHAIN",
    "MAX_LEFT_PATHS", "MAX_NESTING", "MAX_OPEN_ALTERNATIVES", "MAX_OPTIONAL_PROPERTIES",
    "MAX_PATTERN_CHARS", "MAX_REPETITION", "MAX_SCHEMA_DEPTH", "MAX_SCHEMA_NODES",
    "CheckedGrammar", "GrammarError", "check_grammar", "check_strict", "checked",
    "integer_bounds", "json_object_grammar", "schema_grammar", "tool_call_grammar",
    "unenforced",
]
