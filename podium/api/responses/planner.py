"""Planning a response: its conversation, its tools, and each round of the model.

The ``Planner`` turns a request into a ``Plan`` the runner can run: the history behind
``previous_response_id`` (the chain of stored responses) or ``conversation``, the request's
own items, the MCP servers' tools (listed, or reused from the conversation) and the calls
the input approves, the conversation rendered and tokenized, cut to the context with
``truncation: "auto"`` (whole turns, found by bisection). ``again`` plans the next round of
the model after an MCP round: the conversation extended by the response's output so far.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from podium.api.responses import mcp
from podium.api.responses.runner import Plan
from podium.api.responses.translate import (ToolMap, Translation, as_input, cache_ttl,
                                            new_item_id, normalize_input, skeleton,
                                            to_options, translated, turn_starts, with_cache)
from podium.api.sealing import Sealer
from podium.conversation import Options
from podium.dialect import Dialect
from podium.engine.base import Engine
from podium.errors import ContextLengthExceeded, InvalidRequestError, NotFoundError
from podium.generation import Choice, Prepared, off_loop, prepare, start
from podium.protocol.responses import ResponsesRequest
from podium.settings import Settings
from podium.store.base import TERMINAL, ResponseStore

if TYPE_CHECKING:
    from podium.api.conversations import ConversationsService

log = logging.getLogger(__name__)


@dataclass
class _Rounds:
    """What every round of the model is planned from: the history and this request's items,
    translated once (``base``); each round extends that translation by what followed."""

    req: ResponsesRequest
    items: list[dict[str, Any]]
    wheres: list[str]
    tools: ToolMap
    options: Options
    owner: str
    base: Translation | None = None


class Planner:
    def __init__(self, engine: Engine, dialect: Dialect, store: ResponseStore,
                 settings: Settings, sealer: Sealer,
                 conversations: ConversationsService | None = None):
        self.engine = self._engine = engine       # the model this plans for
        self._dialect = dialect
        self._store = store
        self._settings = settings
        self._sealer = sealer
        self._conversations = conversations
        self._mcp_limits = mcp.Limits.from_settings(settings, engine.info.context_length)

    async def plan(self, req: ResponsesRequest, owner: str, small: bool) -> Plan:
        history: list[dict[str, Any]] = []
        response, source = skeleton(req), "previous_response_id"
        if req.previous_response_id:
            history = await self._history(req.previous_response_id, owner)
        elif req.conversation is not None:
            history, source = await self._conversation(req.conversation, owner), "conversation"
            response["conversation"] = {"id": conversation_id(req.conversation)}
        # the input joins the conversation: its ids must be new to it
        items = normalize_input(req.input, self._sealer, owner, taken=(
            item["id"] for item in history if source == "conversation"))
        tools = ToolMap(req.tools, strict=self._settings.strict_tools)
        servers = mcp.servers(req.tools, self._settings.mcp_allow,
                              self._settings.mcp_max_servers)
        sessions = (mcp.Sessions(servers, self._mcp_limits, self._engine.tokenizer)
                    if servers else None)
        try:
            listings, approved = [], []
            if sessions is not None:
                listings = await self._mcp_tools(servers, sessions, history + items, tools)
                approved = _approved(sessions, tools, history, items)
            elif any(item["type"] == "mcp_approval_response" and item["approve"]
                     for item in items):
                raise InvalidRequestError(
                    "An approved MCP call needs its mcp tool in tools", param="tools")
            options = to_options(req, tools, self._settings.effort_budgets())
            wheres = [source] * len(history) + [f"input[{i}]" for i in range(len(items))]
            rounds = _Rounds(req, history + items, wheres, tools, options, owner)
            prepared = await off_loop(self._prepare_fitting, rounds, options, approved,
                                      ["input"] * len(approved),
                                      inline=small and not history and sessions is None)
        except BaseException:
            if sessions is not None:
                await sessions.close()
            raise

        return Plan(response, req.previous_response_id, items, prepared.prompt_tokens,
                    None if approved else prepared.choices[0], tools, options.logprobs,
                    "reasoning.encrypted_content" in set(req.include or ()), mcp=sessions,
                    listings=listings, approved=approved,
                    max_tool_calls=req.max_tool_calls,
                    max_output_tokens=req.max_output_tokens, owner=owner, rounds=rounds,
                    cache_ttl=cache_ttl(req, rounds.base) if rounds.base else "30m")

    async def again(self, plan: Plan, output: list[dict[str, Any]], quiet: bool,
                    max_tokens: int | None = None) -> Choice:
        """The model's next round (queued), on the conversation extended by ``output``, the
        response's output so far; ``quiet``: offer no tools; ``max_tokens``: what is left of
        the response's ``max_output_tokens`` (None: no limit)."""
        rounds = plan.rounds
        options = dataclasses.replace(rounds.options, tool_choice="none" if quiet else "auto",
                                      max_tokens=max_tokens)
        done = as_input(output)
        following = await off_loop(self._prepare_fitting, rounds, options, done,
                                   ["output"] * len(done))  # with the model's output: a worker
        start(self._engine, [following.choices[0]])
        return following.choices[0]

    async def _mcp_tools(self, servers: list[mcp.Server], sessions: mcp.Sessions,
                         conversation: list[dict[str, Any]], tools: ToolMap
                         ) -> list[dict[str, Any]]:
        """Each server's tools offered to the model: a listing already in the conversation
        is reused, the others are fetched (together); the new ``mcp_list_tools`` items."""
        known = {item["server_label"]: item for item in conversation
                 if item["type"] == "mcp_list_tools" and not item.get("error")}

        async def listing(server: mcp.Server) -> dict[str, Any]:
            item: dict[str, Any] = {"id": new_item_id("mcpl"), "type": "mcp_list_tools",
                                    "server_label": server.label, "tools": [], "error": None}
            try:
                item["tools"] = [t for t in await sessions.session(server.label).list_tools()
                                 if server.allows(t)]
            except mcp.McpError as exc:
                log.warning("MCP server %s: %s", server.label, exc.message)
                item["error"] = exc.message
            return item

        fresh = [s for s in servers if s.label not in known]
        listings = list(await asyncio.gather(*(listing(s) for s in fresh)))
        by_label = {item["server_label"]: item for item in listings}
        for server in servers:
            if server.label in known:       # checked again: a conversation's item is data
                offered = await off_loop(mcp.usable, known[server.label]["tools"],
                                         server.label)
            else:
                offered = by_label[server.label]["tools"]
            for tool in offered:
                if server.allows(tool):
                    read_only = bool((tool.get("annotations") or {}).get("readOnlyHint"))
                    tools.add_mcp(server.label, tool,
                                  server.needs_approval(tool["name"], read_only), server.where)
        return listings

    async def _conversation(self, conversation: Any, owner: str) -> list[dict[str, Any]]:
        """The conversation's items, oldest first (they come before the input)."""
        if self._conversations is None:
            raise InvalidRequestError("This server keeps no conversations",
                                      param="conversation")
        return await self._conversations.history(conversation_id(conversation), owner)

    async def _history(self, response_id: str, owner: str) -> list[dict[str, Any]]:
        """The conversation up to and including a finished response's output, rebuilt from
        the chain of stored responses that ends in it."""
        chain = await self._store.chain(response_id, owner)
        if not chain:
            raise NotFoundError(f"No response with id {response_id!r}",
                                param="previous_response_id")
        previous = chain[-1]
        if previous.status not in TERMINAL:
            raise InvalidRequestError(
                f"Response {response_id!r} is still {previous.status}: continue from it once "
                f"it has finished", param="previous_response_id")
        if chain[0].body.get("conversation"):      # its chain lacks the conversation before it
            raise InvalidRequestError(
                f"Response {chain[0].id!r} was made in conversation "
                f"{chain[0].body['conversation']['id']!r}: continue it with conversation, "
                f"not previous_response_id", param="previous_response_id")
        items: list[dict[str, Any]] = []
        for i, record in enumerate(chain):
            # a row stored before chains were linked holds its whole conversation itself
            items += record.history if i == 0 and record.history else [
                item for item in record.input_items     # a client cannot make a request
                if item["type"] != "mcp_approval_request"]
            items += as_input(record.body.get("output") or [])
        return items

    def _prepare(self, rounds: _Rounds, translation: Translation, options: Options
                 ) -> Prepared:
        """``translation``'s conversation rendered and tokenized (on a worker thread: see
        ``off_loop``), its cache breakpoint marked (``rounds.base``: every item, for the
        retention their breakpoints ask)."""
        assert rounds.base is not None
        options = with_cache(options, rounds.req, translation, rounds.base)
        return prepare(self._engine, self._dialect, translation.conversation(), options,
                       self._settings)

    def _translated(self, rounds: _Rounds, items: list[dict[str, Any]], wheres: list[str]
                    ) -> Translation:
        return translated(rounds.req.instructions, items, wheres, rounds.tools, self._sealer,
                          rounds.owner)

    def _prepare_fitting(self, rounds: _Rounds, options: Options, extra: list[dict[str, Any]],
                         extra_wheres: list[str]) -> Prepared:
        """The conversation (``rounds``' items, then ``extra``) rendered and tokenized or,
        with ``truncation: "auto"``, the longest tail of whole turns that fits the context.

        The whole conversation extends the translation of ``rounds``' items, made once for
        every round of the response. Shorter tails never need more tokens, so the cut is
        found by bisection over the turn boundaries: a few renders for any length of
        history, not one per dropped turn.
        """
        items, wheres = rounds.items + extra, rounds.wheres + extra_wheres
        if not items:
            raise InvalidRequestError("input is empty: give at least one item", param="input")
        if rounds.base is None:
            rounds.base = self._translated(rounds, rounds.items, rounds.wheres)
        try:
            return self._prepare(rounds, rounds.base.extended(extra, extra_wheres), options)
        except ContextLengthExceeded:
            cuts = turn_starts(items)
            if rounds.req.truncation != "auto" or len(cuts) == 1:
                raise

        def tail(j: int) -> Prepared:
            return self._prepare(rounds, self._translated(rounds, items[cuts[j]:],
                                                          wheres[cuts[j]:]), options)

        fits: dict[int, Prepared] = {}

        def attempt(j: int) -> bool:
            try:
                fits[j] = tail(j)
                return True
            except ContextLengthExceeded:
                return False

        low, high = 0, len(cuts) - 1         # cuts[low] does not fit
        if not attempt(high):                # raises: nothing fits
            return tail(high)
        while high - low > 1:
            middle = (low + high) // 2
            if attempt(middle):
                high = middle
            else:
                low = middle
        return fits[high]



