"""Per-request sampling on llama.cpp's native sampler chain, and logprobs from real logits.

The chain follows llama.cpp's own order: grammar (when the output is constrained), logit
bias, penalties, top-k, top-p, min-p, temperature, then a seeded draw (or greedy at
temperature 0). Penalties see only generated
tokens, as OpenAI's presence and frequency penalties do.
"""

from __future__ import annotations

import ctypes
import random

import llama_cpp
import numpy as np

from podium.engine.base import SamplingParams, TokenLogprob
from podium.errors import InvalidRequestError
from podium.parsing.constraints import GrammarError, checked


class Sampler:
    """A llama.cpp sampler chain for one request; ``close()`` frees it."""

    def __init__(self, params: SamplingParams, n_vocab: int, vocab=None):
        grammar = _grammar_stage(vocab, params.grammar) if params.grammar is not None else None
        self._chain = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params())
        self.seed = params.seed if params.seed is not None else random.getrandbits(32)
        if grammar is not None:
            llama_cpp.llama_sampler_chain_add(self._chain, grammar)
        for stage in _stages(params, n_vocab, self.seed):
            llama_cpp.llama_sampler_chain_add(self._chain, stage)

    def sample(self, ctx, index: int = -1) -> int:
        """Draw the next token from output ``index`` of the last decode (and remember it)."""
        return llama_cpp.llama_sampler_sample(self._chain, ctx, index)

    def close(self) -> None:
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None


def _grammar_stage(vocab, text: str):
    """llama.cpp's grammar sampler for ``text``, which must pass ``check_grammar`` first
    (grammars from ``podium.parsing.constraints`` have): llama.cpp prints a grammar it
    refuses, whole, to stderr, and can be crashed by one it does not refuse."""
    try:
        text = checked(text)
    except GrammarError as exc:
        raise InvalidRequestError(f"The output constraint cannot be used: {exc}") from None
    stage = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(), b"root")
    if not stage:
        raise InvalidRequestError("llama.cpp refused the output constraint's grammar")
    return stage


def _stages(p: SamplingParams, n_vocab: int, seed: int) -> list:
    stages = []
    if p.logit_bias:
        biases = (llama_cpp.llama_logit_bias * len(p.logit_bias))(
            *(llama_cpp.llama_logit_bias(t, b) for t, b in p.logit_bias.items()))
        stages.append(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), biases))
    if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0:
        window = max(64, min(p.max_tokens, 8192))
        stages.append(llama_cpp.llama_sampler_init_penalties(
            n_vocab, window, p.repetition_penalty, p.frequency_penalty, p.presence_penalty))
    if p.temperature <= 0:
        stages.append(llama_cpp.llama_sampler_init_greedy())
        return stages
    if p.top_k > 0:
        stages.append(llama_cpp.llama_sampler_init_top_k(p.top_k))
    if p.top_p < 1.0:
        stages.append(llama_cpp.llama_sampler_init_top_p(p.top_p, 1))
    if p.min_p > 0:
        stages.append(llama_cpp.llama_sampler_init_min_p(p.min_p, 1))
    stages.append(llama_cpp.llama_sampler_init_temp(p.temperature))
    stages.append(llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))
    return stages


def logits_row(ctx, index: int, n_vocab: int) -> np.ndarray:
    """A view of the logits of output ``index`` of the last decode (valid until the next)."""
    ptr = llama_cpp.llama_get_logits_ith(ctx, index)
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                 shape=(n_vocab,))


def token_logprob(logits: np.ndarray, token_id: int, top: int) -> TokenLogprob:
    """The model's log-probability of ``token_id`` and its ``top`` best alternatives."""
    shifted = logits.astype(np.float64) - float(logits.max())
    logprobs = shifted - np.log(np.exp(shifted).sum())
    best: list[tuple[int, float]] = []
    if top > 0:
        idx = np.argpartition(-logprobs, top - 1)[:top]
        idx = idx[np.argsort(-logprobs[idx], kind="stable")]
        best = [(int(i), float(logprobs[i])) for i in idx]
    return TokenLogprob(token_id, float(logprobs[token_id]), best)
