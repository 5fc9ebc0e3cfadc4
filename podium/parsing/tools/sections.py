"""Tool calls introduced by marker tokens, with JSON arguments: Mistral, DeepSeek, Kimi K2.

Mistral, older (a JSON list), v11+ (name, then ``[ARGS]``), and with a call id::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}
    [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}

DeepSeek V3 and V3.1::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Kimi K2::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

DeepSeek's markers are also read as models spell them (spaces, ``_`` or ``\\_`` for
``▁``, the short ``<｜tool▁calls｜>`` opener), Kimi's section markers in the singular
(``<|tool_call_section_begin|>``): ``Aliases`` rewrites them to the canonical markers as
the text streams in.

A call naming an undeclared tool is dropped, markup and all (logged); the markers never
reach content (a doubled one is read once, a stray one dropped); a call whose opener or
argument marker was left out is still read when its name is unambiguous, and so is a call
glued to the one before it (``...{}get_time[ARGS]{}``: its opener left out). Arguments
written as a JSON string holding the object are decoded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from podium.parsing.scan import JsonValue, Markers
from podium.parsing.tools.base import ToolParser, ToolSet, cut_markup

_WS = " \t\r\n"


@dataclass(frozen=True)
class SectionFormat:
    section_open: str               # where calls begin (content before it is text)
    section_close: str | None       # where they end (None: the output's end)
    call_open: str | None           # before each call (None: calls follow each other)
    header_end: str                 # ends the header that names the function
    call_close: str | None          # after each call's arguments
    name_of: Callable[[str], str]   # header text -> function name
    call_id: str | None = None      # between the name and header_end: a call id follows
    aliases: tuple[tuple[str, str], ...] = ()   # (how models spell a marker, the marker)


def _kimi_name(header: str) -> str:
    return re.sub(r":\d+$", "", header.strip()).removeprefix("functions.")


def _deepseek_spellings() -> tuple[tuple[str, str], ...]:
    """DeepSeek's markers as models write them (llama.cpp reads the same openers): ``▁``
    as a space, ``_`` or an escaped ``\\_`` (once or twice), and the short opener."""
    tags = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>", "<｜tool▁call▁end｜>")
    out = [(tag.replace("▁", sep), tag) for tag in tags for sep in (" ", "_", "\\_", "\\\\_")]
    return (("<｜tool▁calls｜>", tags[0]), *out)


DEEPSEEK = SectionFormat("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                         "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", str.strip,
                         aliases=_deepseek_spellings())
KIMI_K2 = SectionFormat("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                        "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                        _kimi_name,
                        aliases=(("<|tool_call_section_begin|>", "<|tool_calls_section_begin|>"),
                                 ("<|tool_call_section_end|>", "<|tool_calls_section_end|>")))
MISTRAL = SectionFormat("[TOOL_CALLS]", None, None, "[ARGS]", None, str.strip,
                        call_id="[CALL_ID]")


class Aliases:
    """Rewrites other spellings of a family's markers to the markers, as text streams in
    (holding back only what may still become one)."""

    def __init__(self, pairs: tuple[tuple[str, str], ...]):
        self._to = dict(pairs)
        self._marks = Markers(*self._to)
        self._held = ""

    def feed(self, text: str) -> str:
        if self._held:
            text, self._held = self._held + text, ""
        elif self._marks.absent(text):
            return text
        out: list[str] = []
        at = 0
        pos, alias = self._marks.find(text)
        while alias is not None:
            out.append(text[at:pos] + self._to[alias])
            at = pos + len(alias)
            pos, alias = self._marks.find(text, at)
        held = self._marks.held(text[at:])
        if held:
            self._held = text[len(text) - held:]
            text = text[:len(text) - held]
        out.append(text[at:])
        return "".join(out)

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


NAME = re.compile(r"[\w.:\-]*")        # a header: a name (Kimi: functions.NAME:0)
CALL_ID = re.compile(r"[\w\-]*")        # Mistral's call id


class SectionParser(ToolParser):
    def __init__(self, tools: ToolSet, fmt: SectionFormat):
        super().__init__(tools)
        self.fmt = fmt
        self.MARKUP = tuple(m for m in (fmt.section_open, fmt.section_close, fmt.call_open,
                                        fmt.header_end, fmt.call_close, fmt.call_id) if m)
        self._openers = tuple(m for m in (fmt.section_open, fmt.call_open) if m)
        self._text_marks = self._guard = Markers(*self.MARKUP)
        self._state = "text"
        self._header: list[str] = []  # the header (a name) so far, in pieces
        self._named_some = False      # ... it has a name's first characters
        self._after_name = False      # ... and blanks after them
        self._object: list[str] = []  # a list item's text until it names its tool
        self._args: JsonValue | None = None
        self._fresh = False           # just after the section opener
        self._glued = False           # a header right after a call, its opener left out
        self._just_called = False      # "section" right after a call's end
        self._name = ""               # the name, while a call id is read
        self._id_read = False         # ... and the id itself was read
        self._aliases = Aliases(fmt.aliases) if fmt.aliases else None

    def feed(self, text: str) -> list:
        aliases = self._aliases
        if aliases is not None:
            text = aliases.feed(text)
            if not text:
                return []
        return super().feed(text)

    def flush(self) -> list:
        aliases = self._aliases
        if aliases is not None:
            held = aliases.flush()
            if held and cut_markup(held):        # a spelling of a marker, cut short
                self.stray(held, "content (a marker cut short at the end)")
            elif held:
                self._out += super().feed(held)
        return super().flush()

    def _step(self, buf: str) -> int | None:
        return getattr(self, "_s_" + self._state)(buf)

    def _s_text(self, buf: str) -> int | None:
        used, marker = self.scan_text(buf, self._text_marks, self._openers)
        if marker == self.fmt.section_open:
            self._state, self._fresh = "section", True
        elif marker is not None:             # a call's opener, its section's left out
            self._new_header()
        return used

    def _s_section(self, buf: str) -> int | None:
        """Between calls: the next call's opener, the section's end, or (Mistral) a list.
        Blanks here are layout, unless prose follows (then they are content)."""
        blanks = self.hold_blanks(buf)
        if blanks:
            return blanks
        fmt, fresh = self.fmt, self._fresh
        if fmt.section_open.startswith(buf) and buf != fmt.section_open:
            return None
        if buf.startswith(fmt.section_open):     # Mistral's next call, or written twice
            self.take_blanks()
            if fmt.call_open is not None or fresh:
                self.stray(fmt.section_open)
            self._new_header("section" if fmt.call_open else "header")
            return len(fmt.section_open)
        after_call, self._just_called = self._just_called, False
        if after_call and not fresh and NAME.match(buf).end():  # type: ignore[union-attr]
            self._new_header("header", self.take_blanks())  # a call glued to the last, or prose
            self._glued = True
            return 0
        if fmt.call_open is None:              # Mistral: each call repeats [TOOL_CALLS]
            self._fresh = False
            if fresh:
                self._new_header("list" if buf[0] == "[" else "header", self.take_blanks())
                return int(buf[0] == "[")
            return self._back_to_text()
        for tag, state in ((fmt.call_open, "header"), (fmt.section_close, "text"),
                           (fmt.call_close, "section")):
            if tag is None:
                continue
            if tag.startswith(buf) and buf != tag:
                return None
            if buf.startswith(tag):
                self._fresh = False
                self.take_blanks()
                if tag == fmt.call_close:
                    self.stray(tag)
                self._new_header(state)
                return len(tag)
        self._fresh = False
        return self._back_to_text()

    def _back_to_text(self) -> int:
        self._state = "text"
        self.text(self.take_blanks())
        return 0

    def _s_header(self, buf: str) -> int | None:
        """The name up to the header's end (or, left out, the arguments' ``{``); a header
        that is no name was prose after a marker: the marker goes, the prose stays."""
        fmt = self.fmt
        if not self._header:
            if fmt.call_open and fmt.call_open.startswith(buf) and buf != fmt.call_open:
                return None
            if fmt.call_open and buf.startswith(fmt.call_open):    # written twice
                self.stray(fmt.call_open)
                return len(fmt.call_open)
        n = NAME.match(buf).end()                  # type: ignore[union-attr]
        if n:
            if self._after_name or len(self._header) > 300:    # name, blanks, name: prose
                return self._mention("", 0)
            self._header.append(buf[:n])
            self._named_some = True
            if n == len(buf):
                return n
        rest = buf[n:]
        lead = rest.lstrip(_WS)
        blanks = len(rest) - len(lead)
        if blanks and self._named_some:
            self._after_name = True
        if not lead:
            self._header.append(rest)
            return len(buf)
        if lead.startswith(fmt.header_end):
            header = "".join(self._header).strip(_WS)
            used = n + blanks + len(fmt.header_end)
            if fmt is DEEPSEEK and header == "function":      # V3: the name follows
                self._new_header("deepseek_name")
                return used
            return self._named(fmt.name_of(header), used)
        if fmt.call_id and lead.startswith(fmt.call_id):    # Mistral: the call's id next
            self._name, self._id_read = fmt.name_of("".join(self._header)), False
            self._new_header("call_id")
            return n + blanks + len(fmt.call_id)
        if lead[0] == "{" and not self._glued:          # the header's end left out
            self.stray(f"{fmt.header_end} left out", "tool call")
            return self._named(fmt.name_of("".join(self._header)), n + blanks)
        if fmt.header_end.startswith(lead) or (fmt.call_id and fmt.call_id.startswith(lead)):
            if blanks:
                self._header.append(rest[:blanks])
            return (n + blanks) or None
        if blanks and not self._named_some and NAME.match(lead).end():  # type: ignore[union-attr]
            self._header.append(rest[:blanks])          # blanks before the name
            return n + blanks
        return self._mention(rest[:blanks], n + blanks)

    def _mention(self, extra: str, used: int) -> int:
        """A marker followed by prose: the marker goes, the prose is content (after a call,
        with no marker: the prose)."""
        if not self._glued:
            self.stray(self.fmt.call_open or self.fmt.section_open)
        self.text("".join(self._header) + extra)
        self._new_header("text")
        return used

    def _new_header(self, state: str = "header", lead: str = "") -> None:
        self._header, self._state = ([lead] if lead else []), state
        self._named_some = self._after_name = self._glued = False

    def _s_call_id(self, buf: str) -> int | None:
        """Mistral's ``[CALL_ID]``: the id (letters and digits), then ``[ARGS]`` (or, left
        out, the arguments' ``{``). The id is the model's; the call gets Podium's."""
        if not self._id_read:
            n = CALL_ID.match(buf).end()             # type: ignore[union-attr]
            self._header.append(buf[:n])
            if sum(map(len, self._header)) > 100:
                return self._mention("", n)
            if n < len(buf):
                self._id_read = True
            return n or 0
        blanks = self.hold_blanks(buf)
        if blanks:
            return blanks
        end = self.fmt.header_end
        if end.startswith(buf) and buf != end:
            return None
        self.take_blanks()
        if buf.startswith(end):
            return self._named(self._name, len(end))
        if buf[0] != "{":
            self.stray(f"{end} left out", "tool call")
        return self._named(self._name, 0)

    def _s_deepseek_name(self, buf: str) -> int | None:
        newline = buf.find("\n")
        if newline < 0:
            return None if len(buf) < 300 else self._mention("", 0)
        used = newline + 1
        rest = buf[used:].lstrip(_WS)
        if not rest or ("```json".startswith(rest) and rest != "```json"):
            return None
        if rest.startswith("```json"):
            used = len(buf) - len(rest) + len("```json")
        return self._named(buf[:newline].strip(), used)

    def _named(self, name: str, used: int) -> int:
        self._new_header("header")
        if not self.begin_declared(name):
            self._skip, self._state = JsonValue(), "skip"
            return used
        self._args, self._state = JsonValue(), "arguments"
        return used

    def _s_skip(self, buf: str) -> int | None:
        end = self.skipping(buf)
        if end < 0:
            return len(buf)
        self._state = "call_end"
        return end

    def _s_arguments(self, buf: str) -> int | None:
        args = self._args
        assert args is not None                 # set with the call's name
        if not args.kind:                       # the header's end written twice?
            lead = buf.lstrip(_WS)
            end_tag = self.fmt.header_end
            if end_tag.startswith(lead) and lead != end_tag:
                return None
            if lead.startswith(end_tag):
                self.stray(end_tag, "tool call")
                return len(buf) - len(lead) + len(end_tag)
        # the markers are special tokens, never inside arguments: one ends them
        pos, marker = self._text_marks.find(buf)
        limit = pos if marker is not None else len(buf) - self._text_marks.held(buf)
        end = -1
        if limit:
            end = self.value_args(args, buf[:limit])
        if end >= 0 or marker is not None:
            if end < 0:
                self.stray(f"{marker} inside the arguments", "tool call")
            self.end_call()
            self._state = "call_end"
            return end if end >= 0 else limit
        return limit or None

    def end_call(self) -> None:
        super().end_call()
        self._just_called = True

    def _s_call_end(self, buf: str) -> int | None:
        """Skip a closing fence, a stray quote or brace, and the call's end marker (once
        or twice); then back between calls."""
        stripped = buf.lstrip(_WS)
        if len(stripped) < len(buf):        # blanks here are layout
            return len(buf) - len(stripped)
        fmt = self.fmt
        for tag in ("```", fmt.call_close, fmt.header_end):
            if tag and buf.startswith(tag):
                if tag == fmt.header_end:
                    self.stray(tag)
                return len(tag)
            if tag and tag.startswith(buf):
                return None
        stray = self.skip_stray(buf)
        if stray:
            return stray
        self._state, self._just_called = "section", True
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
        self._state, self._object = "list_item", []
        return skipped

    def _s_list_item(self, buf: str) -> int | None:
        outcome, used = self.call_object(buf)
        if outcome == "more":
            self.keep_unnamed(self._object, buf)
        elif outcome == "done":
            self._state = "list"
        elif outcome == "no call":                  # an object naming no declared tool
            skipping = self.drop_call_object(self._object, buf, used)
            self._state = "list_skip" if skipping else "list"
        else:
            self._state = "text"
        return used

    def _s_list_skip(self, buf: str) -> int | None:
        end = self.skipping(buf)
        if end < 0:
            return len(buf)
        self._state = "list"
        return end

    def _finish(self, rest: str) -> None:
        if self._state == "text":
            self.text(rest)
        elif self._state == "header":               # a name and nothing after it
            header = ("".join(self._header) + rest).strip(_WS)
            name = self.fmt.name_of(header) if header and NAME.fullmatch(header) else ""
            if name and self.tools.allows(name):
                self.begin_call(name)
            elif self._glued:                   # prose after a call, no marker before it
                self.text("".join(self._header) + rest)
            elif header:
                self.drop_call(header, "unfinished at the end of the output")
        elif self._state == "call_id" and self.tools.allows(self._name):    # cut in the id
            self.begin_call(self._name)
        self._header, self._object = [], []


def mistral(tools: ToolSet) -> SectionParser:
    return SectionParser(tools, MISTRAL)


def deepseek(tools: ToolSet) -> SectionParser:
    return SectionParser(tools, DEEPSEEK)


def kimi_k2(tools: ToolSet) -> SectionParser:
    return SectionParser(tools, KIMI_K2)
