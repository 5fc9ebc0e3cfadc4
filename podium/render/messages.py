"""Semantic events to Anthropic's Messages API: its stream events, and the ``Message``.

One ``MessageBuilder`` per message, a ``render.base`` renderer: ``open()``, ``event(0, e)`` and
``close(usage)`` return the stream events the new state calls for; ``result()`` is the
message those same events describe, so the non-stream answer is the fold of exactly what a
stream would have sent.

Blocks: one open at a time, indices from 0, each ``content_block_start`` closed by its
``content_block_stop``. A ``thinking`` block ends with a ``signature_delta``: its text sealed
with the server's key, so the client's round trip is verified, not trusted (with
``thinking.display: "omitted"`` the block shows no text, and the signature carries it back). A ``tool_use``
block's ``input_json_delta`` pieces concatenate to its final input.

Usage: ``message_start`` is sent before the engine's first output, so it shows the whole
prompt as ``input_tokens`` and nothing read from or written to the cache yet, and no
``cache_creation``; the closing ``message_delta`` carries the true figures, ``cache_creation``
included. The Python SDK's accumulation (``get_final_message()``) takes the counts from it,
but ``cache_creation`` from ``message_start`` alone: there it is None.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from podium.parsing.events import (Event, Finish, ReasoningDelta, TextDelta, ToolCallArgsDelta,
                                   ToolCallBegin, ToolCallEnd, Usage)
from podium.parsing.scan import json_text

Obj = dict[str, Any]


def usage_object(usage: Usage, one_hour: bool = False) -> Obj:
    """Anthropic's usage: the prompt's tokens read from the cache, those written to it (all
    under the ttl its breakpoints asked: ``one_hour`` when one asked for "1h", the entry the
    engine keeps being one), and the rest (``input_tokens``)."""
    read, written = usage.cached_tokens, usage.cache_written
    return {"input_tokens": max(usage.prompt_tokens - read - written, 0),
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": 0 if one_hour else written,
                               "ephemeral_1h_input_tokens": written if one_hour else 0},
            "output_tokens": usage.completion_tokens}


def stop_reason(finish: Finish | None, called: bool) -> tuple[str, str | None]:
    """Anthropic's stop reason (and the matched stop sequence) for a choice's finish."""
    if finish is not None and finish.reason == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if finish is not None and finish.stop_sequence is not None:
        return "stop_sequence", finish.stop_sequence
    return "end_turn", None


class MessageBuilder:
    def __init__(self, message_id: str, model: str, prompt_tokens: int,
                 seal: Callable[[str], str], omit_thinking: bool = False,
                 one_hour: bool = False):
        start = usage_object(Usage(prompt_tokens, 0))
        del start["cache_creation"]         # not known yet (see the module's docstring)
        self.message: Obj = {
            "id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": start}
        self._seal = seal
        self._omit_thinking = omit_thinking  # ``display: omitted``: the signature alone
        self._one_hour = one_hour           # a breakpoint asked for ttl "1h"
        self._block: Obj | None = None      # the open block
        self._parts: list[str] = []         # its text (or tool input) so far
        self._called = False
        self._finish: Finish | None = None

    def open(self) -> list[Obj]:
        return [{"type": "message_start", "message": {**self.message, "content": []}},
                {"type": "ping"}]

    def keepalive(self) -> list[Obj]:
        return [{"type": "ping"}]           # Anthropic's own, during a long prefill

    def result(self) -> Obj:
        return self.message

    def event(self, index: int, event: Event) -> list[Obj]:
        if isinstance(event, TextDelta):
            return self._open("text") + self._delta({"type": "text_delta", "text": event.text},
                                                    event.text)
        if isinstance(event, ReasoningDelta):
            opened = self._open("thinking")
            delta = self._delta({"type": "thinking_delta", "thinking": event.text}, event.text)
            return opened if self._omit_thinking else opened + delta
        if isinstance(event, ToolCallBegin):
            self._called = True
            return self._close() + self._start(
                {"type": "tool_use", "id": event.id, "name": event.name, "input": {}})
        if isinstance(event, ToolCallArgsDelta):
            return self._delta({"type": "input_json_delta", "partial_json": event.text},
                               event.text)
        if isinstance(event, ToolCallEnd):
            streamed = "".join(self._parts)
            events: list[Obj] = []
            if event.arguments != streamed and event.arguments.startswith(streamed):
                rest = event.arguments[len(streamed):]   # the parser closed the JSON itself
                events = self._delta({"type": "input_json_delta", "partial_json": rest}, rest)
            self._parts = [event.arguments]
            return events + self._close()
        if isinstance(event, Finish):
            self._finish = event
        return []

    def close(self, usage: Usage) -> list[Obj]:
        events = self._close()
        reason, sequence = stop_reason(self._finish, self._called)
        message = self.message
        message["stop_reason"], message["stop_sequence"] = reason, sequence
        message["usage"] = usage_object(usage, self._one_hour)
        return events + [
            {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
             "usage": {**message["usage"], "cache_creation": dict(
                 message["usage"]["cache_creation"])}},
            {"type": "message_stop"}]

    # -- blocks -------------------------------------------------------------------------

    def _open(self, kind: str) -> list[Obj]:
        if self._block is not None and self._block["type"] == kind:
            return []
        block: Obj = ({"type": "text", "text": ""} if kind == "text"
                      else {"type": "thinking", "thinking": "", "signature": ""})
        return self._close() + self._start(block)

    def _start(self, block: Obj) -> list[Obj]:
        self._block, self._parts = block, []
        content = self.message["content"]
        content.append(block)
        return [{"type": "content_block_start", "index": len(content) - 1,
                 "content_block": dict(block)}]

    def _delta(self, delta: Obj, text: str) -> list[Obj]:
        self._parts.append(text)
        return [{"type": "content_block_delta", "index": len(self.message["content"]) - 1,
                 "delta": delta}]

    def _close(self) -> list[Obj]:
        block = self._block
        if block is None:
            return []
        self._block = None
        index = len(self.message["content"]) - 1
        text, self._parts = "".join(self._parts), []
        events: list[Obj] = []
        if block["type"] == "text":
            block["text"] = text
        elif block["type"] == "thinking":
            block["thinking"] = "" if self._omit_thinking else text
            block["signature"] = self._seal(text)   # opens to the whole text either way
            events.append({"type": "content_block_delta", "index": index,
                           "delta": {"type": "signature_delta",
                                     "signature": block["signature"]}})
        else:
            block["input"] = _input(text)
        return events + [{"type": "content_block_stop", "index": index}]


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    if "\\u" in arguments:      # a lone surrogate escape decodes to a str orjson refuses (500)
        value = json.loads(json_text(value))
    return value if isinstance(value, dict) else {"value": value}
