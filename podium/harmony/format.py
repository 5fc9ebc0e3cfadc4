"""Harmony, the format gpt-oss models speak: detection, prompts, stop tokens.

Prompts are rendered by openai-harmony from the chat messages every API produces:

- a system message with the reasoning effort and today's date;
- a developer message with the client's system / developer text as instructions, the
  function tools, and (when asked) a response format;
- the history: user turns; assistant turns as ``analysis`` (reasoning), ``commentary`` (a
  preamble, or a call to ``functions.NAME`` ended by ``<|call|>``) and ``final`` messages;
  tool results as messages from ``functions.NAME``. openai-harmony drops earlier
  ``analysis`` messages once a ``final`` message followed them.

Generation stops at ``<|return|>`` (the answer is done) or ``<|call|>`` (a tool call waits
for its result); ``HarmonyPipeline`` turns the tokens into events.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from podium.engine.base import ModelInfo
from podium.errors import InvalidRequestError, ModelFilesError
from podium.harmony.vocab import ensure_vocabulary

EFFORTS = {"none": "LOW", "minimal": "LOW", "low": "LOW", "medium": "MEDIUM", "high": "HIGH",
           "xhigh": "HIGH"}


def is_harmony(info: ModelInfo) -> bool:
    """gpt-oss by architecture, or a chat template written in Harmony's tokens."""
    if info.metadata.get("general.architecture") == "gpt-oss":
        return True
    template = info.chat_template or ""
    return "<|channel|>" in template and "<|start|>" in template and "<|message|>" in template


class Harmony:
    """openai-harmony's gpt-oss encoding, loaded offline."""

    def __init__(self, vocab_dir: str | None = None):
        ensure_vocabulary(Path(vocab_dir) if vocab_dir else None)
        try:
            import openai_harmony as oh
        except ImportError:
            raise ModelFilesError("Harmony models (gpt-oss) need the openai-harmony package: "
                                  "pip install 'podium[harmony]'") from None
        try:
            self.encoding = oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
        except oh.HarmonyError as exc:
            raise ModelFilesError(f"openai-harmony could not load its vocabulary: {exc}") from None
        self._oh = oh
        self.error = oh.HarmonyError
        self.content_state = oh.StreamState.CONTENT
        special = self.encoding.encode("<|return|><|call|><|endoftext|><|start|>",
                                       allowed_special="all")
        self.return_token, self.call_token, self.start_token = special[0], special[1], special[3]
        self.stop_token_ids = frozenset(special[:3])
        # what the pipeline needs to repair malformed turns (docs/parsing.md)
        self.end_token, self.channel_token, self.message_token, self.constrain_token = (
            self.encoding.encode("<|end|><|channel|><|message|><|constrain|>",
                                 allowed_special="all"))
        self.assistant_tokens = self.encoding.encode("assistant")
        self.expect_start_state = oh.StreamState.EXPECT_START
        self.header_state = oh.StreamState.HEADER

    def stream_parser(self, resume: bool = False):
        """openai-harmony's token-level parser for the assistant's turn (the prompt ended in
        ``<|start|>assistant``), or, resuming after malformed output, for messages that begin
        with ``<|start|>``."""
        oh = self._oh
        return oh.StreamableParser(self.encoding, role=None if resume else oh.Role.ASSISTANT,
                                   strict=False)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               effort: str | None = None, response_format: dict[str, Any] | None = None,
               today: str | None = None) -> list[int]:
        """Prompt token ids for the assistant's next turn.

        ``messages`` are chat messages (role, content text, reasoning_content, tool_calls
        with JSON-text arguments, tool_call_id); ``tools`` are chat function definitions.
        """
        oh = self._oh
        system = (oh.SystemContent.new()
                  .with_reasoning_effort(oh.ReasoningEffort[EFFORTS[effort or "medium"]])
                  .with_conversation_start_date(today or datetime.date.today().isoformat()))
        out = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
        first = 0
        instructions = []
        while first < len(messages) and messages[first]["role"] in ("system", "developer"):
            instructions.append(messages[first].get("content") or "")
            first += 1
        text = "\n\n".join(instructions)
        if response_format is not None:
            text = (text + "\n\n" if text else "") + _response_format_section(response_format)
        if text or tools:
            developer = oh.DeveloperContent.new()
            if text:
                developer = developer.with_instructions(text)
            if tools:
                developer = developer.with_function_tools([
                    oh.ToolDescription.new(t["name"], t.get("description") or "",
                                           parameters=t.get("parameters") or None)
                    for t in tools])
            out.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer))
        names: dict[str, str] = {}        # call id -> function name, for tool results
        for index, message in enumerate(messages[first:], start=first):
            out += self._history(message, index, names)
        conversation = oh.Conversation.from_messages(_drop_answered_reasoning(out))
        return self.encoding.render_conversation_for_completion(conversation, oh.Role.ASSISTANT)

    def _history(self, message: dict[str, Any], index: int, names: dict[str, str]) -> list:
        oh, role = self._oh, message["role"]
        content = message.get("content") or ""
        if role in ("system", "developer"):
            return [oh.Message.from_role_and_content(
                oh.Role.DEVELOPER, oh.DeveloperContent.new().with_instructions(content))]
        if role == "user":
            return [oh.Message.from_role_and_content(oh.Role.USER, content)]
        if role == "tool":
            name = names.get(message.get("tool_call_id") or "") or message.get("name")
            if not name:
                raise InvalidRequestError(
                    f"The tool message's tool_call_id {message.get('tool_call_id')!r} matches "
                    f"no earlier assistant tool call",
                    param=f"{message.get('where') or f'messages[{index}]'}.tool_call_id")
            author = oh.Author.new(oh.Role.TOOL, f"functions.{name}")
            return [oh.Message.from_author_and_content(author, content)
                    .with_channel("commentary").with_recipient("assistant")]
        out = []       # assistant
        if message.get("reasoning_content"):
            out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT,
                                                        message["reasoning_content"])
                       .with_channel("analysis"))
        calls = message.get("tool_calls") or []
        if content:
            out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, content)
                       .with_channel("commentary" if calls else "final"))
        for call in calls:
            name = call["function"]["name"]
            names[call["id"]] = name
            out.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT,
                                                        call["function"]["arguments"])
                       .with_channel("commentary").with_recipient(f"functions.{name}")
                       .with_content_type("<|constrain|>json"))
        return out


def _drop_answered_reasoning(messages: list) -> list:
    """Without the ``analysis`` messages a ``final`` message followed: gpt-oss sees the
    reasoning of the turn in progress (between tool calls), not of answered turns.
    (openai-harmony drops them only when the conversation's last assistant message is a
    ``final`` one; mid-turn it would keep every earlier turn's reasoning.)"""
    last_final = max((i for i, m in enumerate(messages) if m.channel == "final"), default=-1)
    return [m for i, m in enumerate(messages) if i > last_final or m.channel != "analysis"]


def _response_format_section(fmt: dict[str, Any]) -> str:
    """The developer message's ``# Response Formats`` section, as gpt-oss was taught it."""
    if fmt.get("type") == "json_object":
        name, schema, description = "json_object", {"type": "object"}, None
    else:
        spec = fmt.get("json_schema") or {}
        name, schema = spec.get("name") or "response", spec.get("schema") or {}
        description = spec.get("description")
    lines = ["# Response Formats", "", f"## {name}", ""]
    if description:
        lines.append(f"// {description}")
    lines.append(json.dumps(schema, ensure_ascii=False, separators=(",", ":")))
    return "\n".join(lines)
