"""The dialect of models prompted by their own Jinja chat template.

The template renders the conversation the way Hugging Face renders it; the template also
tells which reasoning and tool-call families the model writes (``parsing.registry``), unless
the server's settings name them. Those families pick the output parsers of every choice and
the shape of the grammar that forces a tool call.

Unlike Hugging Face's ``apply_chat_template``, what clients send is tokenized as text: a
control token's text in a message, a tool's schema or a template variable (``<|im_end|>``)
never becomes that token, so no message can close its turn and forge another. Only the
template's own markup is parsed (``Literal``, ``Tokenizer.encode_literal``).
"""

from __future__ import annotations

import json
from typing import Any

from podium.conversation import Conversation, Message, Options, ResponseFormat
from podium.dialect.base import Prompt
from podium.engine.base import ReasoningBudget, SamplingParams, Tokenizer
from podium.errors import InvalidRequestError
from podium.grammar import (custom_input, json_object_grammar, schema_grammar,
                            tool_call_grammar)
from podium.parsing.pipeline import OutputParser
from podium.parsing.reasoning import ReasoningParser
from podium.parsing.registry import (REASONING_TAGS, build_reasoning_parser, build_tool_parser,
                                     detect_reasoning_parser, detect_tool_parser)
from podium.parsing.tools.base import ToolSet
from podium.settings import Settings
from podium.text.pipeline import TextPipeline, TextStream
from podium.text.template import ChatTemplate, Literal, control_pattern

# How each reasoning family's templates end reasoning before the answer (the close tag
# between): Qwen3's and DeepSeek-R1's "<think>\n...\n</think>\n\n", Magistral's "[/THINK]"
CLOSE = {"think": "\n{}\n\n", "mistral": "{}"}

# Used only when a model file carries no template of its own.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class TemplateDialect:
    name = "template"

    def __init__(self, tokenizer: Tokenizer, template: str, tool_family: str,
                 reasoning_family: str, allow_request_template: bool = False):
        self._tokenizer = tokenizer
        self._template = ChatTemplate(template, bos_token=tokenizer.bos_token,
                                      eos_token=tokenizer.eos_token)
        self.tool_family = tool_family
        self.reasoning_family = reasoning_family
        self._allow_request_template = allow_request_template
        self._controls = control_pattern(tokenizer.control_texts)

    @classmethod
    def for_model(cls, tokenizer: Tokenizer, template: str | None,
                  settings: Settings) -> TemplateDialect:
        template = template or FALLBACK_TEMPLATE
        tools = (detect_tool_parser(template) if settings.tool_parser == "auto"
                 else settings.tool_parser)
        reasoning = (detect_reasoning_parser(template) if settings.reasoning_parser == "auto"
                     else settings.reasoning_parser)
        return cls(tokenizer, template, tools, reasoning, settings.allow_request_chat_template)

    # -- prompt -------------------------------------------------------------------------

    def prompt(self, conversation: Conversation, options: Options) -> Prompt:
        template = self._template
        if options.chat_template is not None:
            if not self._allow_request_template:
                raise InvalidRequestError(
                    "Per-request chat templates are disabled on this server (start it with "
                    "--allow-request-chat-template to allow them)", param="chat_template")
            tok = self._tokenizer
            template = ChatTemplate(options.chat_template, bos_token=tok.bos_token,
                                    eos_token=tok.eos_token, from_request=True)
        tools = None
        if options.offers_tools:
            tools = [{"type": "function", "function": _function(t.name, t.description,
                                                                   t.parameters)}
                     for t in options.tools]
        literal = Literal(self._controls)
        messages, tools, extra = literal.protect(
            [template_messages(conversation), tools, options.chat_template_kwargs],
            taken=template.source)
        text = template.render(messages, tools=tools,
                               add_generation_prompt=options.add_generation_prompt, extra=extra)
        if not literal.mapping:
            return Prompt(self._tokenizer.encode(text, add_special=True), text)
        return Prompt(self._tokenizer.encode_literal(text, literal.mapping),
                      literal.restore(text))

    # -- constraint ---------------------------------------------------------------------

    def constraint(self, options: Options) -> str | None:
        """A forced call's grammar; under ``auto``, with a custom tool of a grammar offered
        to a Hermes model, the grammar of text then calls (a call the model starts is held
        to it: Codex sends ``apply_patch`` so) unless a response format holds the answer;
        else the response format's, or None."""
        auto = self._holds_calls(options)
        if options.forced_call or auto:
            family = "hermes" if self.tool_family == "hermes" else "json"
            tools = [t for t in options.tools if t.name in tool_set(options).schemas]
            custom, rules = {}, []
            for i, t in enumerate(tools):
                if t.grammar is not None:
                    custom[t.name], more = custom_input(*t.grammar, t.where, f"podium_ct{i}")
                    rules.append(more)
            return tool_call_grammar(
                {t.name: t.parameters for t in tools}, family,
                parallel=options.parallel_tool_calls if auto else (
                    options.tool_choice == "required" and options.parallel_asked),
                specials=self._tokenizer.grammar_specials,
                params={t.name: t.where for t in tools},
                strict={t.name for t in tools if t.strict}, custom=custom,
                rules="\n".join(rules), text_first=auto)
        return format_grammar(options.response_format)

    def _holds_calls(self, options: Options) -> bool:
        """``tool_choice: auto`` on a Hermes model with a custom tool of a grammar offered
        (and no response format): the calls the model starts are held to the grammar."""
        return (options.offers_tools and not options.forced_call
                and options.response_format is None and self.tool_family == "hermes"
                and any(t.grammar is not None for t in options.tools))

    def sampling(self, params: SamplingParams) -> None:
        pass

    def reasoning(self, prompt: Prompt, options: Options) -> ReasoningBudget | None:
        tags = REASONING_TAGS.get(self.reasoning_family)
        if options.reasoning_budget is None or tags is None:
            return None
        open_tag, close_tag = tags
        encode = self._tokenizer.encode
        close = CLOSE[self.reasoning_family].format(close_tag)
        if options.reasoning_budget == 0:       # right after the open tag: no line to end
            close = close.lstrip("\n")
        return ReasoningBudget(
            options.reasoning_budget,
            close=tuple(encode(close, add_special=False)),
            ends=tuple(encode(close_tag, add_special=False)),
            open=tuple(encode(open_tag, add_special=False)),
            inside=ReasoningParser.starts_inside(prompt.text, open_tag, close_tag))

    # -- per choice ---------------------------------------------------------------------

    def stream(self, prompt: Prompt, options: Options) -> TextStream:
        # thinking off leaves the parser out (a model that ignores the switch writes its tags
        # as text), unless a budget holds reasoning: then the engine closes what the model
        # opens, and the parser takes the block out of the answer
        reasoning = (build_reasoning_parser(self.reasoning_family, prompt.text)
                     if options.thinking or options.reasoning_budget is not None else None)
        tools = build_tool_parser(self.tool_family, tool_set(options),
                                  fallback=not self._holds_calls(options)) \
            if options.offers_tools else None
        parser = OutputParser(reasoning, tools,
                              calls_finish="stop" if options.named_call else "tool_calls")
        return TextStream(TextPipeline(self._tokenizer, options.stop, options.logprobs is not None),
                          parser, len(prompt.token_ids))


