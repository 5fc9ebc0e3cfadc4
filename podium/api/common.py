"""What the adapters of the sampling APIs (Chat Completions, Completions) share: their
wire fields as the engine's sampling parameters."""

from __future__ import annotations

from podium.engine.base import SamplingParams
from podium.errors import InvalidRequestError
from podium.protocol.common import SamplingFields


def stop_strings(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def sampling_params(req: SamplingFields, max_tokens: int, vocab_size: int,
                    seed: int | None) -> SamplingParams:
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k or 0,
        min_p=req.min_p or 0.0,
        seed=seed,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        logit_bias=logit_bias(req.logit_bias, vocab_size),
        max_tokens=max_tokens,
    )


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
