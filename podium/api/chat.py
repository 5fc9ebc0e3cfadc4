"""The Chat Completions adapter: messages in, a chat.completion (or its chunks) out.

``conversation`` and ``options`` translate the wire request into the conversation stage's
terms; from there ``generation.prepare`` and the model's dialect do the rest, and
``render.chat`` renders the choices' events.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from typing import Any, AsyncGenerator

from podium.api import common
from podium.api.common import sampling_params, stop_strings
from podium.api.reasoning import (DEFAULT_BUDGETS, NO_LIMIT, Budget, applied, of_effort,
                                  off)
from podium.api.structured import structured_grammar
from podium.conversation import (Conversation, Message, Options, Reasoning, ResponseFormat,
                                 TextPart, Tool, ToolCall, custom_tool)
from podium.dialect import Dialect
from podium.engine.base import Engine
from podium.errors import InvalidRequestError
from podium.generation import Prepared, drive, fold, new_id, off_loop, prepare, start
from podium.protocol.chat import (AssistantMessage, CacheBreakpoint, ChatCompletionRequest,
                                  NamedToolChoice, PromptCacheOptions, ToolMessage)
from podium.protocol.chat import Tool as WireTool
from podium.protocol.chat import ToolCall as WireToolCall
from podium.protocol.chat import Message as WireMessage
from podium.protocol.chat import Prediction as WirePrediction
from podium.protocol.chat import TextPart as WireTextPart
from podium.protocol.structured import StructuredOutputs
from podium.render.chat import ChatChunks, ChatFold
from podium.settings import Settings

class ChatService:
    def __init__(self, engine: Engine, dialect: Dialect, settings: Settings):
        self._engine = engine
        self._dialect = dialect
        self._settings = settings

    async def create(self, req: ChatCompletionRequest, *, small: bool = False
                     ) -> dict[str, Any] | AsyncGenerator[Any, None]:
        """The folded object, or (``stream``) an iterator of chunks. Raises before
        streaming. ``small``: the route found the body small (prepared on the loop)."""
        # a request's own template may spend seconds rendering, however small its body
        prepared = await off_loop(self._prepare, req,
                                  inline=small and req.chat_template is None)
        choices = prepared.choices
        start(self._engine, choices)
        head = (new_id("chatcmpl"), int(time.time()), req.model, self._engine.tokenizer,
                req.logprobs, self._settings.reasoning_field)
        custom = frozenset(t.name for t in req.tools or () if t.type == "custom")
        if req.stream:
            usage = req.stream_options is not None and req.stream_options.include_usage
            return drive(self._engine, choices,
                         ChatChunks(*head, n=req.n, include_usage=bool(usage), custom=custom),
                         keepalive=self._settings.stream_keepalive_seconds)
        return await fold(self._engine, choices, ChatFold(*head, n=req.n, custom=custom))

    def _prepare(self, req: ChatCompletionRequest) -> Prepared:
        tok = self._engine.tokenizer
        opts = options(req, tok.vocab_size, tok.grammar_specials,
                       budgets=self._settings.effort_budgets())
        return prepare(self._engine, self._dialect, conversation(req), opts, self._settings)


def options(req: ChatCompletionRequest, vocab_size: int,
            specials: Collection[str] = (), *,
            budgets: Mapping[str, int] = DEFAULT_BUDGETS) -> Options:
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs to be true",
                                  param="top_logprobs")
    fmt, spec = req.response_format, (req.response_format and req.response_format.json_schema
                                      or {})
    response_format = common.response_format(
        fmt and fmt.type, spec.get("schema"), param="response_format.json_schema",
        schema_param="response_format.json_schema.schema", name=spec.get("name"),
        description=spec.get("description"), strict=spec.get("strict") is True)
    choice = req.tool_choice
    if req.structured_outputs is not None:
        response_format = _structured(req.structured_outputs, req, response_format, specials)
    mark, retain = prompt_cache(req.prompt_cache_retention, req.prompt_cache_options,
                                *_breakpoints(req))
    return applied(Options(
        model=req.model,
        sampling=sampling_params(req, 0, vocab_size, None),
        n=req.n,
        max_tokens=req.max_completion_tokens or req.max_tokens,
        seed=req.seed,
        stop=stop_strings(req.stop),
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        tools=[_tool(t, f"tools[{i}]") for i, t in enumerate(req.tools or ())],
        tool_choice=choice.name if isinstance(choice, NamedToolChoice) else choice or "auto",
        parallel_tool_calls=req.parallel_tool_calls is not False,
        parallel_asked=req.parallel_tool_calls is True,
        response_format=response_format,
        reasoning_effort=req.reasoning_effort,
        chat_template=req.chat_template,
        chat_template_kwargs=req.chat_template_kwargs,
        add_generation_prompt=req.add_generation_prompt,
        prediction=_prediction(req.prediction),
        cache_mark=mark, cache_retain=retain), _budget(req, budgets))


Mark = tuple[int, int]


def prompt_cache(retention: str | None, options: PromptCacheOptions | None,
                 mark: Mark | None, marked_long: bool) -> tuple[Mark | None, bool | None]:
    """OpenAI's prompt-cache fields as ``Options.cache_mark`` and ``cache_retain`` (Chat's
    and Responses' alike): ``mark``, the last breakpoint as (message, part) in the
    conversation; ``marked_long``: a breakpoint asked for ``ttl`` ``12h``.

    ``mode`` ``explicit`` without a breakpoint keeps nothing (OpenAI: no caching), so
    memory only; ``in_memory`` is memory only whatever the ttl (a client that must not be
    written to disk is not, which is what the retention promises); ``24h``, or a ``12h``
    ttl anywhere, keeps the prompt on disk too; otherwise the server's policy decides."""
    if options is not None and options.mode == "explicit" and mark is None:
        return None, False
    if retention == "in_memory":
        return mark, False
    if retention == "24h" or marked_long or (options is not None and options.ttl == "12h"):
        return mark, True
    return mark, None


