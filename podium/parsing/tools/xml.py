"""Tool calls whose arguments are written as XML-ish key / value pairs.

Qwen3-Coder::

    <tool_call>
    <function=write_file>
    <parameter=path>
    a.py
    </parameter>
    <parameter=content>
    print("</parameter>")
    </parameter>
    </function>
    </tool_call>

GLM-4.5::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

Values are typed by the tool's JSON schema (a string stays a string; numbers, booleans,
objects and arrays are parsed). A Qwen3-Coder value may itself contain ``</parameter>``: the
tag ends the value only when the next tag (``<parameter=`` or ``</function>``) follows it.
String values stream as they arrive; other values are emitted when complete.
"""

from __future__ import annotations

import json
import re
from typing import Any

from podium.parsing.scan import Markers, json_text
from podium.parsing.tools.base import STRAY, ToolParser, ToolSet, double_decoded

_WS = " \t\r\n"
NAME = re.compile(r"[\w.:\-]+")     # a function name (GLM-4.5 writes it bare)


def is_string_type(kind: Any) -> bool:
    """Schema types that keep a value as text (no type at all counts as text)."""
    return kind in (None, "string") or (isinstance(kind, list) and "string" in kind)


def typed(value: str, kind: Any) -> Any:
    """A parameter's text as the JSON value its schema type asks for."""
    if is_string_type(kind):
        return value
    text = value.strip()
    if kind == "boolean" and text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return double_decoded(json.loads(text), kind)
    except ValueError:
        return value


def _tag_name(text: str) -> str:
    """A function or parameter name as written in a tag (quotes around it tolerated)."""
    return text.strip().strip("\"'").strip()


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


