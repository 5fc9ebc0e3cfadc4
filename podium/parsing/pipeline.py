"""The output parser of one choice: reasoning first, then tool calls, then plain text.

It sits after the text pipeline (detokenizer, stop strings) and before the renderers:
raw ``TextDelta`` events in, semantic events out. The finish reason is settled here too:
``tool_calls`` when the choice called a tool under ``auto`` / ``required``.
"""

from __future__ import annotations

from typing import Protocol

from podium.parsing.events import Event, Finish, TextDelta
from podium.parsing.reasoning import ReasoningParser


class CallParser(Protocol):
    calls: int

    def feed(self, text: str) -> list[Event]: ...
    def flush(self) -> list[Event]: ...
    def add_markup(self, *markup: str) -> None: ...


class OutputParser:
    def __init__(self, reasoning: ReasoningParser | None = None, tools: CallParser | None = None,
                 *, calls_finish: str = "tool_calls"):
        self._reasoning = self.reasoning = reasoning
        self._tools = tools
        self._calls_finish = calls_finish     # "stop" under a named tool_choice, as OpenAI
        self._logprobs: list = []             # raw logprobs waiting for a text event
        if reasoning is not None and tools is not None:
            # the close tag written again in the answer is the reasoning's markup: dropped
            tools.add_markup(reasoning.close_tag)

    def feed(self, events: list[Event]) -> list[Event]:
        if len(events) == 1:
            event = events[0]
            if type(event) is TextDelta and not event.logprobs:
                return self.text(event.text)    # the common step: one token's raw text
        out: list[Event] = []
        reasoning, tools = self._reasoning, self._tools
        for event in events:
            if type(event) is TextDelta:
                if event.logprobs:
                    self._logprobs += event.logprobs
                out += self._parse(event.text)
            elif type(event) is Finish:
                out += self._route(reasoning.flush() if reasoning is not None else [])
                if tools is not None:
                    out += tools.flush()
                out.append(self._finish(event))
            else:
                out.append(event)
        return self._attach_logprobs(out) if self._logprobs else out

    def text(self, text: str) -> list[Event]:
        """``feed``'s common step, one raw text delta without logprobs (``feed`` takes
        it so; ``TextStream`` too, with no ``TextDelta`` made for the text)."""
        out = self._parse(text)
        return self._attach_logprobs(out) if self._logprobs else out

    def _parse(self, text: str) -> list[Event]:
        """The events of one raw text delta: reasoning first, then tool calls."""
        reasoning, tools = self._reasoning, self._tools
        if reasoning is not None and not reasoning.finished:
            out = reasoning.feed(text)
            # Still in "reasoning" after the delta, the parser gave reasoning alone (text,
            # the answer, comes only once it left): nothing to route.
            if tools is not None and reasoning.state != "reasoning":
                out = self._route(out)
            return out
        if tools is not None:
            return tools.feed(text)
        return [TextDelta(text)]

    def _route(self, events: list[Event]) -> list[Event]:
        """The reasoning parser's events: its text (the answer after the reasoning) goes on
        to the tool parser."""
        tools = self._tools
        if tools is None:
            return events
        out: list[Event] = []
        for event in events:
            if type(event) is TextDelta:
                out += tools.feed(event.text)
            else:
                out.append(event)
        return out

    def _finish(self, event: Finish) -> Finish:
        if self._tools is not None and self._tools.calls and event.reason == "stop":
            return Finish(self._calls_finish, event.completion_tokens, event.stop_sequence)
        return event

    def _attach_logprobs(self, out: list[Event]) -> list[Event]:
        """Logprobs go with the first visible text that follows them (content only)."""
        for i, event in enumerate(out):
            if isinstance(event, TextDelta):
                out[i] = TextDelta(event.text, self._logprobs)
                self._logprobs = []
                break
        return out
