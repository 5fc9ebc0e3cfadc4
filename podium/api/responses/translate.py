"""The Responses adapter's translation: its request in the conversation stage's terms.

Input items (messages, function calls and their outputs, reasoning, custom tool calls)
become a ``Conversation``; Responses tools (functions, namespaces of functions, ``custom``
tools of free text or a grammar's) become the function ``Tool``s the model sees, with a map
back to the names and kinds the client expects in the output; the request's other fields
become ``Options``.
Every error names the Responses request's own parameter (``input[2].content``,
``tools[1].tools[0].parameters``, ``text.format.schema``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Iterable

from pydantic import TypeAdapter, ValidationError

from podium.api import common
from podium.api.chat import Mark, prompt_cache
from podium.api.reasoning import DEFAULT_BUDGETS, NO_LIMIT, Budget, applied, of_effort
from podium.api.responses.mcp import error_text
from podium.api.sealing import Sealer
from podium.conversation import (Conversation, Message, Options, Reasoning, ResponseFormat,
                                 Role, TextPart, Tool, ToolCall, custom_tool)
from podium.errors import InvalidRequestError
from podium.protocol.chat import TOOL_NAME_PATTERN
from podium.protocol.responses import CustomTool, InputItem, ResponsesRequest
from podium.render import file_search
from podium.render.responses import response_skeleton

log = logging.getLogger(__name__)

_ITEMS = TypeAdapter(InputItem)
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "custom_tool_call": "ctc", "custom_tool_call_output": "ctco", "reasoning": "rs",
              "mcp_list_tools": "mcpl", "mcp_call": "mcp", "mcp_approval_request": "mcpr",
              "mcp_approval_response": "mcpa"}
UNSUPPORTED_TOOLS = {"web_search", "web_search_preview", "code_interpreter",
                     "image_generation", "computer_use_preview", "computer",
                     "local_shell", "shell", "apply_patch", "tool_search"}
MAX_ITEM_ID = 64            # as the store's item id columns
STATUSES = frozenset({"in_progress", "completed", "incomplete"})      # OpenAI's item statuses
MCP_CALL_STATUSES = STATUSES | {"calling", "failed"}
MAX_TOOL_NAME = 128         # the flattened ``ns__fn`` included, as chat's function names
_TOOL_NAME = re.compile(TOOL_NAME_PATTERN)


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def normalize_input(raw: str | list[dict[str, Any]], sealer: Sealer, owner: str,
                    param: str = "input", taken: Iterable[str] = ()) -> list[dict[str, Any]]:
    """A client's items (``responses.create``'s ``input``, a conversation's ``items``),
    validated by ``check_item`` and each given an id (for listing them later); errors name
    ``param[i]``. ``taken``: ids already in the conversation they join."""
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    seen = set(taken)
    return [check_item(data, f"{param}[{i}]", sealer, owner, seen) for i, data in enumerate(raw)]


def check_item(data: dict[str, Any], where: str, sealer: Sealer, owner: str, seen: set[str],
               *, made_here: bool = False) -> dict[str, Any]:
    """The one validation of an input item, wherever it comes from: its shape, its id (at
    most ``MAX_ITEM_ID`` characters, not in ``seen``, which it joins), its status, text-only
    content, a seal that opens for ``owner``; ``mcp_approval_request`` items only when
    ``made_here`` (Podium makes them: a stored conversation's). The item as a plain dict."""
    if "type" not in data and "role" in data:
        data = {**data, "type": "message"}
    try:
        item = _ITEMS.validate_python(data)
    except ValidationError as exc:
        # the error that got furthest: a bad part's (``content[0].input_text.text``), not
        # that the content is not the string it might also have been
        first = max(exc.errors(), key=lambda e: len(e["loc"]))
        raise InvalidRequestError(
            f"Invalid input item {where}: {_field(first['loc'][1:])}: {first['msg']}",
            param=where) from None
    out = item.model_dump(exclude_none=True)
    if item.id is not None:
        if len(item.id) > MAX_ITEM_ID:
            raise InvalidRequestError(f"Item ids are limited to {MAX_ITEM_ID} characters",
                                      param=f"{where}.id")
        if item.id in seen:
            raise duplicate_id(item.id, f"{where}.id")
    out["id"] = item.id or new_item_id(_ID_PREFIX[item.type])
    seen.add(out["id"])
    allowed = MCP_CALL_STATUSES if item.type == "mcp_call" else STATUSES
    if "status" in out and out["status"] not in allowed:
        raise InvalidRequestError(f"Invalid status {out['status']!r}: expected one of "
                                  f"{', '.join(sorted(allowed))}", param=f"{where}.status")
    if item.type == "mcp_approval_request" and not made_here:
        raise InvalidRequestError(
            "mcp_approval_request items are made by Podium alone: answer one with an "
            "mcp_approval_response", param=where)
    for field in ("content", "output"):
        if item.type != "reasoning" and isinstance(out.get(field), list):
            _text_only(out[field], f"{where}.{field}")
    if out.get("encrypted_content"):
        sealer.unseal(out["encrypted_content"], owner, param=f"{where}.encrypted_content")
    return out


def _field(loc: tuple[Any, ...]) -> str:
    """pydantic's location in an item as a path (``content[0].input_text.text``), without
    the names of union members (``str``, ``list[...]``), which say nothing to a client."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "str" and "[" not in part:
            out += f".{part}" if out else part
    return out


def duplicate_id(item_id: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(f"Duplicate item id {item_id!r}: item ids are unique within a "
                               f"conversation", param=param)


@dataclass(frozen=True)
class ClientTool:
    kind: str                 # "function", "custom", or "mcp" (a tool Podium calls itself)
    name: str
    namespace: str | None = None
    server: str | None = None     # an mcp tool's server_label
    approval: bool = False        # an mcp tool whose calls the client approves first


class ToolMap:
    """Request tools as the model sees them, and the way back to the client's names."""

    def __init__(self, tools: list[dict[str, Any]] | None, strict: bool = False):
        self.tools: list[Tool] = []
        self.by_model_name: dict[str, ClientTool] = {}
        self.file_search: dict[str, Any] | None = None    # a file_search tool, with where
        for i, tool in enumerate(tools or ()):
            self._add(tool, None, strict, f"tools[{i}]")

    def _add(self, tool: dict[str, Any], namespace: str | None, strict: bool, where: str) -> None:
        kind = tool.get("type")
        if kind == "mcp":           # its tools are listed when the response runs (add_mcp)
            return
        if kind == "file_search":   # Podium searches the tool's vector stores
            self._add_file_search(tool, where)
            return
        if kind == "namespace":
            if tool.get("name") is not None:
                _check_name(tool["name"], tool["name"], f"{where}.name")
            for j, inner in enumerate(tool.get("tools") or ()):
                self._add(inner, tool.get("name"), strict, f"{where}.tools[{j}]")
            return
        if kind not in ("function", "custom"):
            if strict or kind not in UNSUPPORTED_TOOLS:
                raise InvalidRequestError(f"Tool type {kind!r} is not supported", param=where)
            log.warning("leaving out tool of type %r: Podium cannot run it", kind)
            return
        name = tool.get("name")
        if not name:
            raise InvalidRequestError("A tool needs a name", param=f"{where}.name")
        model_name = f"{namespace}__{name}" if namespace else name
        _check_name(name, model_name, f"{where}.name")
        self.tools.append(_function(tool, model_name, where) if kind == "function"
                          else _custom(tool, model_name, where))
        self.by_model_name[model_name] = ClientTool(kind, name, namespace)

    def _add_file_search(self, tool: dict[str, Any], where: str) -> None:
        if self.file_search is not None or file_search.NAME in self.by_model_name:
            raise InvalidRequestError("A request takes one file_search tool", param=where)
        self.file_search = {**tool, "where": where}
        self.tools.append(Tool(file_search.NAME, file_search.PARAMETERS,
                               file_search.DESCRIPTION, where=where))
        self.by_model_name[file_search.NAME] = ClientTool("file_search", file_search.NAME)

    def add_mcp(self, server: str, tool: dict[str, Any], approval: bool, where: str) -> None:
        """A tool an MCP server listed, offered to the model by its own name."""
        name = tool["name"]
        if name in self.by_model_name:
            raise InvalidRequestError(
                f"Two tools are named {name!r} (MCP server {server!r} lists one): the model "
                f"could not tell them apart", param=where)
        _check_name(name, name, where)
        schema = tool.get("input_schema")
        self.tools.append(Tool(name, schema if isinstance(schema, dict) else None,
                               tool.get("description") or None, where=where))
        self.by_model_name[name] = ClientTool("mcp", name, server=server, approval=approval)

    def model_name(self, name: str, namespace: str | None = None) -> str:
        return f"{namespace}__{name}" if namespace else name

    def client(self, model_name: str) -> ClientTool:
        return self.by_model_name.get(model_name) or ClientTool("function", model_name)

    def tool_choice(self, choice: str | dict[str, Any] | None) -> str:
        """``auto``, ``none``, ``required``, or the model's name of the one function."""
        if choice is None:
            return "auto"
        if isinstance(choice, str):
            return choice
        kind = choice.get("type")
        if kind in ("function", "custom"):
            return self.model_name(choice.get("name", ""), choice.get("namespace"))
        if kind == "file_search" and self.file_search is not None:
            return file_search.NAME
        if kind == "mcp":           # one of a server's tools, or any of them
            name = choice.get("name")
            tool = self.by_model_name.get(name or "")
            if name and (tool is None or tool.server != choice.get("server_label")):
                raise InvalidRequestError(
                    f"MCP server {choice.get('server_label')!r} offers no tool {name!r}",
                    param="tool_choice.name")
            return name or "required"
        if kind == "allowed_tools":
            mode = choice.get("mode") or "auto"
            if mode not in ("auto", "required", "none"):
                raise InvalidRequestError(f"allowed_tools mode {mode!r} is not supported",
                                          param="tool_choice.mode")
            return mode
        raise InvalidRequestError(f"tool_choice of type {kind!r} is not supported",
                                  param="tool_choice")


def _function(tool: dict[str, Any], model_name: str, where: str) -> Tool:
    parameters = tool.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise InvalidRequestError("A function's parameters must be a JSON schema object",
                                  param=f"{where}.parameters")
    return Tool(model_name, parameters, tool.get("description") or None,
                where=f"{where}.parameters", strict=tool.get("strict") is True)


def _custom(tool: dict[str, Any], model_name: str, where: str) -> Tool:
    """A custom tool, its format checked (a grammar's syntax, its size)."""
    try:
        custom = CustomTool.model_validate(tool)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        param = f"{where}.{field}" if field else where
        raise InvalidRequestError(f"Invalid custom tool {param}: {first['msg']}",
                                  param=param) from None
    return custom_tool(model_name, custom.description or None, custom.grammar,
                       f"{where}.format")


def _check_name(name: Any, model_name: Any, where: str) -> None:
    """Names the model sees (``ns__fn`` for a namespace's function) follow chat's rule."""
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(model_name):
        raise InvalidRequestError(
            "Tool names may contain only letters, digits, '_', '-' and '.'", param=where)
    if len(model_name) > MAX_TOOL_NAME:
        raise InvalidRequestError(f"Tool names (with their namespace) are limited to "
                                  f"{MAX_TOOL_NAME} characters", param=where)


def _parts(content: Any, where: str, field: str = "content") -> list[TextPart]:
    if isinstance(content, str):
        return [TextPart(content)]
    _text_only(content, f"{where}.{field}")
    return [TextPart(part["text"]) for part in content]


def _text_only(parts: list[dict[str, Any]], where: str) -> None:
    for j, part in enumerate(parts):
        if part.get("type") not in _TEXT_TYPES:
            raise InvalidRequestError(f"This model accepts text only; content of type "
                                      f"{part.get('type')!r} is not supported",
                                      param=f"{where}[{j}]")


_TEXT_TYPES = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}


