"""Constraints on decoding, stated as llguidance grammars.

Every constraint a client can send becomes one grammar in llguidance's Lark syntax (JSON
schemas inline, as ``%json {...}``): ``response_format`` (``json_object``, ``json_schema``),
a forced tool call in the family's own markup, and a custom tool's input. llguidance
(Microsoft's constraint engine, the one vLLM's ``guidance`` backend, SGLang and llama.cpp's
``%llguidance`` use) compiles it against the model's vocabulary and masks each step in tens
of microseconds; its parser limits (``LIMITS``) bound what one grammar may cost, per step and
in all, so a grammar over them is a 400 at request time, never a slow stream.

Schema keywords: what llguidance enforces is enforced (docs/json_schema.md of llguidance, and
the README's table made from ``keyword_support``). A keyword it cannot enforce is a 400 naming
it when the caller asked for ``strict``; otherwise it is left out with a warning in the log,
as OpenAI's non-strict mode describes the schema to the model without promising it.

Markup such as ``<tool_call>`` is written as a special token where the model's vocabulary has
it as one (``<tool_call>`` in the grammar: the one token the model was trained to write),
and as text otherwise; ``specials`` (the tokenizer's ``grammar_specials``) says which.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from llguidance import LLMatcher, LLParserLimits, StructTag, regex_to_lark
from llguidance.gbnf_to_lark import any_to_lark

from podium.errors import InvalidRequestError
from podium.grammar.escaped import quoted_lark

log = logging.getLogger(__name__)

# llguidance's parser limits, stated (its own defaults: the measured costs are in its docs):
# Earley items a mask step may make (~20k/ms), lexer work a step may do (~14k/ms), lexer
# fuel to build a grammar's regexes (~50k/ms), lexer states in all (1-2 kB each), the
# grammar's size in symbols, and the branching of one production
LIMITS = {
    "step_max_items": 50_000,
    "step_lexer_fuel": 200_000,
    "initial_lexer_fuel": 1_000_000,
    "max_lexer_states": 250_000,
    "max_grammar_size": 500_000,
    "max_items_in_row": 2_000,
}
# JSON as models write it: any JSON whitespace between tokens, at most 64 characters at one
# place (enough for an indented line; a small model that would pad forever cannot)
JSON_OPTIONS: dict[str, Any] = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{1,64}"}


class Grammar(str):
    """A grammar's text, and the request parameter it was made from (for errors found
    when an engine compiles or applies it)."""

    param: str | None = None


def limits() -> LLParserLimits:
    return LLParserLimits(verbose_errors=False, **LIMITS)  # type: ignore[arg-type]


def schema_grammar(schema: Any, param: str, strict: bool = False,
                   prefix: str = "JSON schema: ") -> Grammar:
    """The grammar of JSON valid against ``schema``; a 400 naming ``param`` when llguidance
    cannot make one, or (``strict``) when the schema has a keyword it would not enforce."""
    return _checked(f"start: {_json(schema, strict, param)}\n", param, prefix)


def json_object_grammar() -> Grammar:
    return schema_grammar({"type": "object"}, "response_format")


def check_schema(schema: Any, param: str, strict: bool = False,
                 prefix: str = "JSON schema: ") -> None:
    """A 400 naming ``param`` when ``schema`` cannot constrain output (see
    ``schema_grammar``): for schemas checked before any grammar is made (strict tools)."""
    schema_grammar(schema if schema is not None else {}, param, strict, prefix)


def tool_call_grammar(tools: Mapping[str, Any], family: str, parallel: bool,
                      specials: Collection[str] = (), params: Mapping[str, str] | None = None,
                      strict: Collection[str] = (), custom: Mapping[str, str] | None = None,
                      rules: str = "", text_first: bool = False) -> Grammar:
    """At least one call (several when ``parallel``) to one of ``tools``, each call
    ``{"name": ..., "arguments": ...}`` with arguments valid against the tool's schema.
    ``text_first`` (``tool_choice: auto``, Hermes markup only): any text first, then calls
    or none; a call the model starts (its ``<tool_call>`` token) is held to the grammar.

    ``family`` "hermes": each call inside ``<tool_call>`` markup, one per line; otherwise the
    bare JSON the fallback parser reads (a list of them when ``parallel``). ``custom`` maps a
    custom tool's name to the Lark expression its quoted input must match (``custom_input``;
    ``rules``: the Lark rules those expressions name). ``params`` names each tool's parameter in the
    request for errors; ``strict`` the tools whose every keyword must be enforced.
    """
    params = params or {}
    custom = custom or {}
    for name, schema in tools.items():       # each refusal names its own tool
        if name not in custom:
            check_schema({"type": "object"} if schema is None else schema,
                         params.get(name, "tools"), name in strict,
                         f"Function {name!r} parameters: ")
    # each call as the models write it, {"name": "NAME", "arguments": ...}: the name a fixed
    # head (a %json object per tool would clash in llguidance's lexer with a custom tool's
    # literal head), the arguments the tool's schema or a custom tool's quoted input
    alternatives = []
    for name, schema in tools.items():
        head = json.dumps(json.dumps({"name": name, "arguments": 0})[:-2])
        where = params.get(name, "tools")
        if name in custom:
            args = f'"{{\\"input\\": " {custom[name]} "}}"'
        else:       # the parameters it declares, none other unless it says so: a small
            #         model held to a schema that allows more invents more (as llama.cpp's
            #         grammars, which default additionalProperties to false)
            args = _json(closed_schema({"type": "object"} if schema is None else schema,
                                       where), name in strict, where)
        alternatives.append(f'{head} {args} "}}"')
    lines = ["podium_call: " + "\n    | ".join(alternatives)]
    if family == "hermes":
        lines.append(f'podium_one: {_markup("<tool_call>", specials)} "\\n" podium_call '
                     f'"\\n" {_markup("</tool_call>", specials)}')
        start = 'podium_one ("\\n" podium_one)*' if parallel else "podium_one"
        if text_first:      # text, in which a reasoning family writes its think tokens
            tags = " | ".join(t for t in ("<think>", "</think>") if t in specials)
            # text never spells the markup that opens a call (the parser reads text), so a
            # call can only begin with the <tool_call> token, and the grammar holds it
            lines += ["PODIUM_TEXT: /(?s:.+)/ & ~/(?s:.*)(<tool_call>|<function=)(?s:.*)/",
                      # one text between tags: two in a row could spell the markup
                      "podium_text: PODIUM_TEXT?" + (f" (({tags}) PODIUM_TEXT?)*" if tags
                                                     else "")]
            start = f"podium_text ({start})?"
    else:
        start = ('"[" podium_call ("," " "? podium_call)* "]"' if parallel
                 else "podium_call")
    only = params.get(next(iter(tools)), "tools") if len(tools) == 1 else "tools"
    return _checked("\n".join([f"start: {start}", *lines, rules]), only,
                    "tools: the calls' grammar: " if text_first
                    else "tool_choice: the forced call's grammar: ")


def custom_input(syntax: str, definition: str, param: str, prefix: str
                 ) -> tuple[str, str]:
    """A custom tool's input as the JSON string a call's arguments carry it in: the Lark
    rule for the quoted string, and the rules (names starting ``prefix``) that define it
    (``escaped.quoted_lark``: the grammar of the input's JSON-escaped form)."""
    return f"{prefix}_input", quoted_lark(syntax, definition, param, prefix)


def _json(schema: Any, strict: bool, param: str) -> str:
    """``schema`` inline in Lark, with Podium's JSON options (``lenient`` unless strict: a
    keyword llguidance cannot enforce is then left out, with a warning)."""
    if not isinstance(schema, dict):
        if schema is True:
            schema = {}
        elif schema is False:
            raise InvalidRequestError("JSON schema: the schema false admits no value",
                                      param=param)
        else:
            raise InvalidRequestError("JSON schema: a schema must be an object or a "
                                      "boolean", param=param)
    options = {**JSON_OPTIONS, "lenient": not strict}
    body = {k: v for k, v in schema.items() if k != "x-guidance"}
    return "%json " + json.dumps({"x-guidance": options, **body}, ensure_ascii=False)


def _markup(text: str, specials: Collection[str]) -> str:
    return text if text in specials else json.dumps(text)


def _checked(grammar: str, param: str, prefix: str) -> Grammar:
    """``grammar`` once llguidance accepts it (without a vocabulary: the engine checks that
    part when it compiles it); its warnings (keywords left out) logged."""
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, None, limits=limits())
    if failed:
        raise InvalidRequestError(f"{prefix}{_said(messages[0])}", param=param)
    for message in messages:
        if not message.startswith(_NO_VOCABULARY):
            log.warning("%s (%s): %s", param, prefix.rstrip(": "), _said(message))
    made = Grammar(grammar)
    made.param = param
    return made


