"""Per-request sampling on llama.cpp's native sampler chain, and logprobs from real logits.

The chain follows llama.cpp's own order: logit bias, penalties, top-k, top-p, min-p,
temperature, then a seeded draw (or greedy at temperature 0). Penalties see only generated
tokens, as OpenAI's presence and frequency penalties do.

A grammar (when the output is constrained) is asked lazily, as llama.cpp's own
``common_sampler_sample`` does: the chain draws first, the grammar judges that one token,
and only when it refuses is the vocabulary masked, likeliest tokens first (1,024, then the
next 16,384, then the rest), and the draw made again. Masking costs every grammar stack
times every token masked (the whole vocabulary of the default model, 151,936 tokens, for a
plain JSON object: 10-80 ms a step by the CPU, an enum of 1,000 values sharing a prefix
0.4-0.5 s; its likeliest 17,408 about 4 ms), and the worker thread samples every sequence
in turn, so that cost was paid by every stream in the batch. Judging one token costs
microseconds. The result is the
masked distribution (greedy picks the same token; a draw kept when allowed and redrawn
under the mask otherwise lands on each allowed token with its masked probability), except
that top-k / top-p / min-p cut before the mask when the first draw is kept.

What the grammar still costs (CPU time of this thread) is counted per token against a
budget (``--grammar-ms-per-token``), so a grammar that must mask at every step, or whose
stacks make even one token costly, is ended instead of slowing everyone else.
"""

from __future__ import annotations

import ctypes
import random
import time

import llama_cpp
import numpy as np

from podium.engine.base import SamplingParams, TokenLogprob
from podium.errors import InvalidRequestError
from podium.grammar import GrammarError, checked


_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])   # llama_token_data
MASK_FIRST = 1024           # tokens a refused draw masks first: a full mask of the
#                             151,936 costs 150 times as much (70-77 ms on 2 AVX2 cores)
MASK_GROWTH = 16            # then the next 16 times as many, and so on, likeliest first
GRAMMAR_BURST_TOKENS = 16   # a budget of this many tokens may be spent in one step: a
#                             draw no likely token fits masks the whole vocabulary (70-80 ms
#                             on 2 AVX2 cores; 8 tokens' worth refused a typical tool call)


class Sampler:
    """A llama.cpp sampler chain for one request; ``close()`` frees it.

    ``grammar_budget`` is the grammar's CPU time allowed per token, in seconds, on average
    (with a burst of ``GRAMMAR_BURST_TOKENS`` tokens' worth); 0 is no limit.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, vocab=None,
                 grammar_budget: float = 0.0):
        self._grammar = (_grammar_stage(vocab, params.grammar) if params.grammar is not None
                         else None)
        self._chain = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params())
        self.seed = params.seed if params.seed is not None else random.getrandbits(32)
        for stage in _stages(params, n_vocab, self.seed):
            llama_cpp.llama_sampler_chain_add(self._chain, stage)
        self._budget = grammar_budget
        self.credit = grammar_budget * GRAMMAR_BURST_TOKENS     # seconds left to spend
        self.grammar_seconds = 0.0      # what the grammar cost at the last token
        if self._grammar is not None:
            self._cells = np.zeros(n_vocab, _TOKEN_DATA)
            self._ids = np.arange(n_vocab, dtype=np.int32)
            self._all = _token_array(self._cells)
            self._data = self._all.data
            self._one = np.zeros(1, _TOKEN_DATA)
            self._single = _token_array(self._one)
            self._n_vocab = n_vocab

    @property
    def over_budget(self) -> bool:
        return self._budget > 0 and self.credit < 0

    def sample(self, ctx, index: int = -1) -> int:
        """Draw the next token from output ``index`` of the last decode (and remember it)."""
        if self._grammar is None:
            return llama_cpp.llama_sampler_sample(self._chain, ctx, index)
        return self._constrained(ctx, index)

    def _constrained(self, ctx, index: int) -> int:
        token, _ = self._draw(ctx, index, masked=False)
        start = time.thread_time()
        allowed = self._allows(token)
        spent = time.thread_time() - start
        if not allowed:
            token, masking = self._draw(ctx, index, masked=True)
            spent += masking
        start = time.thread_time()
        llama_cpp.llama_sampler_accept(self._grammar, token)
        spent += time.thread_time() - start
        llama_cpp.llama_sampler_accept(self._chain, token)
        self.grammar_seconds = spent
        burst = self._budget * GRAMMAR_BURST_TOKENS
        self.credit = min(self.credit + self._budget, burst) - spent
        return token

    def _draw(self, ctx, index: int, masked: bool) -> tuple[int, float]:
        """A token drawn by the chain from the logits, and the CPU seconds a mask took.

        ``masked``: the grammar masks the ``MASK_FIRST`` likeliest tokens first, and the
        chain draws among them when the grammar allows any; when it allows none, the next
        ``MASK_GROWTH`` times as many likeliest, and so on to the whole vocabulary. The best
        allowed token is always among those masked (so greedy is exact), and a draw loses
        only allowed tokens less likely than every token the grammar looked at.
        """
        array = self._all
        logits = logits_row(ctx, index, self._n_vocab)
        masking = 0.0
        if masked:
            n, end, size = self._n_vocab, 0, MASK_FIRST
            looked = np.zeros(n, dtype=bool)
            while end < n:          # each round: the next likeliest not looked at yet
                end = min(end + size, n)
                top = np.argpartition(-logits, end - 1)[:end] if end < n else self._ids
                ids = top[~looked[top]].astype(np.int32)
                looked[ids] = True
                start = time.thread_time()
                self._fill(ids, logits[ids])
                llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
                masking += time.thread_time() - start
                if np.isfinite(self._cells["logit"][:len(ids)]).any():
                    break
                size *= MASK_GROWTH
        else:
            self._fill(self._ids, logits)
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(array))
        # stages sort and shrink the array in place: the pick is where ``selected`` says
        return int(array.data[array.selected].id), masking

    def _fill(self, ids: np.ndarray, logits: np.ndarray) -> None:
        cells, array, n = self._cells, self._all, len(ids)
        cells["id"][:n] = ids
        cells["logit"][:n] = logits
        cells["p"][:n] = 0.0
        array.data = self._data
        array.size, array.selected, array.sorted = n, -1, False

    def _allows(self, token: int) -> bool:
        one, array = self._one, self._single
        one["id"], one["logit"], one["p"] = token, 0.0, 0.0
        array.size, array.selected, array.sorted = 1, -1, False
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        return bool(np.isfinite(one["logit"][0]))

    def close(self) -> None:
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None


def _token_array(cells: np.ndarray) -> llama_cpp.llama_token_data_array:
    return llama_cpp.llama_token_data_array(
        cells.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), len(cells), -1,
        False)


def _grammar_stage(vocab, text: str):
    """llama.cpp's grammar sampler for ``text``, which must pass ``check_grammar`` first
    (grammars from ``podium.grammar`` have): llama.cpp prints a grammar it
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
