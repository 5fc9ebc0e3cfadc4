"""What every API adapter shares: sampling fields as the engine's sampling parameters (a
field not given is the engine's default), and a structured-output request as a
``ResponseFormat`` (each API names its own parameters)."""

from __future__ import annotations

from typing import Any

from podium.conversation import ResponseFormat
from podium.engine.base import SamplingParams
from podium.errors import InvalidRequestError
from podium.protocol.common import SamplingFields


def stop_strings(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def sampling(**given: Any) -> SamplingParams:
    """The engine's sampling parameters: each field the caller gave, the default (which
    turns the control off: temperature 1, top_p 1, top_k 0, ...) for each it did not."""
    return SamplingParams(**{name: value for name, value in given.items() if value is not None})


def sampling_params(req: SamplingFields, max_tokens: int, vocab_size: int,
                    seed: int | None) -> SamplingParams:
    """Chat Completions' and Completions' sampling fields."""
    return sampling(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                    min_p=req.min_p, seed=seed, presence_penalty=req.presence_penalty,
                    frequency_penalty=req.frequency_penalty,
                    repetition_penalty=req.repetition_penalty,
                    logit_bias=logit_bias(req.logit_bias, vocab_size), max_tokens=max_tokens)


def response_format(kind: Any, schema: Any, *, param: str, schema_param: str,
                    name: str | None = None, description: str | None = None,
                    strict: bool = False, kinds: tuple[str, ...] = ("json_object",
                                                                    "json_schema")
                    ) -> ResponseFormat | None:
    """A structured-output request (Chat's ``response_format``, the Responses API's
    ``text.format``, Anthropic's ``output_config.format``): None for plain text; a 400 naming
    ``param`` for a kind the API does not take, or a ``json_schema`` without a schema
    object. ``schema_param`` is where the schema is, for errors about the schema itself."""
    if kind in (None, "text"):
        return None
    if kind not in kinds:
        raise InvalidRequestError(f"{param} of type {kind!r} is not supported; use "
                                  f"{' or '.join(repr(k) for k in kinds)}", param=param)
    if kind == "json_object":
        return ResponseFormat("json_object", where=schema_param)
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"A 'json_schema' format needs {schema_param}, a JSON "
                                  f"schema object", param=param)
    return ResponseFormat("json_schema", schema, name, description, where=schema_param,
                          strict=strict)


MAX_LOGIT_BIAS = 1024


def logit_bias(raw: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    if raw and len(raw) > MAX_LOGIT_BIAS:
        raise InvalidRequestError(f"logit_bias may name at most {MAX_LOGIT_BIAS} tokens",
                                  param="logit_bias")
    out: dict[int, float] = {}
    for key, bias in (raw or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidRequestError(f"logit_bias keys must be token ids; got {key!r}",
                                      param="logit_bias") from None
        if not 0 <= token < vocab_size:
            raise InvalidRequestError(
                f"logit_bias token id {token} is outside the vocabulary (0..{vocab_size - 1})",
                param="logit_bias")
        out[token] = bias
    return out
