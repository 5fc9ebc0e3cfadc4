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
objects and arrays are parsed, an object or array written as a Python literal too). A
Qwen3-Coder value may itself contain ``</parameter>``: the tag ends the value only when the
next tag (``<parameter=`` or ``</function>``) follows it. String values stream as they
arrive; other values are emitted when complete.

Hermes reads Qwen3-Coder's function block too (``XmlFunctionCalls``); GLM-4.5's calls are
recovered when an ``<arg_value>`` tag is left out or stray (docs/parsing.md, "Almost right,
round three").
"""

from __future__ import annotations

import json
import re
from typing import Any

from podium.parsing.scan import Markers, json_text
from podium.parsing.tools.base import (STRAY, ToolParser, ToolSet, double_decoded,
                                       python_container)

_WS = " \t\r\n"
NAME = re.compile(r"[\w.:\-]+")     # a function name (GLM-4.5 writes it bare)
NAME_LIMIT = 200                    # a tag's text without its ">" this long is prose


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
        pass
    literal = python_container(text, kind)       # {'a': 1, 'b': True}
    return value if literal is None else literal


def _tag_name(text: str) -> str:
    """A function or parameter name as written in a tag (quotes around it tolerated)."""
    return text.strip().strip("\"'").strip()


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


class XmlFunctionCalls(ToolParser):
    """Qwen3-Coder's function block, wherever a family meets it::

        <function=write_file>
        <parameter=path>
        a.py
        </parameter>
        </function>

    The Qwen3-Coder family's own calls, and the same form written inside (or without)
    Hermes's ``<tool_call>``: Qwen3-Coder models and some Qwen3 fine-tunes write it under a
    template Podium reads as Hermes. A family enters at the ``function`` state (its buffer
    starts with ``<function=``) and says where each way out of the block leads
    (``_function_ended``) and what a ``<function=`` that opens nothing is
    (``_not_a_function``).

    A block that ``<tool_call>`` did not open, in a family that does not own the form
    (``_fn_bare``), is a call only if a parameter or ``</function>`` follows the name:
    prose may mention ``<function=NAME>``.
    """

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    FUNCTION, FUNCTION_END = "<function=", "</function>"
    PARAM, PARAM_END = "<parameter=", "</parameter>"
    # what may end a value, and what must follow each (after blanks) for it to end it
    # (the end of the output always does): a value may hold any of them otherwise
    LINE_PARAM = "\n" + PARAM
    FOLLOW = {PARAM_END: (PARAM, FUNCTION_END, CLOSE, PARAM_END),
              FUNCTION_END: (CLOSE, OPEN, FUNCTION_END, PARAM_END), CLOSE: (OPEN, CLOSE),
              LINE_PARAM: ()}

    # Markers never change: made once, for every parser
    _FN_SKIP = Markers(OPEN, CLOSE, FUNCTION_END)
    _END_TAG = Markers(*FOLLOW)
    # The block's state: class-level defaults, set on an instance once it meets a block.
    # A Hermes parser seldom does, and a small instance keeps CPython's attribute access
    # on its fast path (past 30 attributes every delta of every call pays: 8% measured).
    _param = ""
    _value = ""               # the current parameter's undecided tail (see _s_value)
    _kept: list[str]          # a non-string value's decided text, in pieces (_open_member)
    _search = 0               # where to look for the next end tag in _value
    _after_tag = False        # _value ends in a possible end tag and blanks
    _blanks: list[str]        # more blanks after it, not yet added to _value (_open_member)
    _n_params = 0
    _is_string = True
    _lead = False
    _fn_bare = False          # the block's call is not certain yet (see the class doc)
    _fn_tag = ""              # ... its tag as written (content, if it opens nothing)
    _fn_name = ""

    def _function_ended(self, tag: str | None) -> None:
        """Set the state for what follows the block, which ended at ``tag`` (consumed):
        ``</function>``, ``</tool_call>``, ``<tool_call>``; or None: what follows is no
        part of the format (nothing consumed)."""
        raise NotImplementedError

    def _not_a_function(self, buf: str) -> int:
        """``buf`` starts with a ``<function=`` that opens no block (prose about it): how
        much of it was used (the tag at least, so that the text state does not find it
        again)."""
        raise NotImplementedError

    def _s_function(self, buf: str) -> int | None:
        """``<function=NAME>`` (``buf`` starts with ``<function=``)."""
        close = buf.find(">", 0, NAME_LIMIT)    # bounded: the same at any chunking
        if close < 0:
            return None if len(buf) < NAME_LIMIT else self._not_a_function(buf)
        name = _tag_name(buf[len(self.FUNCTION):close].split(self.FUNCTION)[-1])
        used = close + 1
        if not self._fn_bare:
            self._begin_function(name)
        elif NAME.fullmatch(name):
            self._fn_tag, self._fn_name, self._state = buf[:used], name, "fn_check"
        else:
            return self._not_a_function(buf)
        return used

    def _begin_function(self, name: str) -> None:
        if self.begin_declared(name):
            self._n_params, self._state = 0, "params"
        else:
            self._state = "fn_skip"

    def _s_fn_check(self, buf: str) -> int | None:
        """After a bare ``<function=NAME>`` (``_fn_bare``): a call if a parameter or
        ``</function>`` follows (after blanks); else the tag was prose, content as written."""
        blanks = self.hold_blanks(buf)
        if blanks:
            return blanks
        for tag in (self.PARAM, self.FUNCTION_END):
            if buf.startswith(tag):
                self.take_blanks()
                self.stray(f"{self.FUNCTION} without {self.OPEN}", "tool call")
                self._begin_function(self._fn_name)
                return 0
            if tag.startswith(buf):
                return None
        self.text(self._fn_tag + self.take_blanks())
        self._state = "text"
        return 0

    def _s_fn_skip(self, buf: str) -> int | None:
        """A call to an undeclared function, up to its ``</function>`` or ``</tool_call>``:
        dropped."""
        pos, marker = self._FN_SKIP.find(buf)
        if marker is None:
            safe = len(buf) - self._FN_SKIP.held(buf)
            return safe or None
        self._function_ended(marker)
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
            return self._not_params(skipped)     # not the format: close what we have
        if tag in (self.PARAM, self.FUNCTION):
            close = stripped.find(">", 0, NAME_LIMIT)
            if close < 0:
                return None if len(stripped) < NAME_LIMIT else self._not_params(skipped)
            if tag == self.FUNCTION:        # written twice: the call is already open
                self.stray(stripped[:close + 1], "tool call")
                return skipped + close + 1
            self._param = _tag_name(stripped[len(self.PARAM):close].split(self.PARAM)[-1])
            self._open_member()
            return skipped + close + 1
        if tag == self.PARAM_END:           # written twice
            self.stray(tag, "tool call")
            return skipped + len(tag)
        if tag == self.OPEN:                # the next call, this one left open
            return self._not_params(skipped)
        self._close_call()
        self._function_ended(tag)
        return skipped + len(tag)

    def _not_params(self, skipped: int) -> int:
        self._close_call()
        self._function_ended(None)
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
            pos, tag = self._END_TAG.find(self._value, self._search)
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
        end, tag = self._END_TAG.find(self._value, self._search)
        if tag is None:
            end = len(self._value) - self._END_TAG.held(self._value)
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

    def _function_finish(self, rest: str) -> bool:
        """The output ended in a state of the block (True; else False, nothing done)."""
        state = self._state
        if state == "value" and self._call is not None:
            self._value += "".join(self._blanks) + rest
            self._blanks = []
            end = self._find_end(at_end=True)
            if end is None:                  # cut short: what was written, not a tag's start
                value = self._value
                tail = value[len(value) - self._END_TAG.held(value):]
                if tail.startswith("<"):
                    value = value[:len(value) - len(tail)]
                self._finish_value(value)
            else:
                self._finish_value(self._value[:end[0]])
        elif state == "fn_check":            # cut right after the name
            if self.tools.allows(self._fn_name):
                self.take_blanks()
                self.begin_call(self._fn_name)
                self._n_params = 0
            else:
                self.text(self._fn_tag + self.take_blanks() + rest)
        elif state == "function":
            name = _tag_name(rest[len(self.FUNCTION):])
            if self._fn_bare and name and not NAME.fullmatch(name):
                self.text(rest)
            else:
                self.stray(rest, "tool call (cut short)")
        elif state not in ("params", "value", "fn_skip"):
            return False
        self._close_call()
        return True


class Qwen3CoderParser(XmlFunctionCalls):
    MARKUP = (XmlFunctionCalls.OPEN, XmlFunctionCalls.CLOSE, XmlFunctionCalls.FUNCTION,
              XmlFunctionCalls.FUNCTION_END, XmlFunctionCalls.PARAM,
              XmlFunctionCalls.PARAM_END)

    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._text_marks = Markers(*self.MARKUP)
        self._state = "text"

    def _step(self, buf: str) -> int | None:
        return getattr(self, "_s_" + self._state)(buf)

    def _s_text(self, buf: str) -> int | None:
        used, marker = self.scan_text(buf, self._text_marks, (self.OPEN, self.FUNCTION))
        if marker == self.OPEN:
            self._state = "head"
        elif marker == self.FUNCTION:        # <tool_call> left out: the function names it
            self.stray("<function= without <tool_call>", "tool call")
            self._state = "function"
            self.push_back(marker)
        return used

    def _mention(self, buf: str, used: int) -> int:
        """``<tool_call>`` opened no function (prose about it): the tag goes, text stays."""
        self.stray(self.OPEN)
        self.text(buf[:used])
        self._state = "text"
        return used

    def _not_a_function(self, buf: str) -> int:
        """The tag is this family's markup: it goes, the prose after it stays."""
        self.stray(self.FUNCTION)
        self._state = "text"
        return len(self.FUNCTION)

    def _function_ended(self, tag: str | None) -> None:
        self._state = {self.FUNCTION_END: "tail", self.OPEN: "head"}.get(tag or "", "text")

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
        self._state = "function"
        return skipped

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
        elif not self._function_finish(rest):
            self._close_call()


class Glm45Parser(ToolParser):
    """GLM-4.5 / 4.6 / 4.7 (4.7 may leave the newlines out). A value whose ``<arg_value>``
    was left out (GLM-4.7 does, under load) is the text after its key, to
    ``</arg_value>`` or the next tag; a stray ``</arg_value>`` (or ``</arg_key>``) is
    dropped, after the name too; a value with no key before it is dropped (whose would it
    be?)."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
    MARKUP = (OPEN, CLOSE, KEY, KEY_END, VALUE, VALUE_END)

    def __init__(self, tools: ToolSet):
        super().__init__(tools)
        self._text_marks = Markers(*self.MARKUP)
        self._skip_marks = Markers(self.OPEN, self.CLOSE)
        self._name_ends = Markers("\n", *self.MARKUP)
        self._state = "text"
        self._key: str | None = None    # the key read, while its value is to come
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
        self._n_args, self._state, self._key = 0, "args", None
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
        if self._key is not None:       # <arg_value> left out: the key's value follows
            self.stray(f"{self.VALUE} left out", "tool call")
            self._tag, self._item_text, self._state = self.VALUE, [], "item"
            return skipped
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
        key, self._key = self._key, None
        if key is None:
            self.stray(f"{self.VALUE} without a key", "tool call")
            return
        kind = self.tools.param_type(self._open_name, key)
        prefix = "{" if self._n_args == 0 else ", "
        self._n_args += 1
        self.call_args(f"{prefix}{json_text(key)}: {json_text(typed(text, kind))}")

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
