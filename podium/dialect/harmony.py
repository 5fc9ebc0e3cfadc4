"""The dialect of Harmony models (gpt-oss): prompts by openai-harmony, output parsed by token.

Harmony's structure lives in special tokens, so a choice ends at ``<|return|>`` or
``<|call|>`` (not at EOS, which ``<|end|>`` of each message would be) and its stream is
``HarmonyPipeline``. Podium cannot constrain Harmony output to a grammar: a forced tool call
is refused, and a response format is described to the model in its developer message.
"""

from __future__ import annotations

from typing import Any

from podium.conversation import Conversation, Options
from podium.dialect.base import Prompt
from podium.dialect.template import template_messages, tool_set
from podium.engine.base import SamplingParams
from podium.errors import InvalidRequestError
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
        if options.forced_call:
            raise InvalidRequestError(
                "tool_choice 'required' or a named function is not supported for Harmony "
                "(gpt-oss) models: Podium cannot constrain their output; use 'auto'",
                param="tool_choice")
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
        return None

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
    if fmt.kind == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {
        "name": fmt.name, "schema": fmt.schema, "description": fmt.description}}
