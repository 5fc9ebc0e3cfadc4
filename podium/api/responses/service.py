"""The Responses service: stateful responses, streamed from the same events as chat.

The request becomes a ``Conversation`` and ``Options`` (``translate``), prepended with the
stored conversation behind ``previous_response_id``; ``generation.prepare`` renders it in the
model's dialect; a ``Run`` renders the choice's events as Responses events; an ``EventLog``
keeps them for streamed and background responses (``log``). What is stored (SQL): the
response object, its own input items and its parent's id (so a chain of N turns stores N
turns, and its conversation is rebuilt by walking the chain), and for streamed or background
responses an append-only event log that any replica can replay.

A stored response belongs to its owner (the API key that made it, ``NO_OWNER`` without
keys); every look-up takes the caller's owner, and another owner's response is as missing as
one that never was (the same 404). A stored response is written before anything is
generated, so a store that cannot take it fails the request cleanly (503). A delete deletes:
the response's log writer on this replica stops at once, and on any replica an append finds
the row gone and stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncGenerator

from podium.api.responses import mcp
from podium.api.responses.log import POLL_SECONDS, EventLog, Finalizers, Logs, fail_response
from podium.api.responses.runner import Plan, Run
from podium.api.responses.translate import (ToolMap, as_input, new_item_id, normalize_input,
                                            skeleton, to_conversation, to_options, turn_starts)
from podium.api.sealing import Sealer
from podium.conversation import Options
from podium.dialect import Dialect
from podium.engine.base import Engine
from podium.errors import (ContextLengthExceeded, InvalidRequestError, NotFoundError,
                           StoreUnavailable)
from podium.generation import Choice, Prepared, check_model, off_loop, prepare, start
from podium.protocol.responses import ResponsesRequest
from podium.server.sse import ServerShuttingDown
from podium.settings import Settings
from podium.store.base import NO_OWNER, TERMINAL, ResponseStore, StoredResponse

if TYPE_CHECKING:
    from podium.api.conversations import ConversationsService
    from podium.server.lifecycle import Drain

log = logging.getLogger(__name__)
APPEND_BEFORE = frozenset({"response.completed", "response.incomplete"})


@dataclass
class Turn:
    """A response run in a conversation: where its items are appended when it finishes."""

    conversation_id: str
    owner: str


class ResponsesService:
    def __init__(self, engine: Engine, dialect: Dialect, store: ResponseStore,
                 settings: Settings, sealer: Sealer,
                 conversations: ConversationsService | None = None):
        self._engine = engine
        self._conversations = conversations
        self._dialect = dialect
        self._store = store
        self._settings = settings
        self._sealer = sealer
        self._mcp_limits = mcp.Limits.from_settings(settings, engine.info.context_length)
        self._running: dict[str, asyncio.Task] = {}     # background responses on this replica
        self._replica = secrets.token_hex(8)            # this process, as a lease holder
        self._leased: set[str] = set()                  # stored responses running here
        self._keeper: asyncio.Task | None = None
        self._logs = Logs(store)                        # responses being logged on it
        self._finalizers = Finalizers()                 # last writes of ended streams
        self._closing = False
        self.drain: Drain | None = None                 # the app's (server.lifecycle)

    # -- lifecycle ----------------------------------------------------------------------

    async def startup(self) -> None:
        await self._store.start(self._cancel_here)
        if self._settings.mcp_allow:
            await off_loop(mcp.warm)
        await self._fail_abandoned()
        self._keeper = asyncio.create_task(self._keep_leases(), name="podium-leases")
        if self._settings.response_retention_days > 0:
            cutoff = time.time() - self._settings.response_retention_days * 86400
            await self._store.prune(cutoff)

    async def shutdown(self) -> None:
        """Stop running background responses and give up their leases: the next start,
        or another replica at once, marks them failed with their logs closed."""
        self._closing = True
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        await self._finalizers.drain()
        try:
            await self._store.renew(sorted(self._leased), self._replica, 0)
        except StoreUnavailable as exc:
            log.warning("response leases not given up (they lapse): %s", exc.message)

    # -- create -------------------------------------------------------------------------

    async def create(self, req: ResponsesRequest, owner: str = NO_OWNER, *, small: bool = False
                     ) -> dict[str, Any] | AsyncGenerator[dict, None]:
        check_model(req.model, self._engine, self._settings)
        if req.background and not req.store:
            raise InvalidRequestError("background responses must be stored (store: true)",
                                      param="background")
        if req.conversation is not None and req.previous_response_id:
            raise InvalidRequestError("conversation and previous_response_id cannot be used "
                                      "together", param="conversation")
        plan = await self._plan(req, owner, small)
        try:
            if plan.choice is not None:     # 429 / 400 now, before anything is stored
                start(self._engine, [plan.choice])
            if req.background:
                plan.response["status"] = "queued"
            if req.store:   # first, so a store that cannot take it is a 503 before any work
                await self._store_first(plan, owner)
        except BaseException:
            if plan.mcp is not None:
                await plan.mcp.close()
            raise
        rid = plan.response["id"]
        turn = (Turn(plan.response["conversation"]["id"], owner)
                if plan.response.get("conversation") else None)
        if req.background:
            writer = self._logs.open(rid)       # before any follower looks for it
            self._running[rid] = asyncio.create_task(self._background(plan, writer, turn))
            return (self._logs.follow(rid, -1, owner) if req.stream
                    else dict(plan.response, output=[]))
        if req.stream:
            return self._stream(plan, req.store, turn)
        return await self._respond(plan, req.store, turn)

    async def _store_first(self, plan: Plan, owner: str) -> None:
        record = StoredResponse(plan.response["id"], dict(plan.response), [],
                                plan.input_items, owner, parent_id=plan.parent_id)
        lease = (self._replica, time.time() + self._settings.response_lease_seconds)
        try:
            await self._store.put(record, lease)
            self._leased.add(record.id)
        except BaseException:
            if plan.choice is not None and plan.choice.outputs is not None:   # queued: drop it
                await plan.choice.outputs.aclose()
            raise

    async def _plan(self, req: ResponsesRequest, owner: str, small: bool) -> Plan:
        history: list[dict[str, Any]] = []
        response, source = skeleton(req), "previous_response_id"
        if req.previous_response_id:
            history = await self._history(req.previous_response_id, owner)
        elif req.conversation is not None:
            history, source = await self._conversation(req.conversation, owner), "conversation"
            response["conversation"] = {"id": _conversation_id(req.conversation)}
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
            options = to_options(req, tools)
            wheres = [source] * len(history) + [f"input[{i}]" for i in range(len(items))]
            prepared = await off_loop(self._prepare_fitting, req, history + items + approved,
                                      wheres + ["input"] * len(approved), tools, options,
                                      owner, inline=small and not history and sessions is None)
        except BaseException:
            if sessions is not None:
                await sessions.close()
            raise

        async def again(output: list[dict[str, Any]], quiet: bool) -> Choice:
            """The model's next round, on the conversation extended by ``output``."""
            later = dataclasses.replace(options, tool_choice="none" if quiet else "auto")
            done = as_input(output)
            following = await off_loop(self._prepare_fitting, req, history + items + done,
                                       wheres + ["output"] * len(done), tools, later,
                                       owner)       # with the model's output: on a worker
            start(self._engine, [following.choices[0]])
            return following.choices[0]

        return Plan(response, req.previous_response_id, items, prepared.prompt_tokens,
                    None if approved else prepared.choices[0], tools, options.logprobs,
                    "reasoning.encrypted_content" in set(req.include or ()), mcp=sessions,
                    listings=listings, approved=approved,
                    again=again if sessions is not None else None,
                    max_tool_calls=req.max_tool_calls, owner=owner)

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
        return await self._conversations.history(_conversation_id(conversation), owner)

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

    def _prepare(self, req: ResponsesRequest, items: list[dict[str, Any]], wheres: list[str],
                 tools: ToolMap, options: Options, owner: str) -> Prepared:
        """The conversation rendered and tokenized (on a worker thread: see ``off_loop``)."""
        if not items:
            raise InvalidRequestError("input is empty: give at least one item", param="input")
        conversation = to_conversation(req.instructions, items, wheres, tools, self._sealer,
                                       owner)
        return prepare(self._engine, self._dialect, conversation, options, self._settings)

    def _prepare_fitting(self, req: ResponsesRequest, items: list[dict[str, Any]],
                         wheres: list[str], tools: ToolMap, options: Options,
                         owner: str) -> Prepared:
        """``_prepare`` of the whole conversation or, with ``truncation: "auto"``, of the
        longest tail of whole turns that fits the context.

        Shorter tails never need more tokens, so the cut is found by bisection over the turn
        boundaries: a few renders for any length of history, not one per dropped turn.
        """
        try:
            return self._prepare(req, items, wheres, tools, options, owner)
        except ContextLengthExceeded:
            cuts = turn_starts(items)
            if req.truncation != "auto" or len(cuts) == 1:
                raise
        fits: dict[int, Prepared] = {}

        def attempt(j: int) -> bool:
            try:
                fits[j] = self._prepare(req, items[cuts[j]:], wheres[cuts[j]:], tools, options,
                                        owner)
                return True
            except ContextLengthExceeded:
                return False

        low, high = 0, len(cuts) - 1         # cuts[low] does not fit
        if not attempt(high):                # raises: nothing fits
            return self._prepare(req, items[cuts[high]:], wheres[cuts[high]:], tools, options,
                                 owner)
        while high - low > 1:
            middle = (low + high) // 2
            if attempt(middle):
                high = middle
            else:
                low = middle
        return fits[high]

    # -- running ------------------------------------------------------------------------

    def _run(self, plan: Plan, keepalive: float = 0.0) -> Run:
        return Run(plan, self._engine,
                   functools.partial(self._sealer.seal, owner=plan.owner) if plan.seal else None,
                   keepalive)

    def _cut(self, exc: BaseException) -> BaseException:
        """Why a run was cut short, as its client was told: once the shutdown's grace period
        is over, ``server_shutting_down`` (the stream's last event, or a 503), not a cancel."""
        if (self.drain is not None and self.drain.fired
                and isinstance(exc, (asyncio.CancelledError, GeneratorExit))):
            return ServerShuttingDown()
        return exc

    async def _events(self, run: Run, turn: Turn | None) -> AsyncGenerator[dict[str, Any], None]:
        """The run's events; in a conversation, the finished turn is appended to it before
        the terminal event goes out, so a client that sees the end finds its turn there."""
        async for event in run.events():
            if turn is not None and event["type"] in APPEND_BEFORE:
                assert self._conversations is not None
                if not await self._conversations.append_turn(
                        turn.conversation_id, turn.owner, run.response, run.plan.input_items):
                    log.warning("response %s: conversation %s is gone; its turn was not "
                                "appended", run.response["id"], turn.conversation_id)
            yield event

    async def _respond(self, plan: Plan, store: bool, turn: Turn | None = None
                       ) -> dict[str, Any]:
        run = self._run(plan)
        try:
            async for _ in self._events(run, turn):
                pass
        except BaseException as exc:
            if store:       # a client that left, or a failure: the record says so
                run.stop(self._cut(exc))
                self._finalizers.spawn(self._last_update(plan.response["id"], run.response))
            raise
        if store:
            await self._last_update(plan.response["id"], run.response)
        return run.response

    async def _last_update(self, response_id: str, response: dict[str, Any]) -> None:
        try:
            await self._store.update(response_id, response)
        finally:
            self._leased.discard(response_id)

    async def _stream(self, plan: Plan, store: bool, turn: Turn | None = None
                      ) -> AsyncGenerator[dict[str, Any], None]:
        run = self._run(plan, self._settings.stream_keepalive_seconds)
        writer = self._logs.open(plan.response["id"]) if store else None
        stopped: BaseException | None = None
        try:
            async for event in self._events(run, turn):
                if writer is not None:
                    await writer.add(event)
                yield event
        except BaseException as exc:
            stopped = exc
            raise
        finally:
            if writer is not None:
                events = run.stop(self._cut(stopped)) if stopped is not None else []
                self._finalizers.spawn(self._finalize(writer, events, run.response))

    async def _finalize(self, writer: EventLog, events: list[dict[str, Any]],
                        response: dict[str, Any]) -> None:
        try:
            for event in events:
                await writer.add(event)
            await writer.flush()
            if not writer.gone:
                await self._store.update(response["id"], response)
        finally:
            self._leased.discard(response["id"])
            self._logs.close(writer)

    async def _background(self, plan: Plan, writer: EventLog, turn: Turn | None = None
                          ) -> None:
        rid = plan.response["id"]
        run = self._run(plan, self._settings.stream_keepalive_seconds)   # followers' keep-alive
        try:
            await self._store.update(rid, dict(plan.response, status="in_progress"))
            async for event in self._events(run, turn):
                await writer.add(event)
        except asyncio.CancelledError as exc:
            if self._closing:
                raise                   # shutting down: the next start resolves it
            for event in run.stop(exc):
                await writer.add(event)
        except Exception as exc:  # noqa: BLE001 - a background failure is recorded, not raised
            log.exception("background response %s failed", rid)
            for event in run.stop(exc):
                await writer.add(event)
        finally:
            try:
                await writer.flush()        # what was produced is kept, even when stopping
                if not self._closing and not writer.gone:
                    await self._store.update(rid, run.response)
            except StoreUnavailable as exc:
                log.warning("background response %s was not stored: %s", rid, exc.message)
            finally:
                self._running.pop(rid, None)
                if not self._closing:       # else its lease lapses: another replica ends it
                    self._leased.discard(rid)
                self._logs.close(writer)

    # -- reading back -------------------------------------------------------------------

    async def retrieve(self, response_id: str, owner: str = NO_OWNER) -> dict[str, Any]:
        return (await self._get(response_id, owner)).body

    async def _get(self, response_id: str, owner: str) -> StoredResponse:
        record = await self._store.get(response_id, owner)
        if record is None:      # or another owner's: the same answer, so ids reveal nothing
            raise NotFoundError(f"No response with id {response_id!r}", param="response_id")
        return record

    async def stream_existing(self, response_id: str, starting_after: int,
                              owner: str = NO_OWNER) -> AsyncGenerator[dict[str, Any], None]:
        record = await self._get(response_id, owner)
        if record.status in TERMINAL and not await self._store.events_after(response_id, -1, 1):
            raise InvalidRequestError("This response has no event log to stream (it was "
                                      "created without stream or background)",
                                      param="stream")
        return self._logs.follow(response_id, starting_after, owner)

    async def cancel(self, response_id: str, owner: str = NO_OWNER) -> dict[str, Any]:
        """Cancel a running background response, here or (through the store) on the replica
        that runs it; the answer is the response once it has ended."""
        record = await self._get(response_id, owner)
        task = self._running.get(response_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        elif (record.status in TERMINAL or not record.body.get("background")
              or not await self._store.request_cancel(response_id, owner)):
            raise InvalidRequestError(
                f"Only a background response that is still running can be cancelled; this "
                f"one is {record.status}", param="response_id")
        else:
            await self._until_finished(response_id, owner)
        return (await self._get(response_id, owner)).body

    async def _until_finished(self, response_id: str, owner: str) -> None:
        """Wait (a lease's time at most: by then a dead replica's response is failed) until
        the response has ended on whichever replica runs it."""
        deadline = time.monotonic() + self._settings.response_lease_seconds + 5
        while time.monotonic() < deadline:
            changed = self._store.changed(response_id)      # before the read
            record = await self._store.get(response_id, owner)
            if record is None or record.status in TERMINAL:
                return
            try:
                await asyncio.wait_for(changed.wait(), POLL_SECONDS)
            except asyncio.TimeoutError:
                pass

    # -- leases: every stored response that runs is held by its replica -----------------

    def _cancel_here(self, response_id: str) -> None:
        """A cancel request heard from another replica (or a lease lost): end the
        background response if it runs here."""
        task = self._running.get(response_id)
        if task is not None and not task.done():
            log.info("response %s: cancelled through the store", response_id)
            task.cancel()

    async def _keep_leases(self) -> None:
        """Renew this replica's leases every third of a lease; act on the cancel requests
        they carry; stop what it no longer holds; fail other replicas' lapsed responses."""
        lease = self._settings.response_lease_seconds
        while True:
            await asyncio.sleep(lease / 3)
            try:
                cancel, lost = await self._store.renew(sorted(self._leased), self._replica,
                                                       time.time() + lease)
                self._leased -= lost
                for response_id in cancel | lost:
                    self._cancel_here(response_id)
                await self._fail_abandoned()
            except StoreUnavailable as exc:
                log.warning("response leases not renewed: %s", exc.message)
            except Exception:  # noqa: BLE001 - the keeper must outlive any one failure
                log.exception("response leases: renewal failed")

    async def _fail_abandoned(self) -> None:
        failed = await self._store.fail_unfinished(
            "The server running this response stopped before it finished", fail_response)
        if failed:
            log.warning("marked %d interrupted responses failed: %s", len(failed),
                        ", ".join(failed))

    async def delete(self, response_id: str, owner: str = NO_OWNER) -> dict[str, Any]:
        await self._get(response_id, owner)
        writer = self._logs.get(response_id)
        if writer is not None:
            writer.discard()            # not one more event of it is written here
        task = self._running.get(response_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if not await self._store.delete(response_id, owner):
            raise NotFoundError(f"No response with id {response_id!r}", param="response_id")
        return {"id": response_id, "object": "response", "deleted": True}

    async def input_items(self, response_id: str, after: str | None, limit: int,
                          order: str, owner: str = NO_OWNER) -> dict[str, Any]:
        await self._get(response_id, owner)
        items, more = await self._store.input_items(response_id, owner, after=after,
                                                    limit=limit, order=order)
        return {"object": "list", "data": items,
                "first_id": items[0]["id"] if items else None,
                "last_id": items[-1]["id"] if items else None, "has_more": more}


def _conversation_id(value: Any) -> str:
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