def translated(instructions: str | None, items: list[dict[str, Any]], wheres: list[str],
               tools: ToolMap, sealer: Sealer, owner: str) -> Translation:
    """The translation of ``items`` (the whole conversation, oldest first); ``wheres[i]`` is
    the request's parameter for item i (``input[k]``, or ``previous_response_id`` for items
    of the stored conversation); sealed reasoning opens for ``owner`` alone."""
    translation = Translation(instructions, tools, sealer, owner, items)
    translation.add(items, wheres)
    return translation


class Translation:
    """Items to messages, in order, extendable: the next round of the model after an MCP
    round is the same translation ``extended`` by the response's output, the history not
    translated again. ``answering`` holds the items whose approvals decide which approval
    requests the model waited for (a request never answered is left out).

    ``mark``: the last ``prompt_cache_breakpoint`` of a content part, as (message, part)
    in the conversation; ``marked_long``: a breakpoint asked for ``ttl`` ``12h``."""

    def __init__(self, instructions: str | None, tools: ToolMap, sealer: Sealer, owner: str,
                 answering: list[dict[str, Any]]):
        self._instructions = instructions
        self._tools, self._sealer, self._owner = tools, sealer, owner
        self._messages: list[Message] = []
        self._known_calls: set[str] = set()
        self._closed: set[int] = set()      # assistant messages a tool output followed
        self._reasoning: Reasoning | None = None
        self._results: list[Message] = []   # outputs of the MCP calls just made
        self._answered = {item["approval_request_id"] for item in answering
                          if item["type"] in ("mcp_approval_response", "mcp_call")
                          and item.get("approval_request_id")}
        self.mark: Mark | None = None
        self.marked_long = False

    def extended(self, items: list[dict[str, Any]], wheres: list[str]) -> Translation:
        """The translation of this one's items followed by ``items``; this one is left as
        it was."""
        other = copy.copy(self)
        other._messages = list(self._messages)
        other._known_calls, other._closed = set(self._known_calls), set(self._closed)
        other._results = list(self._results)
        if other._messages:             # the one message later items may change
            last = other._messages[-1] = copy.copy(self._messages[-1])
            last.tool_calls = list(last.tool_calls)
            if id(self._messages[-1]) in self._closed:
                other._closed.add(id(last))
        other.add(items, wheres)
        return other

    def conversation(self) -> Conversation:
        return Conversation(self._messages + self._results, self._instructions or None)

    def _attach(self, call: ToolCall, where: str) -> None:
        """A call joins the assistant message it follows (a new one after a tool output),
        taking the reasoning that came before it."""
        messages = self._messages
        last = messages[-1] if messages else None
        if last is None or last.role != "assistant" or id(last) in self._closed:
            last = Message("assistant", [], where, empty=True)
            messages.append(last)
        if self._reasoning is not None:
            last.reasoning, self._reasoning = self._reasoning, None
        last.tool_calls.append(call)
        self._known_calls.add(call.id)

    def _close_last(self) -> None:
        if self._messages and self._messages[-1].role == "assistant":
            self._closed.add(id(self._messages[-1]))

    def _marked(self, content: Any) -> None:
        """Notes the breakpoints of the last message's content (its parts are the
        content's, one for one: ``_parts``); a later one is the mark."""
        if isinstance(content, list):
            for j, part in enumerate(content):
                point = part.get("prompt_cache_breakpoint")
                if point is not None:
                    self.mark = (len(self._messages) - 1, j)
                    self.marked_long = self.marked_long or point.get("ttl") == "12h"

    def add(self, items: list[dict[str, Any]], wheres: list[str]) -> None:
        messages, known_calls = self._messages, self._known_calls
        for i, item in enumerate(items):
            where, kind = wheres[i], item["type"]
            if kind in ("mcp_call", "mcp_approval_request"):
                request = kind == "mcp_approval_request"
                if request and item["id"] not in self._answered:
                    continue            # never answered: the model did not wait for it
                call_id = item.get("approval_request_id") or item["id"]
                if not request and item.get("approval_request_id") and call_id in known_calls:
                    pass                # approved: its request made the call
                else:
                    self._attach(ToolCall(call_id, item["name"], item["arguments"]), where)
                if not request:
                    text = item.get("output")
                    if text is None:
                        text = error_text(item.get("error") or {})
                    self._results.append(Message("tool", [TextPart(text)], where,
                                                 tool_call_id=call_id))
                continue
            if kind == "mcp_approval_response":
                if item["approve"]:
                    continue            # the mcp_call that follows holds the output
                if item["approval_request_id"] not in known_calls:
                    raise InvalidRequestError(
                        f"No mcp_approval_request with id {item['approval_request_id']!r} "
                        f"precedes this response", param=f"{where}.approval_request_id")
                reason = f": {item['reason']}" if item.get("reason") else ""
                self._results.append(Message(
                    "tool", [TextPart(f"The user denied this call{reason}")], where,
                    tool_call_id=item["approval_request_id"]))
                continue
            if kind == "mcp_list_tools":
                continue
            if kind == "file_search_call":  # Podium's search: a call and its results
                self._attach(ToolCall(item["id"], file_search.NAME,
                                      file_search.arguments(item)), where)
                self._results.append(Message("tool", [TextPart(file_search.results_text(
                    item.get("results")))], where, tool_call_id=item["id"]))
                continue
            if self._results:
                self._close_last()
                messages += self._results
                self._results = []
            if kind == "message":
                role: Role = "system" if item["role"] == "developer" else item["role"]
                message = Message(role, _parts(item["content"], where), where)
                if role == "assistant" and self._reasoning is not None:
                    message.reasoning, self._reasoning = self._reasoning, None
                messages.append(message)
                self._marked(item["content"])
            elif kind == "reasoning":
                self._reasoning = _reasoning(item, self._sealer, self._owner, where)
            elif kind in ("function_call", "custom_tool_call"):
                arguments = (item["arguments"] if kind == "function_call"
                             else json.dumps({"input": item["input"]}, ensure_ascii=False))
                self._attach(ToolCall(item["call_id"],
                                      self._tools.model_name(item["name"],
                                                             item.get("namespace")),
                                      arguments), where)
            else:   # a call's output
                if item["call_id"] not in known_calls:
                    raise InvalidRequestError(
                        f"No tool call with call_id {item['call_id']!r} precedes this output",
                        param=f"{where}.call_id")
                self._close_last()
                messages.append(Message("tool", _parts(item["output"], where, "output"), where,
                                        tool_call_id=item["call_id"]))
                self._marked(item["output"])


