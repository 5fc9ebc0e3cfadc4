"""Ollama's ``/api/chat`` and ``/api/generate``: its requests as Podium's conversations (or,
for ``raw`` and ``suffix``, as a prompt of tokens), rendered by ``render.ollama``.

- ``messages``: ``role``, ``content``, ``thinking`` (an assistant's earlier reasoning),
  ``tool_calls`` (arguments as objects) and tool results (role ``tool``; ``tool_name``, and
  ``tool_call_id`` when the client has one: a result without an id answers the first call
  of its name, or the first call, not yet answered). ``images`` are refused: Podium's
  models read text.
- ``think``: true, false or an effort (``"low"``, ``"medium"``, ``"high"``, ``"max"``, the last
  Harmony's ``high``); on a model that cannot think a true value is Ollama's 400, ``"<model>"
  does not support thinking``. Absent: the model thinks when it can, as in Ollama. A level
  is a reasoning budget through the model's ``--reasoning-budgets``; false is a budget of 0.
- ``format``: ``"json"`` or a JSON schema, enforced by the same grammar as Chat's
  ``response_format``.
- ``options``: ``num_predict`` is a ceiling (cut to the room the context has left; below 1:
  no limit but the room), ``stop``, ``seed``, ``repeat_penalty`` and the samplers; those not
  given take Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9). ``num_ctx`` limits
  the request to that many tokens (a prompt that alone fills them is a 400 naming
  ``options.num_ctx``; Podium never cuts a prompt); a model is served at the context it was
  loaded with, so a larger ``num_ctx`` gives no more than that.
- generate: ``system`` and ``prompt`` are a conversation's system and user turns (their
  text read as text, as every chat message's); ``raw`` sends the prompt as it is (no
  template, no output parsers: special-token markup in it is parsed as those tokens, the
  model's own format); ``suffix`` asks for the middle
  between ``prompt`` and ``suffix`` in the model's fill-in-the-middle tokens
  (``<|fim_prefix|>``, ``<|fim_suffix|>``, ``<|fim_middle|>``; a model without them: 400;
  the client's code between them read as text), the
  system prompt left out as Ollama's fill-in-the-middle templates leave it. ``template``,
  ``context`` (deprecated in Ollama) and ``logprobs`` are refused with a 400 saying so.

The counters of the last object are measured, not estimated (``Clock``): ``load_duration``
is the time the request waited for its model (``model_of``), ``prompt_eval_duration`` the
time from the request being queued to its first token (a wait for a free slot included),
``eval_duration`` from the first token to the end, ``total_duration`` from the request's
arrival; the token counts are the usage every API reports, the ones ``/metrics`` counts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, AsyncGenerator

import orjson

from podium import telemetry
from podium.api import common
from podium.api.common import stop_strings
from podium.api.reasoning import DEFAULT_BUDGETS, NO_LIMIT, Budget, applied, of_effort, off
from podium.conversation import (Conversation, Message, Options, Reasoning, ResponseFormat,
                                 TextPart, Tool, ToolCall)
from podium.dialect import Dialect
from podium.dialect.template import format_grammar
from podium.engine.base import Engine, EngineRequest, SamplingParams
from podium.errors import ContextLengthExceeded, InvalidRequestError
from podium.generation import (Choice, Prepared, choice_seed, drive, fold, new_id, off_loop,
                               output_budget, prepare, start)
from podium.parsing.events import Usage
from podium.protocol.ollama import ChatRequest, GenerateRequest, Generation
from podium.protocol.ollama import Message as WireMessage
from podium.render.ollama import OllamaChunks, OllamaFold
from podium.settings import Settings
from podium.text.pipeline import TextPipeline, TextStream
from podium.text.template import Literal, control_pattern

# Ollama's sampling defaults (api.DefaultOptions), for options a request does not give
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}


@dataclass
class Clock:
    """A request's times (``time.monotonic``) for Ollama's counters: its arrival (the
    request's telemetry record's start), the time it waited for its model, when its
    generation was queued; its first token is the record's (the time ``/metrics`` counts)."""

    arrived: float = field(default_factory=time.monotonic)
    waited: float = 0.0
    queued: float = 0.0

    @classmethod
    def now(cls) -> Clock:
        record = telemetry.current()
        return cls(record.start) if record is not None else cls()

    def counters(self, usage: Usage) -> dict[str, int]:
        """Ollama's counters at the end of the answer (nanoseconds and tokens)."""
        end = time.monotonic()
        record = telemetry.current()
        first = record.first_token if record is not None else None
        first = end if first is None else first
        queued = self.queued or first
        return {"total_duration": _ns(end - self.arrived), "load_duration": _ns(self.waited),
                "prompt_eval_count": usage.prompt_tokens,
                "prompt_eval_duration": _ns(first - queued),
                "eval_count": usage.completion_tokens, "eval_duration": _ns(end - first)}


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


