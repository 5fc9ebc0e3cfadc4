"""Engine outputs to text events for one choice: detokenize, then cut at stop strings.

Logprobs travel with the text they belong to: a token's entry is released once all of its
text has been released, so held-back text (a possible stop string) holds its logprobs too,
and tokens swallowed by a stop string never report logprobs.
"""

from __future__ import annotations

from collections import deque

from podium.engine.base import EngineOutput, TokenLogprob, Tokenizer
from podium.parsing.events import Event, Finish, PromptLogprobs, TextDelta, Usage
from podium.parsing.pipeline import OutputParser
from podium.text.detokenizer import Detokenizer, texts_of
from podium.text.stop import StopMatcher


class TextPipeline:
    __slots__ = ("_detok", "_stops", "_want_logprobs", "_pending", "_produced", "_released",
                 "completion_tokens", "finished", "cached_tokens", "cache_written",
                 "plain")

    def __init__(self, tokenizer: Tokenizer, stop: list[str] | None = None,
                 want_logprobs: bool = False):
        self._detok = Detokenizer(tokenizer.piece, texts_of(tokenizer))
        self._stops = StopMatcher(stop or [])
        self._want_logprobs = want_logprobs
        # no stop strings and no logprobs: a token's text is released as it comes (token)
        self.plain = not self._stops.active and not want_logprobs
        self._pending: deque[tuple[int, TokenLogprob]] = deque()
        self._produced = 0       # characters out of the detokenizer so far
        self._released = 0       # characters released to the client so far
        self.completion_tokens = 0
        self.finished = False
        self.cached_tokens = 0   # prompt tokens the engine reused from its cache
        self.cache_written = 0   # and those it added to its prompt cache

    def feed(self, out: EngineOutput) -> list[Event]:
        """Events for one engine output; the last output also yields ``Finish``."""
        ids = out.token_ids
        self.completion_tokens += len(ids)
        if out.cached_tokens or out.cache_written:
            self.cached_tokens, self.cache_written = out.cached_tokens, out.cache_written
        if out.stopped_by_token:
            ids = ids[:-1]
        detok = self._detok
        if self._want_logprobs and out.logprobs is not None:
            parts = []
            for i, token_id in enumerate(ids):
                text = detok.feed(token_id)
                self._produced += len(text)
                self._pending.append((self._produced, out.logprobs[i]))
                parts.append(text)
            text = "".join(parts)
        elif len(ids) == 1:             # the common case: one token per output
            text = detok.feed(ids[0])
            self._produced += len(text)
        else:
            text = "".join([detok.feed(token_id) for token_id in ids])
            self._produced += len(text)
        stops = self._stops
        events = self._release(stops.feed(text)) if ids else []
        if stops.stopped:
            return self._finish(events, "stop")
        if out.finish_reason is not None:
            tail = detok.flush()
            self._produced += len(tail)
            events += self._release(stops.feed(tail) + stops.flush())
            reason = "stop" if stops.stopped else out.finish_reason
            return self._finish(events, reason)
        return events

    def token(self, token_id: int) -> str:
        """The text of one token that does not end the output, on a ``plain`` pipeline
        (nothing to hold back, nothing to count but the token): ``TextStream``'s common
        step, which hands the text to its parser as it is. Taken through ``feed`` instead
        (the stop matcher, a ``TextDelta`` made, then unpacked by ``OutputParser.feed``), a
        Hermes stream in one-token outputs cost 1.72 us a token, not 1.47 (+17%; TextStream
        over bench/parsing.py's part-1 stream, min of 9, interleaved)."""
        self.completion_tokens += 1
        return self._detok.feed(token_id)

    def _release(self, text: str) -> list[Event]:
        if not text:
            return []
        self._released += len(text)
        logprobs = None
        if self._want_logprobs:
            logprobs = []
            while self._pending and self._pending[0][0] <= self._released:
                logprobs.append(self._pending.popleft()[1])
        return [TextDelta(text, logprobs)]

    def _finish(self, events: list[Event], reason: str) -> list[Event]:
        self.finished = True
        events.append(Finish(reason, self.completion_tokens, self._stops.matched))
        return events


class TextStream:
    """One choice of a text family, engine outputs in, semantic events out: the text pipeline,
    then (chat) the output parser. It implements ``podium.stream.ChoiceStream``: the usage
    follows ``Finish`` as an event, and reasoning is counted in tokens, the tokens that came
    while the reasoning parser was inside the reasoning section (its tags included). The
    prediction's figures are the sums of the outputs'; an output carrying any takes the full
    step, so the common one-token step only checks for them.
    """

    __slots__ = ("_text", "_parser", "_reasoning", "_prompt_tokens", "_reasoning_tokens",
                 "_undecided", "_accepted", "_rejected", "_usage_sent", "finished")

    def __init__(self, text: TextPipeline, parser: OutputParser | None = None,
                 prompt_tokens: int = 0):
        self._text = text
        self._parser = parser
        self._reasoning = parser.reasoning if parser is not None else None
        self._prompt_tokens = prompt_tokens
        self._reasoning_tokens = 0
        self._undecided = 0         # tokens before the parser knew whether reasoning began
        self._accepted = self._rejected = 0     # the prediction's draft tokens
        self._usage_sent = False
        self.finished = False

    def feed(self, out: EngineOutput) -> list[Event]:
        text, parser, reasoning = self._text, self._parser, self._reasoning
        ids = out.token_ids
        before = reasoning.state if reasoning is not None else "content"
        if (text.plain and len(ids) == 1 and out.finish_reason is None
                and out.prompt_logprobs is None and not (out.cached_tokens or out.cache_written)
                and not (out.accepted_prediction or out.rejected_prediction)):
            # The common step, one token mid-output: its text alone, straight to the parser
            # (see ``TextPipeline.token``).
            delta = text.token(ids[0])
            if not delta:
                events: list[Event] = []
            elif parser is not None:
                events = parser.text(delta)
            else:
                events = [TextDelta(delta)]
        else:
            events = text.feed(out)
            self._accepted += out.accepted_prediction
            self._rejected += out.rejected_prediction
            if out.prompt_logprobs is not None:
                events.insert(0, PromptLogprobs(out.prompt_logprobs))
            if parser is not None:
                events = parser.feed(events)
        if before == "reasoning":          # a thinking token (most of a reasoning model's)
            self._reasoning_tokens += len(ids)
        elif before != "content" and reasoning is not None:
            self._count_reasoning(before, reasoning.state, len(ids))
        if text.finished:
            self.finished = True
            events += self.finish()
        return events

    def _count_reasoning(self, before: str, after: str, tokens: int) -> None:
        """Tokens that came while the reasoning parser was in ``before`` ("start" or
        "after"; ``feed`` counts "reasoning" itself) and left it in ``after``."""
        if before == "start":
            if after == "start":            # the opening tag may be coming: wait and see
                self._undecided += tokens
            elif after in ("reasoning", "after"):
                self._reasoning_tokens += self._undecided + tokens
                self._undecided = 0

    def finish(self) -> list[Event]:
        if self._usage_sent:
            return []
        self._usage_sent = True
        text = self._text
        return [Usage(self._prompt_tokens, text.completion_tokens, text.cached_tokens,
                      self._reasoning_tokens, self._accepted, self._rejected,
                      text.cache_written)]
