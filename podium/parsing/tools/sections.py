"""Tool calls introduced by marker tokens, with JSON arguments: Mistral, DeepSeek, Kimi K2.

Mistral, older (a JSON list) and v11+ (name, then ``[ARGS]``)::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

DeepSeek V3 and V3.1::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Kimi K2::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

A call naming an undeclared tool is content, markup included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from podium.parsing.scan import JsonValue, Markers
from podium.parsing.tools.base import ToolParser, ToolSet

_WS = " \t\r\n"


@dataclass(frozen=True)
class SectionFormat:
    section_open: str               # where calls begin (content before it is text)
    section_close: str | None       # where they end (None: the output's end)
    call_open: str | None           # before each call (None: calls follow each other)
    header_end: str                 # ends the header that names the function
    call_close: str | None          # after each call's arguments
    name_of: Callable[[str], str]   # header text -> function name


def _kimi_name(header: str) -> str:
    return re.sub(r":\d+$", "", header.strip()).removeprefix("functions.")


DEEPSEEK = SectionFormat("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                         "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", str.strip)
KIMI_K2 = SectionFormat("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                        "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                        _kimi_name)
MISTRAL = SectionFormat("[TOOL_CALLS]", None, None, "[ARGS]", None, str.strip)


class SectionParser(ToolParser):
    def __init__(self, tools: ToolSet, fmt: SectionFormat):
        super().__init__(tools)
        self.fmt = fmt
        self._open = Markers(fmt.section_open)
        self._state = "text"
        self._raw: list[str] = []     # markup held while it may be content, in pieces
        self._args: JsonValue | None = None
        self._fresh = False           # just after the section opener

    def _step(self, buf: str) -> int | None:
        return getattr(self, "_s_" + self._state)(buf)

    def _s_text(self, buf: str) -> int | None:
        used, marker = self.scan_text(buf, self._open)
        if marker is not None:
            self._state, self._raw, self._fresh = "section", [marker], True
        return used

    def _content(self, used: int, buf: str) -> int:
        self.text("".join(self._raw) + buf[:used])
        self._raw, self._state = [], "text"
        return used

    def _s_section(self, buf: str) -> int | None:
        """Between calls: the next call's opener, the section's end, or (Mistral) a list.
        Blanks are set aside first: markup (kept with ``_raw``) or content, once decided."""
        blanks = self.hold_blanks(buf)
        if blanks:
            return blanks
        fmt, fresh = self.fmt, self._fresh
        if fmt.call_open is None:              # Mistral: each call repeats [TOOL_CALLS]
            if not fresh and fmt.section_open.startswith(buf) and buf != fmt.section_open:
                return None
            self._fresh = False
            self.take_blanks()
            if fresh:
                self._state = "list" if buf[0] == "[" else "header"
                return int(buf[0] == "[")
            if buf.startswith(fmt.section_open):
                self._state = "header"
                return len(fmt.section_open)
            self._state = "text"
            return 0
        for tag, state in ((fmt.call_open, "header"), (fmt.section_close, "text")):
            if tag is None:
                continue
            if tag.startswith(buf) and buf != tag:
                return None
            if buf.startswith(tag):
                self._fresh = False
                self._raw += [self.take_blanks(), tag]
                self._state = state
                return len(tag)
        self._fresh = False
        self._raw.append(self.take_blanks())
        return self._content(0, buf)

    def _s_header(self, buf: str) -> int | None:
        end = buf.find(self.fmt.header_end)
        if end < 0:
            return None if len(buf) < 300 else self._content(len(buf), buf)
        header = buf[:end]
        if self.fmt is DEEPSEEK and header.strip() == "function":     # V3: name follows
            self._raw.append(buf[:end + len(self.fmt.header_end)])
            self._state = "deepseek_name"
            return end + len(self.fmt.header_end)
        return self._named(self.fmt.name_of(header), buf, end + len(self.fmt.header_end))

    def _s_deepseek_name(self, buf: str) -> int | None:
        newline = buf.find("\n")
        if newline < 0:
            return None if len(buf) < 300 else self._content(len(buf), buf)
        used = newline + 1
        rest = buf[used:].lstrip(_WS)
        if not rest or ("```json".startswith(rest) and rest != "```json"):
            return None
        if rest.startswith("```json"):
            used = len(buf) - len(rest) + len("```json")
        return self._named(buf[:newline].strip(), buf, used)

    def _named(self, name: str, buf: str, used: int) -> int:
        if not self.tools.allows(name):
            return self._content(used, buf)
        self.begin_call(name)
        self._raw, self._args, self._state = [], JsonValue(), "arguments"
        return used

    def _s_arguments(self, buf: str) -> int | None:
        args = self._args
        assert args is not None                 # set with the call's name
        end = args.feed(buf)
        self.call_args(args.last)
        if end < 0:
            return len(buf)
        self.end_call()
        self._state = "call_end"
        return end

    def _s_call_end(self, buf: str) -> int | None:
        """Skip a closing fence and the call's end marker; then back between calls."""
        stripped = buf.lstrip(_WS)
        if len(stripped) < len(buf):        # blanks here are layout
            return len(buf) - len(stripped)
        for tag in ("```", self.fmt.call_close):
            if tag and buf.startswith(tag):
                return len(tag)
            if tag and tag.startswith(buf):
                return None
        self._state = "section"
        return 0

    def _s_list(self, buf: str) -> int | None:
        """Mistral's older form: a JSON list of call objects."""
        stripped = buf.lstrip(_WS + ",")
        if not stripped:
            return None
        skipped = len(buf) - len(stripped)
        if stripped[0] == "]":
            self._state = "text"
            return skipped + 1
        if stripped[0] != "{":
            self._state = "text"
            return skipped
        self.start_call_object()
        self._state = "list_item"
        return skipped

    def _s_list_item(self, buf: str) -> int | None:
        outcome, used = self.call_object(buf)
        if outcome == "more":
            if not self.calls:
                self._raw.append(buf)
        elif outcome == "done":
            self._state = "list"
        elif outcome == "no call" and not self.calls:
            return self._content(used, buf)
        else:
            self._state = "text"
        return used

    def _finish(self, rest: str) -> None:
        if self._state == "text":
            self.text(rest)
        elif self._call is None and self._state in ("section", "header", "deepseek_name",
                                                    "list", "list_item") and not self.calls:
            self.text("".join(self._raw) + self.take_blanks() + rest)


def mistral(tools: ToolSet) -> SectionParser:
    return SectionParser(tools, MISTRAL)


def deepseek(tools: ToolSet) -> SectionParser:
    return SectionParser(tools, DEEPSEEK)


def kimi_k2(tools: ToolSet) -> SectionParser:
    return SectionParser(tools, KIMI_K2)
