"""The Responses service: stateful responses, streamed from the same events as chat.

The package is cut along its jobs: ``translate`` (items, tools and fields to the conversation
stage and back), ``planner`` (the history, the MCP tools, the prompt cut to the context, and
each next round of the model), ``runner`` (one response's run, rendered by
``render.responses``), ``log`` (event logs, their followers, the last writes of ended
runs), ``leases`` (which replica runs what) and this thin service. Every response takes one
path, run -> log -> finalize (``_lifecycle``); its mode (blocking, streamed, background)
only picks who consumes it. What is stored (SQL): the
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
import functools
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncGenerator, Callable, Literal

from podium.api.responses import mcp
from podium.api.responses.leases import Leases
from podium.api.responses.log import POLL_SECONDS, EventLog, Finalizers, Logs
from podium.api.responses.planner import Planner
from podium.api.responses.runner import Plan, Run
from podium.api.sealing import Sealer
from podium.errors import InvalidRequestError, NotFoundError, StoreUnavailable
from podium.generation import off_loop, start
from podium.protocol.responses import ResponsesRequest
from podium.server.sse import ServerShuttingDown
from podium.settings import Settings
from podium.store.base import NO_OWNER, TERMINAL, ResponseStore, StoredResponse

if TYPE_CHECKING:
    from podium.api.conversations import ConversationsService
    from podium.server.lifecycle import Drain

log = logging.getLogger(__name__)
APPEND_BEFORE = frozenset({"response.completed", "response.incomplete"})
Mode = Literal["respond", "stream", "background"]


@dataclass
class Turn:
    """A response run in a conversation: where its items are appended when it finishes."""

    conversation_id: str
    owner: str


class ResponsesService:
    """The Responses API over every model: each request brings its model's ``Planner``
    (which knows its engine and dialect); the store, leases and logs are the server's."""

    def __init__(self, store: ResponseStore, settings: Settings, sealer: Sealer,
                 conversations: ConversationsService | None = None):
        self._conversations = conversations
        self._store = store
        self._settings = settings
        self._sealer = sealer
        self._running: dict[str, asyncio.Task] = {}     # background responses on this replica
        self._leases = Leases(store, settings.response_lease_seconds, self._cancel_here)
        self._logs = Logs(store)                        # responses being logged on it
        self._finalizers = Finalizers()                 # last writes of ended runs
        self._closing = False
        self.drain: Drain | None = None                 # the app's (server.lifecycle)
        self.file_search: Any = None    # file_search's stores (api/vector_stores.py)

    # -- lifecycle ----------------------------------------------------------------------

    async def startup(self) -> None:
        if self._settings.mcp_allow:
            await off_loop(mcp.warm)
        await self._leases.start()
        if self._settings.response_retention_days > 0:
            cutoff = time.time() - self._settings.response_retention_days * 86400
            await self._store.prune(cutoff)

    async def shutdown(self) -> None:
        """Stop running background responses and give up their leases: the next start,
        or another replica at once, marks them failed with their logs closed."""
        self._closing = True
        await self._leases.stop_keeping()
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        await self._finalizers.drain()
        await self._leases.give_up()

    # -- create -------------------------------------------------------------------------

    async def create(self, req: ResponsesRequest, owner: str, planner: Planner, *,
                     small: bool = False, hold: Callable[[], Callable[[], None]] | None = None
                     ) -> dict[str, Any] | AsyncGenerator[dict, None]:
        """``planner``: the requested model's; ``hold``: keeps that model loaded while a
        background response outlives its request (it returns the release)."""
        if req.background and not req.store:
            raise InvalidRequestError("background responses must be stored (store: true)",
                                      param="background")
        if req.conversation is not None and req.previous_response_id:
            raise InvalidRequestError("conversation and previous_response_id cannot be used "
                                      "together", param="conversation")
        plan = await planner.plan(req, owner, small)
        searcher = None
        try:
            if plan.tools.file_search is not None:      # its stores checked before any work
                searcher = await self._searcher(plan.tools.file_search, req, owner)
            if plan.choice is not None:     # 429 / 400 now, before anything is stored
                start(planner.engine, [plan.choice])
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
        mode: Mode = "background" if req.background else "stream" if req.stream else "respond"
        keepalive = self._settings.stream_keepalive_seconds if mode != "respond" else 0.0
        writer = self._logs.open(rid) if mode != "respond" and req.store else None
        run = Run(plan, planner.engine, planner,
                  functools.partial(self._sealer.seal, owner=owner) if plan.seal else None,
                  keepalive,        # background: its followers' keep-alive
                  writer.put if writer is not None else None, searcher)
        events = self._lifecycle(run, turn, writer, mode, req.store)
        if mode == "stream":
            return events
        if mode == "respond":
            async for _ in events:
                pass
            if run.final is not None:
                await run.final
            return run.response
        release = hold() if hold is not None else None
        self._running[rid] = asyncio.create_task(self._background(rid, run, events, release))
        return (self._logs.follow(rid, -1, owner) if req.stream
                else dict(plan.response, output=[]))

    async def _searcher(self, tool: dict[str, Any], req: ResponsesRequest, owner: str) -> Any:
        if self.file_search is None:
            raise InvalidRequestError("This server keeps no vector stores",
                                      param=tool["where"])
        return await self.file_search.searcher(
            tool, owner, "file_search_call.results" in set(req.include or ()))

    async def _store_first(self, plan: Plan, owner: str) -> None:
        record = StoredResponse(plan.response["id"], dict(plan.response), [],
                                plan.input_items, owner, parent_id=plan.parent_id)
        try:
            await self._store.put(record, self._leases.new())
            self._leases.held.add(record.id)
        except BaseException:
            if plan.choice is not None and plan.choice.outputs is not None:   # queued: drop it
                await plan.choice.outputs.aclose()
            raise

    # -- the one path: run -> log -> finalize -----------------------------------------

    async def _lifecycle(self, run: Run, turn: Turn | None, writer: EventLog | None,
                         mode: Mode, store: bool) -> AsyncGenerator[dict[str, Any], None]:
        """The run's events, each logged (``writer``: handed it when it was numbered,
        written up to it here) before it goes to the consumer; the
        run's last writes when it ends, however it ends: awaited by a blocking consumer
        that saw it finish (``run.final``) and by a background task, else tracked by
        ``Finalizers`` (a stream's client may be gone, a request cancelled)."""
        rid = run.response["id"]
        stopped: BaseException | None = None
        try:
            if mode == "background":
                await self._store.update(rid, dict(run.response, status="in_progress"))
            async with aclosing(self._events(run, turn)) as events:   # closed here, at once
                async for event in events:
                    if writer is not None:
                        await writer.reached(event)
                    yield event
        except BaseException as exc:
            stopped = exc
            raise
        finally:
            if store:
                # shutting down, a background response is left to the next start (or
                # another replica), which fails it: its lease lapses
                left = mode == "background" and self._closing
                if stopped is not None and not left:
                    run.stop(self._cut(stopped))    # its events: into the log, as numbered
                final = self._finalize(rid, run.response, writer, resolve=not left)
                if mode == "background" or (mode == "respond" and stopped is None):
                    run.final = final
                else:
                    self._finalizers.spawn(final)

    def _cut(self, exc: BaseException | None) -> BaseException:
        """Why a run was cut short, as its client was told: once the shutdown's grace period
        is over, ``server_shutting_down`` (the stream's last event, or a 503), not a cancel."""
        assert exc is not None
        if (self.drain is not None and self.drain.fired
                and isinstance(exc, (asyncio.CancelledError, GeneratorExit))):
            return ServerShuttingDown()
        return exc

    async def _events(self, run: Run, turn: Turn | None) -> AsyncGenerator[dict[str, Any], None]:
        """The run's events; in a conversation, the finished turn is appended to it before
        the terminal event goes out, so a client that sees the end finds its turn there."""
        async with aclosing(run.events()) as events:
            async for event in events:
                if turn is not None and event["type"] in APPEND_BEFORE:
                    assert self._conversations is not None
                    if not await self._conversations.append_turn(
                            turn.conversation_id, turn.owner, run.response,
                            run.plan.input_items):
                        log.warning("response %s: conversation %s is gone; its turn was not "
                                    "appended", run.response["id"], turn.conversation_id)
                yield event

    async def _finalize(self, rid: str, response: dict[str, Any], writer: EventLog | None,
                        resolve: bool) -> None:
        """A run's last writes: the log flushed (every event numbered, those that end it
        too: what was produced is kept, even when stopping), the stored object; then its
        lease and log let go. ``resolve`` False: the object is left as it is, its lease to
        lapse."""
        try:
            if writer is not None:
                await writer.flush()
            if resolve and not (writer is not None and writer.gone):
                await self._store.update(rid, response)
        finally:
            if resolve:
                self._leases.held.discard(rid)
            if writer is not None:
                self._logs.close(writer)

    async def _background(self, rid: str, run: Run,
                          events: AsyncGenerator[dict[str, Any], None],
                          release: Callable[[], None] | None) -> None:
        try:
            async for _ in events:
                pass
        except asyncio.CancelledError:
            if self._closing:
                raise                   # shutting down: the next start resolves it
        except Exception:  # noqa: BLE001 - a background failure is recorded, not raised
            log.exception("background response %s failed", rid)
        finally:
            try:
                if run.final is not None:
                    await run.final
            except StoreUnavailable as exc:
                log.warning("background response %s was not stored: %s", rid, exc.message)
            finally:
                self._running.pop(rid, None)
                if release is not None:
                    release()

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

    def _cancel_here(self, response_id: str) -> None:
        """End the background response if it runs here (a cancel request heard from
        another replica, or a lease lost)."""
        task = self._running.get(response_id)
        # once: the cancel request stays on the row until the response ends, and each lease
        # renewal hears it again; a second cancel would cut the run's last writes short
        if task is not None and not task.done() and not task.cancelling():
            log.info("response %s: cancelled through the store", response_id)
            task.cancel()

    async def cancel(self, response_id: str, owner: str = NO_OWNER) -> dict[str, Any]:
        """Cancel a running background response, here or (through the store) on the replica
        that runs it; the answer is the response once it has ended."""
        record = await self._get(response_id, owner)
        task = self._running.get(response_id)
        if task is not None:
            if not task.cancelling():       # (see _cancel_here)
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
        deadline = time.monotonic() + self._leases.seconds + 5
        while time.monotonic() < deadline:
            changed = self._store.changed(response_id)      # before the read
            record = await self._store.get(response_id, owner)
            if record is None or record.status in TERMINAL:
                return
            try:
                await asyncio.wait_for(changed.wait(), POLL_SECONDS)
            except asyncio.TimeoutError:
                pass

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



