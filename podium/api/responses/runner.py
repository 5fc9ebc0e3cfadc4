"""One response being generated: its choice's events rendered as Responses stream events.

A ``Run`` owns the response's ``ResponseBuilder`` (its renderer); ``events()`` yields the
stamped stream from ``response.created`` to the terminal event, each round of the model
driven by ``generation.drive_round`` (its usage folded there), the next round planned by the
``Planner``; ``stop(exc)`` ends a run cut short: ``cancelled`` when its client left or it was
cancelled, ``failed`` (with the error) for anything else, never the other way round.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncGenerator, Callable, Coroutine

from podium.api.responses.mcp import Sessions, error_text
from podium.api.responses.translate import ToolMap, new_item_id
from podium.engine.base import Engine
from podium.errors import PodiumError
from podium.generation import Choice, UsageFold, drive_round
from podium.parsing.events import Usage
from podium.render.responses import ResponseBuilder
from podium.store.base import TERMINAL

if TYPE_CHECKING:
    from podium.api.responses.planner import Planner

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
    max_tool_calls: int | None = None
    max_output_tokens: int | None = None    # the whole response's, every round's share
    owner: str = ""                     # the API key's id: reasoning is sealed for it alone
    rounds: Any = None                  # what the planner keeps for the next MCP round
    cache_ttl: str = "30m"              # the longest the request asked cache writes kept


class Run:
    def __init__(self, plan: Plan, engine: Engine, planner: Planner,
                 seal: Callable[[str], str] | None, keepalive: float = 0.0,
                 log: Callable[[list[Obj]], None] | None = None, searcher: Any = None):
        """``log``: handed every event as it is stamped (the stored response's event log:
        ``EventLog.put``), so the log holds every number given, however the run ends."""
        self.plan = plan
        self._searcher = searcher           # its file_search tool (api/vector_stores.py)
        self._engine = engine
        self._planner = planner
        self._keepalive = keepalive         # seconds between keep-alive events (0: none)
        self.builder = ResponseBuilder(plan.response, engine.tokenizer,
                                       client_tool=plan.tools.client, new_id=new_item_id,
                                       logprobs=plan.logprobs, seal=seal, sink=log,
                                       cache_ttl=plan.cache_ttl)
        self._usage = UsageFold()           # every round's (one choice each)
        self.final: Coroutine[Any, Any, None] | None = None    # its last writes, once ended

    @property
    def response(self) -> Obj:
        return self.builder.response

    async def events(self) -> AsyncGenerator[Obj, None]:
        """The response's stream events, stamped, from created to the terminal event.

        With MCP tools it is a loop: the model runs (``generation.drive_round``), Podium
        runs the MCP calls it made, and the model runs again on the conversation extended
        by them, until it answers without one (or calls a client's tool, or asks for an
        approval, or runs out of tokens: ``max_output_tokens`` is the whole response's,
        each round given what the rounds before it left)."""
        builder, plan = self.builder, self.plan
        for event in builder.open():
            yield event
        choice, calls, rounds = plan.choice, 0, 0
        try:
            for item in plan.listings:
                for out in builder.mcp_listing(item):
                    yield out
            for item in plan.approved:
                for out in builder.mcp_item(item):
                    yield out
            while True:
                if choice is not None:
                    async with aclosing(drive_round(self._engine, [choice], builder,
                                                    self._usage, self._keepalive)) as objs:
                        async for out in objs:
                            yield out
                    for out in builder.end_round():
                        yield out
                pending = list(builder.calls)
                for index, item in pending:
                    if item["type"] == "file_search_call":
                        for out in builder.search_running(index, item):
                            yield out
                        found = await self._searcher.run(item["queries"])
                        for out in builder.search_result(index, item, found,
                                                         self._searcher.keep):
                            yield out
                        continue
                    for out in builder.mcp_running(index, item):
                        yield out
                    output, error = await self._call(item, calls)
                    calls += 1
                    for out in builder.mcp_result(index, item, output, error):
                        yield out
                if not pending or builder.ends_turn:
                    break
                rounds += 1
                if rounds >= MAX_ROUNDS:    # the model would not stop calling: enough
                    log.warning("response %s: %d rounds of MCP calls, ended there",
                                self.response["id"], rounds)
                    break
                left = self._tokens_left()
                if left is not None and left <= 0:
                    builder.spent()
                    break
                limit = plan.max_tool_calls
                quiet = (rounds == MAX_ROUNDS - 1 or (limit is not None and calls >= limit)
                         or self._searched_alone(pending))
                choice = await self._planner.again(plan, self._searched(), quiet, left)
        except PodiumError as exc:
            log.error("response %s failed: %s", self.response["id"], exc.message)
            for out in self._end("failed", {"code": exc.code or "server_error",
                                            "message": exc.message}):
                yield out
            return
        finally:
            if plan.mcp is not None:
                await plan.mcp.close()
        for out in builder.close(self.usage()):
            yield out

    def _searched_alone(self, pending: list[tuple[int, Obj]]) -> bool:
        """The round only searched, and searching is all the request offers: the next
        round answers from the results (a small model would search again and again)."""
        return (all(item["type"] == "file_search_call" for _, item in pending)
                and len(self.plan.tools.tools) == 1)

    def _searched(self) -> list[Obj]:
        """The output so far, each search with the results the model was given (kept in
        the item only when the client included them)."""
        found = self.builder.found
        return [dict(item, results=found.get(item["id"]))
                if item["type"] == "file_search_call" else item
                for item in self.response["output"]]

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

    def _tokens_left(self) -> int | None:
        """What the rounds so far left of ``max_output_tokens`` (reasoning counts, as in
        OpenAI's ``output_tokens``); None: no limit."""
        limit = self.plan.max_output_tokens
        return None if limit is None else limit - self.usage().completion_tokens

    def usage(self) -> Usage:
        """Every round's usage (a round cut short counted from its stream); the prompt
        alone before the model ran."""
        return self._usage.totals() if self._usage else Usage(self.plan.prompt_tokens, 0)

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
        return self.builder.end(self.usage(), status, error)
