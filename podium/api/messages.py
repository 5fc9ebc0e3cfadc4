"""The Anthropic Messages adapter: ``/v1/messages`` and ``/v1/messages/count_tokens``.

A third rendering of the one pipeline, not a translation through OpenAI JSON: the request
becomes a ``Conversation`` and ``Options`` here, ``generation.prepare`` renders it in the
model's dialect, and ``render.messages`` renders the choice's events as Anthropic's.

- ``system`` (a string or text blocks) is the conversation's instructions. Claude Code's
  first system block, ``x-anthropic-billing-header: ...``, carries a value that changes with
  every request; it is left out of the prompt, or no request would reuse the previous one's
  cached prefix.
- Inline ``system`` messages (Claude Code sends them mid-conversation) stay system messages.
- ``tool_result`` blocks become tool messages (before the user's text in the same turn);
  ``is_error`` results say so in their text.
- ``thinking`` blocks are trusted into the prompt only when their ``signature`` is this
  server's seal of their text for the caller's API key (``redacted_thinking``: their
  ``data``); others (another server's, another key's, an old ``podium.v1`` one) are left out,
  as Anthropic's own signatures must be when Claude Code switches to Podium mid-session.
- ``tools`` follow Chat's name rule (letters, digits, ``_``, ``-``, ``.``; at most 128),
  and no two share a name.
- ``tool_choice`` ``any`` / ``tool`` are forced by the same grammar as Chat's ``required`` /
  named function; ``thinking: disabled`` turns the template's thinking switch off.
- A reasoning budget (api/reasoning.py): ``thinking: enabled``'s ``budget_tokens`` (Anthropic's
  rules: at least 1,024 and below ``max_tokens``, else a 400), else ``output_config.effort``
  through the model's ``--reasoning-budgets``; ``disabled`` is 0.
- ``max_tokens`` is a ceiling: cut to what the context has left (Claude Code asks 128,000).
- ``output_config.format`` (a JSON schema) constrains the text like Chat's response_format;
  ``thinking.display: "omitted"`` sends thinking blocks with their signature alone.
- ``cache_control`` breakpoints (on tools, system blocks, content blocks, blocks inside a
  tool result, and the request's own: automatic caching, on the last block that can hold
  one) are checked as Anthropic checks them; the last becomes ``Options.cache_mark``, where
  the conversation built from the request has that block (a breakpoint on tools or system:
  after the instructions and tools), and any ``ttl: "1h"`` asks the cache to keep the
  prefix (``cache_retain``). ``count_tokens`` checks them and counts as without them.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, AsyncGenerator

from podium.api import common
from podium.api.reasoning import NO_LIMIT, Budget, applied, of_effort, off
from podium.api.sealing import Sealer
from podium.conversation import (Conversation, Message, Options, Reasoning, ResponseFormat,
                                 TextPart, Tool, ToolCall)
from podium.dialect import Dialect
from podium.engine.base import Engine
from podium.errors import ContextLengthExceeded, InvalidRequestError
from podium.generation import (Prepared, check_options, drive, fold, off_loop,
                               prepare, start)
from podium.protocol.messages import CountTokensRequest, MessageParam, MessagesRequest
from podium.render.messages import MessageBuilder
from podium.settings import Settings
from podium.store.base import NO_OWNER

log = logging.getLogger(__name__)

BILLING_HEADER = "x-anthropic-billing-header:"
EFFORTS = ("low", "medium", "high", "xhigh", "max")     # output_config.effort's
MIN_BUDGET_TOKENS = 1024                                # Anthropic's least thinking budget
_CLIENT_TOOL_TYPES = (None, "custom")


class MessagesService:
    def __init__(self, engine: Engine, dialect: Dialect, settings: Settings, sealer: Sealer):
        self._engine = engine
        self._dialect = dialect
        self._settings = settings
        self._sealer = sealer

    async def create(self, req: MessagesRequest, owner: str = NO_OWNER, *, small: bool = False
                     ) -> dict[str, Any] | AsyncGenerator[dict, None]:
        prepared = await off_loop(self._prepare, req, owner, inline=small)
        choice = prepared.choices[0]
        start(self._engine, [choice])
        omit = req.thinking is not None and req.thinking.display == "omitted"
        hint = choice.request.cache
        builder = MessageBuilder(new_message_id(), req.model, prepared.prompt_tokens,
                                 functools.partial(self._sealer.seal, owner=owner),
                                 omit_thinking=omit,
                                 one_hour=hint is not None and hint.retain is True)
        if req.stream:
            return drive(self._engine, [choice], builder,
                         keepalive=self._settings.stream_keepalive_seconds)
        return await fold(self._engine, [choice], builder)

    async def count_tokens(self, req: CountTokensRequest, owner: str = NO_OWNER, *,
                           small: bool = False) -> dict[str, Any]:
        """The prompt's tokens as the model would see them: template, system and tools."""
        return {"input_tokens": await off_loop(self._count, req, owner, inline=small)}

    def _count(self, req: CountTokensRequest, owner: str) -> int:
        options = self._options(req, None)
        check_options(options)
        conversation = self._conversation(req, owner)
        cache_marks(req, conversation.messages)    # checked as for a message; not counted
        return len(self._dialect.prompt(conversation, options).token_ids)

    def _prepare(self, req: MessagesRequest, owner: str) -> Prepared:
        options = self._options(req, req)
        conversation = self._conversation(req, owner)
        options.cache_mark, options.cache_retain = cache_marks(req, conversation.messages)
        try:
            return prepare(self._engine, self._dialect, conversation, options, self._settings)
        except ContextLengthExceeded as exc:
            if exc.tokens is None:
                raise
            # Anthropic's wording, which Claude Code parses to compact its conversation
            raise ContextLengthExceeded(f"prompt is too long: {exc.tokens} tokens > "
                                        f"{exc.limit} maximum", param=exc.param) from None

    # -- translation ----------------------------------------------------------------------

    def _conversation(self, req: CountTokensRequest | MessagesRequest, owner: str
                      ) -> Conversation:
        return Conversation(self._messages(req.messages, owner), _system(req.system))

    def _messages(self, messages: list[MessageParam], owner: str) -> list[Message]:
        out: list[Message] = []
        for i, message in enumerate(messages):
            where = f"messages[{i}]"
            if message.role == "assistant":
                out.append(self._assistant(message.content, where, owner))
            elif message.role == "system":
                out.append(Message("system", _text_blocks(message.content, where), where))
            else:
                out += _user(message.content, where)
        return out

    def _assistant(self, content: str | list[dict[str, Any]], where: str, owner: str
                   ) -> Message:
        message = Message("assistant", [], where)
        if isinstance(content, str):
            message.parts.append(TextPart(content))
            return message
        for j, block in enumerate(content):
            kind, at = block.get("type"), f"{where}.content[{j}]"
            if kind == "text":
                message.parts.append(TextPart(_field(block, "text", str, at)))
            elif kind == "tool_use":
                arguments = json.dumps(_field(block, "input", dict, at), ensure_ascii=False)
                message.tool_calls.append(ToolCall(_field(block, "id", str, at),
                                                   _field(block, "name", str, at), arguments))
            elif kind in ("thinking", "redacted_thinking"):
                reasoning = self._reasoning(block, kind, owner)
                if reasoning is not None:
                    message.reasoning = reasoning
            else:
                raise InvalidRequestError(f"Content blocks of type {kind!r} are not supported "
                                          f"in assistant messages", param=at)
        message.empty = not message.parts and bool(message.tool_calls)
        return message

    def _reasoning(self, block: dict[str, Any], kind: str, owner: str) -> Reasoning | None:
        """A thinking block this server sealed for ``owner``, opened; anything else is left
        out."""
        sealed = block.get("signature") if kind == "thinking" else block.get("data")
        if not isinstance(sealed, str):
            return None
        try:
            text = self._sealer.unseal(sealed, owner)
        except InvalidRequestError as exc:
            log.warning("leaving out a %s block: %s", kind, exc.message)
            return None
        if kind == "thinking" and block.get("thinking") not in (text, ""):  # "": omitted
            log.warning("leaving out a thinking block whose text does not match its signature")
            return None
        return Reasoning(text, sealed)

    def _options(self, req: CountTokensRequest | MessagesRequest,
                 full: MessagesRequest | None) -> Options:
        tools = self._tools(req)
        choice, parallel = "auto", True
        if req.tool_choice is not None:
            kind = req.tool_choice.type
            parallel = not req.tool_choice.disable_parallel_tool_use
            if kind == "tool":
                if not req.tool_choice.name:
                    raise InvalidRequestError("tool_choice of type 'tool' needs a name",
                                              param="tool_choice.name")
                choice = req.tool_choice.name
            else:
                choice = {"auto": "auto", "any": "required", "none": "none"}[kind]
        config = req.output_config or {}
        effort = _effort(config)
        budget = _budget(req, full, effort, self._settings.effort_budgets())
        options = applied(Options(
            model=req.model, sampling=common.sampling(), tools=tools, tool_choice=choice,
            parallel_tool_calls=parallel,       # Harmony's highest effort for Anthropic's max
            reasoning_effort="xhigh" if effort == "max" else effort,
            response_format=_format(config.get("format")),
            fit_max_tokens=True, messages_param="messages", max_tokens_param="max_tokens"),
            budget)
        if full is not None:
            options.sampling = common.sampling(temperature=full.temperature, top_p=full.top_p,
                                               top_k=full.top_k)
            options.max_tokens = full.max_tokens
            options.stop = [s for s in full.stop_sequences or () if s]
        return options

    def _tools(self, req: CountTokensRequest | MessagesRequest) -> list[Tool]:
        tools = []
        named: dict[str, int] = {}
        for i, tool in enumerate(req.tools or ()):
            where = f"tools[{i}]"
            if tool.name in named:      # the model could not tell them apart
                raise InvalidRequestError(
                    f"{where}.name: tool names must be unique ({tool.name!r} is also "
                    f"tools[{named[tool.name]}].name)", param=f"{where}.name")
            named[tool.name] = i
            if tool.type not in _CLIENT_TOOL_TYPES or tool.input_schema is None:
                if self._settings.strict_tools:
                    raise InvalidRequestError(f"Tool {tool.name!r} of type {tool.type!r} is a "
                                              f"server tool; Podium cannot run it", param=where)
                log.warning("leaving out tool %r of type %r: Podium cannot run it",
                            tool.name, tool.type)
                continue
            tools.append(Tool(tool.name, tool.input_schema, tool.description,
                              where=f"{where}.input_schema", strict=tool.strict is True))
        return tools


