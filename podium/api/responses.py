"""The Responses service: stateful responses, streamed from the same events as chat.

A request's items (plus the stored conversation behind ``previous_response_id``) become chat
messages; ``ChatService.prepare`` renders and tokenizes them; the engine's events go through
the same parsers as chat, and ``ResponseBuilder`` renders them as Responses events. What is
stored (SQL): the response object, the conversation before its output, its input items, and
for streamed or background responses an append-only event log that any replica can replay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from pydantic import ValidationError

from podium.api.chat import ChatService
from podium.api.conversation import ToolMap, new_item_id, normalize_input, to_messages
from podium.api.generation import Choice, check_model, run_choices
from podium.api.sealing import Sealer
from podium.engine.base import Engine
from podium.errors import (ContextLengthExceeded, InvalidRequestError, NotFoundError,
                           PodiumError)
from podium.parsing.events import Finish
from podium.protocol.chat import ChatCompletionRequest
from podium.protocol.responses import ResponsesRequest
from podium.render.responses import ResponseBuilder, Sequencer, response_skeleton, usage
from podium.settings import Settings
from podium.store.base import TERMINAL, ResponseStore, StoredResponse

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
        self._wakeups: dict[str, asyncio.Event] = {}    # new events logged, per response
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
        await asyncio.gather(*self._running.values(), return_exceptions=True)

    # -- create -------------------------------------------------------------------------

    async def create(self, req: ResponsesRequest) -> dict[str, Any] | AsyncIterator[dict]:
        check_model(req.model, self._engine)
        if req.background and not req.store:
            raise InvalidRequestError("background responses must be stored (store: true)",
                                      param="background")
        plan = await self._plan(req)
        rid = plan.response["id"]
        if req.background:
            plan.response["status"] = "queued"
            await self._store.put(StoredResponse(rid, dict(plan.response), plan.history,
                                                 plan.input_items))
            self._wakeups[rid] = asyncio.Event()
            self._running[rid] = asyncio.create_task(self._background(plan))
            return self.follow(rid, -1) if req.stream else dict(plan.response, output=[])
        if req.stream:
            return self._stream(plan, req.store)
        builder, seq = self._builder(plan), Sequencer()
        async for _ in self._events(plan, builder, seq):
            pass
        if req.store:
            await self._store.put(StoredResponse(rid, builder.response, plan.history,
                                                 plan.input_items))
        return builder.response

    async def _plan(self, req: ResponsesRequest) -> _Plan:
        items = normalize_input(req.input)
        history: list[dict[str, Any]] = []
        if req.previous_response_id:
            previous = await self._store.get(req.previous_response_id)
            if previous is None:
                raise NotFoundError(f"No response with id {req.previous_response_id!r}",
                                    param="previous_response_id")
            history = previous.history + _as_input(previous.body.get("output") or [])
        tools = ToolMap(req.tools, strict=self._settings.strict_tools)
        conversation = history + items
        while True:
            try:
                prompt_tokens, choices = await asyncio.to_thread(
                    self._chat.prepare, self._chat_request(req, conversation, tools))
                break
            except ContextLengthExceeded:
                if req.truncation != "auto" or len(conversation) <= 1:
                    raise
                conversation = _drop_oldest_turn(conversation)
        include = set(req.include or ())
        logprobs = ((req.top_logprobs or 0) if "message.output_text.logprobs" in include
                    else None)
        return _Plan(self._skeleton(req), history + items, items, prompt_tokens, choices[0],
                     tools, logprobs, "reasoning.encrypted_content" in include)

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
            top_logprobs=req.top_logprobs, service_tier="default")

    # -- running ------------------------------------------------------------------------

    def _builder(self, plan: _Plan) -> ResponseBuilder:
        return ResponseBuilder(plan.response, self._engine.tokenizer,
                               client_tool=plan.tools.client, new_id=new_item_id,
                               logprobs=plan.logprobs,
                               seal=self._sealer.seal if plan.seal else None)

    async def _events(self, plan: _Plan, builder: ResponseBuilder,
                      seq: Sequencer) -> AsyncIterator[dict[str, Any]]:
        """The response's stream events, stamped, from created to the terminal event."""
        for event in seq.stamp(builder.start()):
            yield event
        finish = None
        try:
            async for _, event in run_choices(self._engine, [plan.choice]):
                if isinstance(event, Finish):
                    finish = event
                    continue
                for out in seq.stamp(builder.event(event)):
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

    async def _stream(self, plan: _Plan, store: bool) -> AsyncIterator[dict[str, Any]]:
        rid = plan.response["id"]
        builder, seq = self._builder(plan), Sequencer()
        writer = _LogWriter(self._store, rid, self._wakeups) if store else None
        if store:
            await self._store.put(StoredResponse(rid, dict(plan.response), plan.history,
                                                 plan.input_items))
        done = False
        try:
            async for event in self._events(plan, builder, seq):
                if writer is not None:
                    await writer.add(event)
                yield event
            done = True
        finally:
            if store:
                # a client that left mid-stream: record that the response was cancelled
                events = [] if done else seq.stamp(builder.finish(
                    None, self._usage(plan, builder), status="cancelled"))
                asyncio.ensure_future(self._finalize(writer, events, builder.response))

    async def _finalize(self, writer: "_LogWriter", events: list[dict[str, Any]],
                        response: dict[str, Any]) -> None:
        for event in events:
            await writer.add(event)
        await writer.flush()
        await self._store.update(response["id"], response)

    async def _background(self, plan: _Plan) -> None:
        rid = plan.response["id"]
        builder, seq = self._builder(plan), Sequencer()
        writer = _LogWriter(self._store, rid, self._wakeups)
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
            await writer.flush()            # what was produced is kept, even when stopping
            if not self._closing:
                await self._store.update(rid, builder.response)
            self._running.pop(rid, None)
            self._wakeups.pop(rid, None)

    # -- reading back -------------------------------------------------------------------

    async def retrieve(self, response_id: str) -> dict[str, Any]:
        return (await self._get(response_id)).body

    async def _get(self, response_id: str) -> StoredResponse:
        record = await self._store.get(response_id)
        if record is None:
            raise NotFoundError(f"No response with id {response_id!r}", param="response_id")
        return record

    async def stream_existing(self, response_id: str, starting_after: int
                              ) -> AsyncIterator[dict[str, Any]]:
        record = await self._get(response_id)
        if not await self._store.events_after(response_id, -1) and record.status in TERMINAL:
            raise InvalidRequestError("This response has no event log to stream (it was "
                                      "created without stream or background)",
                                      param="stream")
        return self.follow(response_id, starting_after)

    async def follow(self, response_id: str, after: int) -> AsyncIterator[dict[str, Any]]:
        """The logged events after ``after``, then live ones, up to the terminal event."""
        while True:
            events = await self._store.events_after(response_id, after)
            for event in events:
                yield event
                after = event["sequence_number"]
                if event["type"] in TERMINAL_EVENTS:
                    return
            if not events and response_id not in self._running:
                record = await self._store.get(response_id)
                if record is None or (record.status in TERMINAL and not
                                      await self._store.events_after(response_id, after)):
                    return
            wakeup = self._wakeups.get(response_id)
            try:
                if wakeup is not None:
                    await asyncio.wait_for(wakeup.wait(), _POLL_SECONDS)
                else:
                    await asyncio.sleep(_POLL_SECONDS)
            except asyncio.TimeoutError:
                pass

    async def cancel(self, response_id: str) -> dict[str, Any]:
        task = self._running.get(response_id)
        if task is None:
            record = await self._get(response_id)
            raise InvalidRequestError(
                f"Only a background response that is still running can be cancelled; this "
                f"one is {record.status}", param="response_id")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return (await self._get(response_id)).body

    async def delete(self, response_id: str) -> dict[str, Any]:
        task = self._running.get(response_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if not await self._store.delete(response_id):
            raise NotFoundError(f"No response with id {response_id!r}", param="response_id")
        return {"id": response_id, "object": "response", "deleted": True}

    async def input_items(self, response_id: str, after: str | None, limit: int,
                          order: str) -> dict[str, Any]:
        await self._get(response_id)
        items, more = await self._store.input_items(response_id, after=after, limit=limit,
                                                    order=order)
        return {"object": "list", "data": items,
                "first_id": items[0]["id"] if items else None,
                "last_id": items[-1]["id"] if items else None, "has_more": more}


class _LogWriter:
    """Appends a response's events to the store in small batches and wakes its followers."""

    def __init__(self, store: ResponseStore, response_id: str,
                 wakeups: dict[str, asyncio.Event]):
        self._store, self._id, self._wakeups = store, response_id, wakeups
        self._batch: list[dict[str, Any]] = []
        self._last = time.monotonic()
        wakeups.setdefault(response_id, asyncio.Event())

    async def add(self, event: dict[str, Any]) -> None:
        self._batch.append(event)
        if (len(self._batch) >= _FLUSH_EVENTS or event["type"] in TERMINAL_EVENTS
                or time.monotonic() - self._last >= _FLUSH_SECONDS):
            await self.flush()

    async def flush(self) -> None:
        batch, self._batch = self._batch, []
        self._last = time.monotonic()
        if batch:
            await self._store.append_events(self._id, batch)
        wakeup = self._wakeups.get(self._id)
        if wakeup is not None:
            self._wakeups[self._id] = asyncio.Event()
            wakeup.set()


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


def _drop_oldest_turn(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop items from the front up to the next user message (calls go with their outputs)."""
    rest = items[1:]
    while len(rest) > 1 and not (rest[0]["type"] == "message" and rest[0]["role"] == "user"):
        rest = rest[1:]
    return rest


def _response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
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