_NO_VOCABULARY = "no tokenizer"     # special tokens are checked when the engine compiles
_LOCATION = re.compile(r"^at \d+\(\d+\): ")


def _said(message: str, limit: int = 300) -> str:
    """llguidance's message without its quote of the grammar (which may be a large schema):
    its first line, less the position in Podium's grammar text the caller never saw."""
    line = _LOCATION.sub("", message.strip().split("\n", 1)[0])
    line = line.removeprefix("failed to compile JSON schema: ")
    return line if len(line) <= limit else line[:limit] + "..."


# One minimal schema per JSON Schema keyword that constrains an instance: 2020-12's
# validation, applicator and format vocabularies, and the draft-7 spellings clients still
# send (``dependencies``, ``additionalItems`` beside an ``items`` list), for ``keyword_support``
KEYWORD_PROBES: dict[str, dict[str, Any]] = {
    "type": {"type": ["integer", "null"]},
    "enum": {"enum": [1, "a", None]},
    "const": {"const": {"a": 1}},
    "multipleOf": {"type": "number", "multipleOf": 0.5},
    "minimum": {"type": "number", "minimum": 0.5},
    "maximum": {"type": "number", "maximum": 0.5},
    "exclusiveMinimum": {"type": "number", "exclusiveMinimum": 0.5},
    "exclusiveMaximum": {"type": "number", "exclusiveMaximum": 0.5},
    "minLength": {"type": "string", "minLength": 2},
    "maxLength": {"type": "string", "maxLength": 2},
    "pattern": {"type": "string", "pattern": "^[a-z]+$"},
    "minItems": {"type": "array", "minItems": 2},
    "maxItems": {"type": "array", "maxItems": 1},
    "uniqueItems": {"type": "array", "uniqueItems": True},
    "contains": {"type": "array", "contains": {"type": "integer"}},
    "minContains": {"type": "array", "contains": {"type": "integer"}, "minContains": 2},
    "maxContains": {"type": "array", "contains": {"type": "integer"}, "maxContains": 1},
    "items": {"type": "array", "items": {"type": "integer"}},
    "prefixItems": {"type": "array", "prefixItems": [{"type": "integer"}], "items": False},
    "additionalItems": {"type": "array", "items": [{"type": "integer"}],
                        "additionalItems": False},
    "unevaluatedItems": {"type": "array", "unevaluatedItems": False},
    "properties": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "required": {"type": "object", "required": ["a"]},
    "additionalProperties": {"type": "object", "properties": {"a": {}},
                             "additionalProperties": False},
    "patternProperties": {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
    "minProperties": {"type": "object", "minProperties": 1},
    "maxProperties": {"type": "object", "maxProperties": 1},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
    "dependentSchemas": {"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}},
    "dependencies": {"type": "object", "dependencies": {"a": ["b"]}},
    "unevaluatedProperties": {"type": "object", "unevaluatedProperties": False},
    "allOf": {"allOf": [{"type": "integer"}, {"minimum": 2}]},
    "anyOf": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
    "not": {"not": {"type": "string"}},
    "if": {"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {"type": "string"}},
    "$ref": {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"},
    "$dynamicRef": {"$dynamicAnchor": "n", "$dynamicRef": "#n"},
    **{f"format: {name}": {"type": "string", "format": name} for name in (
        "date-time", "date", "time", "duration", "email", "idn-email", "hostname",
        "idn-hostname", "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference",
        "uuid", "uri-template", "json-pointer", "relative-json-pointer", "regex")},
}


def keyword_support() -> tuple[list[str], list[str]]:
    """The keywords (and formats) llguidance enforces, and those it would not enforce:
    each probed with its minimal schema under ``strict`` (``lenient: false``), so the
    README's table is made from the engine, not by hand."""
    enforced: list[str] = []
    refused: list[str] = []
    for keyword, schema in KEYWORD_PROBES.items():
        failed, _ = LLMatcher.validate_grammar_with_warnings(
            f"start: {_json(schema, True, keyword)}\n", None, limits=limits())
        (refused if failed else enforced).append(keyword)
    return enforced, refused


# -- vLLM's structured_outputs (regex, choice, Lark or GBNF, JSON with its options) --------

def regex_grammar(regex: str, param: str) -> Grammar:
    """Text matching ``regex`` whole (Rust ``regex`` syntax, as vLLM's guidance backend
    reads it)."""
    return _checked(f"start: /{regex_to_lark(regex)}/\n", param, "regex: ")


def choice_grammar(choices: Sequence[str], param: str) -> Grammar:
    """Exactly one of ``choices``."""
    return _checked("start: " + " | ".join(json.dumps(c) for c in choices) + "\n", param,
                    "choice: ")


def lark_grammar(text: str, param: str) -> Grammar:
    """A client's grammar, in llguidance's Lark or in llama.cpp's GBNF (converted to Lark by
    llguidance's converter, which keeps Lark as it is): the same text reaches both engines."""
    try:
        lark = any_to_lark(text)
    except Exception as exc:      # the converter's errors carry no common class
        raise InvalidRequestError(f"grammar: not Lark, and not GBNF either: {exc}",
                                  param=param) from None
    return _checked(lark, param, "grammar: ")


def options_schema_grammar(schema: Any, param: str, compact: bool = False,
                           whitespace_pattern: str | None = None,
                           closed: bool = False) -> Grammar:
    """``schema_grammar`` with vLLM's JSON options: ``compact`` (``disable_any_whitespace``:
    no whitespace between tokens), ``whitespace_pattern`` (the whitespace allowed there),
    ``closed`` (``disable_additional_properties``: objects with ``properties`` take no
    others unless they say so)."""
    return _checked(f"start: {_json_with(schema, param, compact, whitespace_pattern, closed)}\n",
                    param, "JSON schema: ")


def structural_tag_grammar(text: str, param: str, specials: Collection[str] = (),
                           compact: bool = False, closed: bool = False) -> Grammar:
    """vLLM's structural tag (``{"triggers": [...], "structures": [{"begin", "schema",
    "end"}]}``, the form its guidance backend reads): free text in which each structure,
    once its trigger is written, is held to ``begin``, JSON valid against ``schema``, then
    ``end`` (llguidance's ``StructTag``). A ``<...>`` trigger is the special token where the
    vocabulary has every such trigger as one, text otherwise."""
    try:
        spec = json.loads(text)
        triggers, tags = spec["triggers"], []
        for i, s in enumerate(spec["structures"]):
            trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
            if trigger is None:
                raise ValueError(f"structures[{i}].begin starts with none of the triggers")
            schema = _json_with(s["schema"], param, compact, None, closed)
            tags.append(StructTag(trigger=trigger, begin=s["begin"], end=s["end"],
                                  grammar=schema.removeprefix("%json ")))
        if not tags:
            raise ValueError("no structures")
        marked = [t for t in triggers if t.startswith("<") and t.endswith(">")]
        lark = StructTag.to_grammar(tags, assume_special=all(t in specials for t in marked))
    except InvalidRequestError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError) as exc:
        raise InvalidRequestError(
            f"structural_tag: expected a JSON object {{\"triggers\": [str], \"structures\": "
            f"[{{\"begin\", \"schema\", \"end\"}}]}} ({type(exc).__name__}: {exc})",
            param=param) from None
    return _checked(lark, param, "structural_tag: ")


def _json_with(schema: Any, param: str, compact: bool, whitespace_pattern: str | None,
               closed: bool) -> str:
    """``_json`` (not strict) with vLLM's JSON options over Podium's."""
    _json(schema, False, param)         # its refusals: false, or not a schema
    body = {} if schema is True else {k: v for k, v in schema.items() if k != "x-guidance"}
    options: dict[str, Any] = {**JSON_OPTIONS, "lenient": True}
    if compact:
        del options["whitespace_pattern"]
        options["whitespace_flexible"] = False
    elif whitespace_pattern is not None:
        options["whitespace_pattern"] = whitespace_pattern
    if closed:
        body = closed_schema(body, param)
    return "%json " + json.dumps({"x-guidance": options, **body}, ensure_ascii=False)


# where a schema holds subschemas: maps of them, and one or a list of them
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                "dependentSchemas", "dependencies")
_SUBSCHEMAS = ("additionalProperties", "unevaluatedProperties", "propertyNames", "contains",
               "additionalItems", "unevaluatedItems", "not", "if", "then", "else", "items",
               "prefixItems", "allOf", "anyOf", "oneOf")


def closed_schema(schema: Any, param: str) -> Any:
    """``_closed``, or a 400 naming ``param`` for a schema nested past Python's recursion
    (llguidance refuses such depths anyway)."""
    try:
        return _closed(schema)
    except RecursionError:
        raise InvalidRequestError("JSON schema: nested too deeply", param=param) from None


def _closed(schema: Any) -> Any:
    """A copy of ``schema`` in which every object schema with ``properties`` (or
    ``patternProperties``) and no ``additionalProperties`` has it false."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: _closed(v) for k, v in out[key].items()}
    for key in _SUBSCHEMAS:
        if key in out:
            out[key] = _closed(out[key])
    if "additionalProperties" not in out and (isinstance(out.get("properties"), dict) or
                                              isinstance(out.get("patternProperties"), dict)):
        out["additionalProperties"] = False
    return out
