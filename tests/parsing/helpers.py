"""Running an output parser over text cut into pieces, and folding what it says."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from podium.parsing.events import (Finish, ReasoningDelta, TextDelta, ToolCallArgsDelta,
                                   ToolCallBegin, ToolCallEnd)
from podium.parsing.pipeline import OutputParser
from podium.parsing.registry import build_reasoning_parser, build_tool_parser
from podium.parsing.tools.base import ToolSet

SCHEMAS = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "days": {"type": "integer"}}},
    "get_time": {"type": "object", "properties": {}},
    "write_file": {"type": "object", "properties": {"path": {"type": "string"},
                                                    "content": {"type": "string"},
                                                    "mode": {"type": "object"},
                                                    "force": {"type": "boolean"}}},
    # object and array parameters typed three ways: a type, anyOf (pydantic's Optional),
    # no type but what the schema holds (properties)
    "plot": {"type": "object", "properties": {
        "points": {"type": "array"},
        "style": {"anyOf": [{"type": "object"}, {"type": "null"}]},
        "opts": {"properties": {"log": {"type": "boolean"}}}}},
}


@dataclass
class Folded:
    content: str = ""
    reasoning: str = ""
    calls: list[tuple[str, dict]] = field(default_factory=list)
    finish: str | None = None


def parser(tool_family: str | None = "hermes", reasoning: str | None = None, prompt: str = "",
           named: bool = False, max_calls: int | None = None, schemas=None) -> OutputParser:
    ids = iter(range(1000))
    tools = ToolSet(schemas or SCHEMAS, max_calls=max_calls, new_id=lambda: f"call_{next(ids)}")
    return OutputParser(build_reasoning_parser(reasoning, prompt) if reasoning else None,
                        build_tool_parser(tool_family, tools) if tool_family else None,
                        calls_finish="stop" if named else "tool_calls")


def run(p: OutputParser, pieces: list[str], finish: str = "stop") -> list:
    events = []
    for piece in pieces:
        events += p.feed([TextDelta(piece)])
    events += p.feed([Finish(finish, 1)])
    return events


def fold(events: list) -> Folded:
    """Fold events, checking the streaming contract on the way (texts joined once: calls
    of hundreds of KB come in 100,000 deltas)."""
    out, args, begun, ended = Folded(), {}, set(), set()
    content, reasoning = [], []
    for e in events:
        assert not isinstance(e, (TextDelta, ReasoningDelta)) or e.text, "empty delta"
        if isinstance(e, TextDelta):
            content.append(e.text)
        elif isinstance(e, ReasoningDelta):
            reasoning.append(e.text)
        elif isinstance(e, ToolCallBegin):
            assert e.index not in begun and e.index == len(begun)
            begun.add(e.index)
            args[e.index] = []
            out.calls.append((e.name, None))
        elif isinstance(e, ToolCallArgsDelta):
            assert e.index in begun and e.index not in ended
            args[e.index].append(e.text)
        elif isinstance(e, ToolCallEnd):
            assert e.arguments == "".join(args[e.index]), "deltas must add up to the arguments"
            ended.add(e.index)
            out.calls[e.index] = (out.calls[e.index][0], json.loads(e.arguments))
        elif isinstance(e, Finish):
            out.finish = e.reason
    assert begun == ended, "every call begun is ended"
    out.content, out.reasoning = "".join(content), "".join(reasoning)
    return out


def parse(text: str, sizes=None, **kw) -> Folded:
    return fold(run(parser(**kw), cut(text, sizes)))


def cut(text: str, sizes=None) -> list[str]:
    if sizes is None:
        return [text]
    pieces, i, k = [], 0, 0
    while i < len(text):
        size = sizes[k % len(sizes)] if sizes else 1
        pieces.append(text[i:i + size])
        i += size
        k += 1
    return pieces
