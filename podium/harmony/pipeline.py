"""A Harmony model's tokens to Podium's events, parsed token by token by openai-harmony.

It takes the place of the text pipeline and output parser of other families (the engine
outputs of one choice in, semantic events out: a ``podium.stream.ChoiceStream``), because
Harmony's structure lives in special tokens, not in text:

- ``analysis`` messages are reasoning;
- ``final`` messages, and ``commentary`` messages without a recipient (preambles), are text;
- ``commentary`` messages to ``functions.NAME`` are tool calls, their arguments streamed.

The choice ends at ``<|return|>`` (stop), ``<|call|>`` (tool_calls), a stop string in the
text, or the token limit (length; an open call is closed as valid JSON).

Malformed turns (docs/parsing.md, "Malformed model output"): a message left open before the
next ``<|start|>`` or ``<|channel|>`` is closed there; a left-out ``<|start|>assistant`` is
put back; a ``<|start|>`` inside a header starts it again; a stray ``<|message|>`` or
``<|constrain|>`` in a message, and any other special token there, is dropped (never text);
a recipient that names a declared function without ``functions.`` is that function; other
recipients are dropped; anything else malformed skips to the next ``<|start|>``.
"""

from __future__ import annotations

import logging
import re

from podium.engine.base import EngineOutput, TokenLogprob
from podium.harmony.format import Harmony
from podium.parsing.events import Event, Finish, ReasoningDelta, TextDelta, Usage
from podium.parsing.tools.base import ToolParser, ToolSet
from podium.text.stop import StopMatcher

log = logging.getLogger(__name__)

_REASONING, _TEXT, _CALL, _DROP = range(4)
_SPECIAL = re.compile(r"<\|[a-z_0-9]+\|>")      # one special token's text


class _Calls(ToolParser):
    """The call bookkeeping every tool parser shares, driven by Harmony's structure."""

    def take(self) -> list[Event]:
        out, self._out = self._out, []
        return out