def _breakpoints(req: ChatCompletionRequest) -> tuple[Mark | None, bool]:
    """The last ``prompt_cache_breakpoint`` (messages and their parts are the
    conversation's one for one), and whether any asked for ``ttl`` ``12h``."""
    mark, long = None, False
    for i, message in enumerate(req.messages):
        if isinstance(message.content, list):
            for j, part in enumerate(message.content):
                point: CacheBreakpoint | None = getattr(part, "prompt_cache_breakpoint", None)
                if point is not None:
                    mark, long = (i, j), long or point.ttl == "12h"
    return mark, long


def _budget(req: ChatCompletionRequest, budgets: Mapping[str, int]) -> Budget:
    """``enable_thinking: false`` is off; else vLLM's count; else the effort's tokens (an
    effort of none turns thinking off: not beside an explicit ``enable_thinking: true``)."""
    switch = (req.chat_template_kwargs or {}).get("enable_thinking")
    if switch is False:
        return off("chat_template_kwargs.enable_thinking")
    if req.thinking_token_budget is not None:
        return Budget(req.thinking_token_budget, "thinking_token_budget")
    if req.reasoning_effort is None:
        return NO_LIMIT
    budget = of_effort(req.reasoning_effort, budgets, "reasoning_effort")
    if switch is True and not budget.thinking:
        raise InvalidRequestError(
            f"reasoning_effort {req.reasoning_effort!r} turns thinking off, but "
            f"chat_template_kwargs.enable_thinking is true; give one", param="reasoning_effort")
    return budget


def _prediction(prediction: WirePrediction | None) -> str | None:
    """The predicted text; text parts joined as they are, since together they are the text
    the answer is expected to be (not paragraphs of a message)."""
    if prediction is None:
        return None
    content = prediction.content
    return content if isinstance(content, str) else "".join(p.text for p in content)


def _structured(so: StructuredOutputs, req: ChatCompletionRequest,
                response_format: ResponseFormat | None,
                specials: Collection[str]) -> ResponseFormat:
    """vLLM's ``structured_outputs`` as the answer's format: alone (not beside a response
    format, nor a forced call, which would each need a grammar of their own)."""
    if response_format is not None:
        raise InvalidRequestError("structured_outputs and response_format each constrain the "
                                  "answer; give one", param="structured_outputs")
    if req.tool_choice not in (None, "auto", "none"):
        raise InvalidRequestError("structured_outputs cannot constrain a forced tool call; "
                                  "use tool_choice 'auto' or 'none'",
                                  param="structured_outputs")
    return ResponseFormat("grammar", where="structured_outputs",
                          grammar=structured_grammar(so, specials))


def _tool(tool: WireTool, where: str) -> Tool:
    if tool.type == "custom":
        c = tool.custom
        assert c is not None                # (the wire model's check)
        return custom_tool(c.name, c.description, c.grammar, f"{where}.custom.format")
    f = tool.function
    assert f is not None
    return Tool(f.name, f.parameters, f.description, where=f"{where}.function.parameters",
                strict=f.strict is True)


def conversation(req: ChatCompletionRequest) -> Conversation:
    return Conversation([_message(m, f"messages[{i}]") for i, m in enumerate(req.messages)])


def _message(message: WireMessage, where: str) -> Message:
    role = "system" if message.role == "developer" else message.role
    out = Message(role, _parts(message.content, where), where,
                  name=getattr(message, "name", None), empty=message.content is None)
    if isinstance(message, ToolMessage):
        out.tool_call_id = message.tool_call_id
    if isinstance(message, AssistantMessage):
        reasoning = message.reasoning_content or message.reasoning
        if reasoning:
            out.reasoning = Reasoning(reasoning)
        out.tool_calls = [_call(c) for c in message.tool_calls or ()]
    return out


def _call(call: WireToolCall) -> ToolCall:
    """A call as the model wrote it: a custom tool's input as its one argument."""
    if call.type == "custom":
        c = call.custom
        assert c is not None                # (the wire model's check)
        return ToolCall(call.id, c.name, json.dumps({"input": c.input}, ensure_ascii=False))
    f = call.function
    assert f is not None
    return ToolCall(call.id, f.name, f.arguments)


def _parts(content: Any, where: str) -> list[TextPart]:
    """Text parts; others are refused (the model reads text only)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(content)]
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, WireTextPart):
            raise InvalidRequestError(
                f"This model accepts text only; content part of type {part.type!r} is not "
                f"supported", param=f"{where}.content[{j}]")
        parts.append(TextPart(part.text))
    return parts
