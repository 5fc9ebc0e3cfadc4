"""Checking Responses streams: every event valid, and the event-order invariants."""

from __future__ import annotations

import json

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

EVENT = TypeAdapter(ResponseStreamEvent)
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
# an MCP item's own events, in the order OpenAI sends them (equal ranks: one or the other)
MCP_STEPS = {"response.mcp_call_arguments.delta": 0, "response.mcp_call_arguments.done": 1,
             "response.mcp_call.in_progress": 2, "response.mcp_call.completed": 3,
             "response.mcp_call.failed": 3, "response.mcp_list_tools.in_progress": 0,
             "response.mcp_list_tools.completed": 1, "response.mcp_list_tools.failed": 1}


def sse_events(body: str) -> list[dict]:
    """The events of a named-event SSE body (Responses, Anthropic Messages: no [DONE])."""
    out = []
    for frame in body.split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        event = json.loads(lines["data"])
        assert lines.get("event") == event["type"]
        out.append(event)
    return out


def check_stream(events: list[dict], *, first_seq: int = 0, whole: bool = True) -> dict:
    """Validate every event and the ordering rules; the terminal response, validated."""
    for event in events:
        EVENT.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(
        range(first_seq, first_seq + len(events)))
    if whole:
        assert events[0]["type"] in ("response.created", "response.queued")
    assert events[-1]["type"] in TERMINAL
    assert sum(e["type"] in TERMINAL for e in events) == 1
    open_items, open_parts, last_index = {}, set(), -1
    for e in events:
        kind = e["type"]
        if kind == "response.output_item.added":
            assert e["output_index"] > last_index          # indices never go back
            last_index = e["output_index"]
            open_items[e["output_index"]] = e["item"]["id"]
        elif kind == "response.output_item.done" and (whole or e["output_index"] in open_items):
            assert open_items.pop(e["output_index"]) == e["item"]["id"]
        elif kind == "response.content_part.added":
            assert open_items.get(e["output_index"]) == e["item_id"]
            open_parts.add((e["item_id"], e["content_index"]))
        elif kind == "response.content_part.done" and (whole or e["item_id"] in open_items.values()):
            open_parts.remove((e["item_id"], e["content_index"]))
        elif "item_id" in e and (whole or e["output_index"] in open_items):
            assert open_items.get(e["output_index"]) == e["item_id"], e
    if whole:
        assert not open_items and not open_parts           # every added has its done
        check_mcp(events)
    final = events[-1]["response"]
    Response.model_validate(final)
    return final


def check_mcp(events: list[dict]) -> None:
    """MCP items: listing in_progress -> completed | failed, and a call's arguments ->
    in_progress -> completed | failed, each once and in order, before the item's done; the
    done item agrees with the outcome."""
    steps: dict[str, list[str]] = {}
    for e in events:
        if e["type"] in MCP_STEPS:
            seen = steps.setdefault(e["item_id"], [])
            if seen and e["type"] != "response.mcp_call_arguments.delta":
                assert MCP_STEPS[e["type"]] > MCP_STEPS[seen[-1]], (seen, e["type"])
            seen.append(e["type"])
        elif e["type"] == "response.output_item.done":
            item, seen = e["item"], steps.get(e["item"]["id"], [])
            if item["type"] == "mcp_list_tools":
                outcome = "failed" if item.get("error") else "completed"
                assert seen == ["response.mcp_list_tools.in_progress",
                                f"response.mcp_list_tools.{outcome}"], seen
            elif item["type"] == "mcp_call" and item.get("status") in ("completed", "failed"):
                assert seen[-3:] == ["response.mcp_call_arguments.done",
                                     "response.mcp_call.in_progress",
                                     f"response.mcp_call.{item['status']}"], seen
                assert (item.get("error") is None) == (item["status"] == "completed")
            elif item["type"] == "mcp_call":             # cut short: no outcome
                assert not {"response.mcp_call.completed", "response.mcp_call.failed"} & set(
                    seen), seen
