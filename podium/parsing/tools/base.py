"""What every tool-call parser shares: the declared tools, call bookkeeping, content text.

A tool parser reads the model's visible text (reasoning is already split off) and turns it
into ``TextDelta`` and ``ToolCall*`` events. ``feed`` and ``flush`` are its whole surface.
Subclasses implement ``_step(buffer)``: act on the start of the unprocessed buffer and return
how many characters they used (0 is fine after a change of state), or None to wait for more.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

from podium.parsing.events import Event, TextDelta, ToolCallArgsDelta, ToolCallBegin, ToolCallEnd
from podium.parsing.scan import JsonPrefix, JsonValue, Markers, json_text, split_escapes
from podium.parsing.tools.jsoncall import JsonCall, Lane, string_arguments

log = logging.getLogger(__name__)
_WS = " \t\r\n"
STRAY = "\"'}])"       # what a model leaves after a call's JSON: dropped, never content
# What a model leaves right after a call, as text: the end of its turn (each chat format's
# end token, written out instead of sampled as the special token), a reasoning close tag
# written again. Dropped there, before any other content (see ``ToolParser._after_call``).
LEFTOVERS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "</s>", "<|endoftext|>",
             "<|end_of_text|>", "<｜end▁of▁sentence｜>", "<|return|>", "<|call|>",
             "<end_of_turn>", "<|END_OF_TURN_TOKEN|>", "</think>", "[/THINK]")
FENCE = "```"
# Content that ends in a code fence's opener (or the start of one): held, and dropped if a
# call follows it (the fence was around the call), else released with what follows.
_FENCE_TAIL = re.compile(r"```[\w+.-]*[ \t]*\n?[ \t]*\Z|(?<!`)`{1,2}\Z")


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class ToolSet:
    """The function tools a request declared, and how many calls it allows."""

    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)   # name -> parameters
    max_calls: int | None = None            # 1 when parallel_tool_calls is false
    new_id: Callable[[], str] = new_call_id

    def allows(self, name: str | None) -> bool:
        return bool(name) and name in self.schemas

    def param_type(self, function: str, param: str) -> Any:
        props = _field(self.schemas.get(function), "properties")
        return schema_type(_field(props, param))


def schema_type(schema: dict[str, Any]) -> Any:
    """A parameter schema's ``type``; without one, what the schema says all the same: an
    object (``properties``), an array (``items``), or the types of its ``anyOf`` /
    ``oneOf`` (``Optional[dict]`` in pydantic's schemas), as a list."""
    kind = schema.get("type")
    if kind is not None:
        return kind
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    options = schema.get("anyOf") or schema.get("oneOf")
    kinds = [schema_type(s) for s in options if isinstance(s, dict)] \
        if isinstance(options, list) else []
    flat = [k for kind in kinds for k in (kind if isinstance(kind, list) else [kind]) if k]
    return flat or None


class ToolParser:
    """Base: buffering, content text, and opening / streaming / closing calls.

    ``MARKUP`` is the family's structure (its delimiters): it never reaches content. Text
    states scan for it with ``scan_text`` and drop what does not open a call.
    """

    MARKUP: tuple[str, ...] = ()
    _state: str                 # the family's state machine (``_step``), if it keeps one here
    # The state in which the family's step is ``call_object(buf)`` alone (then "more": all
    # of ``buf`` used; what it keeps of a call object before its name is empty once named)
    # when ``buf`` holds no ``LANE_GUARD`` (if any): ``feed``'s fast path for the arguments
    # object's text there (see ``feed``).
    LANE_STATE = ""
    LANE_GUARD = ""

    def __init__(self, tools: ToolSet):
        self.tools = tools
        self.calls = 0              # calls begun (and kept)
        self._buf = ""
        self._back = ""             # text a step handed back, processed next
        self._out: list[Event] = []
        self._ws: list[str] = []    # whitespace held until we know it is not before a call
        self._gap: list[str] = []   # blanks a state set aside while it waits (hold_blanks)
        self._call: _OpenCall | None = None
        self._dropping = False      # a call beyond max_calls: parsed, never shown
        self._skip: JsonValue | None = None     # a dropped call's JSON, followed to its end
        self._guard = Markers(*self.MARKUP) if self.MARKUP else None    # see text()
        self._guard_tail = ""       # content that may begin a marker with what follows
        self._fast_state = ""       # see fast_text()
        self._fast: Markers | None = None
        # "" (content as it comes), "after" (right after a call: leftovers are dropped, see
        # _after_call), "fence" (held content ends in a fence: see _tidy_plain)
        self._tidy = ""
        self._tidy_held = ""        # the start of what may be a leftover, after a call

    def add_markup(self, *markup: str) -> None:
        """More strings that never reach content (the reasoning parser's close tag written
        again in the answer): the last guard drops them, and the fast path looks for them."""
        markup = tuple(m for m in markup if m and (self._guard is None
                                                   or m not in self._guard.markers))
        if not markup:
            return
        self._guard = Markers(*(self._guard.markers if self._guard else ()), *markup)
        if self._fast is not None:
            self._fast = Markers(*self._fast.markers, *markup)

    def fast_text(self, state: str, marks: Markers) -> None:
        """Take ``feed``'s fast path in ``state``: the family's step there is
        ``scan_text(buf, marks, ...)``, and nothing else (call it once ``_guard`` is set)."""
        guard = self._guard.markers if self._guard is not None else ()
        if not set(guard) <= set(marks.markers):
            marks = Markers(*marks.markers, *guard)
        self._fast_state, self._fast = state, marks

    # -- the parser surface -------------------------------------------------------------

    def feed(self, text: str) -> list[Event]:
        fast = self._fast
        if (fast is not None and self._state == self._fast_state and not self._buf
                and not self._back and not self._guard_tail and text and fast.absent(text)):
            # Nearly every token of an answer's text: nothing buffered, no marker nor the
            # start of one in it (the state's or the guard's), so scan_text() and text()
            # would find nothing after their scans: it is content as it stands.
            self._plain(text)
            out, self._out = self._out, []
            return out
        if (self.LANE_STATE and self._state == self.LANE_STATE and text and not self._buf
                and not self._back):
            json_call = self._json
            if (json_call.lane is not None and (not self.LANE_GUARD or self.LANE_GUARD not in text)
                    and json_call.feed_args(text)):
                # Nearly every token of a call's arguments: the arguments object is read with
                # the open call's own validator, and the step's first move would be to feed
                # it all of ``text`` (call_object -> JsonCall.feed -> feed_args). Taken ahead
                # of the step: if it took all and the object goes on, that was all the step
                # would do; else the step's feed goes on from where it stopped.
                out, self._out = self._out, []
                return out
        buf = self._buf + text if self._buf else text
        step = self._step
        while buf:
            used = step(buf)
            if used is None:
                break
            if self._back:
                buf, self._back = self._back + buf[used:], ""
            else:
                buf = buf[used:]
        self._buf = buf
        out, self._out = self._out, []
        return out

    def flush(self) -> list[Event]:
        """The output ended: finish what is open, release what was held."""
        rest, self._buf = self._buf, ""
        self._finish(rest)
        if self._guard_tail:            # the output ended: no marker can follow
            tail, self._guard, self._guard_tail = self._guard_tail, None, ""
            if cut_markup(tail):
                self.stray(tail, "content (a marker cut short at the end)")
            else:
                self.text(tail)
        if self._tidy_held:             # the start of a leftover, cut short
            held, self._tidy_held = self._tidy_held, ""
            if len(held) >= 2:
                self.stray(held, "content after a tool call")
            else:
                self._plain(held)
        if self._call is not None:
            self.end_call()
        held = "".join(self._ws)
        if self._tidy == "fence":           # a fence, then the end: it closed a code block
            held = held.rstrip() if self.calls else held
        elif self.calls:                    # blanks after the last call
            held = ""
        if held:
            self._out.append(TextDelta(held))
        self._ws, self._tidy = [], ""
        out, self._out = self._out, []
        return out

    def _step(self, buf: str) -> int | None:
        raise NotImplementedError

    def _finish(self, rest: str) -> None:
        """End of output with ``rest`` unprocessed: release or close what is pending."""
        self.text(rest)

    def push_back(self, text: str) -> None:
        """Return ``text`` (already consumed by this step) to the front of the buffer."""
        self._back = text

    def hold_blanks(self, buf: str, chars: str | None = _WS) -> int:
        """Set the blanks that start ``buf`` aside; how many. A state that must see what
        follows blanks takes them off at once instead of waiting with them in its buffer
        (rescanned with every delta of a long run); ``take_blanks`` gives them back."""
        n = len(buf) - len(buf.lstrip(chars))
        if n:
            self._gap.append(buf[:n])
        return n

    def take_blanks(self) -> str:
        gap, self._gap = "".join(self._gap), []
        return gap

    def scan_text(self, buf: str, markers: Markers,
                  openers: tuple[str, ...] | None = None) -> tuple[int | None, str | None]:
        """Content up to the first marker: (characters used, the marker found or None).

        With ``openers``, a marker that is not one of them is stray markup: it is dropped
        (logged) and the scan goes on as if it had not been there (the marker is None)."""
        pos, marker = markers.find(buf)
        if marker is None:
            safe = len(buf) - markers.held(buf)
            self.text(buf[:safe])
            return (safe or None), None
        self.text(buf[:pos])
        if openers is not None and marker not in openers:
            self.stray(marker)
            return pos + len(marker), None
        return pos + len(marker), marker

    # -- malformed output (docs/parsing.md, "Malformed model output") ---------------------

    def stray(self, markup: str, where: str = "content") -> None:
        """Markup out of place (a doubled, unmatched or unfinished delimiter): dropped."""
        log.warning("dropped stray %r from the model's %s", markup, where)

    def drop_call(self, name: str | None, why: str = "not a declared tool") -> None:
        """A call that cannot be kept: nothing of it (markup or text) reaches the answer."""
        log.warning("dropped a tool call%s: %s", f" to {name!r}" if name else "", why)
        self._held_before_call()
        self.called()

    def begin_declared(self, name: str) -> bool:
        """A call to ``name`` begins if the request declared that tool; else it is dropped
        (logged), and the family skips what the model wrote for it. Whether it began."""
        if self.tools.allows(name):
            self.begin_call(name)
            return True
        self.drop_call(name)
        return False

    def keep_unnamed(self, raw: list[str], text: str) -> None:
        """More of the call object being read (``call_object``: "more"): kept in ``raw``
        while it names no tool (if it names none declared, ``drop_call_object`` skips it
        whole); once named, nothing is kept."""
        if self._json.name is None:
            raw.append(text)
        else:
            raw.clear()

    def drop_call_object(self, raw: list[str], buf: str, used: int) -> bool:
        """The call object being read names no declared tool (``call_object``: "no call"):
        the call is dropped (logged), and its JSON, ``raw`` (the object's text before this
        step, emptied here) then ``buf[:used]``, skipped to its end. True if it goes on past
        ``buf`` (``skipping`` takes the rest); False if it ended (what followed is given
        back: ``push_back``)."""
        self.drop_call(self._json.seen_name, self._json.why)
        text = "".join(raw) + buf[:used]
        raw.clear()
        end = self.skip_json(text)
        if end < 0:
            return True
        self.push_back(text[end:])
        return False

    def skip_stray(self, buf: str) -> int:
        """How many of the characters that start ``buf`` are a stray quote, brace or bracket
        left after a call's JSON (dropped, logged once per run)."""
        n = len(buf) - len(buf.lstrip(STRAY))
        if n:
            self.stray(buf[:n], "tool call")
        return n

    def skip_json(self, text: str) -> int:
        """Start skipping a dropped call's JSON value with ``text`` (the value's text so
        far, and perhaps more): the index in ``text`` just past its end, or -1 if it goes
        on (then ``skipping`` takes the rest)."""
        self._skip = JsonValue()
        return self.skipping(text)

    def skipping(self, buf: str) -> int:
        """More of a skipped JSON value: the index just past its end, or -1 (all used)."""
        assert self._skip is not None
        end = self._skip.feed(buf)
        self._skip._parts.clear()           # followed, never kept
        if end >= 0:
            self._skip = None
        return end

    # -- helpers for subclasses ----------------------------------------------------------

    def text(self, text: str) -> None:
        """Content; whitespace right before a call (or after the last one) is dropped.

        Trailing whitespace is held until more text shows it is not before a call. The
        family's markup never passes: the states drop what is out of place, and this last
        guard drops what their pieces would make again when joined (``a[`` + ``ARGS]``).
        """
        if self._guard is not None:
            text = self._guarded(text)
        if text:
            self._plain(text)

    def _plain(self, text: str) -> None:
        """Content past the guard (not empty): trailing whitespace is held (see ``text``)."""
        if self._tidy or "`" in text:
            self._tidy_plain(text)
            return
        body = text.rstrip()
        if not body:
            self._ws.append(text)       # pieces: a run of blank deltas is joined once
            return
        self._out.append(TextDelta("".join(self._ws) + body if self._ws else body))
        self._ws = [text[len(body):]] if len(body) < len(text) else []

    def _tidy_plain(self, text: str) -> None:
        """``_plain`` right after a call (leftovers dropped), or with a code fence at the end
        of the content: held like trailing blanks (a call right after it drops it), and
        looked at again with what follows (a fence's language comes in pieces)."""
        if self._tidy == "after":
            text = self._after_call(text)
            if self._tidy == "after":       # blanks alone so far: the next text decides
                if text:
                    self._ws.append(text)
                return
        elif self._tidy == "fence":
            text, self._ws = "".join(self._ws) + text, []
        self._tidy = ""
        body = text.rstrip()
        if not body:
            self._ws.append(text)
            return
        held = text[len(body):]
        fence = _FENCE_TAIL.search(body) if "`" in body else None
        if fence is not None:
            body, held = body[:fence.start()], body[fence.start():] + held
            lead = body.rstrip()            # blanks before the fence go with it
            body, held = lead, body[len(lead):] + held
            self._tidy = "fence"
        if body:
            self._out.append(TextDelta("".join(self._ws) + body if self._ws else body))
            self._ws = []
        if held:
            self._ws.append(held)

    def _after_call(self, text: str) -> str:
        """Content right after a call, with what a model leaves there as text dropped (an
        end token, a reasoning close tag, a bare closing fence; see ``LEFTOVERS``). What
        may still become one waits; the first other content ends this."""
        if self._tidy_held:
            text, self._tidy_held = self._tidy_held + text, ""
        i = 0
        while True:
            j = i
            while j < len(text) and text[j] in _WS:
                j += 1
            rest = text[j:]
            if not rest:
                return text
            token = next((t for t in LEFTOVERS if rest.startswith(t)), None)
            if token is not None:
                self.stray(token, "content after a tool call")
                text, i = text[:j] + rest[len(token):], j
                continue
            if rest.startswith(FENCE):
                after = rest[3:]
                newline = after.find("\n")
                line = after if newline < 0 else after[:newline]
                if newline >= 0 and not line.strip(_WS):      # a bare fence line
                    self.stray(FENCE, "content after a tool call")
                    text, i = text[:j] + after[newline + 1:], j
                    continue
                if any(after.startswith(t) for t in LEFTOVERS):     # ```<|im_end|>
                    self.stray(FENCE, "content after a tool call")
                    text, i = text[:j] + after, j
                    continue
                if not line.strip(_WS + "`") or any(t.startswith(after) for t in LEFTOVERS):
                    self._tidy_held = rest          # what follows decides
                    return text[:j]
                break                               # a code block opens: content
            if any(t.startswith(rest) for t in (*LEFTOVERS, FENCE)):
                self._tidy_held = rest
                return text[:j]
            break
        self._tidy = ""
        return text

    def _guarded(self, text: str) -> str:
        guard = self._guard
        assert guard is not None
        if self._guard_tail:
            text, self._guard_tail = self._guard_tail + text, ""
        pos, marker = guard.find(text)
        while marker is not None:
            self.stray(marker)
            text = text[:pos] + text[pos + len(marker):]
            pos, marker = guard.find(text, max(0, pos - len(marker)))
        held = guard.held(text)
        if held:
            self._guard_tail, text = text[len(text) - held:], text[:len(text) - held]
        return text

    def called(self) -> None:
        """A call just ended (here, or in the parser that handed the text over): what
        follows is looked at for leftovers first (see ``_after_call``)."""
        self._tidy = "after"

    def _held_before_call(self) -> None:
        """A call begins (or one was dropped): what content held back before it goes (blanks,
        a fence opened around the call)."""
        if self._tidy == "fence":
            self.stray(FENCE, "content before a tool call")
        self._ws, self._tidy = [], ""

    @property
    def _open_name(self) -> str:
        """The name of the call being written (states that read arguments have one)."""
        assert self._call is not None
        return self._call.name

    def begin_call(self, name: str) -> None:
        self._held_before_call()
        if self.tools.max_calls is not None and self.calls >= self.tools.max_calls:
            log.warning("dropping tool call %r: parallel_tool_calls is false", name)
            self._dropping = True
            self._call = _OpenCall(-1, "", name)
            return
        self._dropping = False
        self._call = _OpenCall(self.calls, self.tools.new_id(), name)
        self.calls += 1
        self._out.append(ToolCallBegin(self._call.index, self._call.id, name))

    def call_args(self, text: str) -> None:
        """Stream argument text, as far as it stays a valid JSON prefix."""
        call = self._call
        if not text or call is None:
            return
        if not call.parts and not call.json.broken:     # arguments are an object, or {}
            text = text.lstrip(_WS)
            if not text:
                return
            if text[0] != "{":
                call.json.broken = call.warned = True
                log.warning("tool call %r: arguments are not a JSON object; sent as {}",
                            call.name)
                return
        n = call.json.feed(text)
        accepted = text if n == len(text) else text[:n]
        if call.json.broken and not call.warned:
            call.warned = True
            log.warning("tool call %r has malformed arguments; keeping the valid part",
                        call.name)
        self._append(call, accepted)

    def end_call(self) -> None:
        """Close the open call; arguments cut short or malformed are completed to valid JSON
        (always an object)."""
        call, self._call = self._call, None
        if call is None:
            return
        self.called()
        held, call.hold = call.hold, ""          # a cut escape, a comma: never completed
        fix = call.json.completion() if call.parts else "{}"
        if (fix or held.strip(_WS)) and call.parts and not call.warned:
            log.warning("tool call %r was cut short; closed as valid JSON", call.name)
        call.json.attention, call.json.out = False, None
        self._emit(call, fix)
        if not self._dropping:
            self._out.append(ToolCallEnd(call.index, "".join(call.parts)))
        self._dropping = False

    def _append(self, call: "_OpenCall", text: str) -> None:
        """Argument text the call's validator accepted. What it flagged (``attention``)
        is looked at first: Python literals it converted, commas it dropped or holds, and
        escapes (one cut short waits for its end, a lone surrogate is replaced)."""
        if call.json.attention:               # (it stays set while text is held)
            text = self._held_back(call, text)
        if text:                                # _emit, inline: nearly every token comes here
            call.parts.append(text)
            if not self._dropping:
                self._out.append(ToolCallArgsDelta(call.index, text))

    def _emit(self, call: "_OpenCall", text: str) -> None:
        if text:
            call.parts.append(text)
            if not self._dropping:
                self._out.append(ToolCallArgsDelta(call.index, text))

    def _held_back(self, call: "_OpenCall", text: str) -> str:
        prefix = call.json
        prefix.attention = False
        if prefix.out is not None:              # Python literals: the JSON made of them
            text, prefix.out = prefix.out, None
        offset = len(call.hold)
        text, call.hold = call.hold + text, ""
        if prefix.closers:                      # a comma right before a closer goes
            for at in reversed(prefix.closers):
                k = text.rfind(",", 0, offset + at)
                text = text[:k] + text[k + 1:]
            prefix.closers = []
            if not call.warned:
                log.warning("tool call %r: dropped a comma before a closing bracket",
                            call.name)
        comma = ""
        if prefix.comma_pending:                # held until a key or value follows it
            at = text.rfind(",")
            text, comma = text[:at], text[at:]
        if "\\" in text:
            text, call.hold, lone = split_escapes(text)
            if lone:
                log.warning("tool call %r: replaced %d lone surrogate escape(s) with "
                            "U+FFFD", call.name, lone)
        call.hold += comma
        prefix.attention = bool(call.hold)      # the next text joins what is held
        return text

    def start_call_object(self) -> None:
        """Expect a ``{"name": ..., "arguments": ...}`` object next (see ``call_object``)."""
        self._json = JsonCall(self.tools.allows, self.begin_call, self.call_args,
                              self._args_lane)

    def _args_lane(self) -> Lane:
        """The open call's validator for a call object's arguments object, if nothing was
        written to the call yet (its arguments are then exactly that object's text): the
        object's reader checks them with it, once, and hands over what it accepted
        (``call_args`` would only check it again and pass it on)."""
        call = self._call
        if call is None or call.parts or call.json.broken:
            return None

        def accepted(text: str) -> None:
            if self._call is call:
                self._append(call, text)
            else:                           # the call was closed meanwhile: as before
                self.call_args(text)
        return call.json, accepted

    def call_object(self, buf: str) -> tuple[str, int]:
        """Feed the expected call object; (outcome, characters used). Outcomes: "more" (all
        used, not finished), "done" (the call is complete), "no call" (not a call object or
        an undeclared name: nothing was begun), "broken" (begun, then malformed: closed as
        valid JSON)."""
        json_call = self._json
        end = json_call.feed(buf)
        if json_call.failed:
            if json_call.name is None:
                return "no call", json_call.stopped_at
            if self._call is not None:
                self.end_call()
            return "broken", json_call.stopped_at
        if end < 0:
            return "more", len(buf)
        self.end_call()
        return "done", end

    def emit_whole_call(self, name: str, arguments: Any) -> None:
        """A call known all at once (pythonic lists), if its tool was declared (else
        dropped: see ``begin_declared``)."""
        if self.begin_declared(name):
            self.call_args(json_text(arguments))
            self.end_call()

    def value_args(self, args: JsonValue, text: str) -> int:
        """More of a call's arguments written as one JSON value (``args`` follows it): the
        index in ``text`` just past its end, or -1. An object streams as written; a JSON
        string holding the object (double-encoded) is decoded once it is whole."""
        end = args.feed(text)
        if args.kind == "string":
            if end >= 0:
                self.call_args(string_arguments(args.text))
                args._parts.clear()
            return end
        self.call_args(args.last)
        args._parts.clear()
        return end


@dataclass
class _OpenCall:
    index: int
    id: str
    name: str
    parts: list[str] = field(default_factory=list)
    json: JsonPrefix = field(default_factory=JsonPrefix)
    warned: bool = False
    hold: str = ""          # accepted text not passed on yet (see ToolParser._append)


def _field(schema: Any, key: str) -> dict[str, Any]:
    """``schema[key]`` if both are objects (a schema may be ``true``, or malformed), else {}."""
    value = schema.get(key) if isinstance(schema, dict) else None
    return value if isinstance(value, dict) else {}


def double_decoded(value: Any, kind: Any) -> Any:
    """A value the schema types as an object or array, written as a JSON string holding
    it (double-encoded, or a Python literal in the string): the value it holds; anything
    else as it is."""
    wanted = _containers(kind)
    if not isinstance(value, str) or not wanted:
        return value
    try:
        inner = json.loads(value)
    except ValueError:
        inner = python_container(value, kind)
    return inner if isinstance(inner, wanted) else value


# ``ast.literal_eval`` builds a syntax tree many times its text's size (and the text was
# the model's): longer Python literals stay text
PY_LITERAL_LIMIT = 100_000


def python_container(text: str, kind: Any) -> Any:
    """A value the schema types as an object or array, written as a Python literal where
    JSON failed (``{'a': 1, 'b': True}``, ``[1, 'x', None]``): the JSON value it means, or
    None. Bounded: literals only (``ast.literal_eval`` runs no code), at most
    ``PY_LITERAL_LIMIT`` characters, and only what JSON holds (a tuple is a list; a set,
    bytes, a complex number, an infinity or a non-string key: None)."""
    wanted = _containers(kind)
    text = text.strip()
    if not wanted or len(text) > PY_LITERAL_LIMIT or text[:1] not in "{[(":
        return None
    try:
        value = _jsonable(ast.literal_eval(text))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, wanted) else None


def _containers(kind: Any) -> tuple[type, ...]:
    """The Python types of the containers a schema type names (``object``, ``array``)."""
    kinds = kind if isinstance(kind, list) else [kind]
    return tuple(t for k, t in (("object", dict), ("array", list)) if k in kinds)


def _jsonable(value: Any) -> Any:
    """A Python literal's value as JSON's (raises ValueError where JSON has none)."""
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("a key that is no string")
        return {k: _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise ValueError(f"no JSON value: {type(value).__name__}")


def cut_markup(tail: str) -> bool:
    """A held start of a marker, at the end of the output: markup cut short (dropped), not
    text (``<｜tool▁calls`` is; ``a [`` is not)? Three characters, or one a text never
    holds (a full-width bar)."""
    return len(tail) >= 3 or not tail.isascii()
