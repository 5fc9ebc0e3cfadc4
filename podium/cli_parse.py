"""``podium parse``: what Podium makes of a model's raw output, without a server.

    podium parse out.txt --tool-parser hermes --reasoning-parser think
    podium parse - --model model.gguf --json < out.txt
    podium parse out.txt --harmony              # gpt-oss: the text is encoded to tokens

It runs the output parsers the server runs (the same code, fed the same way: deltas in,
events out, folded as a non-streamed answer is) and prints the content, the reasoning, the
tool calls, the finish reason and the warnings the parsers logged (stray markup dropped,
calls dropped or recovered). ``--chunk N`` feeds N characters at a time, as a stream would;
the result must not depend on it.

Without ``--tools`` / ``--tool``, every tool name counts as declared (a call is read
whatever it names; its values are typed as text). With them, calls to other names are
dropped, as the server drops them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podium.parsing.events import (Event, Finish, ReasoningDelta, TextDelta, ToolCallBegin,
                                   ToolCallEnd)
from podium.parsing.tools.base import ToolSet

USAGE = "podium parse [FILE] [options]   (FILE: raw model output; '-' or nothing: stdin)"


class AnyTool(ToolSet):
    """No tools given: any name is a declared tool (values typed as text)."""

    def allows(self, name: str | None) -> bool:
        return bool(name)


@dataclass
class Parsed:
    content: str = ""
    reasoning: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    warnings: list[str] = field(default_factory=list)
    tool_parser: str = ""
    reasoning_parser: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"content": self.content, "reasoning": self.reasoning,
                "tool_calls": self.calls, "finish_reason": self.finish_reason,
                "warnings": self.warnings, "tool_parser": self.tool_parser,
                "reasoning_parser": self.reasoning_parser}


def fold(events: list[Event], out: Parsed) -> Parsed:
    content, reasoning = [], []
    names: dict[int, str] = {}
    for event in events:
        if isinstance(event, TextDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ToolCallBegin):
            names[event.index] = event.name
        elif isinstance(event, ToolCallEnd):
            out.calls.append({"name": names[event.index],
                              "arguments": json.loads(event.arguments)})
        elif isinstance(event, Finish):
            out.finish_reason = event.reason
    out.content, out.reasoning = "".join(content), "".join(reasoning)
    return out


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def pieces(text: str, chunk: int | None) -> list[str]:
    if not chunk or chunk <= 0:
        return [text] if text else []
    return [text[i:i + chunk] for i in range(0, len(text), chunk)]


def parse_text(text: str, tool_parser: str, reasoning_parser: str, tools: ToolSet,
               chunk: int | None = None, in_reasoning: bool = False) -> Parsed:
    """The folded result of the text families' output parser over ``text``."""
    from podium.parsing.pipeline import OutputParser
    from podium.parsing.reasoning import ReasoningParser
    from podium.parsing.registry import REASONING_TAGS, build_tool_parser

    reasoning = None
    if reasoning_parser in REASONING_TAGS:
        open_tag, close_tag = REASONING_TAGS[reasoning_parser]
        reasoning = ReasoningParser(open_tag, close_tag, inside=in_reasoning)
    parser = OutputParser(reasoning, build_tool_parser(tool_parser, tools))
    out = Parsed(tool_parser=tool_parser, reasoning_parser=reasoning_parser)
    with _captured() as warnings:
        events: list[Event] = []
        for piece in pieces(text, chunk):
            events += parser.feed([TextDelta(piece)])
        events += parser.feed([Finish("stop", 0)])
    out.warnings = warnings.messages
    return fold(events, out)


def parse_harmony(text: str, tools: ToolSet, chunk: int | None = None,
                  vocab_dir: str | None = None) -> Parsed:
    """gpt-oss: the text (special tokens written out) encoded to Harmony's tokens and parsed
    token by token, as the server does; ``chunk`` is in tokens here."""
    from podium.engine.base import EngineOutput
    from podium.harmony.format import Harmony
    from podium.harmony.pipeline import HarmonyPipeline

    harmony = Harmony(vocab_dir)
    tokens = harmony.encoding.encode(text, allowed_special="all")
    pipeline = HarmonyPipeline(harmony, tools)
    out = Parsed(tool_parser="harmony", reasoning_parser="harmony")
    step = chunk if chunk and chunk > 0 else max(len(tokens), 1)
    with _captured() as warnings:
        events: list[Event] = []
        for i in range(0, len(tokens), step):
            events += pipeline.feed(EngineOutput(tokens[i:i + step]))
            if pipeline.finished:
                break
        if not pipeline.finished:
            events += pipeline.feed(EngineOutput([], finish_reason="stop"))
    out.warnings = warnings.messages
    return fold(events, out)


class _captured:
    """The parsers' warnings while parsing, kept for the report (not printed as logs)."""

    def __enter__(self) -> _Warnings:
        self._handler = _Warnings()
        self._logger = logging.getLogger("podium")
        self._level, self._propagate = self._logger.level, self._logger.propagate
        self._logger.addHandler(self._handler)
        self._logger.setLevel(logging.WARNING)
        self._logger.propagate = False
        return self._handler

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self._handler)
        self._logger.setLevel(self._level)
        self._logger.propagate = self._propagate


