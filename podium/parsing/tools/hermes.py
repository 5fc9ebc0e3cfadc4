"""Hermes / Qwen2.5 / Qwen3 tool calls, and the JSON shared by several families.

    Let me check.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {}}
    </tool_call>

What a ``<tool_call>`` opens (docs/parsing.md, "Malformed model output"):

- a call object naming a declared tool: a call (a stray quote or brace after it, a doubled
  or missing ``</tool_call>`` are recovered; if its JSON breaks, the valid part is closed
  as valid JSON and the rest of the block is dropped);
- a bare name, as GLM models write zero-argument calls (``<tool_call>get_time</tool_call>``),
  or a name followed by its arguments object: a call, if the tool is declared;
- an object naming no declared tool: dropped, markup and all (logged);
- anything else (prose that mentions the tag): the tag is dropped, the prose is content.

``<tool_call>`` written twice is read once; a ``</tool_call>`` out of place is dropped; a
second call object right after the first, inside the same block (``</tool_call><tool_call>``
left out between them), is a second call.

Qwen3-Coder's function block (``<function=NAME><parameter=KEY>...``), as Qwen3-Coder models
and some Qwen3 fine-tunes write under this template, is read as the Qwen3-Coder family reads
it (``XmlFunctionCalls``): inside ``<tool_call>`` like a call object; without it, only when a
parameter or ``</function>`` follows the name (prose may mention the tag).
"""

from __future__ import annotations

import re

from podium.parsing.scan import JsonValue, Markers
from podium.parsing.tools.base import ToolSet
from podium.parsing.tools.xml import XmlFunctionCalls

_WS = " \t\r\n"
NAME_CHARS = re.compile(r"[\w.:\-\"']*")     # a bare tool name (quotes stripped later)
NAME_LIMIT = 200