class Qwen3CoderParser(ToolParser):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    FUNCTION, FUNCTION_END = "<function=", "</function>"
    PARAM, PARAM_END = "<parameter=", "</parameter>"
    MARKUP = (OPEN, CLOSE, FUNCTION, FUNCTION_END, PARAM, PARAM_END)
    # what may end a value, and what must follow each (after blanks) for it to end it
    # (the end of the output always does): a value may hold any of them otherwise
    LINE_PARAM = "\n" + PARAM
    FOLLOW = {PARAM_END: (PARAM, FUNCTION_END, CLOSE, PARAM_END),
              FUNCTION_END: (CLOSE, OPEN, FUNCTION_END, PARAM_END), CLOSE: (OPEN, CLOSE),
              LINE_PARAM: ()}

    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._text_marks = Markers(*self.MARKUP)
        self._skip_marks = Markers(self.OPEN, self.CLOSE, self.FUNCTION_END)
        self._state = "text"
        self._param = ""
        self._value = ""          # the current parameter's undecided tail (see _s_value)
        self._kept: list[str] = []    # a non-string value's decided text, in pieces
        self._search = 0          # where to look for the next end tag in _value
        self._after_tag = False   # _value ends in a possible end tag and blanks
        self._blanks: list[str] = []  # more blanks after it, not yet added to _value
        self._n_params = 0
        self._is_string = True
        self._lead = False
        self._end_tag = Markers(*self.FOLLOW)

    def _step(self, buf: str) -> int | None:
        return getattr(self, "_s_" + self._state)(buf)

    def _s_text(self, buf: str) -> int | None:
        used, marker = self.scan_text(buf, self._text_marks, (self.OPEN, self.FUNCTION))
        if marker == self.OPEN:
            self._state = "head"
        elif marker == self.FUNCTION:        # <tool_call> left out: the function names it
            self.stray("<function= without <tool_call>", "tool call")
            self._state = "head"
            self.push_back(marker)
        return used

    def _mention(self, buf: str, used: int) -> int:
        """``<tool_call>`` opened no function (prose about it): the tag goes, text stays."""
        self.stray(self.OPEN)
        self.text(buf[:used])
        self._state = "text"
        return used

    def _s_head(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS)
        skipped = len(buf) - len(stripped)
        if not stripped:
            return None
        for tag in (self.OPEN, self.CLOSE):          # doubled, or an empty block
            if tag.startswith(stripped) and stripped != tag:
                return None
            if stripped.startswith(tag):
                self.stray(self.OPEN)
                self._state = "head" if tag == self.OPEN else "text"
                return skipped + len(tag)
        if self.FUNCTION.startswith(stripped) and stripped != self.FUNCTION:
            return None
        if not stripped.startswith(self.FUNCTION):
            return self._mention(buf, skipped)
        close = stripped.find(">")
        if close < 0:
            return None if len(stripped) < 200 else self._mention(buf, skipped)
        name = _tag_name(stripped[len(self.FUNCTION):close].split(self.FUNCTION)[-1])
        used = skipped + close + 1
        if not self.begin_declared(name):
            self._state = "skip"
            return used
        self._n_params, self._state = 0, "params"
        return used

    def _s_skip(self, buf: str) -> int | None:
        """A call to an undeclared function, up to its ``</function>`` or ``</tool_call>``:
        dropped."""
        pos, marker = self._skip_marks.find(buf)
        if marker is None:
            safe = len(buf) - self._skip_marks.held(buf)
            return safe or None
        self._state = {self.OPEN: "head", self.CLOSE: "text", self.FUNCTION_END: "tail"}[marker]
        return pos + len(marker)

    def _s_params(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS)
        skipped = len(buf) - len(stripped)
        if not stripped:
            return len(buf)
        stray = self.skip_stray(stripped)
        if stray:
            return skipped + stray
        for tag in (self.PARAM, self.FUNCTION_END, self.CLOSE, self.PARAM_END, self.FUNCTION,
                    self.OPEN):
            if stripped.startswith(tag):
                break
            if tag.startswith(stripped):
                return None
        else:
            self._close_call()              # not the format: close what we have
            self._state = "text"
            return skipped
        if tag in (self.PARAM, self.FUNCTION):
            close = stripped.find(">")
            if close < 0:
                return None if len(stripped) < 200 else self._not_params(skipped)
            if tag == self.FUNCTION:        # written twice: the call is already open
                self.stray(stripped[:close + 1], "tool call")
                return skipped + close + 1
            self._param = _tag_name(stripped[len(self.PARAM):close].split(self.PARAM)[-1])
            self._open_member()
            return skipped + close + 1
        if tag == self.PARAM_END:           # written twice
            self.stray(tag, "tool call")
            return skipped + len(tag)
        self._close_call()
        if tag == self.OPEN:                # the next call, this one left open
            self._state = "text"
            return skipped
        self._state = "tail" if tag == self.FUNCTION_END else "text"
        return skipped + len(tag)

    def _not_params(self, skipped: int) -> int:
        self._close_call()
        self._state = "text"
        return skipped

    def _open_member(self) -> None:
        prefix = "{" if self._n_params == 0 else ", "
        self._n_params += 1
        self.call_args(f"{prefix}{json.dumps(self._param, ensure_ascii=False)}: ")
        kind = self.tools.param_type(self._open_name, self._param)
        self._is_string = is_string_type(kind)
        if self._is_string:
            self.call_args('"')
        self._value, self._kept, self._search, self._lead = "", [], 0, True
        self._after_tag, self._blanks = False, []
        self._state = "value"

    def _s_value(self, buf: str) -> int | None:
        """A value's text. Only its undecided tail stays in ``_value`` (a possible end tag,
        a newline that may be the last): the rest is streamed or kept at once, so each delta
        costs the same however long the value (agents write whole files)."""
        used = len(buf)
        if self._lead:                      # the newline after <parameter=...> is layout
            self._lead = False
            buf = buf[1:] if buf.startswith("\n") else buf
        if self._after_tag and not buf.strip(_WS):     # more blanks decide nothing
            self._blanks.append(buf)
            return used
        if self._blanks:
            buf, self._blanks = "".join(self._blanks) + buf, []
        self._value += buf
        if "<" not in self._value:          # no tag can end it yet (most deltas of a file)
            self._after_tag = False
            self._decide(len(self._value) - self._value.endswith("\n"))
            return used
        end = self._find_end()
        if end is None:                     # undecided: pass on what cannot be the end
            self._decide(self._safe_end())
            return used
        value_end, resume = end
        self._finish_value(self._value[:value_end])
        self.push_back(self._value[resume:])
        self._state, self._value = "params", ""
        return used

    def _find_end(self, at_end: bool = False) -> tuple[int, int] | None:
        """(end of value, where the markup after it starts) once an end tag is confirmed:
        the tag its follower (or, ``at_end``, the end of the output or a part of the
        follower) comes after."""
        self._after_tag = False
        while True:
            pos, tag = self._end_tag.find(self._value, self._search)
            if tag is None:
                return None
            if tag == self.LINE_PARAM:      # an unclosed value, then the next parameter
                return pos + 1, pos + 1     # (its newline is the value's last, dropped)
            resume = pos + len(tag) if tag == self.PARAM_END else pos
            after = self._value[pos + len(tag):].lstrip(_WS + STRAY)
            follow = self.FOLLOW[tag]
            if at_end and (not after or any(t.startswith(after) for t in follow)):
                return pos, resume
            if not after:
                self._after_tag = True
                return None                 # wait: the next tag decides
            if any(t.startswith(after) and t != after for t in follow):
                return None
            if after.startswith(follow):
                return pos, resume
            self._search = pos + 1          # part of the value

    def _safe_end(self) -> int:
        end, tag = self._end_tag.find(self._value, self._search)
        if tag is None:
            end = len(self._value) - self._end_tag.held(self._value)
        elif tag == self.LINE_PARAM:
            end += 1
        if end and self._value[end - 1] == "\n":
            end -= 1                        # a trailing newline may be the last one, dropped
        return end

    def _decide(self, end: int) -> None:
        """``_value[:end]`` is the value's for sure: stream it (a string) or keep it."""
        if end <= 0:
            return
        if self._is_string:
            self.call_args(_escaped(self._value[:end]))
        else:
            self._kept.append(self._value[:end])
        self._value = self._value[end:]
        self._search = max(0, self._search - end)

    def _finish_value(self, tail: str) -> None:
        """The value ends with ``tail`` (what ``_decide`` left, up to the end tag)."""
        if tail.endswith("\n"):
            tail = tail[:-1]
        if self._is_string:
            if tail:
                self.call_args(_escaped(tail))
            self.call_args('"')
            return
        value = "".join(self._kept) + tail
        self._kept = []
        kind = self.tools.param_type(self._open_name, self._param)
        self.call_args(json_text(typed(value, kind)))

    def _close_call(self) -> None:
        if self._call is not None:
            self.call_args("}" if self._n_params else "{}")
            self.end_call()

    def _s_tail(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS)
        if len(stripped) < len(buf):        # blanks after </function> are layout
            return len(buf) - len(stripped)
        if self.CLOSE.startswith(buf) and buf != self.CLOSE:
            return None
        self._state = "text"
        return len(self.CLOSE) if buf.startswith(self.CLOSE) else 0

    def _finish(self, rest: str) -> None:
        if self._state == "text":
            self.text(rest)
        elif self._state == "value" and self._call is not None:
            self._value += "".join(self._blanks) + rest
            self._blanks = []
            end = self._find_end(at_end=True)
            if end is None:                  # cut short: what was written, not a tag's start
                value = self._value
                tail = value[len(value) - self._end_tag.held(value):]
                if tail.startswith("<"):
                    value = value[:len(value) - len(tail)]
                self._finish_value(value)
            else:
                self._finish_value(self._value[:end[0]])
            self._close_call()
        else:
            self._close_call()