def can_think(dialect: Dialect) -> bool:
    """The model writes reasoning its dialect separates (a think-tag family, or Harmony)."""
    return dialect.name == "harmony" or getattr(dialect, "reasoning_family", "none") != "none"


class OllamaService:
    """One loaded model's ``/api/chat`` and ``/api/generate``."""

    def __init__(self, engine: Engine, dialect: Dialect, settings: Settings):
        self._engine = engine
        self._dialect = dialect
        self._settings = settings

    async def chat(self, req: ChatRequest, clock: Clock, *, small: bool = False
                   ) -> dict[str, Any] | AsyncGenerator[Any, None]:
        _no_logprobs(req)
        prepared = await off_loop(self._prepare_chat, req, inline=small)
        return await self._run(req, prepared.choices, clock, chat=True)

    async def generate(self, req: GenerateRequest, clock: Clock, *, small: bool = False
                       ) -> dict[str, Any] | AsyncGenerator[Any, None]:
        _refuse(req)
        _think(req, self._dialect)          # a model that cannot think says so on every path
        if req.raw or req.suffix:
            choices = [await off_loop(self._raw_choice, req, inline=small)]
        else:
            choices = (await off_loop(self._prepare_generate, req, inline=small)).choices
        return await self._run(req, choices, clock, chat=False)

    async def _run(self, req: Generation, choices: list[Choice], clock: Clock, *, chat: bool
                   ) -> dict[str, Any] | AsyncGenerator[Any, None]:
        start(self._engine, choices)
        clock.queued = time.monotonic()
        if req.stream is not False:
            return drive(self._engine, choices, OllamaChunks(req.model, chat, clock.counters),
                         keepalive=self._settings.stream_keepalive_seconds)
        return await fold(self._engine, choices, OllamaFold(req.model, chat, clock.counters))

    # -- conversations --------------------------------------------------------------------

    def _prepare_chat(self, req: ChatRequest) -> Prepared:
        conversation = Conversation(_messages(req))
        return self._prepare(req, conversation, "messages", [
            Tool(t.function.name, t.function.parameters, t.function.description,
                 where=f"tools[{i}].function.parameters") for i, t in enumerate(req.tools or ())])

    def _prepare_generate(self, req: GenerateRequest) -> Prepared:
        _no_images(req.model, req.images, "images")
        conversation = Conversation([Message("user", [TextPart(req.prompt)], "prompt")],
                                    instructions=req.system or None)
        return self._prepare(req, conversation, "prompt", [])

    def _prepare(self, req: Generation, conversation: Conversation, prompt_param: str,
                 tools: list[Tool]) -> Prepared:
        opts = options(req, self._dialect, prompt_param, tools,
                       self._settings.effort_budgets())
        prepared = prepare(self._engine, self._dialect, conversation, opts, self._settings)
        for choice in prepared.choices:
            _fit_num_ctx(req, prepared.prompt_tokens, choice.request.sampling)
        return prepared

    # -- raw prompts (raw, suffix) ----------------------------------------------------------

    def _raw_choice(self, req: GenerateRequest) -> Choice:
        """The prompt as it is (``raw``), or the model's fill-in-the-middle prompt
        (``suffix``): no template, no output parsers; ``format`` still constrains it."""
        _no_images(req.model, req.images, "images")
        tok = self._engine.tokenizer
        ids = tok.encode(req.prompt, add_special=True) if req.raw else _fim_ids(self._engine,
                                                                                  req)
        if not ids:
            raise InvalidRequestError("The prompt is empty", param="prompt")
        given = _num_predict(req)
        context = self._engine.info.context_length
        if given is not None:
            given = max(1, min(given, context - len(ids)))
        budget = output_budget(len(ids), given, context, self._settings.max_tokens_cap,
                               "prompt", "options.num_predict")
        fmt = _format(req)
        sampling = replace(_sampling(req), max_tokens=budget, grammar=format_grammar(fmt),
                           seed=choice_seed(_opt(req, "seed"), self._settings.seed, 0))
        _fit_num_ctx(req, len(ids), sampling)
        request = EngineRequest(new_id("req"), ids, sampling)
        return Choice(request, TextStream(TextPipeline(tok, stop_strings(_opt(req, "stop")),
                                                       False), prompt_tokens=len(ids)))