def _reasoning(item: dict[str, Any], sealer: Sealer, owner: str, where: str
               ) -> Reasoning | None:
    sealed = item.get("encrypted_content")
    if sealed:
        return Reasoning(sealer.unseal(sealed, owner, param=f"{where}.encrypted_content"),
                         sealed)
    parts = item.get("content") or item.get("summary") or []
    text = "".join(p["text"] for p in parts)
    return Reasoning(text) if text else None


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def to_options(req: ResponsesRequest, tools: ToolMap,
               budgets: Mapping[str, int] = DEFAULT_BUDGETS) -> Options:
    include = set(req.include or ())
    effort = (req.reasoning or {}).get("effort")
    if req.prompt_cache_options is not None and req.prompt_cache_options.prewarm:
        raise InvalidRequestError(
            "prompt_cache_options.prewarm is not supported: send the request itself, whose "
            "prompt the cache keeps (a breakpoint marks what to keep)",
            param="prompt_cache_options.prewarm")
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequestError(f"reasoning.effort must be one of {', '.join(EFFORTS)}",
                                  param="reasoning.effort")
    return applied(Options(
        model=req.model,
        sampling=common.sampling(temperature=req.temperature, top_p=req.top_p),
        max_tokens=req.max_output_tokens,
        seed=req.seed,
        logprobs=((req.top_logprobs or 0) if "message.output_text.logprobs" in include
                  else None),
        tools=tools.tools,
        tool_choice=(tools.tool_choice(req.tool_choice) if tools.tools    # none: a choice
                     else "required" if req.tool_choice == "required" else "auto"),  # is moot
        parallel_tool_calls=req.parallel_tool_calls is not False,
        parallel_asked=req.parallel_tool_calls is True,
        response_format=response_format((req.text or {}).get("format")),
        reasoning_effort=effort,
        messages_param="input",
        max_tokens_param="max_output_tokens"), _budget(req.thinking_token_budget, effort, budgets))


