"""The Responses service: stateful responses, streamed from the same events as chat.

A request's items (plus the stored conversation behind ``previous_response_id``) become chat
messages; ``ChatService.prepare`` renders and tokenizes them; the engine's events go through
the same parsers as chat, and ``ResponseBuilder`` renders them as Responses events. What is
stored (SQL): the response object, the conversation before its output, its input items, and
for streamed or background responses an append-only event log that any replica can replay.

A stored response belongs to its owner (the API key that made it, ``NO_OWNER`` without
keys); every look-up takes the caller's owner, and another owner's response is as missing as
one that never was (the same 404). A stored response is written before anything is
generated, so a store that cannot take it fails the request cleanly (503). A delete deletes:
the response's log writer on this replica stops at once, and on any replica an append finds
the row gone and stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable

from pydantic import ValidationError

from podium.api.chat import ChatService
from podium.api.conversation import ToolMap, new_item_id, normalize_input, to_messages
from podium.api.generation import Choice, check_model, off_loop, run_choices, start
from podium.api.sealing import Sealer
from podium.engine.base import Engine
from podium.errors import (ContextLengthExceeded, InvalidRequestError, NotFoundError,
                           PodiumError, StoreUnavailable)
from podium.parsing.events import Finish
from podium.protocol.chat import ChatCompletionRequest
from podium.protocol.responses import ResponsesRequest
from podium.render.responses import ResponseBuilder, Sequencer, response_skeleton, usage
from podium.settings import Settings
from podium.store.base import NO_OWNER, TERMINAL, ResponseStore, StoredResponse

log = logging.getLogger(__name__)

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_FLUSH_EVENTS, _FLUSH_SECONDS, _POLL_SECONDS = 32, 0.05, 0.25


@dataclass
class _Plan:
    response: dict[str, Any]
    history: list[dict[str, Any]]       # the conversation before this response's output
    input_items: list[dict[str, Any]]
    prompt_tokens: int
    choice: Choice
    tools: ToolMap
    logprobs: int | None
    seal: bool


class ResponsesService:
    def __init__(self, engine: Engine, chat: ChatService, store: ResponseStore,
                 settings: Settings, sealer: Sealer):
        self._engine = engine
        self._chat = chat
        self._store = store
        self._settings = settings
        self._sealer = sealer
        self._running: dict[str, asyncio.Task] = {}     # background responses on this replica
        self._logs: dict[str, _LogWriter] = {}          # responses being logged on it
        self._finishing: set[asyncio.Task] = set()      # last writes of ended streams
        self._closing = False

    # -- lifecycle ----------------------------------------------------------------------

    async def startup(self) -> None:
        failed = await self._store.fail_unfinished(
            "The server stopped while this response was running")
        if failed:
            log.warning("marked %d interrupted responses failed", len(failed))
        if self._settings.response_retention_days > 0:
            cutoff = time.time() - self._settings.response_retention_days * 86400
            await self._store.prune(cutoff)

    async def shutdown(self) -> None:
        """Leave running background responses for the next start to resolve."""
        self._closing = True
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), *self._finishing,
                             return_exceptions=True)

    # -- create -------------------------------------------------------------------------

    async def create(self, req: ResponsesRequest, owner: str = NO_OWNER
                     ) -> dict[str, Any] | AsyncGenerator[dict, None]:
        check_model(req.model, self._engine)
        if req.background and not req.store:
            raise InvalidRequestError("background responses must be stored (store: true)",
                                      param="background")
        plan = await self._plan(req, owner)
        start(self._engine, [plan.choice])      # 429 / 400 now, before anything is stored
        rid = plan.response["id"]
        if req.background:
            plan.response["status"] = "queued"
        if req.store:       # first, so a store that cannot take it is a 503 before any work
            await self._store_first(plan, owner)
        if req.background:
            writer = self._open_log(rid)        # before any follower looks for it
            self._running[rid] = asyncio.create_task(self._background(plan, writer))
            return self.follow(rid, -1, owner) if req.stream else dict(plan.response, output=[])
        if req.stream:
            return self._stream(plan, req.store)
        return await self._respond(plan, req.store)

    async def _store_first(self, plan: _Plan, owner: str) -> None:
        record = StoredResponse(plan.response["id"], dict(plan.response), plan.history,
                                plan.input_items, owner)
        try:
            await self._store.put(record)
        except BaseException:
            if plan.choice.outputs is not None:     # already queued with the engine: drop it
                await plan.choice.outputs.aclose()
            raise

    async def _plan(self, req: ResponsesRequest, owner: str) -> _Plan:
        items = normalize_input(req.input)
        history: list[dict[str, Any]] = []
        if req.previous_response_id:
            history = await self._history(req.previous_response_id, owner)
        tools = ToolMap(req.tools, strict=self._settings.strict_tools)
        if req.tool_choice == "required" and not tools.chat_tools:
            raise InvalidRequestError("tool_choice 'required' needs tools", param="tool_choice")
        try:
            prompt_tokens, choices = await off_loop(self._prepare_fitting, req,
                                                    history + items, tools)
        except InvalidRequestError as exc:          # name the Responses request's parameter
            exc.param = tools.responses_param(exc.param)
            raise
        include = set(req.include or ())
        logprobs = ((req.top_logprobs or 0) if "message.output_text.logprobs" in include
                    else None)
        return _Plan(self._skeleton(req), history + items, items, prompt_tokens, choices[0],
                     tools, logprobs, "reasoning.encrypted_content" in include)

    async def _history(self, response_id: str, owner: str) -> list[dict[str, Any]]:
        """The conversation up to and including a finished response's output."""
        previous = await self._store.get(response_id, owner)
        if previous is None:
            raise NotFoundError(f"No response with id {response_id!r}",
                                param="previous_response_id")
        if previous.status not in TERMINAL:
            raise InvalidRequestError(
                f"Response {response_id!r} is still {previous.status}: continue from it once "
                f"it has finished", param="previous_response_id")
        return previous.history + _as_input(previous.body.get("output") or [])

    def _prepare(self, req: ResponsesRequest, items: list[dict[str, Any]],
                 tools: ToolMap) -> tuple[int, list[Choice]]:
        """The conversation rendered and tokenized (on a worker thread: see ``off_loop``)."""
        return self._chat.prepare(self._chat_request(req, items, tools))

    def _prepare_fitting(self, req: ResponsesRequest, items: list[dict[str, Any]],
                         tools: ToolMap) -> tuple[int, list[Choice]]:
        """``_prepare`` of the whole conversation or, with ``truncation: "auto"``, of the
        longest tail of whole turns that fits the context.

        Shorter tails never need more tokens, so the cut is found by bisection over the turn
        boundaries: a few renders for any length of history, not one per dropped turn.
        """
        try:
            return self._prepare(req, items, tools)
        except ContextLengthExceeded:
            cuts = _turn_starts(items)
            if req.truncation != "auto" or len(cuts) == 1:
                raise
        fits: dict[int, tuple[int, list[Choice]]] = {}

        def attempt(j: int) -> bool:
            try:
                fits[j] = self._prepare(req, items[cuts[j]:], tools)
                return True
            except ContextLengthExceeded:
                return False

        low, high = 0, len(cuts) - 1         # cuts[low] does not fit
        if not attempt(high):
            return self._prepare(req, items[cuts[high]:], tools)   # raises: nothing fits
        while high - low > 1:
            middle = (low + high) // 2
            if attempt(middle):
                high = middle
            else:
                low = middle
        return fits[high]

    def _chat_request(self, req: ResponsesRequest, items: list[dict[str, Any]],
                      tools: ToolMap) -> ChatCompletionRequest:
        include = set(req.include or ())
        body: dict[str, Any] = {
            "model": req.model,
            "messages": to_messages(req.instructions, items, tools, self._sealer.unseal),
            "max_tokens": req.max_output_tokens, "temperature": req.temperature,
            "top_p": req.top_p, "seed": req.seed, "user": req.user,
            "tools": tools.chat_tools or None,
            "tool_choice": tools.chat_tool_choice(req.tool_choice) if tools.chat_tools
            else None,
            "parallel_tool_calls": req.parallel_tool_calls,
            "reasoning_effort": (req.reasoning or {}).get("effort"),
            "response_format": _response_format((req.text or {}).get("format")),
        }
        if "message.output_text.logprobs" in include:
            body.update(logprobs=True, top_logprobs=req.top_logprobs or 0)
        try:
            return ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidRequestError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}",
                                      param="input") from None

    def _skeleton(self, req: ResponsesRequest) -> dict[str, Any]:
        return response_skeleton(
            id=new_item_id("resp"), created_at=time.time(), model=req.model,
            instructions=req.instructions, tools=req.tools or [],
            tool_choice=req.tool_choice or "auto",
            parallel_tool_calls=req.parallel_tool_calls is not False,
            temperature=req.temperature if req.temperature is not None else 1.0,
            top_p=req.top_p if req.top_p is not None else 1.0,
            max_output_tokens=req.max_output_tokens, max_tool_calls=req.max_tool_calls,
            previous_response_id=req.previous_response_id, metadata=req.metadata or {},
            background=req.background, text=req.text or {"format": {"type": "text"}},
            reasoning=req.reasoning, truncation=req.truncation or "disabled", user=req.user,
            prompt_cache_key=req.prompt_cache_key, safety_identifier=req.safety_identifier,
            top_logprobs=req.top_logprobs, service_tier="default", store=req.store)

    # -- running ------------------------------------------------------------------------

    def _builder(self, plan: _Plan) -> ResponseBuilder:
        return ResponseBuilder(plan.response, self._engine.tokenizer,
                               client_tool=plan.tools.client, new_id=new_item_id,
                               logprobs=plan.logprobs,
                               seal=self._sealer.seal if plan.seal else None)

    async def _events(self, plan: _Plan, builder: ResponseBuilder,
                      seq: Sequencer) -> AsyncGenerator[dict[str, Any], None]:
        """The response's stream events, stamped, from created to the terminal event."""
        for event in seq.stamp(builder.start()):
            yield event
        finish = None
        try:
            async for _, semantic in run_choices(self._engine, [plan.choice]):
                if isinstance(semantic, Finish):
                    finish = semantic
                    continue
                for out in seq.stamp(builder.event(semantic)):
                    yield out
        except PodiumError as exc:
            log.error("response %s failed: %s", plan.response["id"], exc.message)
            error = {"code": exc.code or "server_error", "message": exc.message}
            for out in seq.stamp(builder.finish(None, self._usage(plan, builder),
                                                status="failed", error=error)):
                yield out
            return
        for out in seq.stamp(builder.finish(finish, self._usage(plan, builder))):
            yield out

    def _usage(self, plan: _Plan, builder: ResponseBuilder) -> dict[str, Any]:
        reasoning_tokens = getattr(plan.choice.pipeline, "reasoning_tokens", None)
        if reasoning_tokens is None:      # text families: count what the parser split off
            reasoning = "".join(builder.reasoning_text)
            reasoning_tokens = (len(self._engine.tokenizer.encode(reasoning, add_special=False))
                                if reasoning else 0)
        return usage(plan.prompt_tokens, plan.choice.pipeline.completion_tokens,
                     reasoning_tokens, plan.choice.pipeline.cached_tokens)

    async def _respond(self, plan: _Plan, store: bool) -> dict[str, Any]:
        builder, seq = self._builder(plan), Sequencer()
        try:
            async for _ in self._events(plan, builder, seq):
                pass
        except BaseException as exc:
            if store:       # a client that left, or a failure: the record says so
                self._spawn(self._store.update(plan.response["id"], self._stopped(
                    plan, builder, seq, exc)[1]))
            raise
        if store:
            await self._store.update(plan.response["id"], builder.response)
        return builder.response

    async def _stream(self, plan: _Plan, store: bool) -> AsyncGenerator[dict[str, Any], None]:
        rid = plan.response["id"]
        builder, seq = self._builder(plan), Sequencer()
        writer = self._open_log(rid) if store else None
        stopped: BaseException | None = None
        try:
            async for event in self._events(plan, builder, seq):
                if writer is not None:
                    await writer.add(event)
                yield event
        except BaseException as exc:
            stopped = exc
            raise
        finally:
            if writer is not None:
                events, response = (self._stopped(plan, builder, seq, stopped)
                                    if stopped is not None else ([], builder.response))
                self._spawn(self._finalize(writer, events, response))

    def _stopped(self, plan: _Plan, builder: ResponseBuilder, seq: Sequencer,
                 exc: BaseException) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """A response cut short by ``exc``: the events that end it, and its final object
        (cancelled when its client left, failed otherwise)."""
        if builder.response["status"] in TERMINAL:      # it had ended already
            return [], builder.response
        if isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
            status, error = "cancelled", None
        else:
            status = "failed"
            error = {"code": getattr(exc, "code", None) or "server_error",
                     "message": getattr(exc, "message", None) or "The response failed"}
        events = seq.stamp(builder.finish(None, self._usage(plan, builder), status=status,
                                          error=error))
        return events, builder.response

    async def _finalize(self, writer: "_LogWriter", events: list[dict[str, Any]],
                        response: dict[str, Any]) -> None:
        try:
            for event in events:
                await writer.add(event)
            await writer.flush()
            if not writer.gone:
                await self._store.update(response["id"], response)
        finally:
            self._close_log(writer)

    async def _background(self, plan: _Plan, writer: "_LogWriter") -> None:
        rid = plan.response["id"]
        builder, seq = self._builder(plan), Sequencer()
        try:
            await self._store.update(rid, dict(plan.response, status="in_progress"))
            async for event in self._events(plan, builder, seq):
                await writer.add(event)
        except asyncio.CancelledError:
            if self._closing:
                raise                   # shutting down: the next start resolves it
            for event in seq.stamp(builder.finish(None, self._usage(plan, builder),
                                                  status="cancelled")):
                await writer.add(event)
        except Exception:  # noqa: BLE001 - a background failure is recorded, not raised
            log.exception("background response %s failed", rid)
            error = {"code": "server_error", "message": "The response failed"}
            for event in seq.stamp(builder.finish(None, self._usage(plan, builder),
                                                  status="failed", error=error)):
                await writer.add(event)
        finally:
            try:
                await writer.flush()        # what was produced is kept, even when stopping
                if not self._closing and not writer.gone:
                    await self._store.update(rid, builder.response)
            except StoreUnavailable as exc:
                log.warning("background response %s was not stored: %s", rid, exc.message)
            finally:
                self._running.pop(rid, None)
                self._close_log(writer)

    def _open_log(self, response_id: str) -> "_LogWriter":
        writer = self._logs[response_id] = _LogWriter(self._store, response_id)
        return writer

    def _close_log(self, writer: "_LogWriter") -> None:
        if self._logs.get(writer.response_id) is writer:
            del self._logs[writer.response_id]
        writer.wake()                   # followers look at the store from now on

    def _spawn(self, work: Awaitable[None]) -> None:
        """Run a last write to its end although its caller is going (kept until done)."""
        async def run() -> None:
            try:
                await work
            except StoreUnavailable as exc:
                log.warning("a stored response could not be finished: %s", exc.message)

        task = asyncio.ensure_future(run())
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

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
        return self.follow(response_id, starting_after, owner)

    async def follow(self, response_id: str, after: int,
                     owner: str) -> AsyncGenerator[dict[str, Any], None]:
        """The logged events after ``after``, then live ones, up to the terminal event."""
        while True:
            events = await self._store.events_after(response_id, after)
            for event in events:
                yield event
                after = event["sequence_number"]
                if event["type"] in TERMINAL_EVENTS:
                    return
            writer = self._logs.get(response_id)
            if writer is not None and writer.gone:
                writer = None           # deleted: the store says so at once
            if not events and writer is None:
                record = await self._store.get(response_id, owner)
                if record is None or (record.status in TERMINAL and not
                                      await self._store.events_after(response_id, after, 1)):
                    return
            try:
                if writer is not None:
                    await asyncio.wait_for(writer.changed.wait(), _POLL_SECONDS)
                else:
                    await asyncio.sleep(_POLL_SECONDS)
            except asyncio.TimeoutError:
                pass

    async def cancel(self, response_id: str, owner: str = NO_OWNER) -> dict[str, Any]:
        record = await self._get(response_id, owner)
        task = self._running.get(response_id)
        if task is None:
            raise InvalidRequestError(
                f"Only a background response that is still running can be cancelled; this "
                f"one is {record.status}", param="response_id")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return (await self._get(response_id, owner)).body

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


