"""The dialect of Harmony models (gpt-oss): prompts by openai-harmony, output parsed by token.

Harmony's structure lives in special tokens, so a choice ends at ``<|return|>`` or
``<|call|>`` (not at EOS, which ``<|end|>`` of each message would be) and its stream is
``HarmonyPipeline``. A forced tool call and a response format constrain decoding with a
grammar over Harmony's message structure (``podium.grammar.harmony``); the format is also
described to the model in its developer message.
"""

from __future__ import annotations

from typing import Any

from podium.conversation import Conversation, Options
from podium.dialect.base import Prompt
from podium.dialect.template import template_messages, tool_set
from podium.engine.base import ReasoningBudget, SamplingParams
from podium.errors import InvalidRequestError
from podium.grammar.harmony import call_grammar, format_grammar
from podium.harmony.format import Harmony
from podium.harmony.pipeline import HarmonyPipeline


class HarmonyDialect:
    name = "harmony"

    def __init__(self, harmony: Harmony):
        self.harmony = harmony

    def prompt(self, conversation: Conversation, options: Options) -> Prompt:
        if options.chat_template is not None:
            raise InvalidRequestError("This model speaks Harmony; its prompts are rendered by "
                                      "openai-harmony, not a chat template",
                                      param="chat_template")
        tools = None
        if options.offers_tools:
            tools = [{"name": t.name, "description": t.description,
                      "parameters": t.parameters} for t in options.tools]
        messages = template_messages(conversation, raw_arguments=True)
        offset = 1 if conversation.instructions else 0
        for message, source in zip(messages[offset:], conversation.messages):
            message["where"] = source.where
        return Prompt(self.harmony.render(messages, tools, options.reasoning_effort,
                                          _format(options)))

    def constraint(self, options: Options) -> str | None:
        if options.forced_call:
            tools = [t for t in options.tools if t.name in tool_set(options).schemas]
            if any(t.grammar is not None for t in tools):
                raise InvalidRequestError(
                    "A custom tool's grammar cannot constrain a Harmony (gpt-oss) model's "
                    "call yet; use tool_choice 'auto'", param="tool_choice")
            return call_grammar({t.name: t.parameters for t in tools},
                                {t.name: t.where for t in tools},
                                {t.name for t in tools if t.strict})
        fmt = options.response_format
        if fmt is None:
            return None
        schema = {"type": "object"} if fmt.kind == "json_object" else fmt.schema or {}
        return format_grammar(schema, fmt.where, fmt.strict)

    def reasoning(self, prompt: Prompt, options: Options) -> ReasoningBudget | None:
        """Reasoning is the analysis channel: the budget ends it with the end of that
        message and the start of the final one."""
        if options.reasoning_budget is None:
            return None
        encode = self.harmony.encoding.encode
        return ReasoningBudget(
            options.reasoning_budget,
            close=tuple(encode("<|end|><|start|>assistant<|channel|>final<|message|>",
                               allowed_special="all")),
            ends=(self.harmony.end_token,),
            open=tuple(encode("<|channel|>analysis<|message|>", allowed_special="all")))

    def sampling(self, params: SamplingParams) -> None:
        params.stop_token_ids = self.harmony.stop_token_ids
        params.ignore_eos = True        # <|end|> ends a message, not the turn

    def stream(self, prompt: Prompt, options: Options) -> HarmonyPipeline:
        tools = tool_set(options) if options.offers_tools else None
        return HarmonyPipeline(self.harmony, tools, options.stop, options.logprobs is not None,
                               len(prompt.token_ids))


def _format(options: Options) -> dict[str, Any] | None:
    fmt = options.response_format
    if fmt is None:
        return None
    if fmt.kind == "grammar":
        raise InvalidRequestError("structured_outputs cannot constrain a Harmony (gpt-oss) "
                                  "model's output yet; use response_format", param=fmt.where)
    if fmt.kind == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {
        "name": fmt.name, "schema": fmt.schema, "description": fmt.description}}
