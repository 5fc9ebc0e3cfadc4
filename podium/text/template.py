"""Chat templates: the model's own Jinja template, rendered the way Hugging Face renders it.

The environment is Jinja2's immutable sandbox (no attribute access to Python internals, no
mutation of passed-in data) with the helpers HF templates rely on: ``tojson`` without HTML
escaping, ``raise_exception``, ``strftime_now`` and the ``{% generation %}`` block.
A template's own errors (``raise_exception``, a sandbox violation, a syntax error) are the
client's problem when the client chose the template or the messages that tripped it: 400.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from podium.errors import InvalidRequestError


class _GenerationBlock(Extension):
    """HF's ``{% generation %}...{% endgeneration %}`` marks assistant text; render it as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class ChatTemplate:
    """A compiled chat template plus the special tokens it is rendered with."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = ""):
        try:
            self._template = _compile(source)
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"Invalid chat template: {exc}",
                                      param="chat_template") from exc
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        context = {**kwargs, "messages": messages, "tools": tools or None,
                   "add_generation_prompt": add_generation_prompt,
                   "bos_token": self.bos_token, "eos_token": self.eos_token}
        try:
            return self._template.render(context)
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"Chat template error: {exc}", param="messages") from exc
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            raise InvalidRequestError(
                f"Chat template could not render these messages: {exc}",
                param="messages") from exc