def load_tools(path: str | None, names: list[str]) -> ToolSet:
    """``--tools``: a JSON list of tools (Chat's or Responses' shape) or a map of name to
    parameters schema; ``--tool NAME``: one more tool with any arguments."""
    if path is None and not names:
        return AnyTool()
    schemas: dict[str, dict[str, Any]] = {name: {"type": "object"} for name in names}
    if path is not None:
        data = json.loads(Path(path).read_text())
        if isinstance(data, dict) and "tools" in data:
            data = data["tools"]
        if isinstance(data, dict):
            schemas.update({str(k): v or {} for k, v in data.items()})
        elif isinstance(data, list):
            for tool in data:
                fn = tool.get("function", tool) if isinstance(tool, dict) else None
                if not isinstance(fn, dict) or not fn.get("name"):
                    raise ValueError(f"--tools {path}: a tool without a name: {tool!r}")
                schemas[fn["name"]] = fn.get("parameters") or {}
        else:
            raise ValueError(f"--tools {path}: expected a list of tools or an object")
    return ToolSet(schemas)


def model_families(path: str) -> tuple[str, str, bool]:
    """The tool and reasoning families a GGUF's chat template implies, and whether it speaks
    Harmony (read from its metadata and vocabulary only: no weights are loaded)."""
    from podium.engine.base import ModelInfo
    from podium.engine.llamacpp.model import LlamaModel
    from podium.harmony.format import is_harmony
    from podium.parsing.registry import detect_reasoning_parser, detect_tool_parser

    model = LlamaModel(Path(path), vocab_only=True)
    try:
        template = model.metadata.get("tokenizer.chat_template")
        info = ModelInfo(Path(path).stem, 0, template, 0, metadata=model.metadata)
    finally:
        model.close()
    return detect_tool_parser(template), detect_reasoning_parser(template), is_harmony(info)


def arguments(argv: list[str]) -> argparse.Namespace:
    from podium.parsing.registry import REASONING_TAGS, TOOL_PARSERS

    p = argparse.ArgumentParser(prog="podium parse", usage=USAGE, description=(
        "Print what Podium makes of a model's raw output: content, reasoning, tool calls "
        "and the parsers' warnings."))
    p.add_argument("file", nargs="?", default="-", help="the raw output ('-': stdin)")
    p.add_argument("--tool-parser", choices=["auto", "none", *TOOL_PARSERS], default="auto",
                   help="tool-call family (auto: from --model's template, else hermes)")
    p.add_argument("--reasoning-parser", choices=["auto", "none", *REASONING_TAGS],
                   default="auto",
                   help="reasoning family (auto: from --model's template, else think)")
    p.add_argument("--model", help="a GGUF file: its chat template names the families "
                                   "(and gpt-oss means Harmony)")
    p.add_argument("--harmony", action="store_true",
                   help="parse as gpt-oss's Harmony format (special tokens written out)")
    p.add_argument("--tools", help="JSON file: the request's tools (Chat's or Responses' "
                                   "list) or a map of name to parameters schema")
    p.add_argument("--tool", action="append", default=[], metavar="NAME",
                   help="a declared tool with any arguments (repeatable)")
    p.add_argument("--in-reasoning", action="store_true",
                   help="the prompt opened the reasoning (the template ends in <think>)")
    p.add_argument("--chunk", type=int, default=0, metavar="N",
                   help="feed N characters at a time (Harmony: N tokens), as a stream")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args(argv)


def run(argv: list[str]) -> Parsed:
    args = arguments(argv)
    tools = load_tools(args.tools, args.tool)
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    tool_family, reasoning_family, harmony = "hermes", "think", args.harmony
    if args.model:
        tool_family, reasoning_family, is_harmony = model_families(args.model)
        harmony = harmony or is_harmony
    if harmony:
        return parse_harmony(text, tools, args.chunk)
    if args.tool_parser != "auto":
        tool_family = args.tool_parser
    if args.reasoning_parser != "auto":
        reasoning_family = args.reasoning_parser
    return parse_text(text, tool_family, reasoning_family, tools, args.chunk,
                      args.in_reasoning)


def report(out: Parsed) -> str:
    lines = [f"parsers: tool {out.tool_parser}, reasoning {out.reasoning_parser}",
             f"finish: {out.finish_reason}", "content:", _indent(out.content),
             "reasoning:", _indent(out.reasoning), f"tool calls: {len(out.calls)}"]
    for i, call in enumerate(out.calls):
        lines.append(f"  [{i}] {call['name']} "
                     f"{json.dumps(call['arguments'], ensure_ascii=False)}")
    lines.append(f"warnings: {len(out.warnings)}")
    lines += [f"  {w}" for w in out.warnings]
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("  | " + line for line in text.split("\n")) if text else "  (none)"


def main(argv: list[str]) -> int:
    try:
        out = run(argv)
    except (OSError, ValueError) as exc:         # an unreadable file, bad JSON, a bad GGUF
        print(f"podium parse: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:                     # ModelFilesError and the like
        message = getattr(exc, "message", None)
        if message is None:
            raise
        print(f"podium parse: {message}", file=sys.stderr)
        return 1
    if "--json" in argv:
        _print(json.dumps(out.as_json(), ensure_ascii=False, indent=2))
    else:
        _print(report(out))
    return 0


def _print(text: str) -> None:
    """The report, whatever it holds: a lone surrogate (Harmony's arguments, a stdin read
    with surrogate escapes) is written as its escape, not a UnicodeEncodeError."""
    try:
        print(text)
    except UnicodeEncodeError:
        encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
        print(text.encode(encoding, "backslashreplace").decode(encoding))
