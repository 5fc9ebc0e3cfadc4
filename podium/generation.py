"""The generation stage: a conversation prepared for the engine, started, and run per choice.

``prepare`` renders a ``Conversation`` in the model's ``Dialect`` and builds one ``Choice``
per requested completion; ``start`` queues them with the engine atomically;
``run_choices`` drives each choice's engine request through its ``ChoiceStream`` and yields
``(choice_index, event)`` pairs in the order they happen; it is the single stream every
rendering (streamed chunks or a folded object) is computed from. ``stream_choices`` is the
same for a stream, with a ``KEEPALIVE`` now and then while a choice waits for its first token.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable, TypeVar, cast, final

from podium import telemetry
from podium.conversation import Conversation, Options
from podium.dialect import Dialect
from podium.engine.base import Engine, EngineOutput, EngineRequest, Generation
from podium.errors import ContextLengthExceeded, InvalidRequestError, ModelNotFound
from podium.grammar import check_strict
from podium.parsing.events import Event
from podium.settings import Settings
from podium.stream import ChoiceStream

T = TypeVar("T")


def serves(requested: str, engine: Engine, settings: Settings | None = None) -> bool:
    """Whether ``requested`` names the served model, by its name or a ``--model-alias``."""
    served = engine.info.served_name
    return requested == served or (settings is not None
                                   and settings.alias_for(requested) == served)


def check_model(requested: str, engine: Engine, settings: Settings | None = None) -> None:
    """404 ``model_not_found`` unless ``requested`` is the served model or an alias of it."""
    record = telemetry.current()
    if record is not None:
        record.model = requested
    if not serves(requested, engine, settings):
        raise ModelNotFound(f"The model '{requested}' does not exist; this server serves "
                            f"'{engine.info.served_name}'", param="model")


def output_budget(prompt_tokens: int, requested: int | None, context: int, cap: int = 0,
                  prompt_param: str = "messages", max_param: str = "max_tokens") -> int:
    """Max new tokens: as asked, or what the context has left (at most ``cap`` when set);
    400 if that does not fit (naming the caller's ``prompt_param`` / ``max_param``)."""
    if cap and requested is not None and requested > cap:
        raise InvalidRequestError(f"{max_param} is {requested}; this server allows at most "
                                  f"{cap}", param=max_param)
    if prompt_tokens >= context:
        exc = ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens, but the prompt has "
            f"{prompt_tokens} tokens", param=prompt_param)
        exc.tokens, exc.limit = prompt_tokens, context
        raise exc
    if requested is None:
        return min(context - prompt_tokens, cap) if cap else context - prompt_tokens
    if prompt_tokens + requested > context:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + requested} tokens ({prompt_tokens} in the prompt, {requested} "
            f"for the completion). Please reduce the prompt or the completion length.",
            param=max_param)
    return requested


def choice_seed(seed: int | None, default_seed: int, index: int) -> int | None:
    """Choice i of a seeded request uses seed + i, so choice 0 equals the same request with n=1."""
    if seed is not None:
        return (seed + index) & 0xFFFFFFFF
    return None if default_seed < 0 else (default_seed + index) & 0xFFFFFFFF


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


@dataclass
class Choice:
    """One engine request and the stream that turns its tokens into events. ``outputs`` is
    the engine's stream once ``start`` has queued the request."""

    request: EngineRequest
    stream: ChoiceStream
    outputs: Generation | None = None


@dataclass
class Prepared:
    prompt_tokens: int
    choices: list[Choice]


def check_options(options: Options) -> None:
    """What no model can be asked, whatever its dialect."""
    names: dict[str, str] = {}
    for tool in options.tools:
        if tool.name in names:          # the model could not tell them apart
            param = tool.where.rsplit(".", 1)[0] + ".name"
            raise InvalidRequestError(
                f"{param}: tool names must be unique ({tool.name!r} is also "
                f"{names[tool.name].rsplit('.', 1)[0]}.name)", param=param)
        names[tool.name] = tool.where
    if options.tool_choice == "required" and not names:
        raise InvalidRequestError("tool_choice 'required' needs tools", param="tool_choice")
    named = options.named_call
    if named is not None and named not in names:
        raise InvalidRequestError(f"tool_choice names function {named!r}, which is not in "
                                  f"tools", param="tool_choice")
    for tool in options.tools:
        if tool.strict:
            check_strict(tool.parameters, tool.where, f"Function {tool.name!r} parameters: ")
    fmt = options.response_format
    if fmt is not None and fmt.strict:
        check_strict(fmt.schema, fmt.where)


def prepare(engine: Engine, dialect: Dialect, conversation: Conversation, options: Options,
            settings: Settings) -> Prepared:
    """Render, constrain and tokenize: the prompt's length and one ``Choice`` per
    ``options.n``, ready for ``start``. Every API that speaks in messages starts here.

    CPU-heavy and free of event-loop state: callers run it on a worker thread (``off_loop``).
    """
    check_options(options)
    prompt = dialect.prompt(conversation, options)
    grammar = dialect.constraint(options)      # built once, shared by the n choices
    context, asked = engine.info.context_length, options.max_tokens
    if options.fit_max_tokens and asked is not None:
        asked = max(1, min(asked, context - len(prompt.token_ids),
                           settings.max_tokens_cap or asked))
    budget = output_budget(len(prompt.token_ids), asked, context, settings.max_tokens_cap,
                           options.messages_param, options.max_tokens_param)
    choices = []
    for i in range(options.n):
        sampling = replace(options.sampling, max_tokens=budget, grammar=grammar,
                           seed=choice_seed(options.seed, settings.seed, i))
        dialect.sampling(sampling)
        request = EngineRequest(new_id("req"), prompt.token_ids, sampling, options.logprobs)
        choices.append(Choice(request, dialect.stream(prompt, options)))
    return Prepared(len(prompt.token_ids), choices)