def format_grammar(fmt: ResponseFormat | None) -> str | None:
    if fmt is None:
        return None
    if fmt.kind == "json_object":
        return json_object_grammar()
    if fmt.kind == "grammar":
        return fmt.grammar
    return schema_grammar(fmt.schema or {}, fmt.where, fmt.strict)


def tool_set(options: Options) -> ToolSet:
    """The declared functions a call may name (only the chosen one under a named choice)."""
    schemas = {t.name: t.parameters or {} for t in options.tools}
    named = options.named_call
    if named is not None:
        schemas = {named: schemas[named]} if named in schemas else {}
    return ToolSet(schemas, max_calls=None if options.parallel_tool_calls else 1)


def _function(name: str, description: str | None, parameters: dict[str, Any] | None
              ) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if description is not None:
        out["description"] = description
    if parameters is not None:
        out["parameters"] = parameters
    return out


def template_messages(conversation: Conversation, raw_arguments: bool = False
                      ) -> list[dict[str, Any]]:
    """The conversation in the shape Hugging Face chat templates expect: tool call arguments
    as objects (templates render them with ``tojson``), unless ``raw_arguments``: then as
    the JSON text the client sent."""
    out = []
    if conversation.instructions:
        out.append({"role": "system", "content": conversation.instructions})
    for message in conversation.messages:
        out.append(_message(message, raw_arguments))
    return out


def _message(message: Message, raw_arguments: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.text}
    if message.name:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning is not None and message.reasoning.text:
        out["reasoning_content"] = message.reasoning.text
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.name,
            "arguments": c.arguments if raw_arguments else _arguments(c.arguments)}}
            for c in message.tool_calls]
    return out


def _arguments(raw: str) -> Any:
    """Templates render arguments with ``tojson``: hand them the object, not its JSON text."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, dict) else raw
