"""Which parsers a model needs, read off its chat template; and building them per request.

``--tool-parser`` / ``--reasoning-parser`` override the detection (``none`` turns one off);
a user should never have to name a parser for a model whose template says it all.
"""

from __future__ import annotations

from typing import Callable

from podium.errors import InvalidRequestError
from podium.parsing.reasoning import ReasoningParser
from podium.parsing.tools.base import ToolParser, ToolSet
from podium.parsing.tools.fallback import WithJsonFallback
from podium.parsing.tools.hermes import HermesParser
from podium.parsing.tools.llama import Llama3JsonParser, PythonicParser
from podium.parsing.tools.sections import deepseek, kimi_k2, mistral
from podium.parsing.tools.xml import Glm45Parser, Qwen3CoderParser


class PlainParser(ToolParser):
    """No markup of its own: all text is content (the JSON fallback may still find calls)."""

    def _step(self, buf: str) -> int | None:
        self.text(buf)
        return len(buf)


TOOL_PARSERS: dict[str, Callable[[ToolSet], ToolParser]] = {
    "hermes": HermesParser,
    "qwen3_coder": Qwen3CoderParser,
    "glm45": Glm45Parser,
    "llama3_json": Llama3JsonParser,
    "pythonic": PythonicParser,
    "mistral": mistral,
    "deepseek_v3": deepseek,
    "kimi_k2": kimi_k2,
    "json": PlainParser,            # only the bare / fenced JSON fallback
}
# families that read JSON at the start of an answer themselves
_NO_FALLBACK = {"llama3_json", "pythonic"}

REASONING_TAGS = {"think": ("<think>", "</think>"), "mistral": ("[THINK]", "[/THINK]")}


def detect_tool_parser(template: str | None) -> str:
    t = template or ""
    checks = [
        ("qwen3_coder", "<tool_call>" in t and "<function=" in t),
        ("glm45", "<arg_key>" in t),
        ("hermes", "<tool_call>" in t),
        ("kimi_k2", "<|tool_calls_section_begin|>" in t),
        ("deepseek_v3", "tool▁calls▁begin" in t),
        ("mistral", "[TOOL_CALLS]" in t),
        ("pythonic", "func_name1(" in t),
        ("llama3_json", "<|python_tag|>" in t or ("ipython" in t and "parameters" in t)),
    ]
    return next((name for name, hit in checks if hit), "json")


def detect_reasoning_parser(template: str | None) -> str:
    t = template or ""
    if "[THINK]" in t:
        return "mistral"
    if "<think>" in t:
        return "think"
    return "none"


def check_names(tool_parser: str, reasoning_parser: str) -> None:
    if tool_parser not in TOOL_PARSERS and tool_parser not in ("auto", "none"):
        raise ValueError(f"unknown tool parser {tool_parser!r}; one of "
                         f"{', '.join(['auto', 'none', *TOOL_PARSERS])}")
    if reasoning_parser not in REASONING_TAGS and reasoning_parser not in ("auto", "none"):
        raise ValueError(f"unknown reasoning parser {reasoning_parser!r}; one of "
                         f"{', '.join(['auto', 'none', *REASONING_TAGS])}")


def build_tool_parser(name: str, tools: ToolSet, fallback: bool = True):
    """The family's parser, and the bare / fenced JSON fallback unless ``fallback`` is off
    (a grammar that holds the calls to the family's markup: a call in plain JSON text would
    escape it)."""
    if name == "none":
        return None
    try:
        primary = TOOL_PARSERS[name](tools)
    except KeyError:
        raise InvalidRequestError(f"Unknown tool parser {name!r}") from None
    return primary if name in _NO_FALLBACK or not fallback else WithJsonFallback(primary,
                                                                              tools)


def build_reasoning_parser(name: str, prompt: str) -> ReasoningParser | None:
    if name not in REASONING_TAGS:
        return None
    open_tag, close_tag = REASONING_TAGS[name]
    inside = ReasoningParser.starts_inside(prompt, open_tag, close_tag)
    return ReasoningParser(open_tag, close_tag, inside=inside)
