"""The Chat Completions service: messages in, a chat.completion (or its chunks) out."""

from __future__ import annotations

import json
import time
from typing import Any, AsyncGenerator

from podium.api.generation import (Choice, cached_tokens, check_model, choice_seed, new_id,
                                   off_loop, output_budget, run_choices, sampling_params, start,
                                   stop_strings)
from podium.engine.base import Engine, EngineRequest
from podium.errors import InvalidRequestError
from podium.harmony.format import Harmony, is_harmony
from podium.harmony.pipeline import HarmonyPipeline
from podium.parsing.events import Finish
from podium.parsing.constraints import json_object_grammar, schema_grammar, tool_call_grammar
from podium.parsing.pipeline import OutputParser
from podium.parsing.registry import (build_reasoning_parser, build_tool_parser,
                                     detect_reasoning_parser, detect_tool_parser)
from podium.parsing.tools.base import ToolSet
from podium.protocol.chat import (AssistantMessage, ChatCompletionRequest, Message,
                                  NamedToolChoice, TextPart, ToolMessage)
from podium.render.chat import ChatChunks, ChatFold
from podium.settings import Settings
from podium.text.pipeline import TextPipeline
from podium.text.template import ChatTemplate

# Used only when a model file carries no template of its own.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class ChatService:
    def __init__(self, engine: Engine, settings: Settings):
        self._engine = engine
        self._settings = settings
        tok = engine.tokenizer
        template = engine.info.chat_template or FALLBACK_TEMPLATE
        self._template = ChatTemplate(template, bos_token=tok.bos_token, eos_token=tok.eos_token)
        self.tool_family = (detect_tool_parser(template) if settings.tool_parser == "auto"
                            else settings.tool_parser)
        self.reasoning_family = (detect_reasoning_parser(template)
                                 if settings.reasoning_parser == "auto"
                                 else settings.reasoning_parser)
        self.harmony = (Harmony(settings.harmony_vocab_dir)
                        if settings.harmony or is_harmony(engine.info) else None)

    async def create(self, req: ChatCompletionRequest) -> dict[str, Any] | AsyncGenerator[dict, None]:
        """The folded object, or (``stream``) an iterator of chunks. Raises before streaming."""
        prompt_tokens, choices = await off_loop(self.prepare, req)
        start(self._engine, choices)
        cid, created = new_id("chatcmpl"), int(time.time())
        if req.stream:
            return self._stream(req, choices, prompt_tokens, cid, created)
        fold = ChatFold(req.n, self._engine.tokenizer, req.logprobs,
                        self._settings.reasoning_field)
        async for index, event in run_choices(self._engine, choices):
            fold.add(index, event)
        return fold.result(cid, created, req.model, prompt_tokens, cached_tokens(choices, req.n))

    def prepare(self, req: ChatCompletionRequest) -> tuple[int, list[Choice]]:
        """Check, render and tokenize: the prompt's length and one ``Choice`` per n, ready
        for ``generation.start``.

        Every API that speaks in messages (Chat Completions, Responses) starts here. CPU-heavy
        and free of event-loop state: callers run it on a worker thread (``off_loop``).
        """
        engine = self._engine
        check_model(req.model, engine)
        _refuse_unsupported(req)
        if self.harmony is not None:
            text, prompt, grammar = "", self._harmony_prompt(req), None
        else:
            text = self._render(req)
            prompt = engine.tokenizer.encode(text, add_special=True)
            grammar = self._grammar(req)      # built once, shared by the n choices
        budget = output_budget(len(prompt), req.max_completion_tokens or req.max_tokens,
                               engine.info.context_length, self._settings.max_tokens_cap)
        return len(prompt), [self._choice(req, prompt, text, budget, grammar, i)
                             for i in range(req.n)]

    def _harmony_prompt(self, req: ChatCompletionRequest) -> list[int]:
        if req.chat_template is not None:
            raise InvalidRequestError("This model speaks Harmony; its prompts are rendered by "
                                      "openai-harmony, not a chat template",
                                      param="chat_template")
        if req.tools and (req.tool_choice == "required"
                          or isinstance(req.tool_choice, NamedToolChoice)):
            raise InvalidRequestError(
                "tool_choice 'required' or a named function is not supported for Harmony "
                "(gpt-oss) models: Podium cannot constrain their output; use 'auto'",
                param="tool_choice")
        tools = None
        if req.tools and _offers_tools(req):
            tools = [t.function.model_dump(exclude_none=True) for t in req.tools]
        fmt = req.response_format
        assert self.harmony is not None         # only called for Harmony models
        return self.harmony.render(
            [_template_message(m, i, raw_arguments=True) for i, m in enumerate(req.messages)],
            tools, req.reasoning_effort,
            fmt.model_dump(exclude_none=True) if fmt is not None and fmt.type != "text" else None)

    def _render(self, req: ChatCompletionRequest) -> str:
        template = self._template
        if req.chat_template is not None:
            if not self._settings.allow_request_chat_template:
                raise InvalidRequestError(
                    "Per-request chat templates are disabled on this server (start it with "
                    "--allow-request-chat-template to allow them)", param="chat_template")
            tok = self._engine.tokenizer
            template = ChatTemplate(req.chat_template, bos_token=tok.bos_token,
                                    eos_token=tok.eos_token, from_request=True)
        tools = None
        if req.tools and _offers_tools(req):
            tools = [t.model_dump(exclude_none=True) for t in req.tools]
        return template.render([_template_message(m, i) for i, m in enumerate(req.messages)],
                               tools=tools, add_generation_prompt=req.add_generation_prompt,
                               extra=req.chat_template_kwargs)

    def _choice(self, req: ChatCompletionRequest, prompt: list[int], prompt_text: str,
                budget: int, grammar: str | None, index: int) -> Choice:
        tok = self._engine.tokenizer
        seed = choice_seed(req.seed, self._settings.seed, index)
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        sampling = sampling_params(req, budget, tok.vocab_size, seed)
        sampling.grammar = grammar
        request = EngineRequest(new_id("req"), prompt, sampling, logprobs)
        if self.harmony is not None:
            sampling.stop_token_ids = self.harmony.stop_token_ids
            sampling.ignore_eos = True      # <|end|> ends a message, not the turn
            tools = tool_set(req) if _offers_tools(req) else None
            return Choice(request, HarmonyPipeline(self.harmony, tools, stop_strings(req.stop),
                                                   req.logprobs))
        return Choice(request, TextPipeline(tok, stop_strings(req.stop), req.logprobs),
                      self._output_parser(req, prompt_text))

    def _grammar(self, req: ChatCompletionRequest) -> str | None:
        """The constraint a forced tool call or a response format puts on decoding."""
        if req.tools and (req.tool_choice == "required" or isinstance(req.tool_choice,
                                                                       NamedToolChoice)):
            family = "hermes" if self.tool_family == "hermes" else "json"
            return tool_call_grammar(tool_set(req).schemas, family,
                                     parallel=req.parallel_tool_calls is not False
                                     and req.tool_choice == "required",
                                     params={t.function.name: f"tools[{i}].function.parameters"
                                             for i, t in enumerate(req.tools)})
        fmt = req.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return json_object_grammar()
        return schema_grammar((fmt.json_schema or {})["schema"],
                              "response_format.json_schema.schema")

    def _output_parser(self, req: ChatCompletionRequest, prompt_text: str) -> OutputParser:
        thinking = (req.chat_template_kwargs or {}).get("enable_thinking", True) is not False
        reasoning = (build_reasoning_parser(self.reasoning_family, prompt_text)
                     if thinking else None)
        tools = None
        if _offers_tools(req):
            tools = build_tool_parser(self.tool_family, tool_set(req))
        named = isinstance(req.tool_choice, NamedToolChoice)
        return OutputParser(reasoning, tools, calls_finish="stop" if named else "tool_calls")

    async def _stream(self, req: ChatCompletionRequest, choices: list[Choice],
                      prompt_tokens: int, cid: str, created: int) -> AsyncGenerator[dict, None]:
        chunks = ChatChunks(cid, created, req.model, self._engine.tokenizer, req.logprobs,
                            self._settings.reasoning_field)
        for i in range(len(choices)):
            yield chunks.role(i)
        completion_tokens = 0
        async for index, event in run_choices(self._engine, choices):
            if isinstance(event, Finish):
                completion_tokens += event.completion_tokens
            chunk = chunks.event(index, event)
            if chunk is not None:
                yield chunk
        if req.stream_options is not None and req.stream_options.include_usage:
            yield chunks.usage(prompt_tokens, completion_tokens,
                               cached_tokens(choices, len(choices)))