def options(req: Generation, dialect: Dialect, prompt_param: str, tools: list[Tool],
            budgets: Mapping[str, int] = DEFAULT_BUDGETS) -> Options:
    thinking, effort = _think(req, dialect)
    return applied(Options(
        model=req.model, sampling=_sampling(req), max_tokens=_num_predict(req),
        seed=_opt(req, "seed"), stop=stop_strings(_opt(req, "stop")), tools=tools,
        response_format=_format(req), reasoning_effort=effort, thinking=thinking,
        fit_max_tokens=True, messages_param=prompt_param,
        max_tokens_param="options.num_predict"), _budget(req, budgets))


def _budget(req: Generation, budgets: Mapping[str, int]) -> Budget:
    """``think: false`` is off; a level is its tokens; true or absent, no limit."""
    if req.think is False:
        return off("think")
    return of_effort(req.think, budgets, "think") if isinstance(req.think, str) else NO_LIMIT


def _opt(req: Generation, name: str) -> Any:
    return getattr(req.options, name) if req.options is not None else None


def _sampling(req: Generation) -> SamplingParams:
    given = {name: _opt(req, name) for name in ("temperature", "top_k", "top_p")}
    return common.sampling(
        **{name: DEFAULTS[name] if value is None else value for name, value in given.items()},
        min_p=_opt(req, "min_p"), presence_penalty=_opt(req, "presence_penalty"),
        frequency_penalty=_opt(req, "frequency_penalty"),
        repetition_penalty=_opt(req, "repeat_penalty"))


def _num_predict(req: Generation) -> int | None:
    """Ollama's -1 (no limit) and -2 (fill the context) are the room the context has."""
    n = _opt(req, "num_predict")
    return n if n is not None and n >= 1 else None


def _fit_num_ctx(req: Generation, prompt_tokens: int, sampling: SamplingParams) -> None:
    """``options.num_ctx`` below the model's context: the request's prompt and answer fit in
    that many tokens."""
    num_ctx = _opt(req, "num_ctx")
    if num_ctx is None:
        return
    if prompt_tokens >= num_ctx:
        exc = ContextLengthExceeded(
            f"options.num_ctx is {num_ctx} tokens, but the prompt has {prompt_tokens} tokens "
            f"(Podium does not cut prompts; raise num_ctx or shorten the prompt)",
            param="options.num_ctx")
        exc.tokens, exc.limit = prompt_tokens, num_ctx
        raise exc
    sampling.max_tokens = min(sampling.max_tokens, num_ctx - prompt_tokens)


def _format(req: Generation) -> ResponseFormat | None:
    fmt = req.format
    if fmt is None or fmt == "":
        return None
    kind = "json_object" if fmt == "json" else "json_schema"
    return common.response_format(kind, fmt if isinstance(fmt, dict) else None,
                                  param="format", schema_param="format")