def start(engine: Engine, choices: list[Choice]) -> None:
    """Queue every choice's request with the engine, or none of them: 400 when they could
    never fit, 429 when the engine cannot take them now.

    Runs on the event loop with no await inside, so the room check and the enqueueing are
    one step that no other request can come between.
    """
    engine.check_room(len(choices))
    for choice in choices:
        choice.outputs = engine.generate(choice.request)


@final
class KeepAlive:
    """What a choice's stream yields every ``keepalive`` seconds while it waits for its
    first output: a queued request or a long prefill has nothing else to send, and agent
    clients drop a stream that stays silent for their idle limit (Codex: 300 s)."""

    __slots__ = ()


KEEPALIVE = KeepAlive()


async def run_choice(engine: Engine, index: int, choice: Choice, keepalive: float = 0.0
                     ) -> AsyncIterator[tuple[int, Event | KeepAlive]]:
    outputs = choice.outputs if choice.outputs is not None else engine.generate(choice.request)
    record = telemetry.current()
    if record is not None and index == 0:
        record.prompt(len(choice.request.prompt_token_ids))
    stream = choice.stream
    feed = stream.feed
    try:
        if keepalive > 0:
            # the first output alone is awaited apart (the loops below stay one hop a token)
            first = asyncio.ensure_future(outputs.__anext__())
            try:
                while not (await asyncio.wait((first,), timeout=keepalive))[0]:
                    yield index, KEEPALIVE
            finally:
                if not first.done():
                    first.cancel()
                    await asyncio.gather(first, return_exceptions=True)
            try:
                out = first.result()
            except StopAsyncIteration:
                return
            for event in _first_events(out, feed, record):
                yield index, event
            if stream.finished:
                return
        if record is None:
            async for out in outputs:
                for event in feed(out):
                    yield index, event
                if stream.finished:
                    break
        else:
            tokens, capture = record.meter(), record.capture
            async for out in outputs:
                if out.token_ids:
                    tokens(len(out.token_ids))
                for event in feed(out):
                    if capture and hasattr(event, "text"):
                        record.output.append(event.text)
                    yield index, event
                if stream.finished:
                    break
    finally:
        # Stopping early (a stop string, a disconnect) must end the engine's work at once.
        await outputs.aclose()
        if not stream.finished:
            await engine.abort(choice.request.request_id)


def _first_events(out: EngineOutput, feed: Callable[[EngineOutput], list[Event]],
                  record: telemetry.RequestRecord | None) -> list[Event]:
    """The events of a choice's first output, counted as ``run_choice``'s loops count
    every other output."""
    if record is not None and out.token_ids:
        record.meter()(len(out.token_ids))
    events = feed(out)
    if record is not None and record.capture:
        record.output.extend(e.text for e in events if hasattr(e, "text"))
    return events


async def off_loop(fn: Callable[..., T], *args: Any, inline: bool = False) -> T:
    """Run CPU-heavy request preparation (rendering, tokenizing, grammar building) on a
    worker thread, so the event loop keeps serving every other client meanwhile; or at once
    (``inline``), when the caller knows the work is small: it grows with the request body
    alone (no stored history, no request template) and the route found that body small
    (``server.routing.small``)."""
    if inline:
        return fn(*args)
    context = contextvars.copy_context()       # the request's telemetry record goes along
    return await asyncio.get_running_loop().run_in_executor(
        _PREPARE, functools.partial(context.run, fn, *args))


_PREPARE = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1),
                              thread_name_prefix="podium-prepare")


def run_choices(engine: Engine, choices: list[Choice]) -> AsyncIterator[tuple[int, Event]]:
    """Every choice's events; a single choice is not wrapped (one less hop per token)."""
    return cast(AsyncIterator[tuple[int, Event]], stream_choices(engine, choices, 0.0))


def stream_choices(engine: Engine, choices: list[Choice], keepalive: float
                   ) -> AsyncIterator[tuple[int, Event | KeepAlive]]:
    """``run_choices`` for a stream: also a ``KEEPALIVE`` (for each choice) every
    ``keepalive`` seconds until the choice's first output (0: never)."""
    if len(choices) == 1:
        return run_choice(engine, 0, choices[0], keepalive)
    return _merge([run_choice(engine, i, c, keepalive) for i, c in enumerate(choices)])


async def _merge(streams: list[AsyncIterator[tuple[int, Event | KeepAlive]]]
                 ) -> AsyncIterator[tuple[int, Event | KeepAlive]]:
    """Interleave several streams in arrival order; closing the merge closes them all."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncIterator[tuple[int, Event | KeepAlive]]) -> None:
        try:
            async for item in stream:
                await queue.put(item)
            await queue.put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer below
            await queue.put(exc)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
