"""Constraints for Harmony models (gpt-oss), over Harmony's message structure.

A gpt-oss turn is a run of messages, each ``<|channel|>NAME<|message|>TEXT`` closed by
``<|end|>`` (and the next opened by ``<|start|>assistant``): reasoning in ``analysis``, the
answer in ``final`` (closed by ``<|return|>``), a tool call in ``commentary`` addressed
``to=functions.NAME``, its arguments JSON after ``<|constrain|>json`` (closed by
``<|call|>``). These markers are special tokens of the vocabulary, and the grammars name them
as such. Reasoning stays free (any number of analysis messages); what the client constrains
is the final message's JSON (``response_format``) or the call (``tool_choice`` ``required``
or named): one call, as Harmony ends the turn at ``<|call|>``. The recipient may sit in the
role header instead (``<|start|>assistant to=functions.NAME<|channel|>commentary``), as
openai-harmony renders history; both forms are accepted.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from podium.grammar.build import Grammar, _checked, _json, closed_schema

_REASONING = ['PODIUM_TEXT: /(.|\\n)+/',
              'podium_analysis: <|channel|> "analysis" <|message|> PODIUM_TEXT? <|end|> '
              '<|start|> "assistant"']


def format_grammar(schema: Any, param: str, strict: bool) -> Grammar:
    """Reasoning, then a final message whose text is JSON valid against ``schema``."""
    return _checked("\n".join([
        "start: podium_analysis* podium_final",
        f'podium_final: <|channel|> "final" <|message|> {_json(schema, strict, param)} '
        "<|return|>", *_REASONING, ""]), param, "JSON schema: ")


def call_grammar(tools: Mapping[str, Any], params: Mapping[str, str],
                 strict: Collection[str]) -> Grammar:
    """Reasoning, then one call to one of ``tools`` (name: parameters schema), its
    arguments valid against the tool's schema."""
    calls = []
    for name, schema in tools.items():
        where = params.get(name, "tools")
        args = _json(closed_schema({"type": "object"} if schema is None else schema, where),
                     name in strict, where)     # the parameters it declares (build.py)
        to = json.dumps(f"to=functions.{name}")
        calls.append(f'(<|channel|> "commentary " {to} | " " {to} <|channel|> "commentary")'
                     f' " " <|constrain|>? "json" <|message|> {args} <|call|>')
    only = params.get(next(iter(tools)), "tools") if len(tools) == 1 else "tools"
    return _checked("\n".join([
        "start: podium_analysis* podium_call",
        "podium_call: " + "\n    | ".join(calls), *_REASONING, ""]), only,
        "tool_choice: the forced call's grammar: ")
