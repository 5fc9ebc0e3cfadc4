"""Semantic events to the Responses API: its stream events, and the response object.

One ``ResponseBuilder`` per response, a ``render.base`` renderer: ``open()``, ``event(0, e)``,
``close(usage)`` (and, between rounds of the model, the MCP methods) return the stream events
the new state calls for, stamped with their sequence numbers (``Sequencer``, in one place);
``response`` is the object those same events describe, so the non-stream answer and the
terminal event's ``response`` are the fold of exactly what was streamed.

Item lifecycles: every ``output_item.added`` gets its ``output_item.done``, every
``content_part.added`` its ``content_part.done``; output indices only grow.

``recover`` folds a logged stream that was cut anywhere (the process was killed) back into
output items, so a response failed after a crash keeps what its log holds.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from podium.engine.base import TokenLogprob, Tokenizer
from podium.parsing.events import (Event, Finish, ReasoningDelta, TextDelta, ToolCallArgsDelta,
                                   ToolCallBegin, ToolCallEnd, Usage)
from podium.render import file_search
from podium.render.custom_input import CustomInput
from podium.render.logprobs import FLOOR

Obj = dict[str, Any]

# Every field of openai's Response type; nulls where OpenAI sends nulls.
RESPONSE_NULLS = ("access_programs", "background", "completed_at", "conversation", "error",
                  "image", "incomplete_details", "input_transformations", "instructions",
                  "max_output_tokens", "max_tool_calls", "moderation", "previous_response_id",
                  "prompt", "prompt_cache_diagnostics", "prompt_cache_key", "prompt_cache_options",
                  "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier",
                  "temperature", "text", "tool_usage", "top_logprobs", "top_p", "truncation",
                  "usage", "user")


def response_skeleton(**fields: Any) -> Obj:
    base: Obj = {name: None for name in RESPONSE_NULLS}
    base.update({"object": "response", "output": [], "metadata": {}, "parallel_tool_calls": True,
                 "tool_choice": "auto", "tools": [], "status": "in_progress"})
    base.update(fields)
    return base


class Sequencer:
    """Stamps ``sequence_number`` 0, 1, 2, ... on events, in the one place that does it.

    ``sink`` (a stored response's event log) is handed every event as it is numbered, not
    as its consumer takes it: a run cut short between the events of one call (a cancel
    landing while the consumer waits on the store) would otherwise leave numbers its log
    never holds, and items opened that its log never announced."""

    def __init__(self, start: int = 0, sink: Callable[[list[Obj]], None] | None = None):
        self.next = start
        self.sink = sink

    def stamp(self, events: list[Obj]) -> list[Obj]:
        for event in events:
            event["sequence_number"] = self.next
            self.next += 1
        if self.sink is not None and events:
            self.sink(events)
        return events


class ResponseBuilder:
    def __init__(self, response: Obj, tokenizer: Tokenizer, *,
                 client_tool: Callable[[str], Any], new_id: Callable[[str], str],
                 logprobs: int | None = None, seal: Callable[[str], str] | None = None,
                 sink: Callable[[list[Obj]], None] | None = None, cache_ttl: str = "30m"):
        self.response = response
        self._cache_ttl = cache_ttl     # how usage counts the prompt cache's writes
        self._tokenizer = tokenizer
        self._client_tool = client_tool
        self._new_id = new_id
        self._logprobs = logprobs
        self._seal = seal               # set when reasoning.encrypted_content is included
        self._item: Obj | None = None   # the open output item
        self._parts: list[str] = []     # its text so far
        self._lps: list[Obj] = []       # its logprobs so far
        self._input = CustomInput()     # its input, if it is a custom tool's call
        self.calls: list[tuple[int, Obj]] = []  # MCP calls the model made, not yet run
        self.ends_turn = False          # a call for the client to answer (set per round)
        self.found: dict[str, list[Obj]] = {}   # file_search results the model was given
        self.seq = Sequencer(sink=sink)     # sink: the response's event log, if stored
        self._stamp = self.seq.stamp
        self._round: Finish | None = None   # how the model's current round ended
        self._last: Finish | None = None    # how its last finished round ended

    # -- the render contract ------------------------------------------------------------

    def open(self) -> list[Obj]:
        return self._stamp([{"type": "response.created", "response": self._snapshot()},
                            {"type": "response.in_progress", "response": self._snapshot()}])

    def event(self, index: int, event: Event) -> list[Obj]:
        if type(event) is Finish:
            self._round = event
            return []
        return self._stamp(self._event(event))

    def keepalive(self) -> list[Obj]:
        """``response.in_progress`` again, the response as it stands: an event of OpenAI's
        published set, so every SDK parses it (OpenAI's own undocumented ``keepalive`` type
        crashed several), and an event all the same to idle timers that count events
        (Codex's)."""
        return self._stamp([{"type": "response.in_progress", "response": self._snapshot()}])

    def close(self, usage: Usage) -> list[Obj]:
        """The terminal event of a response that ran to its end."""
        return self._stamp(self._finish(self._round or self._last,
                                        usage_object(usage, self._cache_ttl)))

    def end(self, usage: Usage, status: str, error: Obj | None) -> list[Obj]:
        """The terminal event of a response cut short (``failed``, ``cancelled``)."""
        return self._stamp(self._finish(None, usage_object(usage, self._cache_ttl),
                                        status=status, error=error))

    def result(self) -> Obj:
        return self.response

    def end_round(self) -> list[Obj]:
        """Close the item still open when a round of the model ends (before its MCP calls,
        in ``calls``, run: ``mcp_running`` and ``mcp_result`` follow each). A round cut by
        its token limit (what is left of ``max_output_tokens``, which every round shares)
        ends the response ``incomplete``: none of its calls is run, not even one the parser
        found whole, since the model could not go on from it; each is ``incomplete``."""
        events = self._close()
        finish, self._round = self._round, None
        self._last = finish
        if finish is not None and finish.reason == "length":
            for index, item in self.calls:
                item["status"] = "incomplete"
                events.append({"type": "response.output_item.done", "output_index": index,
                               "item": item})
            self.calls = []
        return self._stamp(events)

    def spent(self) -> None:
        """The response's ``max_output_tokens`` are spent although its last round ended of
        itself: the model cannot run again, so the response ends ``incomplete``."""
        self._last = Finish("length", 0)

    def _event(self, event: Event) -> list[Obj]:
        if isinstance(event, TextDelta):
            return self._open("message") + self._text(event)
        if isinstance(event, ReasoningDelta):
            events = self._open("reasoning")
            self._parts.append(event.text)
            return events + self._delta("response.reasoning_text.delta", event.text,
                                        content_index=0)
        if isinstance(event, ToolCallBegin):
            return self._close() + self._open_call(event)
        if isinstance(event, ToolCallArgsDelta):
            self._parts.append(event.text)
            item = self._item
            if item is not None and item["type"] == "custom_tool_call":
                return _input_delta(item, self._index(), self._input.feed(event.text))
            if item is None or item["type"] not in ("function_call", "mcp_call"):
                return []
            return [{"type": "response.function_call_arguments.delta"
                     if item["type"] == "function_call" else "response.mcp_call_arguments.delta",
                     "item_id": item["id"], "output_index": self._index(),
                     "delta": event.text}]
        if isinstance(event, ToolCallEnd):
            return self._close()
        return []

    def _finish(self, finish: Finish | None, usage: Obj | None, *, status: str | None = None,
                error: Obj | None = None) -> list[Obj]:
        """Close what is open and end the response: the one terminal event. A response cut
        short (failed, cancelled) leaves its open item ``incomplete``."""
        cut = status in ("failed", "cancelled")
        events = self._close("incomplete" if cut else "completed")
        for index, item in self.calls:      # MCP calls never run: the response was cut short
            item["status"] = "incomplete"
            events.append({"type": "response.output_item.done", "output_index": index,
                           "item": item})
        self.calls = []
        r = self.response
        if status is None:
            status = "incomplete" if finish is not None and finish.reason == "length" \
                else "completed"
        r["status"] = status
        if status == "incomplete":
            r["incomplete_details"] = {"reason": "max_output_tokens"}
        if error is not None:
            r["error"] = error
        r["usage"] = usage
        if status == "completed":
            r["completed_at"] = time.time()
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            status, "response.failed")
        return events + [{"type": kind, "response": self._snapshot()}]

    # -- items --------------------------------------------------------------------------

    def _index(self) -> int:
        return len(self.response["output"]) - 1

    def _open(self, kind: str) -> list[Obj]:
        if self._item is not None and self._item["type"] == kind:
            return []
        events = self._close()
        if kind == "message":
            item = {"id": self._new_id("msg"), "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"id": self._new_id("rs"), "type": "reasoning", "summary": [],
                    "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        self._item, self._parts, self._lps = item, [], []
        self.response["output"].append(item)
        return events + [
            {"type": "response.output_item.added", "output_index": self._index(),
             "item": dict(item, content=[])},
            {"type": "response.content_part.added", "item_id": item["id"],
             "output_index": self._index(), "content_index": 0, "part": part}]

    def _open_call(self, event: ToolCallBegin) -> list[Obj]:
        tool = self._client_tool(event.name)
        if tool.kind == "mcp" and tool.approval:    # the client approves it first
            self.ends_turn = True
            item = {"id": self._new_id("mcpr"), "type": "mcp_approval_request",
                    "server_label": tool.server, "name": tool.name, "arguments": ""}
        elif tool.kind == "mcp":
            item = {"id": self._new_id("mcp"), "type": "mcp_call", "server_label": tool.server,
                    "name": tool.name, "arguments": "", "status": "in_progress"}
        elif tool.kind == "file_search":    # Podium searches (``search_running``)
            item = {"id": self._new_id("fs"), "type": "file_search_call", "queries": [],
                    "status": "in_progress", "results": None}
        elif tool.kind == "custom":
            item = {"id": self._new_id("ctc"), "type": "custom_tool_call",
                    "call_id": event.id, "name": tool.name, "input": "",
                    "status": "in_progress"}
            self._input = CustomInput()
        else:
            item = {"id": self._new_id("fc"), "type": "function_call", "call_id": event.id,
                    "name": tool.name, "arguments": "", "status": "in_progress"}
        if tool.kind not in ("mcp", "file_search"):
            self.ends_turn = True
        if tool.namespace:
            item["namespace"] = tool.namespace
        self._item, self._parts = item, []
        self.response["output"].append(item)
        return [{"type": "response.output_item.added", "output_index": self._index(),
                 "item": dict(item)}]

    def _text(self, event: TextDelta) -> list[Obj]:
        self._parts.append(event.text)   # (after _open, which resets the parts)
        logprobs = [self._logprob(lp) for lp in event.logprobs or ()] \
            if self._logprobs is not None else []
        self._lps += logprobs
        return self._delta("response.output_text.delta", event.text, content_index=0,
                           logprobs=logprobs)

    def _delta(self, kind: str, text: str, **extra: Any) -> list[Obj]:
        assert self._item is not None           # deltas follow the item they belong to
        return [{"type": kind, "item_id": self._item["id"], "output_index": self._index(),
                 "delta": text, **extra}]

    def _close(self, status: str = "completed") -> list[Obj]:
        item, self._item = self._item, None
        if item is None:
            return []
        index = len(self.response["output"]) - 1
        if item["type"] == "mcp_call":      # closed once it has run (``mcp_result``)
            item["arguments"] = "".join(self._parts)
            self.calls.append((index, item))
            return [{"type": "response.mcp_call_arguments.done", "item_id": item["id"],
                     "output_index": index, "arguments": item["arguments"]}]
        if item["type"] == "file_search_call":     # done once it has run (``search_result``)
            item["queries"] = file_search.queries("".join(self._parts))
            self.calls.append((index, item))
            return []
        text, events = "".join(self._parts), []
        if item["type"] == "message" and self.found:
            events = self._cite(item, index, text)
        if item["type"] == "custom_tool_call":      # the input, decoded from the arguments
            text = self._input.result(text)
            events = _input_delta(item, index, self._input.rest(text))
        closed = close_item(item, text, self._lps, index, status=status, seal=self._seal)
        if item["type"] == "message" and events:   # its closed part carries the citations
            item["content"][0]["annotations"] = [e["annotation"] for e in events]
        return events + closed

    # -- MCP: listings, and the calls Podium runs ---------------------------------------

    def mcp_listing(self, item: Obj) -> list[Obj]:
        """A server's tools (or the error that kept them): the item, whole."""
        events = self._close()
        self.response["output"].append(item)
        base = {"item_id": item["id"], "output_index": self._index()}
        outcome = "failed" if item.get("error") else "completed"
        return self._stamp(events + [
            {"type": "response.output_item.added", "output_index": self._index(),
             "item": dict(item, tools=[], error=None)},
            {"type": "response.mcp_list_tools.in_progress", **base},
            {"type": f"response.mcp_list_tools.{outcome}", **base},
            {"type": "response.output_item.done", "output_index": self._index(),
             "item": item}])

    def mcp_item(self, item: Obj) -> list[Obj]:
        """An MCP call made before the model runs (an approved one): opened, arguments
        whole; ``mcp_result`` closes it."""
        events = self._close()
        self.response["output"].append(item)
        index = self._index()
        self.calls.append((index, item))
        base = {"item_id": item["id"], "output_index": index}
        return self._stamp(events + [
            {"type": "response.output_item.added", "output_index": index,
             "item": dict(item, arguments="")},
            {"type": "response.mcp_call_arguments.delta", **base, "delta": item["arguments"]},
            {"type": "response.mcp_call_arguments.done", **base,
             "arguments": item["arguments"]}])

    def mcp_running(self, index: int, item: Obj) -> list[Obj]:
        return self._stamp([{"type": "response.mcp_call.in_progress", "item_id": item["id"],
                             "output_index": index}])

    def mcp_result(self, index: int, item: Obj, output: str | None,
                   error: Obj | None) -> list[Obj]:
        self.calls = [(i, c) for i, c in self.calls if i != index]
        item.update(output=output, error=error,
                    status="failed" if error is not None else "completed")
        return self._stamp([{"type": "response.mcp_call.failed" if error is not None
                             else "response.mcp_call.completed", "item_id": item["id"],
                             "output_index": index},
                            {"type": "response.output_item.done", "output_index": index,
                             "item": item}])

    # -- file_search: the searches Podium runs ------------------------------------------

    def search_running(self, index: int, item: Obj) -> list[Obj]:
        base = {"item_id": item["id"], "output_index": index}
        return self._stamp([{"type": "response.file_search_call.in_progress", **base},
                            {"type": "response.file_search_call.searching", **base}])

    def search_result(self, index: int, item: Obj, results: list[Obj] | None,
                      keep: bool) -> list[Obj]:
        """A search ran (``results`` None: it failed); the results are the item's only when
        the client included ``file_search_call.results``; the model's answer cites them."""
        self.calls = [(i, c) for i, c in self.calls if i != index]
        item.update(status="failed" if results is None else "completed",
                    results=results if keep and results is not None else None)
        if results is not None:
            self.found[item["id"]] = results
        base = {"item_id": item["id"], "output_index": index}
        done = [] if results is None else [{"type": "response.file_search_call.completed",
                                            **base}]
        return self._stamp(done + [{"type": "response.output_item.done",
                                    "output_index": index, "item": item}])

    def _cite(self, item: Obj, index: int, text: str) -> list[Obj]:
        """The answer's ``file_citation`` annotations (set on its part when it closes)."""
        return [{"type": "response.output_text.annotation.added", "item_id": item["id"],
                 "output_index": index, "content_index": 0, "annotation_index": i,
                 "annotation": a}
                for i, a in enumerate(file_search.citations(
                    text, [r for found in self.found.values() for r in found]))]

    def _snapshot(self) -> Obj:
        return dict(self.response, output=list(self.response["output"]))

    def _logprob(self, lp: TokenLogprob) -> Obj:
        piece = self._tokenizer.piece
        top = [{"token": piece(t).decode("utf-8", "replace"), "bytes": list(piece(t)),
                "logprob": max(v, FLOOR)} for t, v in lp.top[:self._logprobs or 0]]
        return {"token": piece(lp.token_id).decode("utf-8", "replace"),
                "bytes": list(piece(lp.token_id)), "logprob": max(lp.logprob, FLOOR),
                "top_logprobs": top}


def close_item(item: Obj, text: str, logprobs: list[Obj], index: int, *,
               status: str = "completed", seal: Callable[[str], str] | None = None
               ) -> list[Obj]:
    """Give the open output ``item`` its final ``text`` (and ``status``); the events that
    close it: its text's ``done``, its part's ``done``, then ``output_item.done``."""
    base = {"item_id": item["id"], "output_index": index}
    kind, events = item["type"], []
    if kind == "message":
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
        item.update(status=status, content=[part])
        events = [{"type": "response.output_text.done", **base, "content_index": 0,
                   "text": text, "logprobs": logprobs},
                  {"type": "response.content_part.done", **base, "content_index": 0,
                   "part": part}]
    elif kind == "reasoning":
        part = {"type": "reasoning_text", "text": text}
        item.update(status=status, content=[part])
        if seal is not None:
            item["encrypted_content"] = seal(text)
        events = [{"type": "response.reasoning_text.done", **base, "content_index": 0,
                   "text": text},
                  {"type": "response.content_part.done", **base, "content_index": 0,
                   "part": part}]
    elif kind == "function_call":
        item.update(status=status, arguments=text)
        events = [{"type": "response.function_call_arguments.done", **base,
                   "arguments": text, "name": item["name"]}]
    elif kind == "mcp_call":
        item.update(status=status, arguments=text)
        events = [{"type": "response.mcp_call_arguments.done", **base, "arguments": text}]
    elif kind == "mcp_approval_request":
        item["arguments"] = text
    elif kind == "mcp_list_tools":
        item.setdefault("error", "The listing was cut short")
    else:   # a custom tool's call: ``text`` is its input
        item.update(status=status, input=text)
        events = [{"type": "response.custom_tool_call_input.done", **base, "input": text}]
    return events + [{"type": "response.output_item.done", "output_index": index,
                      "item": item}]


def _input_delta(item: Obj, index: int, text: str) -> list[Obj]:
    """More of a custom tool call's input, if there is more."""
    if not text:
        return []
    return [{"type": "response.custom_tool_call_input.delta", "item_id": item["id"],
             "output_index": index, "delta": text}]


# -- the fold of a logged stream ----------------------------------------------------------

_DELTAS = ("response.output_text.delta", "response.reasoning_text.delta",
           "response.function_call_arguments.delta", "response.mcp_call_arguments.delta",
           "response.custom_tool_call_input.delta")


@dataclass
class _Cut:
    """An item the log opened and never finished: what its deltas carried, and which of its
    closing events the log already has."""

    parts: list[str] = field(default_factory=list)
    logprobs: list[Obj] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def missing(self, event: Obj) -> bool:
        kind = event["type"]
        if kind == "response.content_part.done":
            return "response.content_part.added" in self.seen and kind not in self.seen
        return kind not in self.seen


def recover(events: Iterable[Obj]) -> tuple[list[Obj], list[Obj]]:
    """The output items a logged stream describes, even one cut anywhere (a crash), and the
    events that close the items it left open.

    Items the log finished are its ``output_item.done`` items; an item still open gets the
    text (or arguments) its deltas carried and ``status: "incomplete"``. The closing events
    (no sequence numbers) are the ``done`` events those items never got, so a log ended with
    them keeps the rule that every ``added`` has its ``done``. Pure: the log is not changed.
    """
    output: list[Obj] = []
    cut: dict[int, _Cut] = {}
    for event in events:
        kind, index = event["type"], event.get("output_index", -1)
        if kind == "response.output_item.added":
            output.append(copy.deepcopy(event["item"]))
            cut[index] = _Cut()
        elif kind == "response.output_item.done":
            output[index] = copy.deepcopy(event["item"])
            cut.pop(index, None)
        elif index in cut:
            cut[index].seen.add(kind)
            if kind in _DELTAS:
                cut[index].parts.append(event["delta"])
                cut[index].logprobs += copy.deepcopy(event.get("logprobs") or [])
    closing: list[Obj] = []
    for index, item in sorted(cut.items()):
        closing += [e for e in close_item(output[index], "".join(item.parts), item.logprobs,
                                          index, status="incomplete") if item.missing(e)]
    return output, closing


def usage_object(u: Usage, cache_ttl: str = "30m") -> Obj:
    """The Responses API's usage object. The prompt cache's writes are counted under the
    lifetime the request asked (``cache_ttl``, ``30m`` or ``12h``): Podium's entries have no
    clock (the disk tier drops the least recently used), so that is what it can say."""
    written = u.cache_written
    long = cache_ttl == "12h"
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": u.cached_tokens, "cache_write_tokens": written,
                "cache_write_tokens_details": {"ttl_30m_tokens": 0 if long else written,
                                               "ttl_12h_tokens": written if long else 0}},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens}
