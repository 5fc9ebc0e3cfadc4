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
from typing import Any

from podium.parsing.scan import Markers
from podium.parsing.tools.base import ToolParser, ToolSet

_WS = " \t\r\n"


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
        return json.loads(text)
    except ValueError:
        return value


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


class Qwen3CoderParser(ToolParser):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    FUNCTION, FUNCTION_END = "<function=", "</function>"
    PARAM, PARAM_END = "<parameter=", "</parameter>"

    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._open = Markers(self.OPEN)
        self._state = "text"
        self._raw = ""
        self._param = ""
        self._value = ""          # the current parameter's undecided tail (see _s_value)
        self._kept: list[str] = []    # a non-string value's decided text, in pieces
        self._search = 0          # where to look for the next </parameter> in _value
        self._after_tag = False   # _value ends in a possible </parameter> and blanks
        self._blanks: list[str] = []  # more blanks after it, not yet added to _value
        self._n_params = 0
        self._is_string = True
        self._lead = False
        self._end_tag = Markers(self.PARAM_END)

    def _step(self, buf: str) -> int | None:
        return getattr(self, "_s_" + self._state)(buf)

    def _s_text(self, buf: str) -> int | None:
        used, marker = self.scan_text(buf, self._open)
        if marker is not None:
            self._state, self._raw = "head", marker
        return used

    def _not_a_call(self, buf: str, used: int) -> int:
        self.text(self._raw + buf[:used])
        self._state = "text"
        return used

    def _s_head(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS)
        skipped = len(buf) - len(stripped)
        if not stripped or (self.FUNCTION.startswith(stripped) and stripped != self.FUNCTION):
            return None
        if not stripped.startswith(self.FUNCTION):
            return self._not_a_call(buf, skipped)
        close = stripped.find(">")
        if close < 0:
            return None if len(stripped) < 200 else self._not_a_call(buf, len(buf))
        name = stripped[len(self.FUNCTION):close].strip()
        used = skipped + close + 1
        if not self.tools.allows(name):
            return self._not_a_call(buf, used)
        self.begin_call(name)
        self._n_params, self._state = 0, "params"
        return used

    def _s_params(self, buf: str) -> int | None:
        stripped = buf.lstrip(_WS)
        skipped = len(buf) - len(stripped)
        if not stripped:
            return len(buf)
        for tag in (self.PARAM, self.FUNCTION_END, self.CLOSE):
            if stripped.startswith(tag):
                break
            if tag.startswith(stripped):
                return None
        else:
            self._close_call()              # not the format: close what we have
            self._state = "text"
            return skipped
        if tag == self.PARAM:
            close = stripped.find(">")
            if close < 0:
                return None
            self._param = stripped[len(self.PARAM):close].strip()
            self._open_member()
            return skipped + close + 1
        self._close_call()
        self._state = "tail" if tag == self.FUNCTION_END else "text"
        return skipped + len(tag)

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
        end = self._find_end()
        if end is None:                     # undecided: pass on what cannot be the end
            self._decide(self._safe_end())
            return used
        value_end, resume = end
        self._finish_value(self._value[:value_end])
        self.push_back(self._value[resume:])
        self._state, self._value = "params", ""
        return used

    def _find_end(self) -> tuple[int, int] | None:
        """(end of value, index after </parameter>) once an end tag is confirmed."""
        self._after_tag = False
        while True:
            pos = self._value.find(self.PARAM_END, self._search)
            if pos < 0:
                return None
            after = self._value[pos + len(self.PARAM_END):].lstrip(_WS)
            if not after:
                self._after_tag = True
                return None                 # wait: the next tag decides
            if any(t.startswith(after) and t != after
                   for t in (self.PARAM, self.FUNCTION_END, self.CLOSE)):
                return None
            if after.startswith((self.PARAM, self.FUNCTION_END, self.CLOSE)):
                return pos, pos + len(self.PARAM_END)
            self._search = pos + 1          # part of the value

    def _safe_end(self) -> int:
        end = self._value.find(self.PARAM_END, self._search)
        if end < 0:
            end = len(self._value) - self._end_tag.held(self._value)
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
        self.call_args(json.dumps(typed(value, kind), ensure_ascii=False))

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
        elif self._state == "head":
            self.text(self._raw + rest)
        elif self._state == "value" and self._call is not None:
            self._finish_value(self._value + "".join(self._blanks) + rest)
            self._close_call()
        else:
            self._close_call()


class Glm45Parser(ToolParser):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"

    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._open = Markers(self.OPEN)
        self._state = "text"
        self._raw = ""
        self._key = ""
        self._n_args = 0
        self._tag = ""                  # the open <arg_key> or <arg_value>
        self._item_text: list[str] = []     # its text so far, in pieces
        self._ends = {self.KEY: Markers(self.KEY_END), self.VALUE: Markers(self.VALUE_END)}

    def _step(self, buf: str) -> int | None:
        return getattr(self, "_s_" + self._state)(buf)

    def _s_text(self, buf: str) -> int | None:
        used, marker = self.scan_text(buf, self._open)
        if marker is not None:
            self._state, self._raw = "name", marker
        return used

    def _s_name(self, buf: str) -> int | None:
        ends = [i for i in (buf.find("\n"), buf.find(self.KEY), buf.find(self.CLOSE)) if i >= 0]
        if not ends:
            return None if len(buf) < 200 else self._not_a_call(buf, len(buf))
        end = min(ends)
        name = buf[:end].strip()
        if not name and buf[end] == "\n":
            self._raw += buf[:end + 1]
            return end + 1
        if not self.tools.allows(name):
            return self._not_a_call(buf, end)
        self.begin_call(name)
        self._n_args, self._state = 0, "args"
        return end

    def _not_a_call(self, buf: str, used: int) -> int:
        self.text(self._raw + buf[:used])
        self._state = "text"
        return used

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
        if stripped.startswith(self.CLOSE):
            self._close_call()
            self._state = "text"
            return skipped + len(self.CLOSE)
        if any(t.startswith(stripped) for t in (self.KEY, self.VALUE, self.CLOSE)):
            return None
        self._close_call()
        self._state = "text"
        return skipped

    def _s_item(self, buf: str) -> int | None:
        """A key's or value's text up to its end tag, looked for in new text only."""
        end_tag = self._ends[self._tag]
        pos, marker = end_tag.find(buf)
        if marker is None:
            safe = len(buf) - end_tag.held(buf)
            if safe:
                self._item_text.append(buf[:safe])
            return safe or None
        self._item(self._tag, "".join(self._item_text) + buf[:pos])
        self._item_text, self._state = [], "args"
        return pos + len(marker)

    def _item(self, tag: str, text: str) -> None:
        if tag == self.KEY:
            self._key = text.strip()
            return
        kind = self.tools.param_type(self._open_name, self._key)
        prefix = "{" if self._n_args == 0 else ", "
        self._n_args += 1
        self.call_args(f"{prefix}{json.dumps(self._key, ensure_ascii=False)}: "
                       f"{json.dumps(typed(text, kind), ensure_ascii=False)}")

    def _close_call(self) -> None:
        if self._call is not None:
            self.call_args("}" if self._n_args else "{}")
            self.end_call()

    def _finish(self, rest: str) -> None:
        if self._state == "text":
            self.text(rest)
        elif self._state == "name":
            self.text(self._raw + rest)
        else:
            self._close_call()
