"""The Chat Completions adapter: messages in, a chat.completion (or its chunks) out.

``conversation`` and ``options`` translate the wire request into the conversation stage's
terms; from there ``generation.prepare`` and the model's dialect do the rest, and
``render.chat`` renders the choices' events.
"""

from __future__ import annotations

import time
from typing import Any, AsyncGenerator

from podium.api.common import sampling_params, stop_strings
from podium.conversation import (Conversation, Message, Options, Reasoning, ResponseFormat,
                                 TextPart, Tool, ToolCall)
from podium.dialect import Dialect
from podium.engine.base import Engine
from podium.errors import InvalidRequestError
from podium.generation import (Choice, KeepAlive, Prepared, check_model, new_id, off_loop,
                               prepare, run_choices, start, stream_choices)
from podium.parsing.events import Usage
from podium.protocol.chat import (AssistantMessage, ChatCompletionRequest, NamedToolChoice,
                                  ToolMessage)
from podium.protocol.chat import Message as WireMessage
from podium.protocol.chat import TextPart as WireTextPart
from podium.render.chat import ChatChunks, ChatFold
from podium.render.usage import UsageFold
from podium.settings import Settings

# A chunk would reach the SDKs' callers (``choices[0]`` fails on an empty list); a comment is
# dropped by every SSE parser, and still restarts the byte-level idle timers (httpx's read
# timeout, undici's bodyTimeout, proxies') that are what Chat clients have.
KEEPALIVE_COMMENT = b": keepalive\n\n"


class ChatService:
    def __init__(self, engine: Engine, dialect: Dialect, settings: Settings):
        self._engine = engine
        self._dialect = dialect
        self._settings = settings

    async def create(self, req: ChatCompletionRequest, *, small: bool = False
                     ) -> dict[str, Any] | AsyncGenerator[bytes, None]:
        """The folded object, or (``stream``) an iterator of chunks, framed for SSE. Raises
        before streaming. ``small``: the route found the body small (prepared on the loop)."""
        check_model(req.model, self._engine, self._settings)
        # a request's own template may spend seconds rendering, however small its body
        prepared = await off_loop(self._prepare, req,
                                  inline=small and req.chat_template is None)
        choices = prepared.choices
        start(self._engine, choices)
        cid, created = new_id("chatcmpl"), int(time.time())
        if req.stream:
            return self._stream(req, choices, cid, created)
        fold = ChatFold(req.n, self._engine.tokenizer, req.logprobs,
                        self._settings.reasoning_field)
        async for index, event in run_choices(self._engine, choices):
            fold.add(index, event)
        return fold.result(cid, created, req.model)

    def _prepare(self, req: ChatCompletionRequest) -> Prepared:
        opts = options(req, self._engine.tokenizer.vocab_size)
        return prepare(self._engine, self._dialect, conversation(req), opts, self._settings)

    async def _stream(self, req: ChatCompletionRequest, choices: list[Choice], cid: str,
                      created: int) -> AsyncGenerator[bytes, None]:
        chunks = ChatChunks(cid, created, req.model, self._engine.tokenizer, req.logprobs,
                            self._settings.reasoning_field)
        for i in range(len(choices)):
            yield chunks.role(i)
        usage = UsageFold(len(choices), len(choices))
        async for index, event in stream_choices(self._engine, choices,
                                                 self._settings.stream_keepalive_seconds):
            if type(event) is KeepAlive:
                yield KEEPALIVE_COMMENT
                continue
            chunk = chunks.event(index, event)
            if chunk is not None:
                yield chunk
            elif isinstance(event, Usage):
                usage.add(index, event)
        if req.stream_options is not None and req.stream_options.include_usage:
            yield chunks.usage(usage)


def options(req: ChatCompletionRequest, vocab_size: int) -> Options:
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs to be true",
                                  param="top_logprobs")
    fmt = req.response_format
    response_format = None
    if fmt is not None and fmt.type != "text":
        spec = fmt.json_schema or {}
        if fmt.type == "json_schema" and not isinstance(spec.get("schema"), dict):
            raise InvalidRequestError("response_format json_schema needs json_schema.schema, "
                                      "a JSON schema object",
                                      param="response_format.json_schema")
        response_format = ResponseFormat(
            fmt.type, spec.get("schema"), spec.get("name"), spec.get("description"),
            where="response_format.json_schema.schema", strict=spec.get("strict") is True)
    choice = req.tool_choice
    return Options(
        model=req.model,
        sampling=sampling_params(req, 0, vocab_size, None),
        n=req.n,
        max_tokens=req.max_completion_tokens or req.max_tokens,
        seed=req.seed,
        stop=stop_strings(req.stop),
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        tools=[Tool(t.function.name, t.function.parameters, t.function.description,
                    where=f"tools[{i}].function.parameters", strict=t.function.strict is True)
               for i, t in enumerate(req.tools or ())],
        tool_choice=(choice.function.name if isinstance(choice, NamedToolChoice)
                     else choice or "auto"),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        response_format=response_format,
        reasoning_effort=req.reasoning_effort,
        thinking=(req.chat_template_kwargs or {}).get("enable_thinking", True) is not False,
        chat_template=req.chat_template,
        chat_template_kwargs=req.chat_template_kwargs,
        add_generation_prompt=req.add_generation_prompt)


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
        out.tool_calls = [ToolCall(c.id, c.function.name, c.function.arguments)
                          for c in message.tool_calls or ()]
    return out


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
