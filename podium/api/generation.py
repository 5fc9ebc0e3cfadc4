"""What the generating APIs share: request checks, sampling params, and the per-choice run.

``run_choices`` drives one engine request per choice through its text pipeline and yields
``(choice_index, event)`` pairs in the order they happen; it is the single stream every
rendering (streamed chunks or a folded object) is computed from.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol, TypeVar

from podium import telemetry
from podium.engine.base import (Engine, EngineOutput, EngineRequest, Generation,
                                SamplingParams, TokenLogprob)
from podium.errors import ContextLengthExceeded, InvalidRequestError, ModelNotFound
from podium.parsing.events import Event
from podium.parsing.pipeline import OutputParser
from podium.protocol.common import SamplingFields

T = TypeVar("T")


def check_model(requested: str, engine: Engine) -> None:
    record = telemetry.current()
    if record is not None:
        record.model = requested
    if requested != engine.info.served_name:
        raise ModelNotFound(f"The model '{requested}' does not exist; this server serves "
                            f"'{engine.info.served_name}'", param="model")


def stop_strings(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def output_budget(prompt_tokens: int, requested: int | None, context: int, cap: int = 0) -> int:
    """Max new tokens: as asked, or what the context has left (at most ``cap`` when set);
    400 if that does not fit."""
    if cap and requested is not None and requested > cap:
        raise InvalidRequestError(f"max_tokens is {requested}; this server allows at most {cap}",
                                  param="max_tokens")
    if prompt_tokens >= context:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens, but the prompt has "
            f"{prompt_tokens} tokens", param="messages")
    if requested is None:
        return min(context - prompt_tokens, cap) if cap else context - prompt_tokens
    if prompt_tokens + requested > context:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + requested} tokens ({prompt_tokens} in the prompt, {requested} "
            f"for the completion). Please reduce the prompt or the completion length.",
            param="max_tokens")
    return requested


def sampling_params(req: SamplingFields, max_tokens: int, vocab_size: int,
                    seed: int | None) -> SamplingParams:
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k or 0,
        min_p=req.min_p or 0.0,
        seed=seed,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        logit_bias=logit_bias(req.logit_bias, vocab_size),
        max_tokens=max_tokens,
    )


MAX_LOGIT_BIAS = 1024


def logit_bias(raw: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    if raw and len(raw) > MAX_LOGIT_BIAS:
        raise InvalidRequestError(f"logit_bias may name at most {MAX_LOGIT_BIAS} tokens",
                                  param="logit_bias")
    out: dict[int, float] = {}
    for key, bias in (raw or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidRequestError(f"logit_bias keys must be token ids; got {key!r}",
                                      param="logit_bias") from None
        if not 0 <= token < vocab_size:
            raise InvalidRequestError(
                f"logit_bias token id {token} is outside the vocabulary (0..{vocab_size - 1})",
                param="logit_bias")
        out[token] = bias
    return out


def choice_seed(seed: int | None, default_seed: int, index: int) -> int | None:
    """Choice i of a seeded request uses seed + i, so choice 0 equals the same request with n=1."""
    if seed is not None:
        return (seed + index) & 0xFFFFFFFF
    return None if default_seed < 0 else (default_seed + index) & 0xFFFFFFFF


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


class ChoiceStream(Protocol):
    """What turns one choice's engine outputs into events: the text pipeline (detokenizer,
    stop strings, logprobs) or, for Harmony models, its token parser."""

    finished: bool                  # the choice ended (finish reason, or a stop string)
    completion_tokens: int
    cached_tokens: int              # prompt tokens the engine reused
    prompt_logprobs: list[TokenLogprob | None] | None

    def feed(self, out: EngineOutput) -> list[Event]: ...


@dataclass
class Choice:
    """One engine request, the stream that turns its tokens into events, and (text families)
    the output parser that turns text into reasoning, tool calls and content. ``outputs`` is
    the engine's stream once ``start`` has queued the request."""

    request: EngineRequest
    pipeline: ChoiceStream
    parser: OutputParser | None = None
    outputs: Generation | None = None


def start(engine: Engine, choices: list[Choice]) -> None:
    """Queue every choice's request with the engine, or none of them: 400 when they could
    never fit, 429 when the engine cannot take them now.

    Runs on the event loop with no await inside, so the room check and the enqueueing are
    one step that no other request can come between.
    """
    engine.check_room(len(choices))
    for choice in choices:
        choice.outputs = engine.generate(choice.request)


async def run_choice(engine: Engine, index: int, choice: Choice
                     ) -> AsyncIterator[tuple[int, Event]]:
    outputs = choice.outputs if choice.outputs is not None else engine.generate(choice.request)
    record = telemetry.current()
    if record is not None and index == 0:
        record.prompt(len(choice.request.prompt_token_ids))
    try:
        parser = choice.parser
        async for out in outputs:
            if record is not None and out.token_ids:
                record.tokens(len(out.token_ids))
            events = choice.pipeline.feed(out)
            for event in parser.feed(events) if parser is not None else events:
                if record is not None and record.capture and hasattr(event, "text"):
                    record.output.append(event.text)
                yield index, event
            if choice.pipeline.finished:
                break
    finally:
        # Stopping early (a stop string, a disconnect) must end the engine's work at once.
        await outputs.aclose()
        if not choice.pipeline.finished:
            await engine.abort(choice.request.request_id)


def cached_tokens(choices: list[Choice], n: int = 1) -> int:
    """Prompt tokens the engine reused: per prompt (``n`` choices each), the most any of its
    choices reused."""
    return sum(max(c.pipeline.cached_tokens for c in choices[i:i + n])
               for i in range(0, len(choices), n))


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run CPU-heavy request preparation (rendering, tokenizing, grammar building) on a
    worker thread, so the event loop keeps serving every other client meanwhile."""
    context = contextvars.copy_context()       # the request's telemetry record goes along
    return await asyncio.get_running_loop().run_in_executor(
        _PREPARE, functools.partial(context.run, fn, *args))


_PREPARE = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1),
                              thread_name_prefix="podium-prepare")


def run_choices(engine: Engine, choices: list[Choice]) -> AsyncIterator[tuple[int, Event]]:
    """Every choice's events; a single choice is not wrapped (one less hop per token)."""
    if len(choices) == 1:
        return run_choice(engine, 0, choices[0])
    return _merge([run_choice(engine, i, c) for i, c in enumerate(choices)])


async def _merge(streams: list[AsyncIterator[tuple[int, Event]]]
                 ) -> AsyncIterator[tuple[int, Event]]:
    """Interleave several streams in arrival order; closing the merge closes them all."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncIterator[tuple[int, Event]]) -> None:
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