def _refuse_unsupported(req: ChatCompletionRequest) -> None:
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs to be true",
                                  param="top_logprobs")
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_schema" and not isinstance(
            (fmt.json_schema or {}).get("schema"), dict):
        raise InvalidRequestError("response_format json_schema needs json_schema.schema, "
                                  "a JSON schema object", param="response_format.json_schema")
    names = {t.function.name for t in req.tools or ()}
    if req.tool_choice == "required" and not names:
        raise InvalidRequestError("tool_choice 'required' needs tools", param="tool_choice")
    if isinstance(req.tool_choice, NamedToolChoice) and req.tool_choice.function.name not in names:
        raise InvalidRequestError(
            f"tool_choice names function {req.tool_choice.function.name!r}, which is not in "
            f"tools", param="tool_choice")


def _offers_tools(req: ChatCompletionRequest) -> bool:
    """The model sees the tools (declared, and tool_choice is not "none")."""
    return bool(req.tools) and req.tool_choice != "none"


def tool_set(req: ChatCompletionRequest) -> ToolSet:
    """The declared functions a call may name (only the chosen one under a named choice)."""
    schemas = {t.function.name: t.function.parameters or {} for t in req.tools or ()}
    if isinstance(req.tool_choice, NamedToolChoice):
        name = req.tool_choice.function.name
        schemas = {name: schemas[name]} if name in schemas else {}
    return ToolSet(schemas, max_calls=1 if req.parallel_tool_calls is False else None)


def _text(content: Any, where: str) -> str | None:
    """Message content as one string; non-text parts are refused (the model reads text only)."""
    if content is None or isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, TextPart):
            raise InvalidRequestError(
                f"This model accepts text only; content part of type {part.type!r} is not "
                f"supported", param=f"{where}.content[{j}]")
        texts.append(part.text)
    return "\n".join(texts)


def _template_message(message: Message, index: int, raw_arguments: bool = False
                      ) -> dict[str, Any]:
    """A message in the shape Hugging Face chat templates expect (tool call arguments as
    objects, unless ``raw_arguments``: then as the JSON text the client sent)."""
    where = f"messages[{index}]"
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role, "content": _text(message.content, where)}
    name = getattr(message, "name", None)
    if name:
        out["name"] = name
    if isinstance(message, ToolMessage):
        out["tool_call_id"] = message.tool_call_id
    if isinstance(message, AssistantMessage):
        reasoning = message.reasoning_content or message.reasoning
        if reasoning:
            out["reasoning_content"] = reasoning
        if message.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name,
                "arguments": c.function.arguments if raw_arguments
                else _arguments(c.function.arguments)}}
                for c in message.tool_calls]
    return out


def _arguments(raw: str) -> Any:
    """Templates render arguments with ``tojson``: hand them the object, not its JSON text."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, dict) else raw