class Glm45Parser(ToolParser):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
    MARKUP = (OPEN, CLOSE, KEY, KEY_END, VALUE, VALUE_END)

    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._text_marks = Markers(*self.MARKUP)
        self._skip_marks = Markers(self.OPEN, self.CLOSE)
        self._name_ends = Markers("\n", self.KEY, self.CLOSE, self.OPEN)
        self._state = "text"
        self._key = ""
        self._n_args = 0
        self._tag = ""                  # the open <arg_key> or <arg_value>
        self._item_text: list[str] = []     # its text so far, in pieces
        # an item ends at its own end tag, or (left unclosed) at the next tag; a value may
        # hold <tool_call> (agents write code that does): only the tags inside calls end it
        self._ends = {self.KEY: Markers(*self.MARKUP),
                      self.VALUE: Markers(self.KEY, self.KEY_END, self.VALUE, self.VALUE_END,
                                          self.CLOSE)}

    def _step(self, buf: str) -> int | None:
        return getattr(self, "_s_" + self._state)(buf)

    def _s_text(self, buf: str) -> int | None:
        used, marker = self.scan_text(buf, self._text_marks, (self.OPEN,))
        if marker is not None:
            self._state = "name"
        return used

    def _s_name(self, buf: str) -> int | None:
        """The function's name, on the line after ``<tool_call>`` (up to a newline,
        ``<arg_key>`` or ``</tool_call>``); blanks before it are held until it is known."""
        blanks = self.hold_blanks(buf)
        if blanks:
            return blanks
        if buf.startswith(self.OPEN):               # written twice
            self.stray(self.OPEN)
            return len(self.OPEN)
        if self.OPEN.startswith(buf):
            return None
        pos, marker = self._name_ends.find(buf)
        if marker is None:
            partial = _tag_name(buf[:len(buf) - self._name_ends.held(buf)])
            if len(buf) >= 200 or (partial and not NAME.fullmatch(partial)):
                return self._mention(buf)
            return None
        return self._name_line(buf, pos)

    def _name_line(self, buf: str, end: int) -> int:
        name = _tag_name(buf[:end])
        if not name:                                # <tool_call><arg_key> or </tool_call>
            self.take_blanks()
            self.drop_call(None, "no function name")
            self._state = "skip"
            return end
        if not NAME.fullmatch(name):
            return self._mention(buf)
        self.take_blanks()
        if not self.begin_declared(name):
            self._state = "skip"
            return end
        self._n_args, self._state = 0, "args"
        return end

    def _mention(self, buf: str) -> int:
        """``<tool_call>`` named no tool (prose about it): the tag goes, the text stays."""
        self.stray(self.OPEN)
        self.text(self.take_blanks())
        self._state = "text"
        return 0

    def _s_skip(self, buf: str) -> int | None:
        """A call to an undeclared tool, up to its ``</tool_call>``: dropped."""
        pos, marker = self._skip_marks.find(buf)
        if marker is None:
            safe = len(buf) - self._skip_marks.held(buf)
            return safe or None
        self._state = "name" if marker == self.OPEN else "text"
        return pos + len(marker)

    def _s_args(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS)
        skipped = len(buf) - len(stripped)
        if not stripped:
            return len(buf)
        for tag in (self.KEY, self.VALUE):
            if stripped.startswith(tag):
                self._tag, self._item_text = tag, []
                self._state = "item"
                return skipped + len(tag)
        for tag in (self.KEY_END, self.VALUE_END):     # written twice, or unopened
            if stripped.startswith(tag):
                self.stray(tag, "tool call")
                return skipped + len(tag)
        if stripped.startswith(self.CLOSE):
            self._close_call()
            self._state = "text"
            return skipped + len(self.CLOSE)
        if any(t.startswith(stripped) for t in (self.KEY, self.VALUE, self.CLOSE, self.KEY_END,
                                                self.VALUE_END)):
            return None
        self._close_call()
        self._state = "text"
        return skipped

    def _s_item(self, buf: str) -> int | None:
        """A key's or value's text up to its end tag (or the next tag, if it was left
        unclosed), looked for in new text only."""
        end_tag = self._ends[self._tag]
        pos, marker = end_tag.find(buf)
        if marker is None:
            safe = len(buf) - end_tag.held(buf)
            if safe:
                self._item_text.append(buf[:safe])
            return safe or None
        text = "".join(self._item_text) + buf[:pos]
        if marker == self._tag and not text.strip(_WS):      # its opener written twice
            self.stray(marker, "tool call")
            self._item_text = []
            return pos + len(marker)
        self._item_text, self._state = [], "args"
        own = marker in (self.KEY_END, self.VALUE_END)     # its end tag (or the other's)
        if not own:
            self.stray(f"{self._tag} left unclosed", "tool call")
            text = text.rstrip(_WS)
        self._item(self._tag, text)
        return pos + len(marker) if own else pos

    def _item(self, tag: str, text: str) -> None:
        if tag == self.KEY:
            self._key = text.strip()
            return
        kind = self.tools.param_type(self._open_name, self._key)
        prefix = "{" if self._n_args == 0 else ", "
        self._n_args += 1
        self.call_args(f"{prefix}{json_text(self._key)}: {json_text(typed(text, kind))}")

    def _close_call(self) -> None:
        if self._call is not None:
            self.call_args("}" if self._n_args else "{}")
            self.end_call()

    def _finish(self, rest: str) -> None:
        if self._state == "text":
            self.text(rest)
        elif self._state == "name":
            name = _tag_name(rest)
            self.take_blanks()
            if name and NAME.fullmatch(name) and self.tools.allows(name):
                self.begin_call(name)
                self._close_call()
            elif name:
                self.drop_call(name, "unfinished at the end of the output")
        else:
            if self._state == "item" and self._tag == self.VALUE and self._call is not None:
                text = "".join(self._item_text) + rest        # cut short: what was written
                held = self._ends[self.VALUE].held(text)
                self._item(self.VALUE, text[:len(text) - held] if held else text)
            self._close_call()