def with_cache(options: Options, req: ResponsesRequest, translation: Translation,
               whole: Translation) -> Options:
    """``options`` with the prompt cache's mark in ``translation``'s conversation (the one
    rendered: truncation may have cut the history) and the retention the request asked
    for, its breakpoints read in ``whole``, the conversation before any cut."""
    mark, retain = prompt_cache(req.prompt_cache_retention, req.prompt_cache_options,
                                translation.mark, whole.marked_long)
    return dataclasses.replace(options, cache_mark=mark, cache_retain=retain)


def cache_ttl(req: ResponsesRequest, whole: Translation) -> str:
    """The longest a request asked its cache writes kept: ``12h`` when its ``ttl`` or a
    breakpoint's says so, else ``30m`` (how usage splits ``cache_write_tokens``)."""
    options = req.prompt_cache_options
    return "12h" if whole.marked_long or (options is not None and options.ttl == "12h") \
        else "30m"


def _budget(count: int | None, effort: str | None, budgets: Mapping[str, int]) -> Budget:
    """vLLM's count wins; else the effort's tokens (none: thinking off); else no limit."""
    if count is not None:
        return Budget(count, "thinking_token_budget")
    return NO_LIMIT if effort is None else of_effort(effort, budgets, "reasoning.effort")


def response_format(fmt: Any) -> ResponseFormat | None:
    if fmt is not None and not isinstance(fmt, dict):
        raise InvalidRequestError("text.format must be an object such as {\"type\": "
                                  "\"json_object\"}", param="text.format")
    fmt = fmt or {}
    return common.response_format(fmt.get("type"), fmt.get("schema"), param="text.format",
                                  schema_param="text.format.schema",
                                  name=fmt.get("name", "output"),
                                  description=fmt.get("description"),
                                  strict=fmt.get("strict") is True)