class _LogWriter:
    """Appends a response's events to the store in small batches and wakes its followers.

    It stops for good (``gone``) when the response is deleted: at once on this replica
    (``discard``), at its next append on any other (the store refuses it)."""

    def __init__(self, store: ResponseStore, response_id: str):
        self._store, self.response_id = store, response_id
        self._batch: list[dict[str, Any]] = []
        self._last = time.monotonic()
        self.changed = asyncio.Event()      # set (and replaced) after each write
        self.gone = False

    async def add(self, event: dict[str, Any]) -> None:
        if self.gone:
            return
        self._batch.append(event)
        if (len(self._batch) >= _FLUSH_EVENTS or event["type"] in TERMINAL_EVENTS
                or time.monotonic() - self._last >= _FLUSH_SECONDS):
            await self.flush()

    async def flush(self) -> None:
        batch, self._batch = self._batch, []
        self._last = time.monotonic()
        if batch and not self.gone:
            self.gone = not await self._store.append_events(self.response_id, batch)
        self.wake()

    def discard(self) -> None:
        self.gone, self._batch = True, []
        self.wake()

    def wake(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


def _as_input(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items, as input items of the next turn."""
    items = []
    for item in output:
        if item.get("type") == "message":
            items.append({"type": "message", "id": item["id"], "role": "assistant",
                          "content": [{"type": "output_text", "text": p.get("text", "")}
                                      for p in item.get("content") or ()]})
        elif item.get("type") in ("function_call", "custom_tool_call", "reasoning"):
            items.append({k: v for k, v in item.items() if k != "status"})
    return items


def _turn_starts(items: list[dict[str, Any]]) -> list[int]:
    """Where truncation may cut, oldest first: the start, each later user message (a turn's
    calls go with their outputs), and as a last resort the last item alone."""
    cuts = [0] + [i for i, item in enumerate(items) if i > 0 and item["type"] == "message"
                  and item["role"] == "user"]
    if cuts[-1] < len(items) - 1:
        cuts.append(len(items) - 1)
    return cuts


def _response_format(fmt: Any) -> dict[str, Any] | None:
    if fmt is not None and not isinstance(fmt, dict):
        raise InvalidRequestError("text.format must be an object such as {\"type\": "
                                  "\"json_object\"}", param="text.format")
    if not fmt or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        return {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "output"), "schema": fmt.get("schema"),
            "strict": fmt.get("strict")}}
    raise InvalidRequestError(f"text.format of type {fmt['type']!r} is not supported",
                              param="text.format")
