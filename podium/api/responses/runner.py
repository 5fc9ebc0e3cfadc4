"""One response being generated: its choice's events rendered as Responses stream events.

A ``Run`` owns the response's ``ResponseBuilder`` and ``Sequencer``; ``events()`` yields the
stamped stream from ``response.created`` to the terminal event, and ``stop(exc)`` ends a run
cut short: ``cancelled`` when its client left or it was cancelled, ``failed`` (with the
error) for anything else, never the other way round. Usage comes from the choice's ``Usage``
event (or, cut short, from ``ChoiceStream.finish()``): counted from tokens for every family.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Callable

from podium.api.responses.translate import ToolMap, new_item_id
from podium.engine.base import Engine
from podium.errors import PodiumError
from podium.generation import Choice, run_choices
from podium.parsing.events import Finish, Usage
from podium.render.responses import ResponseBuilder, Sequencer, usage
from podium.store.base import TERMINAL

log = logging.getLogger(__name__)

Obj = dict[str, Any]


@dataclass
class Plan:
    """A response ready to run: its object so far, what is stored of its request, and its
    one choice (already rendered; queued by ``generation.start``)."""

    response: Obj
    parent_id: str | None               # previous_response_id
    input_items: list[Obj]              # this request's own items
    prompt_tokens: int
    choice: Choice
    tools: ToolMap
    logprobs: int | None
    seal: bool


class Run:
    def __init__(self, plan: Plan, engine: Engine, seal: Callable[[str], str] | None):
        self.plan = plan
        self._engine = engine
        self.builder = ResponseBuilder(plan.response, engine.tokenizer,
                                       client_tool=plan.tools.client, new_id=new_item_id,
                                       logprobs=plan.logprobs, seal=seal)
        self.seq = Sequencer()
        self._usage: Usage | None = None

    @property
    def response(self) -> Obj:
        return self.builder.response

    async def events(self) -> AsyncGenerator[Obj, None]:
        """The response's stream events, stamped, from created to the terminal event."""
        builder, seq = self.builder, self.seq
        for event in seq.stamp(builder.start()):
            yield event
        finish = None
        try:
            async for _, semantic in run_choices(self._engine, [self.plan.choice]):
                if isinstance(semantic, Finish):
                    finish = semantic
                elif isinstance(semantic, Usage):
                    self._usage = semantic
                else:
                    for out in seq.stamp(builder.event(semantic)):
                        yield out
        except PodiumError as exc:
            log.error("response %s failed: %s", self.response["id"], exc.message)
            for out in self._end("failed", {"code": exc.code or "server_error",
                                            "message": exc.message}):
                yield out
            return
        for out in seq.stamp(builder.finish(finish, self.usage())):
            yield out

    def usage(self) -> Obj:
        if self._usage is None:
            for event in self.plan.choice.stream.finish():
                if isinstance(event, Usage):
                    self._usage = event
        u = self._usage or Usage(self.plan.prompt_tokens, 0)
        return usage(u.prompt_tokens, u.completion_tokens, u.reasoning_tokens, u.cached_tokens)

    def stop(self, exc: BaseException) -> list[Obj]:
        """The events that end a run cut short by ``exc`` (none if it had ended)."""
        if self.response["status"] in TERMINAL:
            return []
        if isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
            return self._end("cancelled", None)
        return self._end("failed", {
            "code": getattr(exc, "code", None) or "server_error",
            "message": getattr(exc, "message", None) or "The response failed"})

    def _end(self, status: str, error: Obj | None) -> list[Obj]:
        return self.seq.stamp(self.builder.finish(None, self.usage(), status=status,
                                                  error=error))
