"""vLLM's ``structured_outputs`` request extension (Chat Completions and Completions).

The field as vLLM 0.32 takes it (``vllm.sampling_params.StructuredOutputsParams``), so vLLM
clients move over unchanged: exactly one constraint (``json``, ``regex``, ``choice``,
``grammar``, ``json_object``, ``structural_tag``) and the options vLLM documents beside it.
vLLM 0.32 no longer reads its older ``guided_*`` fields; neither does Podium. Each
definition is bounded like a custom tool's grammar: the server compiles it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, model_validator

from podium.protocol.common import LENIENT

MAX_DEFINITION_BYTES = 64 * 1024
MAX_CHOICES = 1000
MAX_CHOICE_BYTES = 1024
KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def _at_most(limit: int):      # noqa: ANN202 - a validator factory
    def check(text: str) -> str:
        if len(text.encode("utf-8", "surrogatepass")) > limit:
            raise ValueError(f"limited to {limit} bytes of UTF-8")
        return text
    return check


def _schema_bounded(schema: str | dict[str, Any]) -> str | dict[str, Any]:
    text = schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)
    _at_most(MAX_DEFINITION_BYTES)(text)
    return schema


Definition = Annotated[str, AfterValidator(_at_most(MAX_DEFINITION_BYTES))]
ChoiceText = Annotated[str, AfterValidator(_at_most(MAX_CHOICE_BYTES))]


class StructuredOutputs(BaseModel):
    """One constraint on the output, and its options (vLLM's names and meanings)."""

    model_config = LENIENT
    json_: Annotated[str | dict[str, Any], AfterValidator(_schema_bounded)] | None = Field(
        None, alias="json")
    regex: Definition | None = None
    choice: Annotated[list[ChoiceText], Field(min_length=1, max_length=MAX_CHOICES)] | None \
        = None
    grammar: Definition | None = None
    json_object: bool | None = None
    structural_tag: Definition | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Annotated[str, AfterValidator(_at_most(MAX_CHOICE_BYTES))] | None \
        = None

    @model_validator(mode="after")
    def _one_kind(self) -> StructuredOutputs:
        given = [k for k in KINDS if getattr(self, "json_" if k == "json" else k) is not None]
        if len(given) != 1:
            raise ValueError(f"exactly one of {', '.join(KINDS)} is needed; got "
                             f"{', '.join(given) or 'none'}")
        if self.json_object is False:
            raise ValueError("json_object must be true when given")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, "json_" if k == "json" else k)
                    is not None)