def conversation_id(value: Any) -> str:
    """The id of a ``conversation`` parameter: a string, or ``{"id": ...}``."""
    if isinstance(value, dict):
        value = value.get("id")
    if not isinstance(value, str) or not value:
        raise InvalidRequestError('conversation must be a conversation id or {"id": ...}',
                                  param="conversation")
    return value


def _approved(sessions: mcp.Sessions, tools: ToolMap, history: list[dict[str, Any]],
              items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The MCP calls this request's input approves, ready to run (``mcp_call`` items): each
    one Podium asked for (the history holds only its own ``mcp_approval_request`` items: a
    client's are refused as input) of a tool this request offers (listed, allowed)."""
    requests = {item["id"]: item for item in history if item["type"] == "mcp_approval_request"}
    calls = []
    for i, item in enumerate(items):
        if item["type"] != "mcp_approval_response" or not item["approve"]:
            continue
        request = requests.get(item["approval_request_id"])
        if request is None:
            raise InvalidRequestError(
                f"No mcp_approval_request with id {item['approval_request_id']!r} in the "
                f"conversation", param=f"input[{i}].approval_request_id")
        if request["server_label"] not in sessions.servers:
            raise InvalidRequestError(
                f"The approved call is to MCP server {request['server_label']!r}: give its "
                f"mcp tool in tools", param="tools")
        offered = tools.by_model_name.get(request["name"])
        if offered is None or offered.kind != "mcp" or offered.server != request["server_label"]:
            raise InvalidRequestError(
                f"The approved call is to {request['name']!r}, which MCP server "
                f"{request['server_label']!r} does not offer in this request (not listed, or "
                f"not in its allowed_tools)", param=f"input[{i}]")
        calls.append({"id": new_item_id("mcp"), "type": "mcp_call",
                      "server_label": request["server_label"], "name": request["name"],
                      "arguments": request["arguments"], "status": "in_progress",
                      "approval_request_id": request["id"]})
    return calls
