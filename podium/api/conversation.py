"""Responses items and tools, translated into what the chat pipeline speaks.

Input items (messages, function calls and their outputs, reasoning, custom tool calls)
become chat messages in the shape chat templates expect; Responses tools (functions,
namespaces of functions, freeform ``custom`` tools) become function tools the model sees,
with a map back to the names and kinds the client expects in the output.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import TypeAdapter, ValidationError

from podium.errors import InvalidRequestError
from podium.protocol.chat import TOOL_NAME_PATTERN
from podium.protocol.responses import InputItem

log = logging.getLogger(__name__)

_ITEMS = TypeAdapter(InputItem)
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "custom_tool_call": "ctc", "custom_tool_call_output": "ctco", "reasoning": "rs"}
UNSUPPORTED_TOOLS = {"web_search", "web_search_preview", "file_search", "code_interpreter",
                     "image_generation", "computer_use_preview", "computer", "mcp",
                     "local_shell", "shell", "apply_patch", "tool_search"}
CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}},
                     "required": ["input"]}
MAX_TOOL_NAME = 128         # the flattened ``ns__fn`` included, as chat's function names
_TOOL_NAME = re.compile(TOOL_NAME_PATTERN)
_CHAT_TOOL_PARAM = re.compile(r"^tools\[(\d+)\](?:\.function)?")


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def normalize_input(raw: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Validated input items as plain dicts, each with an id (for listing them later)."""
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    items = []
    for i, data in enumerate(raw):
        if "type" not in data and "role" in data:
            data = {**data, "type": "message"}
        try:
            item = _ITEMS.validate_python(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"][1:])
            raise InvalidRequestError(f"Invalid input item {i}: {where}: {first['msg']}",
                                      param=f"input[{i}]") from None
        out = item.model_dump(exclude_none=True)
        out["id"] = item.id or new_item_id(_ID_PREFIX[item.type])
        items.append(out)
    return items


@dataclass(frozen=True)
class ClientTool:
    kind: str                 # "function" or "custom"
    name: str
    namespace: str | None = None


class ToolMap:
    """Request tools as the model sees them, and the way back to the client's names."""

    def __init__(self, tools: list[dict[str, Any]] | None, strict: bool = False):
        self.chat_tools: list[dict[str, Any]] = []
        self.by_model_name: dict[str, ClientTool] = {}
        self._where: list[str] = []         # each chat tool's place in the request
        for i, tool in enumerate(tools or ()):
            self._add(tool, None, strict, f"tools[{i}]")

    def _add(self, tool: dict[str, Any], namespace: str | None, strict: bool, where: str) -> None:
        kind = tool.get("type")
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
        description = tool.get("description")
        parameters = (tool.get("parameters") or {"type": "object", "properties": {}}
                      if kind == "function" else CUSTOM_PARAMETERS)
        if not isinstance(parameters, dict):
            raise InvalidRequestError("A function's parameters must be a JSON schema object",
                                      param=f"{where}.parameters")
        if kind == "custom":
            description = (description or "") + " (Put the whole input in the 'input' field.)"
        function = {"name": model_name, "parameters": parameters}
        if description:
            function["description"] = description
        self.chat_tools.append({"type": "function", "function": function})
        self._where.append(where)
        self.by_model_name[model_name] = ClientTool(kind, name, namespace)

    def responses_param(self, param: str | None) -> str | None:
        """A chat request's parameter (from an error the chat pipeline raised) as the
        Responses request's: ``tools[k].function.parameters`` becomes the place the k-th
        tool came from, ``response_format.json_schema.schema`` ``text.format.schema``."""
        if param is None:
            return None
        m = _CHAT_TOOL_PARAM.match(param)
        if m and int(m.group(1)) < len(self._where):
            return self._where[int(m.group(1))] + param[m.end():]
        if param.startswith("response_format"):
            rest = param.removeprefix("response_format").removeprefix(".json_schema")
            return "text.format" + rest
        return param

    def model_name(self, name: str, namespace: str | None = None) -> str:
        return f"{namespace}__{name}" if namespace else name

    def client(self, model_name: str) -> ClientTool:
        return self.by_model_name.get(model_name) or ClientTool("function", model_name)

    def chat_tool_choice(self, choice: str | dict[str, Any] | None) -> Any:
        if choice is None or isinstance(choice, str):
            return choice
        kind = choice.get("type")
        if kind in ("function", "custom"):
            name = self.model_name(choice.get("name", ""), choice.get("namespace"))
            return {"type": "function", "function": {"name": name}}
        if kind in ("allowed_tools",):
            return choice.get("mode") or "auto"
        raise InvalidRequestError(f"tool_choice of type {kind!r} is not supported",
                                  param="tool_choice")


def _check_name(name: Any, model_name: Any, where: str) -> None:
    """Names the model sees (``ns__fn`` for a namespace's function) follow chat's rule."""
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(model_name):
        raise InvalidRequestError(
            "Tool names may contain only letters, digits, '_', '-' and '.'", param=where)
    if len(model_name) > MAX_TOOL_NAME:
        raise InvalidRequestError(f"Tool names (with their namespace) are limited to "
                                  f"{MAX_TOOL_NAME} characters", param=where)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content):
        if part.get("type") not in _TEXT_TYPES:
            raise InvalidRequestError(f"This model accepts text only; content of type "
                                      f"{part.get('type')!r} is not supported",
                                      param=f"{where}.content[{j}]")
        parts.append(part["text"])
    return "\n".join(parts)


_TEXT_TYPES = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}


def to_messages(instructions: str | None, items: list[dict[str, Any]], tools: ToolMap,
                unseal: Callable[[str], str]) -> list[dict[str, Any]]:
    """Chat messages for ``items`` (the whole conversation, oldest first)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    known_calls: set[str] = set()
    reasoning: str | None = None
    for i, item in enumerate(items):
        where, kind = f"input[{i}]", item["type"]
        if kind == "message":
            message = {"role": item["role"], "content": _text(item["content"], where)}
            if item["role"] == "assistant" and reasoning:
                message["reasoning_content"], reasoning = reasoning, None
            messages.append(message)
        elif kind == "reasoning":
            reasoning = _reasoning_text(item, unseal, where)
        elif kind in ("function_call", "custom_tool_call"):
            arguments = (item["arguments"] if kind == "function_call"
                         else json.dumps({"input": item["input"]}, ensure_ascii=False))
            call = {"id": item["call_id"], "type": "function", "function": {
                "name": tools.model_name(item["name"], item.get("namespace")),
                "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant" or last.get("_closed"):
                last = {"role": "assistant", "content": None}
                messages.append(last)
            if reasoning:
                last["reasoning_content"], reasoning = reasoning, None
            last.setdefault("tool_calls", []).append(call)
            known_calls.add(item["call_id"])
        else:   # a call's output
            if item["call_id"] not in known_calls:
                raise InvalidRequestError(
                    f"No tool call with call_id {item['call_id']!r} precedes this output",
                    param=f"{where}.call_id")
            if messages and messages[-1]["role"] == "assistant":
                messages[-1]["_closed"] = True
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text(item["output"], where)})
    for message in messages:
        message.pop("_closed", None)
    return messages


def _reasoning_text(item: dict[str, Any], unseal: Callable[[str], str], where: str) -> str:
    if item.get("encrypted_content"):
        return unseal(item["encrypted_content"])
    parts = item.get("content") or item.get("summary") or []
    return "".join(p["text"] for p in parts)