def _effort(config: dict[str, Any]) -> str | None:
    effort = config.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequestError(f"output_config.effort must be one of {', '.join(EFFORTS)}",
                                  param="output_config.effort")
    return effort


def _budget(req: CountTokensRequest | MessagesRequest, full: MessagesRequest | None,
            effort: str | None, budgets: Mapping[str, int]) -> Budget:
    """``thinking: disabled`` is off; ``enabled`` is its ``budget_tokens`` (Anthropic's
    rules: at least 1,024, below ``max_tokens``); else ``output_config.effort``'s tokens."""
    thinking = req.thinking
    if thinking is not None and thinking.type == "disabled":
        return off("thinking.type")
    if thinking is not None and thinking.type == "enabled":
        n = thinking.budget_tokens
        if n is None or n < MIN_BUDGET_TOKENS:
            raise InvalidRequestError(
                f"thinking.budget_tokens: thinking of type 'enabled' needs budget_tokens, "
                f"an integer of at least {MIN_BUDGET_TOKENS}", param="thinking.budget_tokens")
        if full is not None and n >= full.max_tokens:
            raise InvalidRequestError("`max_tokens` must be greater than "
                                      "`thinking.budget_tokens`", param="thinking.budget_tokens")
        return Budget(n, "thinking.budget_tokens")
    return NO_LIMIT if effort is None else of_effort(effort, budgets, "output_config.effort")


