"""Per-request sampling on llama.cpp's native sampler chain, and logprobs from real logits.

The chain follows llama.cpp's own order: logit bias, penalties, top-k, top-p, min-p,
temperature, then a seeded draw (or greedy at temperature 0). Penalties see only generated
tokens, as OpenAI's presence and frequency penalties do.

A constrained request (a JSON schema, a forced tool call, a custom tool's grammar) carries an
llguidance matcher: before each draw it computes the mask of the tokens its grammar allows
(about 30 µs at a tool schema on the default model's 151,936 tokens), the disallowed tokens'
logits are set to minus infinity in place (about 70 µs), and the chain draws as it always
does, so every sampling setting applies to exactly the allowed tokens. The matcher then
consumes the token drawn. What the mask costs (CPU time of this thread) is counted per token
against a budget (``--grammar-ms-per-token``): llguidance bounds one step's work
(``podium.grammar.LIMITS``), and the budget ends a request whose grammar would spend that
bound at every step, instead of slowing every other stream of the batch.
"""

from __future__ import annotations

import ctypes
import random
import time

import llama_cpp
import numpy as np
from llguidance import LLMatcher
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from podium.engine.base import SamplingParams, TokenLogprob
from podium.engine.budget import BudgetKeeper

GRAMMAR_BURST_TOKENS = 16   # a budget of this many tokens may be spent in one step


class GrammarFailed(RuntimeError):
    """The matcher refused the token drawn under its own mask, or allows none: an
    llguidance error (a limit reached mid-output, or a grammar that leads nowhere)."""


class Sampler:
    """A llama.cpp sampler chain for one request, and its grammar's matcher if it is
    constrained; ``close()`` frees the chain.

    ``grammar_budget`` is the grammar's CPU time allowed per token, in seconds, on average
    (with a burst of ``GRAMMAR_BURST_TOKENS`` tokens' worth); 0 is no limit.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, matcher: LLMatcher | None = None,
                 grammar_budget: float = 0.0):
        self._matcher = matcher
        # the reasoning budget, kept here so a preempted job's count travels with it
        self.reasoning = BudgetKeeper(params.reasoning) if params.reasoning else None
        self._chain = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params())
        self.seed = params.seed if params.seed is not None else random.getrandbits(32)
        for stage in _stages(params, n_vocab, self.seed):
            llama_cpp.llama_sampler_chain_add(self._chain, stage)
        self._n_vocab = n_vocab
        self._budget = grammar_budget
        self.credit = grammar_budget * GRAMMAR_BURST_TOKENS     # seconds left to spend
        self.grammar_seconds = 0.0      # what the grammar cost at the last token
        if matcher is not None:
            self._mask = allocate_token_bitmask(1, n_vocab)

    @property
    def constrained(self) -> bool:
        return self._matcher is not None

    @property
    def over_budget(self) -> bool:
        return self._budget > 0 and self.credit < 0

    def sample(self, ctx, index: int = -1) -> int:
        """The next token: the reasoning budget's forced one (``engine/budget.py``), or one
        drawn from output ``index`` of the last decode; remembered either way."""
        keeper = self.reasoning
        if keeper is None:
            return self._draw(ctx, index)
        token = keeper.forced()
        if token is not None and self._allows(token):
            llama_cpp.llama_sampler_accept(self._chain, token)     # penalties see it
            if self._matcher is not None:
                self._matcher.consume_token(token)
        else:
            if token is not None:
                keeper.refused()
            token = self._draw(ctx, index)
        keeper.feed(token)
        return token

    def forced_ahead(self) -> list[int]:
        """The tokens this request's controls will write next whatever the model's logits
        say: the rest of a reasoning budget's close, else the tokens the grammar alone allows
        from here. The engine verifies them as a draft: each is drawn as usual, so the answer
        is the one it would be without."""
        keeper, matcher = self.reasoning, self._matcher
        if keeper is not None and keeper.forcing:
            return self.allowed(keeper.forcing)
        if matcher is not None:
            return matcher.compute_ff_tokens()
        return []

    def allowed(self, tokens: list[int]) -> list[int]:
        """The longest start of ``tokens`` the grammar allows from here (all without one)."""
        if self._matcher is None or not tokens:
            return tokens
        return tokens[:self._matcher.validate_tokens(tokens)]

    def _allows(self, token: int) -> bool:
        return self._matcher is None or self._matcher.validate_tokens([token]) == 1

    def _draw(self, ctx, index: int) -> int:
        matcher = self._matcher
        if matcher is None:
            return llama_cpp.llama_sampler_sample(self._chain, ctx, index)
        start = time.thread_time()
        fill_next_token_bitmask(matcher, self._mask)
        if matcher.is_error():
            raise GrammarFailed(matcher.get_error())
        refused = np.unpackbits((~self._mask).view(np.uint8), count=self._n_vocab,
                                bitorder="little").view(bool)
        np.copyto(logits_row(ctx, index, self._n_vocab), -np.inf, where=refused)
        spent = time.thread_time() - start
        token = llama_cpp.llama_sampler_sample(self._chain, ctx, index)
        start = time.thread_time()
        if not matcher.consume_token(token):
            raise GrammarFailed(matcher.get_error())
        spent += time.thread_time() - start
        self.grammar_seconds = spent
        burst = self._budget * GRAMMAR_BURST_TOKENS
        self.credit = min(self.credit + self._budget, burst) - spent
        return token

    def close(self) -> None:
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None


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
    """The model's log-probability of ``token_id`` and its ``top`` best alternatives (under
    a constraint: of the distribution drawn from, the allowed tokens')."""
    shifted = logits.astype(np.float64) - float(logits.max())
    logprobs = shifted - np.log(np.exp(shifted).sum())
    best: list[tuple[int, float]] = []
    if top > 0:
        idx = np.argpartition(-logprobs, top - 1)[:top]
        idx = idx[np.argsort(-logprobs[idx], kind="stable")]
        best = [(int(i), float(logprobs[i])) for i in idx
                if np.isfinite(logprobs[i])]      # a constraint's masked tokens: never
    return TokenLogprob(token_id, float(logprobs[token_id]), best)