class HarmonyPipeline:
    def __init__(self, harmony: Harmony, tools: ToolSet | None = None,
                 stop: list[str] | None = None, want_logprobs: bool = False,
                 prompt_tokens: int = 0):
        self._harmony = harmony
        self._parser = harmony.stream_parser()
        self._calls = _Calls(tools or ToolSet())
        self._may_call = tools is not None
        self._stops = StopMatcher(stop) if stop else None
        self._want_logprobs = want_logprobs
        self._logprobs: list[TokenLogprob] = []     # waiting for visible text
        self._kind: int | None = None               # what the open message is
        self._streamed = False                       # the open message showed content
        self._messages = 0
        self._resync = False                         # skipping malformed tokens
        self.completion_tokens = 0
        self.reasoning_tokens = 0
        self.finished = False
        self.cached_tokens = 0
        self.cache_written = 0
        self._prompt_tokens = prompt_tokens
        self._usage_sent = False

    def feed(self, out: EngineOutput) -> list[Event]:
        self.completion_tokens += len(out.token_ids)
        if out.cached_tokens or out.cache_written:
            self.cached_tokens, self.cache_written = out.cached_tokens, out.cache_written
        events: list[Event] = []
        for i, token in enumerate(out.token_ids):
            logprob = out.logprobs[i] if self._want_logprobs and out.logprobs else None
            self._token(token, logprob, events)
            if self.finished:
                return events
        if out.finish_reason is not None:
            self._end(events, out.finish_reason)
        return events

    # -- one token ------------------------------------------------------------------------

    def _token(self, token: int, logprob: TokenLogprob | None, events: list[Event]) -> None:
        parser = self._parser
        if self._resync:
            if token != self._harmony.start_token:
                return
            self._parser = parser = self._harmony.stream_parser(resume=True)
            self._messages = 0
            self._resync = False
        try:
            if not self._repair(token, events):
                return
            parser = self._parser
            parser.process(token)
        except self._harmony.error as exc:
            log.warning("malformed Harmony output (%s); skipping to the next message", exc)
            self._close(events)
            self._resync = True
            return
        if self._kind is None and parser.state == self._harmony.content_state:
            self._open(parser.current_channel, parser.current_recipient, events)
        delta = parser.last_content_delta
        if delta and _SPECIAL.fullmatch(delta):         # never text
            log.warning("dropped stray %r from a Harmony message", delta)
            delta = None
        if self._kind == _REASONING:
            self.reasoning_tokens += 1
        if delta:
            self._content(self._kind, delta, logprob, events)
        elif logprob is not None and self._kind == _TEXT:
            self._logprobs.append(logprob)
        if len(parser.messages) > self._messages:
            self._messages = len(parser.messages)
            self._close(events, parser.messages[-1])

    def _repair(self, token: int, events: list[Event]) -> bool:
        """Put a malformed turn's structure right before ``token``; False: drop ``token``."""
        hm, parser = self._harmony, self._parser
        state = parser.state
        if state == hm.content_state:
            if token in (hm.start_token, hm.channel_token):     # the message left open
                log.warning("a Harmony message was left open; closed at the next one")
                self._synthetic([hm.end_token], events)
                if token == hm.channel_token:
                    self._synthetic([hm.start_token, *hm.assistant_tokens], events)
            elif token in (hm.message_token, hm.constrain_token):
                log.warning("dropped a stray Harmony header token from a message")
                return False
        elif state == hm.expect_start_state and token == hm.channel_token:
            log.warning("a Harmony message without <|start|>assistant; read as one")
            self._synthetic([hm.start_token, *hm.assistant_tokens], events)
        elif state == hm.header_state and token == hm.start_token:
            log.warning("a Harmony header started again; the first one dropped")
            self._parser = hm.stream_parser(resume=True)
            self._messages = 0
        return True

    def _synthetic(self, tokens: list[int], events: list[Event]) -> None:
        """Tokens the model left out, given to openai-harmony's parser (not counted)."""
        parser = self._parser
        for token in tokens:
            parser.process(token)
            if len(parser.messages) > self._messages:
                self._messages = len(parser.messages)
                self._close(events, parser.messages[-1])

    def _open(self, channel: str | None, recipient: str | None, events: list[Event]) -> None:
        self._streamed = False
        if recipient and recipient != "assistant":
            name = recipient.removeprefix("functions.")
            namespaced = recipient.startswith("functions.") or "." not in recipient
            if self._may_call and namespaced and self._calls.tools.allows(name):
                if not recipient.startswith("functions."):
                    log.warning("a call to %r without functions.: read as a call", name)
                self._kind = _CALL
                self._calls.begin_call(name)
                events += self._calls.take()
            else:
                log.warning("dropping a call to %r: not a declared function", recipient)
                self._kind = _DROP
        elif channel == "analysis":
            self._kind = _REASONING
        else:
            self._kind = _TEXT

    def _content(self, kind: int | None, delta: str, logprob: TokenLogprob | None,
                 events: list[Event]) -> None:
        self._streamed = True
        if kind == _REASONING:
            events.append(ReasoningDelta(delta))
        elif kind == _TEXT:
            if logprob is not None:
                self._logprobs.append(logprob)
            self._text(self._stops.feed(delta) if self._stops else delta, events)
            if self._stops is not None and self._stops.stopped:
                self._end(events, "stop")
        elif kind == _CALL:
            self._calls.call_args(delta)
            events += self._calls.take()

    def _text(self, text: str, events: list[Event]) -> None:
        if text:
            events.append(TextDelta(text, self._logprobs or None))
            self._logprobs = []

    def _close(self, events: list[Event], message=None) -> None:
        """The open message ended (or was cut off)."""
        kind, self._kind = self._kind, None
        if kind is None and message is not None:
            # A message whose header never closed (non-strict parsing): its text is content.
            kind = _TEXT
        if not self._streamed and message is not None and kind in (_TEXT, _REASONING):
            whole = "".join(getattr(part, "text", "") for part in message.content)
            if whole:
                self._content(kind, whole, None, events)
        if kind == _TEXT and self._stops is not None and not self._stops.stopped:
            self._text(self._stops.flush(), events)
        elif kind == _CALL:
            self._calls.end_call()
            events += self._calls.take()
        self._streamed = False

    def _end(self, events: list[Event], reason: str) -> None:
        if self.finished:
            return
        if self._kind is not None:
            self._close(events)
        if reason == "stop" and self._calls.calls:
            reason = "tool_calls"
        self.finished = True
        matched = self._stops.matched if self._stops is not None else None
        events.append(Finish(reason, self.completion_tokens,
                             matched if reason == "stop" else None))
        events += self.finish()

    def finish(self) -> list[Event]:
        """The choice's usage (once; for a choice cut short, what it cost so far)."""
        if self._usage_sent:
            return []
        self._usage_sent = True
        return [Usage(self._prompt_tokens, self.completion_tokens, self.cached_tokens,
                      self.reasoning_tokens, cache_written=self.cache_written)]
