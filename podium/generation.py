"""The generation stage: a conversation prepared for the engine, started, run and rendered.

``prepare`` renders a ``Conversation`` in the model's ``Dialect`` and builds one ``Choice``
per requested completion; ``start`` queues them with the engine atomically; ``drive`` is the
one loop that runs them: each engine output through its choice's ``ChoiceStream``, each event
through the API's renderer (``render.base.Renderer``), usage folded once (``UsageFold``),
keep-alives while a choice waits for its first token, and the engine's work ended when the
consumer stops. ``fold`` is the same drive for a non-stream answer, so a streamed and a folded
answer are renderings of one event stream.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from contextlib import aclosing
from typing import Any, AsyncGenerator, Callable, TypeVar

from podium import telemetry
from podium.conversation import Conversation, Message, Options, Role, TextPart
from podium.dialect import Dialect
from podium.engine.base import CacheHint, Engine, EngineOutput, EngineRequest, Generation
from podium.errors import ContextLengthExceeded, InvalidRequestError, ModelUnloaded
from podium.grammar import check_schema
from podium.parsing.events import Usage
from podium.render.base import Folding, Renderer
from podium.settings import Settings
from podium.stream import ChoiceStream

T = TypeVar("T")

# The engine priority of the requests started from this context (``EngineRequest.priority``):
# interactive requests keep 0; the batch worker sets its own, lower, for each request it runs.
PRIORITY: contextvars.ContextVar[int] = contextvars.ContextVar("podium_priority", default=0)


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
        if tool.strict and tool.grammar is None:
            check_schema(tool.parameters, tool.where, True,
                         f"Function {tool.name!r} parameters: ")
    fmt = options.response_format
    if fmt is not None and fmt.strict:
        check_schema(fmt.schema, fmt.where, True)


def prepare(engine: Engine, dialect: Dialect, conversation: Conversation, options: Options,
            settings: Settings) -> Prepared:
    """Render, constrain and tokenize: the prompt's length and one ``Choice`` per
    ``options.n``, ready for ``start``. Every API that speaks in messages starts here.

    CPU-heavy and free of event-loop state: callers run it on a worker thread (``off_loop``).
    """
    check_options(options)
    prompt = dialect.prompt(conversation, options)
    grammar = dialect.constraint(options)      # built once, shared by the n choices
    if grammar is not None:
        engine.check_grammar(grammar)
    context, asked = engine.info.context_length, options.max_tokens
    if options.fit_max_tokens and asked is not None:
        asked = max(1, min(asked, context - len(prompt.token_ids),
                           settings.max_tokens_cap or asked))
    budget = output_budget(len(prompt.token_ids), asked, context, settings.max_tokens_cap,
                           options.messages_param, options.max_tokens_param)
    reasoning = dialect.reasoning(prompt, options)
    prediction = predicted(engine, dialect, options)
    cache = None
    if options.cache_mark is not None or options.cache_retain is not None:
        cache = CacheHint(cache_until(dialect, conversation, options, prompt.token_ids),
                          options.cache_retain)
    record = telemetry.current()
    if record is not None:
        if reasoning is not None:
            record.reasoning_budget = reasoning.tokens
        if prediction is not None:
            record.prediction_tokens = len(prediction)
    choices = []
    for i in range(options.n):
        sampling = replace(options.sampling, max_tokens=budget, grammar=grammar,
                           reasoning=reasoning, seed=choice_seed(options.seed, settings.seed, i),
                           prediction=prediction)
        dialect.sampling(sampling)
        request = EngineRequest(new_id("req"), prompt.token_ids, sampling, options.logprobs,
                                cache=cache)
        choices.append(Choice(request, dialect.stream(prompt, options)))
    return Prepared(len(prompt.token_ids), choices)


# What a breakpoint's probe message says: text no conversation goes on with, so the probe's
# tokens part from the prompt's where the breakpoint is.
_PROBE = "\u2042 cache probe \u2042"


def cache_until(dialect: Dialect, conversation: Conversation, options: Options,
                prompt: list[int]) -> int | None:
    """How many of the prompt's first tokens ``options.cache_mark`` (a client's last cache
    breakpoint) covers: the conversation up to the marked part, then a probe message of
    other text (the role after the marked one, so templates that insist on alternating
    roles accept it), rendered; the tokens it shares with the prompt. A few tokens of the
    next turn's opening may be counted with it. None when there is no mark, or the
    template cannot render the cut conversation (then the server's policy decides)."""
    mark = options.cache_mark
    if mark is None:
        return None
    at, part = mark
    if at >= len(conversation.messages):
        return None
    head: list[Message] = []
    if at >= 0:
        marked = conversation.messages[at]
        head = conversation.messages[:at] + [replace(marked, parts=marked.parts[:part + 1])]
    role: Role = "assistant" if head and head[-1].role == "user" else "user"
    probe = Conversation(head + [Message(role, [TextPart(_PROBE)], "cache probe")],
                         conversation.instructions)
    try:
        ids = dialect.prompt(probe, replace(options, add_generation_prompt=False)).token_ids
    except Exception:  # noqa: BLE001 - a template's own refusal of the cut conversation
        return None
    n = min(len(ids), len(prompt) - 1)      # the prompt's last token is never cached
    same = 0
    while same < n and ids[same] == prompt[same]:
        same += 1
    return same


def predicted(engine: Engine, dialect: Dialect, options: Options) -> tuple[int, ...] | None:
    """The prediction's tokens (Predicted Outputs), for the engine to verify as drafts, where
    they can be: one choice (the drafts follow one output), a dialect whose output is the
    answer's text (Harmony's is channel markup around it), an engine that drafts. Elsewhere
    the request is answered as without one, no token accepted: OpenAI's answer to a
    prediction that does not match. Cut at the context length: no output is longer."""
    if (not options.prediction or options.n != 1 or dialect.name == "harmony"
            or not engine.capabilities.drafts):
        return None
    tokens = engine.tokenizer.encode(options.prediction, add_special=False)
    return tuple(tokens[:engine.info.context_length]) or None


def start(engine: Engine, choices: list[Choice]) -> None:
    """Queue every choice's request with the engine, or none of them: 400 when they could
    never fit, 429 when the engine cannot take them now. Each goes at the ``PRIORITY`` of
    the work that started it.

    Runs on the event loop with no await inside, so the room check and the enqueueing are
    one step that no other request can come between.
    """
    engine.check_room(len(choices))
    priority = PRIORITY.get()
    for choice in choices:
        choice.request.priority = priority
        choice.outputs = engine.generate(choice.request)


class UsageFold:
    """The one place a request's usage is summed: the ``Usage`` event of each choice the
    driver ran, or, for a choice cut short, its stream's ``finish()``.

    Choices come in groups of ``n`` that share one prompt (Chat: one group; Completions: one
    per prompt; Responses: one per round of the model). A group's prompt counts once and its
    cached tokens are the most any of its choices reused; completion and reasoning tokens,
    and the prediction's accepted and rejected ones, add up over every choice.
    """

    __slots__ = ("_n", "_streams", "_usages")

    def __init__(self, n: int = 1):
        self._n = n
        self._streams: list[ChoiceStream] = []
        self._usages: list[Usage | None] = []

    def track(self, choices: list[Choice]) -> int:
        """Count ``choices`` too; the slot of the first (the others follow it)."""
        base = len(self._usages)
        self._streams += [c.stream for c in choices]
        self._usages += [None] * len(choices)
        return base

    def add(self, slot: int, usage: Usage) -> None:
        self._usages[slot] = usage

    def __bool__(self) -> bool:
        return bool(self._usages)

    def totals(self) -> Usage:
        usages = self._usages
        for i, u in enumerate(usages):
            if u is None:           # cut short: counted from what its stream saw
                usages[i] = next((e for e in self._streams[i].finish()
                                  if isinstance(e, Usage)), None)
        total, n = Usage(0, 0), self._n
        for start in range(0, len(usages), n):
            group = [u for u in usages[start:start + n] if u is not None]
            if group:
                total.prompt_tokens += group[0].prompt_tokens
                total.cached_tokens += max(u.cached_tokens for u in group)
                total.cache_written += max(u.cache_written for u in group)
                total.completion_tokens += sum(u.completion_tokens for u in group)
                total.reasoning_tokens += sum(u.reasoning_tokens for u in group)
                total.accepted_prediction_tokens += sum(u.accepted_prediction_tokens
                                                        for u in group)
                total.rejected_prediction_tokens += sum(u.rejected_prediction_tokens
                                                        for u in group)
        record = telemetry.current()
        if record is not None:
            record.reasoning_tokens = total.reasoning_tokens
            record.accepted_prediction_tokens = total.accepted_prediction_tokens
            record.rejected_prediction_tokens = total.rejected_prediction_tokens
        return total


def drive(engine: Engine, choices: list[Choice], renderer: Renderer, *, n: int = 0,
          keepalive: float = 0.0) -> AsyncGenerator[Any, None]:
    """The one driver: a request's choices run and rendered, from ``renderer.open()`` to
    ``renderer.close(usage)``. ``n``: choices per prompt (0: all of them share one);
    ``keepalive``: seconds between ``renderer.keepalive()`` objects while a choice waits for
    its first output (0: none). Closing it ends every choice's engine work at once."""
    return _drive(engine, choices, renderer, UsageFold(n or len(choices)), keepalive, True)


async def fold(engine: Engine, choices: list[Choice], renderer: Folding, *, n: int = 0
               ) -> dict[str, Any]:
    """The non-stream answer: ``drive``'s objects dropped, the renderer's ``result()``."""
    async with aclosing(drive(engine, choices, renderer, n=n)) as objs:
        async for _ in objs:
            pass
    return renderer.result()


def drive_round(engine: Engine, choices: list[Choice], renderer: Renderer, usage: UsageFold,
                keepalive: float = 0.0) -> AsyncGenerator[Any, None]:
    """``drive`` without the opening and closing: one round of the model (the Responses
    API runs several in one response), its usage folded into ``usage``."""
    return _drive(engine, choices, renderer, usage, keepalive, False)


def _drive(engine: Engine, choices: list[Choice], renderer: Renderer, usage: UsageFold,
           keepalive: float, whole: bool) -> AsyncGenerator[Any, None]:
    """A single choice's loop is the driver itself (one generator less for every token to
    pass through); several are merged in arrival order. ``whole``: opened and closed."""
    base = usage.track(choices)
    if len(choices) == 1:
        return _run_choice(engine, 0, choices[0], renderer, usage, base, keepalive, whole)
    return _merged([_run_choice(engine, i, c, renderer, usage, base + i, keepalive, False)
                    for i, c in enumerate(choices)], renderer, usage, whole)


async def _merged(streams: list[AsyncGenerator[Any, None]], renderer: Renderer,
                  usage: UsageFold, whole: bool) -> AsyncGenerator[Any, None]:
    if whole:
        for obj in renderer.open():
            yield obj
    async with aclosing(_merge(streams)) as objs:
        async for obj in objs:
            yield obj
    if whole:
        for obj in renderer.close(usage.totals()):
            yield obj


def cut_short(engine: Engine) -> ModelUnloaded:
    """What the client of a choice the engine aborted is told. The driver's own abort (the
    consumer stopped) is never read back, so an ``abort`` it reads came from outside the
    request: the engine closed under it, when its model was unloaded past the grace period.
    "abort" is no finish reason of any API: the request ends with this error instead, in
    the API's own shape (in-band once a stream has begun; a 503 before)."""
    return ModelUnloaded(f"The model '{engine.info.served_name}' was unloaded before this "
                         f"request finished; send it again to have the model loaded anew")


def _uncounted(count: int) -> None:
    """A request without a telemetry record (a service called directly) counts nothing."""


async def _run_choice(engine: Engine, index: int, choice: Choice, renderer: Renderer,
                      usage: UsageFold, slot: int, keepalive: float, whole: bool
                      ) -> AsyncGenerator[Any, None]:
    """One choice: each engine output through its stream, each event rendered. The first
    output may be awaited apart (keep-alives while it is queued or prefilling); then it
    enters the same loop as every other output. ``whole``: the request's only choice,
    opened and closed here."""
    outputs = choice.outputs if choice.outputs is not None else engine.generate(choice.request)
    record = telemetry.current()
    count: Callable[[int], None] = _uncounted
    capture: Callable[[str], None] | None = None
    if record is not None:
        count = record.meter()
        if record.capture:
            capture = record.output.append
        if index == 0:
            record.prompt(len(choice.request.prompt_token_ids))
    stream = choice.stream
    feed, render, step = stream.feed, renderer.event, outputs.__anext__
    out: EngineOutput | None = None
    ended = False                   # the engine's outputs ended before the first one
    try:
        if whole:
            for obj in renderer.open():
                yield obj
        if keepalive > 0:
            first = asyncio.ensure_future(step())
            try:
                while not (await asyncio.wait((first,), timeout=keepalive))[0]:
                    for obj in renderer.keepalive():
                        yield obj
            finally:
                if not first.done():
                    first.cancel()
                    await asyncio.gather(first, return_exceptions=True)
            try:
                out = first.result()
            except StopAsyncIteration:
                ended = True
        while not ended:
            if out is None:
                try:
                    out = await step()
                except StopAsyncIteration:
                    break
            if out.finish_reason == "abort":
                raise cut_short(engine)
            if out.token_ids:
                count(len(out.token_ids))
            for event in feed(out):
                if type(event) is Usage:
                    usage.add(slot, event)
                    continue
                if capture is not None and hasattr(event, "text"):
                    capture(event.text)
                for obj in render(index, event):
                    yield obj
            if stream.finished:
                break
            out = None
    finally:
        # Stopping early (a stop string, a disconnect) must end the engine's work at once.
        await outputs.aclose()
        if not stream.finished:
            await engine.abort(choice.request.request_id)
    if whole:
        for obj in renderer.close(usage.totals()):
            yield obj


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


async def _merge(streams: list[AsyncGenerator[Any, None]]) -> AsyncGenerator[Any, None]:
    """Interleave several streams in arrival order; closing the merge closes them all."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncGenerator[Any, None]) -> None:
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