def _format(fmt: Any) -> ResponseFormat | None:
    """``output_config.format``: structured output, constrained like Chat's response_format."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") is None:
        raise InvalidRequestError("output_config.format must be {\"type\": \"json_schema\", "
                                  "\"schema\": {...}}", param="output_config.format")
    return common.response_format(fmt["type"], fmt.get("schema"), param="output_config.format",
                                  schema_param="output_config.format.schema",
                                  name=fmt.get("name"), description=fmt.get("description"),
                                  kinds=("json_schema",))


def new_message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def _system(system: str | list[dict[str, Any]] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    texts = []
    for j, block in enumerate(system):
        text = _field(block, "text", str, f"system[{j}]")
        if block.get("type") != "text":
            raise InvalidRequestError("system blocks must be text blocks", param=f"system[{j}]")
        if j == 0 and text.startswith(BILLING_HEADER):
            continue            # changes with every request: it would defeat prefix caching
        texts.append(text)
    return "\n\n".join(texts) or None


def _user(content: str | list[dict[str, Any]], where: str) -> list[Message]:
    """A user turn: its tool results (tool messages, first), then its text (if any)."""
    if isinstance(content, str):
        return [Message("user", [TextPart(content)], where)]
    results: list[Message] = []
    parts: list[TextPart] = []
    for j, block in enumerate(content):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text":
            parts.append(TextPart(_field(block, "text", str, at)))
        elif kind == "tool_result":
            text = _result_text(block.get("content"), at)
            if block.get("is_error"):
                text = "Error: " + text
            results.append(Message("tool", [TextPart(text)], at,
                                   tool_call_id=_field(block, "tool_use_id", str, at)))
        elif kind in ("image", "document"):
            raise InvalidRequestError(f"This model accepts text only; content blocks of type "
                                      f"{kind!r} are not supported", param=at)
        else:
            raise InvalidRequestError(f"Content blocks of type {kind!r} are not supported",
                                      param=at)
    return results + ([Message("user", parts, where)] if parts else [])


def _result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError("tool_result content must be a string or a list of blocks",
                                  param=f"{where}.content")
    return "\n".join(p.text for p in _text_blocks(content, f"{where}"))


def _text_blocks(content: str | list[dict[str, Any]], where: str) -> list[TextPart]:
    if isinstance(content, str):
        return [TextPart(content)]
    parts = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        if block.get("type") != "text":
            kind = block.get("type")
            raise InvalidRequestError(
                f"This model accepts text only; content blocks of type {kind!r} are not "
                f"supported here", param=at)
        parts.append(TextPart(_field(block, "text", str, at)))
    return parts


# -- cache_control ----------------------------------------------------------------------

MAX_BREAKPOINTS = 4                 # Anthropic's most blocks with cache_control
_TTLS = ("5m", "1h")
_HEAD = (-1, 0)                     # ``Options.cache_mark``: after the instructions and tools
_UNMARKABLE = ("thinking", "redacted_thinking")


@dataclass(frozen=True, slots=True)
class _Block:
    """A block of the request that could hold a breakpoint, in Anthropic's order (tools,
    system, messages)."""

    path: str                       # Anthropic's name for it: "messages.2.content.0"
    kind: str | None                # its type ("tool" for a tool)
    control: Any                    # its cache_control (None: none)
    text: str | None                # a text block's text
    at: tuple[int, int]             # ``Options.cache_mark`` for a breakpoint after it


def cache_marks(req: CountTokensRequest | MessagesRequest, messages: list[Message]
                ) -> tuple[tuple[int, int] | None, bool | None]:
    """The request's ``cache_control`` breakpoints, checked with Anthropic's rules and
    wording, as ``(Options.cache_mark, Options.cache_retain)``: the last breakpoint's place in
    ``messages`` (the conversation ``_messages`` built from the request), and True when one
    asks for ``ttl: "1h"`` (None otherwise: the server's policy)."""
    blocks = list(_blocks(req, messages))
    marks = [(block, _checked(block)) for block in blocks if block.control is not None]
    if req.cache_control is not None:
        marks += _automatic(_ttl(req.cache_control, "cache_control"), blocks)
    if len(marks) > MAX_BREAKPOINTS:
        raise InvalidRequestError(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control "
                                  f"may be provided. Found {len(marks)}.",
                                  param="cache_control")
    shorter = False
    for block, ttl in marks:
        if ttl == "1h" and shorter:
            raise _refused(f"{block.path}.cache_control.ttl",
                           "a ttl='1h' cache_control block must not come after a ttl='5m' "
                           "cache_control block. Note that blocks are processed in the "
                           "following order: `tools`, `system`, `messages`.")
        shorter = shorter or ttl == "5m"
    if not marks:
        return None, None
    return max(block.at for block, _ in marks), any(ttl == "1h" for _, ttl in marks) or None


def _automatic(ttl: str, blocks: list[_Block]) -> list[tuple[_Block, str]]:
    """The request's own ``cache_control``: a breakpoint on the last block that can hold
    one (none, when no block can); nothing more when that block has one of the same ttl."""
    target = next((b for b in reversed(blocks) if _markable(b)), None)
    if target is None:
        return []
    if target.control is None:
        return [(target, ttl)]
    own = _ttl(target.control, f"{target.path}.cache_control")
    if own != ttl:
        raise _refused("cache_control.ttl", f"the automatic breakpoint's ttl='{ttl}' differs "
                       f"from the ttl='{own}' of the cache_control already on the last "
                       f"cacheable block ({target.path})")
    return []


def _markable(block: _Block) -> bool:
    return block.kind not in _UNMARKABLE and not (block.kind == "text" and block.text == "")


def _checked(block: _Block) -> str:
    """A block's own breakpoint, refused where Anthropic refuses it; its ttl."""
    if block.kind in _UNMARKABLE:
        raise _refused(f"{block.path}.{block.kind}.cache_control",
                       "Extra inputs are not permitted")
    ttl = _ttl(block.control, f"{block.path}.cache_control")
    if not _markable(block):
        raise _refused(f"{block.path}.text", "cache_control cannot be set for empty text blocks")
    return ttl


def _ttl(control: Any, path: str) -> str:
    """A ``cache_control``'s ttl ("5m" when not given), or a 400 for a malformed one."""
    if not isinstance(control, dict):
        raise _refused(path, "Input should be a valid dictionary")
    if "type" not in control:
        raise _refused(f"{path}.type", "Field required")
    if control["type"] != "ephemeral":
        raise _refused(f"{path}.type", "Input should be 'ephemeral'")
    ttl = control.get("ttl")
    if ttl is None:
        return "5m"
    if ttl not in _TTLS:
        raise _refused(f"{path}.ttl", "Input should be '5m' or '1h'")
    return ttl


def _refused(path: str, text: str) -> InvalidRequestError:
    """Anthropic's wording (``messages.1.content.0.cache_control.ttl: ...``), with the param
    in Podium's own form (``messages[1].content[0].cache_control.ttl``)."""
    return InvalidRequestError(f"{path}: {text}", param=re.sub(r"\.(\d+)", r"[\1]", path))


def _blocks(req: CountTokensRequest | MessagesRequest, messages: list[Message]
            ) -> Iterator[_Block]:
    """Every block of the request, in Anthropic's order, with the place a breakpoint after
    it has in ``messages`` (found by the ``where`` ``_messages`` gave each message)."""
    for i, tool in enumerate(req.tools or ()):
        yield _Block(f"tools.{i}", "tool", tool.cache_control, None, _HEAD)
    if isinstance(req.system, list):
        for j, block in enumerate(req.system):
            yield _Block(f"system.{j}", "text", block.get("cache_control"), block.get("text"),
                         _HEAD)
    elif req.system:
        yield _Block("system", "text", None, req.system, _HEAD)
    index = {message.where: k for k, message in enumerate(messages)}
    for i, message in enumerate(req.messages):
        yield from _message_blocks(i, message.content, index)


def _message_blocks(i: int, content: str | list[dict[str, Any]], index: dict[str, int]
                    ) -> Iterator[_Block]:
    """A message's blocks. Its text blocks are the parts of one Message (``messages[i]``),
    in order; a tool result is a Message of its own (``messages[i].content[j]``, before the
    turn's text), and so are blocks inside it; a ``tool_use`` block follows all of its
    message's text (the call is rendered after it)."""
    own = index.get(f"messages[{i}]", -1)   # -1: none (a turn of tool results alone)
    if isinstance(content, str):
        yield _Block(f"messages.{i}.content.0", "text", None, content, (own, 0))
        return
    texts = sum(1 for block in content if block.get("type") == "text")
    seen = 0
    for j, block in enumerate(content):
        kind, path = block.get("type"), f"messages.{i}.content.{j}"
        at = (own, max(texts - 1, 0))
        if kind == "text":
            at, seen = (own, seen), seen + 1
        elif kind == "tool_result":
            at = (index[f"messages[{i}].content[{j}]"], 0)
            inner = block.get("content")
            for k, part in enumerate(inner if isinstance(inner, list) else ()):
                yield _Block(f"{path}.content.{k}", part.get("type"),
                             part.get("cache_control"), part.get("text"), at)
        yield _Block(path, kind, block.get("cache_control"), block.get("text"), at)


def _field(block: dict[str, Any], name: str, kind: type, where: str) -> Any:
    value = block.get(name)
    if not isinstance(value, kind):
        raise InvalidRequestError(f"{block.get('type') or 'block'} blocks need {name!r} "
                                  f"({kind.__name__})", param=f"{where}.{name}")
    return value

