"""The conversation stage: what every API's request means, in no API's shape.

Each API adapter (``api/chat.py``, ``api/responses/translate.py``, the Anthropic Messages
adapter next) turns its own wire model into a ``Conversation`` (who said what) and
``Options`` (what the caller wants of the answer). From here on nothing knows which API
asked: a ``Dialect`` renders the conversation for the model, ``generation.prepare`` starts
it. Every place that can be wrong carries the caller's own parameter name (``where``), so an
error found anywhere downstream names ``messages[1].content`` for Chat and
``input[2].content`` for Responses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from podium.engine.base import SamplingParams

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


# The model reads text only: adapters refuse other parts (images, audio, files) with the
# caller's parameter, so a ``Message`` holds text parts alone.
ContentPart = TextPart


@dataclass(frozen=True, slots=True)
class ToolCall:
    """An assistant's call of a function, as the model saw or wrote it."""

    id: str
    name: str                   # the name the model knows (a namespace's function flattened)
    arguments: str              # the JSON text


@dataclass(frozen=True, slots=True)
class Reasoning:
    """What the model thought before an assistant turn; ``encrypted`` is the sealed form a
    client sent back (Responses' ``encrypted_content``), already opened into ``text``."""

    text: str
    encrypted: str | None = None


@dataclass(slots=True)
class Message:
    role: Role                  # "developer" arrives as "system"
    parts: list[ContentPart]
    where: str                  # the caller's parameter for this message: "messages[3]"
    name: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None     # a tool result: the call it answers
    reasoning: Reasoning | None = None
    empty: bool = False         # the content was null (an assistant turn of calls only)

    @property
    def text(self) -> str | None:
        if self.empty:
            return None
        return self.parts[0].text if len(self.parts) == 1 else "\n".join(
            p.text for p in self.parts)


@dataclass(slots=True)
class Conversation:
    messages: list[Message]
    instructions: str | None = None     # a system message before all others


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call, by the name the model sees."""

    name: str
    parameters: dict[str, Any] | None       # None: the caller gave none (templates see none)
    description: str | None = None
    where: str = "tools"        # the caller's parameter for its schema
    strict: bool = False        # every schema keyword must be enforced (else 400)
    grammar: tuple[str, str] | None = None  # a custom tool's input: (syntax "lark" or
    #                                         "regex", definition); None: a function, or
    #                                         a custom tool of free text


# A custom tool as the model sees it: a function of one string.
CUSTOM_INPUT: dict[str, Any] = {"type": "object", "properties": {"input": {"type": "string"}},
                                "required": ["input"]}


def custom_tool(name: str, description: str | None, grammar: tuple[str, str] | None,
                where: str) -> Tool:
    """A custom tool (free text in, or a grammar's language), offered to the model as a
    function of one ``input`` string: every family's call markup and chat template knows
    functions, none knows custom tools. ``where``: the caller's parameter for the grammar."""
    hint = "(Put the whole input in the 'input' field.)"
    return Tool(name, CUSTOM_INPUT, f"{description} {hint}" if description else hint,
                where=where, grammar=grammar)


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    kind: Literal["json_object", "json_schema", "grammar"]
    schema: dict[str, Any] | None = None
    name: str | None = None
    description: str | None = None
    where: str = "response_format"      # the caller's parameter for the schema
    strict: bool = False                # every schema keyword must be enforced (else 400)
    grammar: str | None = None          # kind "grammar": the ready grammar (vLLM's extension)


@dataclass(slots=True)
class Options:
    """What the caller asks of the answer, in no API's shape.

    ``sampling`` is complete except for what ``prepare`` settles per choice (max tokens,
    seed, grammar, stop tokens, the prediction's tokens). The ``*_param`` fields are the
    caller's parameter names, used in errors.
    """

    model: str
    sampling: SamplingParams
    n: int = 1
    max_tokens: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None         # None: none; k: the chosen token and k alternatives
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str = "auto"           # "auto", "none", "required", or a function's name
    parallel_tool_calls: bool = True
    parallel_asked: bool = False        # the client sent parallel_tool_calls: true itself
    response_format: ResponseFormat | None = None
    reasoning_effort: str | None = None
    thinking: bool = True               # False: the model is asked not to think
    reasoning_budget: int | None = None     # reasoning tokens the model may write before
    #                                         the engine ends its reasoning (None: no limit)
    reasoning_budget_param: str | None = None   # the caller's parameter it came from
    chat_template: str | None = None    # a per-request template (Chat's extension)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    prediction: str | None = None       # Predicted Outputs: the text the answer is expected
    #                                     to mostly be (drafts for the engine to verify)
    fit_max_tokens: bool = False        # max_tokens is a ceiling: cut it to the room left
    # the prompt cache (Anthropic's cache_control, OpenAI's prompt_cache_*): the last
    # breakpoint, as (message index, part index) it follows, (-1, 0) for after the
    # instructions and tools; and the retention (True: on disk too, False: memory only,
    # None: the server's policy)
    cache_mark: tuple[int, int] | None = None
    cache_retain: bool | None = None
    messages_param: str = "messages"
    max_tokens_param: str = "max_tokens"

    @property
    def offers_tools(self) -> bool:
        """The model sees the tools (declared, and tool_choice is not "none")."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def forced_call(self) -> bool:
        """A call is required (``required``, or one named function)."""
        return bool(self.tools) and self.tool_choice not in ("auto", "none")

    @property
    def named_call(self) -> str | None:
        if self.tool_choice in ("auto", "none", "required"):
            return None
        return self.tool_choice
