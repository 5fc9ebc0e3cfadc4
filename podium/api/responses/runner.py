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
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Awaitable, Callable

from podium.api.responses.mcp import Sessions, error_text
from podium.api.responses.translate import ToolMap, new_item_id
from podium.engine.base import Engine
from podium.errors import PodiumError
from podium.generation import Choice, KeepAlive, stream_choices
from podium.parsing.events import Finish, Usage
from podium.render.responses import ResponseBuilder, Sequencer, usage
from podium.store.base import TERMINAL

log = logging.getLogger(__name__)

Obj = dict[str, Any]
MAX_ROUNDS = 16         # model runs in one response; the last is offered no tools


@dataclass
class Plan:
    """A response ready to run: its object so far, what is stored of its request, and its
    one choice (already rendered; queued by ``generation.start``)."""

    response: Obj
    parent_id: str | None               # previous_response_id
    input_items: list[Obj]              # this request's own items
    prompt_tokens: int
    choice: Choice | None               # None: MCP calls run first (``approved``)
    tools: ToolMap
    logprobs: int | None
    seal: bool
    mcp: Sessions | None = None         # the response's MCP sessions
    listings: list[Obj] = field(default_factory=list)   # new mcp_list_tools items
    approved: list[Obj] = field(default_factory=list)   # approved mcp_call items to run
    # the model again, on the conversation extended by ``output`` (True: offer no tools)
    again: Callable[[list[Obj], bool], Awaitable[Choice]] | None = None
    max_tool_calls: int | None = None
    owner: str = ""                     # the API key's id: reasoning is sealed for it alone


class Run:
    def __init__(self, plan: Plan, engine: Engine, seal: Callable[[str], str] | None,
                 keepalive: float = 0.0):
        self.plan = plan
        self._engine = engine
        self._keepalive = keepalive         # seconds between keepalive events (0: none)
        self.builder = ResponseBuilder(plan.response, engine.tokenizer,
                                       client_tool=plan.tools.client, new_id=new_item_id,
                                       logprobs=plan.logprobs, seal=seal)
        self.seq = Sequencer()
        self._choice = plan.choice          # the model's current round
        self._usage: Usage | None = None    # that round's, once it has ended
        self._spent: list[Usage] = []       # every round's that ended
        self._counted = False               # the current round's is in ``_spent``

    @property
    def response(self) -> Obj:
        return self.builder.response

    async def events(self) -> AsyncGenerator[Obj, None]:
        """The response's stream events, stamped, from created to the terminal event.

        With MCP tools it is a loop: the model runs, Podium runs the MCP calls it made, and
        the model runs again on the conversation extended by them, until it answers without
        one (or calls a client's tool, or asks for an approval, or runs out of tokens)."""
        builder, seq = self.builder, self.seq
        for event in seq.stamp(builder.start()):
            yield event
        finish, calls, rounds = None, 0, 0
        try:
            for item in self.plan.listings:
                for out in seq.stamp(builder.mcp_listing(item)):
                    yield out
            for item in self.plan.approved:
                for out in seq.stamp(builder.mcp_item(item)):
                    yield out
            while True:
                if self._choice is not None:
                    finish = None
                    async for _, semantic in stream_choices(self._engine, [self._choice],
                                                            self._keepalive):
                        if type(semantic) is KeepAlive:     # OpenAI's own, during a prefill
                            yield seq.stamp([{"type": "keepalive"}])[0]
                        elif isinstance(semantic, Finish):
                            finish = semantic
                        elif isinstance(semantic, Usage):
                            self._usage = semantic
                        else:
                            for out in seq.stamp(builder.event(semantic)):
                                yield out
                    self._spent.append(self._round_usage())
                    self._counted = True
                    for out in seq.stamp(builder.end_round()):
                        yield out
                if finish is not None and finish.reason == "length":
                    for out in seq.stamp(builder.cut_call()):
                        yield out
                pending = list(builder.calls)
                for index, item in pending:
                    for out in seq.stamp(builder.mcp_running(index, item)):
                        yield out
                    output, error = await self._call(item, calls)
                    calls += 1
                    for out in seq.stamp(builder.mcp_result(index, item, output, error)):
                        yield out
                if not pending or builder.ends_turn:
                    break
                assert self.plan.again is not None
                rounds += 1
                if rounds >= MAX_ROUNDS:    # the model would not stop calling: enough
                    log.warning("response %s: %d rounds of MCP calls, ended there",
                                self.response["id"], rounds)
                    break
                limit = self.plan.max_tool_calls
                quiet = rounds == MAX_ROUNDS - 1 or (limit is not None and calls >= limit)
                self._choice = await self.plan.again(self.response["output"], quiet)
                self._counted = False
        except PodiumError as exc:
            log.error("response %s failed: %s", self.response["id"], exc.message)
            for out in self._end("failed", {"code": exc.code or "server_error",
                                            "message": exc.message}):
                yield out
            return
        finally:
            if self.plan.mcp is not None:
                await self.plan.mcp.close()
        for out in seq.stamp(builder.finish(finish, self.usage())):
            yield out

    async def _call(self, item: Obj, made: int) -> tuple[str | None, Obj | None]:
        limit = self.plan.max_tool_calls
        if limit is not None and made >= limit:
            return None, {"type": "mcp_protocol_error", "code": -32000,
                          "message": f"Not run: max_tool_calls ({limit}) were made already"}
        assert self.plan.mcp is not None
        output, error = await self.plan.mcp.call(item["server_label"], item["name"],
                                                 item["arguments"])
        if error is not None:
            log.info("response %s: MCP call %s failed: %s", self.response["id"], item["name"],
                     error_text(error))
        return output, error

    def _round_usage(self) -> Usage:
        if self._usage is None and self._choice is not None:
            for event in self._choice.stream.finish():
                if isinstance(event, Usage):
                    self._usage = event
        u, self._usage = self._usage or Usage(self.plan.prompt_tokens, 0), None
        return u

    def usage(self) -> Obj:
        """Every round's usage, summed (a round cut short counted from its stream)."""
        if self._choice is not None and not self._counted:
            self._spent.append(self._round_usage())
            self._counted = True
        spent = list(self._spent)
        if not spent:
            spent = [Usage(self.plan.prompt_tokens, 0)]
        return usage(sum(u.prompt_tokens for u in spent),
                     sum(u.completion_tokens for u in spent),
                     sum(u.reasoning_tokens for u in spent), sum(u.cached_tokens for u in spent))

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
