"""Chat Completions request models (``POST /v1/chat/completions``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, model_validator

from podium.protocol.common import LENIENT, SamplingFields, ThinkingTokenBudget
from podium.protocol.structured import StructuredOutputs


CacheTtl = Literal["30m", "12h"]
# OpenAI's bound on ``prompt_cache_key`` (its 400 says "maximum length 64"); Podium finds
# cached prefixes by their tokens, so the key changes nothing here, but it is echoed
MAX_CACHE_KEY = 64
CacheKey = Annotated[str, Field(max_length=MAX_CACHE_KEY)]


class CacheBreakpoint(BaseModel):
    """A content part's ``prompt_cache_breakpoint``: the prompt up to the end of the part is
    worth keeping (``ttl``: for how long, at least; None: the request's ``ttl``)."""

    model_config = LENIENT
    mode: Literal["explicit"] = "explicit"
    ttl: CacheTtl | None = None


class PromptCacheOptions(BaseModel):
    """``prompt_cache_options``: ``mode`` ``explicit`` keeps only what breakpoints mark
    (none: nothing); ``ttl`` the least a breakpoint asks to be kept."""

    model_config = LENIENT
    mode: Literal["implicit", "explicit"] = "implicit"
    ttl: CacheTtl = "30m"


class TextPart(BaseModel):
    model_config = LENIENT
    type: Literal["text"]
    text: str
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class ImagePart(BaseModel):
    model_config = LENIENT
    type: Literal["image_url"]
    image_url: Any


class AudioPart(BaseModel):
    model_config = LENIENT
    type: Literal["input_audio"]
    input_audio: Any


class FilePart(BaseModel):
    model_config = LENIENT
    type: Literal["file"]
    file: Any


class RefusalPart(BaseModel):
    model_config = LENIENT
    type: Literal["refusal"]
    refusal: str


UserPart = Annotated[TextPart | ImagePart | AudioPart | FilePart, Field(discriminator="type")]
AssistantPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


class FunctionCall(BaseModel):
    model_config = LENIENT
    name: str
    arguments: str


class CustomCall(BaseModel):
    model_config = LENIENT
    name: str
    input: str


class _FunctionOrCustom(BaseModel):
    """An entry of ``type`` ``function`` or ``custom``, holding the field its type names
    (one model with both fields rather than a tagged union, so errors name
    ``tools[0].custom.name``, not ``tools[0].custom.custom.name``)."""

    model_config = LENIENT
    type: Literal["function", "custom"] = "function"

    @model_validator(mode="after")
    def _filled(self) -> _FunctionOrCustom:
        if getattr(self, self.type, None) is None:
            raise ValueError(f"a {self.type!r} entry needs its {self.type!r} field")
        return self

    @property
    def name(self) -> str:
        return getattr(self, self.type).name


class ToolCall(_FunctionOrCustom):
    """A function's call, or (``type: "custom"``) a custom tool's."""

    id: str
    function: FunctionCall | None = None
    custom: CustomCall | None = None


class SystemMessage(BaseModel):
    model_config = LENIENT
    role: Literal["system"]
    content: str | list[TextPart]
    name: str | None = None


class DeveloperMessage(BaseModel):
    model_config = LENIENT
    role: Literal["developer"]
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(BaseModel):
    model_config = LENIENT
    role: Literal["user"]
    content: str | list[UserPart]
    name: str | None = None


class AssistantMessage(BaseModel):
    model_config = LENIENT
    role: Literal["assistant"]
    content: str | list[AssistantPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class ToolMessage(BaseModel):
    model_config = LENIENT
    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str


Message = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage,
    Field(discriminator="role")]


# OpenAI's function names, and dotted ones (``files.read``); no quotes or backslashes, which
# the name would carry into prompts and output grammars.
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"


class FunctionDefinition(BaseModel):
    model_config = LENIENT
    name: str = Field(min_length=1, max_length=128, pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


MAX_GRAMMAR_BYTES = 64 * 1024


def _bounded(definition: str) -> str:
    if len(definition.encode("utf-8", "surrogatepass")) > MAX_GRAMMAR_BYTES:
        raise ValueError(f"a grammar is limited to {MAX_GRAMMAR_BYTES} bytes of UTF-8")
    return definition


# A custom tool's grammar (Lark or a regular expression), bounded: the engine compiles it.
GrammarDefinition = Annotated[str, AfterValidator(_bounded)]


class Grammar(BaseModel):
    model_config = LENIENT
    syntax: Literal["lark", "regex"]
    definition: GrammarDefinition


class CustomFormat(BaseModel):
    model_config = LENIENT
    type: Literal["text", "grammar"]
    grammar: Grammar | None = None

    @model_validator(mode="after")
    def _filled(self) -> CustomFormat:
        if self.type == "grammar" and self.grammar is None:
            raise ValueError("a format of type 'grammar' needs its 'grammar'")
        return self


class CustomDefinition(BaseModel):
    model_config = LENIENT
    name: str = Field(min_length=1, max_length=128, pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    format: CustomFormat | None = None

    @property
    def grammar(self) -> tuple[str, str] | None:
        """(syntax, definition), or None for free text."""
        grammar = self.format and self.format.grammar
        return (grammar.syntax, grammar.definition) if grammar else None



class Tool(_FunctionOrCustom):
    """A function, or (``type: "custom"``) a custom tool: free text, or a grammar's."""

    type: Literal["function", "custom"]
    function: FunctionDefinition | None = None
    custom: CustomDefinition | None = None


class NamedFunction(BaseModel):
    model_config = LENIENT
    name: str


class NamedToolChoice(_FunctionOrCustom):
    type: Literal["function", "custom"]
    function: NamedFunction | None = None
    custom: NamedFunction | None = None


class ResponseFormat(BaseModel):
    model_config = LENIENT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class Prediction(BaseModel):
    """Predicted Outputs: text the answer is expected to mostly be (a file before an edit),
    as a string or text parts; ``content`` is the one type there is."""

    model_config = LENIENT
    type: Literal["content"]
    # the parts first: a bad part's error (the first, which names the parameter) is then
    # at that part, ``prediction.content[1].type``, not at the content for not being a string
    content: list[TextPart] | str


class ChatCompletionRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None     # vLLM's extension
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    thinking_token_budget: ThinkingTokenBudget = None      # vLLM's extension
    prediction: Prediction | None = None
    prompt_cache_key: CacheKey | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