def skeleton(req: ResponsesRequest) -> dict[str, Any]:
    """The response object before anything is generated (request fields echoed)."""
    return response_skeleton(
        id=new_item_id("resp"), created_at=time.time(), model=req.model,
        instructions=req.instructions, tools=req.tools or [],
        tool_choice=req.tool_choice or "auto",
        parallel_tool_calls=req.parallel_tool_calls is not False,
        parallel_asked=req.parallel_tool_calls is True,
        temperature=req.temperature if req.temperature is not None else 1.0,
        top_p=req.top_p if req.top_p is not None else 1.0,
        max_output_tokens=req.max_output_tokens, max_tool_calls=req.max_tool_calls,
        previous_response_id=req.previous_response_id, metadata=req.metadata or {},
        background=req.background, text=req.text or {"format": {"type": "text"}},
        reasoning=req.reasoning, truncation=req.truncation or "disabled", user=req.user,
        prompt_cache_key=req.prompt_cache_key, safety_identifier=req.safety_identifier,
        top_logprobs=req.top_logprobs, service_tier="default", store=req.store,
        **_cache_echo(req))


def _cache_echo(req: ResponsesRequest) -> dict[str, Any]:
    """The prompt cache's fields as OpenAI's response object gives them: the retention as
    asked, the options applied (defaults filled in); a comparison asked for diagnostics
    Podium does not make (no store of why a cache missed): ``unavailable``, a type of
    OpenAI's own for it."""
    options = req.prompt_cache_options
    echo: dict[str, Any] = {"prompt_cache_retention": req.prompt_cache_retention}
    if options is not None:
        echo["prompt_cache_options"] = options.model_dump(
            include={"mode", "ttl", "comparison_response_id"}, exclude_none=True)
        if options.comparison_response_id is not None:
            echo["prompt_cache_diagnostics"] = {"type": "unavailable"}
    return echo


def as_input(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items, as input items of the next turn."""
    items = []
    for item in output:
        if item.get("type") == "message":
            items.append({"type": "message", "id": item["id"], "role": "assistant",
                          "content": [{"type": "output_text", "text": p.get("text", "")}
                                      for p in item.get("content") or ()]})
        elif item.get("type") in ("function_call", "custom_tool_call", "reasoning",
                                  "mcp_call", "mcp_list_tools", "mcp_approval_request",
                                  "file_search_call"):
            items.append({k: v for k, v in item.items() if k != "status"})
    return items


def turn_starts(items: list[dict[str, Any]]) -> list[int]:
    """Where truncation may cut, oldest first: the start, each later user message (a turn's
    calls go with their outputs), and as a last resort the last item alone."""
    cuts = [0] + [i for i, item in enumerate(items) if i > 0 and item["type"] == "message"
                  and item["role"] == "user"]
    if cuts[-1] < len(items) - 1:
        cuts.append(len(items) - 1)
    return cuts