class HermesParser(XmlFunctionCalls):
    MARKUP = (XmlFunctionCalls.OPEN, XmlFunctionCalls.CLOSE)
    LANE_STATE, LANE_GUARD = "call", "<"   # _s_call without "<": call_object(buf) alone

    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._text_marks = Markers(*self.MARKUP, self.FUNCTION)
        self._block_marks = Markers(*self.MARKUP)
        self._state = "text"
        self._raw: list[str] = []   # the call object's text until it names its tool (to
                                    # skip it if it names none; pieces: it can be 400 KB)
        self._name: list[str] = []  # a bare name, and the blanks around it
        self._args: JsonValue | None = None
        self._closed = False        # "after": the call's </tool_call> was seen
        self._name_ended = False    # "name": blanks or markup followed the name
        self._junk_logged = False
        self._close_mark = Markers(self.CLOSE)
        self.fast_text("text", self._text_marks)     # _s_text is scan_text alone

    def _step(self, buf: str) -> int | None:
        if self._state == "call":               # the hot path: a call's arguments
            return self._s_call(buf)
        return getattr(self, "_s_" + self._state)(buf)

    def _s_text(self, buf: str) -> int | None:
        used, marker = self.scan_text(buf, self._text_marks, (self.OPEN, self.FUNCTION))
        if marker == self.OPEN:
            self._state = "open"
        elif marker == self.FUNCTION:           # a call, if a parameter follows its name
            self._state, self._fn_bare = "function", True
            self.push_back(marker)
        return used

    def _not_a_function(self, buf: str) -> int:
        """Prose: the tag is no markup of this family; content (the ``<tool_call>`` that
        opened it goes)."""
        if not self._fn_bare:
            self.stray(self.OPEN)
        self.text(self.FUNCTION)
        self._state = "text"
        return len(self.FUNCTION)

    def _function_ended(self, tag: str | None) -> None:
        if tag is None:
            self._state = "text"
        elif tag == self.OPEN:
            self._state = "open"
        else:
            self._state, self._closed = "after", tag == self.CLOSE

    def _s_open(self, buf: str) -> int | None:
        """Just after ``<tool_call>``: what kind of block is this?"""
        blanks = self.hold_blanks(buf)
        if blanks:
            return blanks
        for tag in (self.OPEN, self.CLOSE):
            if tag.startswith(buf) and buf != tag:
                return None
            if buf.startswith(tag):
                self.take_blanks()
                self.stray(self.OPEN if tag == self.OPEN else self.OPEN + self.CLOSE)
                self._state = "open" if tag == self.OPEN else "text"
                return len(tag)
        if buf[0] == "{":
            self.take_blanks()
            self._raw = []
            self.start_call_object()
            self._state = "call"
            return 0
        if buf.startswith(self.FUNCTION):       # Qwen3-Coder's form of a call
            self.take_blanks()
            self._state, self._fn_bare = "function", False
            return 0
        if self.FUNCTION.startswith(buf):
            return None
        if NAME_CHARS.match(buf).end():          # type: ignore[union-attr]
            self._name, self._state = [self.take_blanks()], "name"
            self._name_ended = False
            return 0
        return self._mention(0)

    def _mention(self, used: int) -> int:
        """The tag opened no call (prose about it): the tag goes, the text stays."""
        self.stray(self.OPEN)
        self.text(self.take_blanks() + "".join(self._name))
        self._name, self._state = [], "text"
        return used

    def _s_name(self, buf: str) -> int | None:
        """A bare name: a call if ``{``, ``</tool_call>``, ``<tool_call>`` or the end of the
        output follows it (after blanks); prose otherwise."""
        if not self._name_ended:
            n = NAME_CHARS.match(buf).end()        # type: ignore[union-attr]
            if n:
                self._name.append(buf[:n])
                if sum(map(len, self._name)) > NAME_LIMIT:
                    return self._mention(n)
                return n
            self._name_ended = True
        blanks = len(buf) - len(buf.lstrip(_WS))
        if blanks:
            self._name.append(buf[:blanks])
            return blanks
        if buf[0] == "{" or buf.startswith((self.CLOSE, self.OPEN)):
            self._bare_call(buf[0] == "{")
            return 0
        if self.CLOSE.startswith(buf) or self.OPEN.startswith(buf):
            return None
        return self._mention(0)

    def _bare_call(self, with_args: bool) -> None:
        name = "".join(self._name).strip(_WS + "\"'")
        self._name = []
        if not self.begin_declared(name):
            self._state = "skip" if with_args else "after"
            self._closed = False
            if with_args:
                self._skip = JsonValue()
            return
        if with_args:
            self._args, self._state = JsonValue(), "bare_args"
        else:
            self.end_call()
            self._state, self._closed = "after", False

    def _s_bare_args(self, buf: str) -> int | None:
        args = self._args
        assert args is not None
        end = args.feed(buf)
        self.call_args(args.last)
        args._parts.clear()
        if end < 0:
            return len(buf)
        self.end_call()
        self._state, self._closed = "after", False
        return end

    def _s_call(self, buf: str) -> int | None:
        """The call object. ``</tool_call>`` inside it (in a string: outside one the JSON
        breaks there) is text of the string, unless only blanks and the end of the
        output or the next ``<tool_call>`` follow it: then the model left the string
        unclosed, and the tag ends the call."""
        if "<" in buf:
            close = self._close_mark
            pos, tag = close.find(buf)
            limit = pos if tag is not None else len(buf) - close.held(buf)
            piece = buf[:limit]
        else:
            pos, tag, limit, piece = -1, None, len(buf), buf
        if limit:
            outcome, used = self.call_object(piece)
        else:
            outcome, used = "more", 0
        if outcome == "more":
            self.keep_unnamed(self._raw, piece)
            if tag is None or used < limit:
                return used or None
            after = buf[pos + len(tag):].lstrip(_WS)
            if not after or (self.OPEN.startswith(after) and after != self.OPEN):
                return used or None             # what follows decides
            if after.startswith(self.OPEN):     # the call ends here, its string unclosed
                self.stray(f"{self.CLOSE} inside an unclosed string", "tool call")
                if self._json.name is None:
                    self.drop_call(None, "unfinished")
                self.end_call()
                self._state, self._closed = "after", True
                return pos + len(tag)
            outcome, n = self.call_object(tag)  # text of the string
            if outcome == "more":
                return pos + n
            used = pos + n
        if outcome == "no call":                # names no declared tool: skip the object
            if self.drop_call_object(self._raw, buf, used):
                self._state = "skip"
                return used
        elif outcome == "broken":               # the rest of the block is the call's
            self._state, self._junk_logged = "junk", False
            return used
        self._state, self._closed = "after", False
        return used

    def _s_junk(self, buf: str) -> int | None:
        """What follows a call whose JSON broke, up to ``</tool_call>``: dropped."""
        pos, marker = self._block_marks.find(buf)
        end = pos if marker is not None else len(buf) - self._block_marks.held(buf)
        if not self._junk_logged and buf[:end].strip(_WS):
            self._junk_logged = True            # once per call: it comes in many deltas
            junk = buf[:end].strip(_WS)
            self.stray(junk if len(junk) <= 40 else junk[:40] + "...",
                       "tool call (what followed its broken JSON)")
        if marker is None:
            return end or None
        if marker == self.OPEN:
            self._state = "text"
            return pos
        self._state, self._closed = "after", True
        return pos + len(marker)

    def _s_skip(self, buf: str) -> int | None:
        end = self.skipping(buf)
        if end < 0:
            return len(buf)
        self._state, self._closed = "after", False
        return end

    def _s_after(self, buf: str) -> int | None:
        """After a call: blanks, a stray quote or brace, ``</tool_call>`` (doubled or not);
        anything else is content again."""
        blanks = self.hold_blanks(buf)
        if blanks:
            return blanks
        if not self._closed:
            if buf[0] == "{":               # the next call, glued to this one
                self.take_blanks()
                self.stray(f"{self.CLOSE}{self.OPEN} left out", "tool call")
                self._raw = []
                self.start_call_object()
                self._state = "call"
                return 0
            stray = self.skip_stray(buf)
            if stray:
                self.take_blanks()
                return stray
        if self.CLOSE.startswith(buf) and buf != self.CLOSE:
            return None
        if buf.startswith(self.CLOSE):
            self.take_blanks()
            if self._closed:
                self.stray(self.CLOSE)
            self._closed = True
            return len(self.CLOSE)
        for tag in (self.FUNCTION_END, self.PARAM_END):     # a function block's, doubled
            if buf.startswith(tag):
                self.take_blanks()
                self.stray(tag, "tool call")
                return len(tag)
            if tag.startswith(buf):
                return None
        gap, self._state = self.take_blanks(), "text"
        self.text(gap)
        return 0

    def _finish(self, rest: str) -> None:
        state = self._state
        if state == "text":
            self.text(rest)
        elif self._function_finish(rest):
            pass
        elif state == "name":
            name = ("".join(self._name) + rest).strip(_WS + "\"'")
            if NAME_CHARS.fullmatch(name) and self.tools.allows(name):
                self.begin_call(name)
                self.end_call()
            else:
                self.drop_call(name or None, "unfinished at the end of the output")
        elif state == "call" and self._json.name is None:
            self.drop_call(None, "unfinished at the end of the output")
        elif state == "open":
            self.stray(self.OPEN)
        self._name, self._raw = [], []