def _think(req: Generation, dialect: Dialect) -> tuple[bool, str | None]:
    """Whether the model thinks, and how hard (an effort for the dialect)."""
    able = can_think(dialect)
    if req.think is None:
        return able, None
    if req.think is False:
        return False, None
    if not able:
        raise InvalidRequestError(f'"{req.model}" does not support thinking', param="think")
    return True, None if req.think is True else _EFFORTS[req.think]


def _no_logprobs(req: Generation) -> None:
    if req.logprobs:
        raise InvalidRequestError("logprobs is not supported on Ollama's routes (Podium's "
                                  "/v1/chat/completions has them)", param="logprobs")


def _refuse(req: GenerateRequest) -> None:
    _no_logprobs(req)
    if req.template:
        raise InvalidRequestError(
            "template is not supported: Podium renders prompts with the model's own chat "
            "template (send raw: true with a prompt of your own)", param="template")
    if req.context:
        raise InvalidRequestError(
            "context is not supported (Ollama deprecated it): send the conversation as "
            "messages to /api/chat", param="context")
    if req.raw and req.system:
        raise InvalidRequestError("raw mode does not support template, system, or context",
                                  param="system")
    if req.raw and req.suffix:
        raise InvalidRequestError("suffix cannot be used with raw: a raw prompt is sent as "
                                  "it is", param="suffix")
    if req.raw and req.think:
        raise InvalidRequestError("think cannot be used with raw: a raw prompt is sent as it "
                                  "is, and its output is not parsed", param="think")


def _fim_ids(engine: Engine, req: GenerateRequest) -> list[int]:
    """The fill-in-the-middle prompt's ids: the model's FIM tokens around the client's code,
    which is text (a ``<|fim_middle|>`` or ``<|endoftext|>`` in it is not that token), as a
    chat message's is."""
    tok = engine.tokenizer
    if any(len(tok.encode(marker, add_special=False)) != 1 for marker in FIM):
        raise InvalidRequestError(
            f'"{req.model}" does not support insert: its vocabulary has no fill-in-the-middle '
            f"tokens ({', '.join(FIM)})", param="suffix")
    literal = Literal(control_pattern(tok.control_texts))
    prefix, suffix = literal.protect([req.prompt, req.suffix or ""], taken="".join(FIM))
    text = f"{FIM[0]}{prefix}{FIM[1]}{suffix}{FIM[2]}"
    if not literal.mapping:
        return tok.encode(text, add_special=True)
    return tok.encode_literal(text, literal.mapping)


def _no_images(model: str, images: list[Any] | None, param: str) -> None:
    if images:
        raise InvalidRequestError(f'"{model}" does not support images: it reads text only',
                                  param=param)


def _messages(req: ChatRequest) -> list[Message]:
    """The wire messages as the conversation's; tool results matched to their calls."""
    out: list[Message] = []
    pending: list[ToolCall] = []            # the last assistant turn's calls not answered
    for i, wire in enumerate(req.messages):
        where = f"messages[{i}]"
        _no_images(req.model, wire.images, f"{where}.images")
        message = Message(wire.role, [TextPart(wire.content or "")], where,
                          empty=wire.content is None)
        if wire.role == "assistant":
            if wire.thinking:
                message.reasoning = Reasoning(wire.thinking)
            message.tool_calls = [
                ToolCall(c.id or f"call_{i}_{j}", c.function.name,
                         orjson.dumps(c.function.arguments).decode())
                for j, c in enumerate(wire.tool_calls or ())]
            pending = list(message.tool_calls)
        elif wire.role == "tool":
            message.name = wire.tool_name
            message.tool_call_id = wire.tool_call_id or _answered(pending, wire)
        out.append(message)
    return out


def _answered(pending: list[ToolCall], wire: WireMessage) -> str | None:
    """The id of the call a result without one answers (taken off ``pending``)."""
    call = next((c for c in pending if c.name == wire.tool_name), None) or (
        pending[0] if pending and wire.tool_name is None else None)
    if call is None:
        return None
    pending.remove(call)
    return call.id
