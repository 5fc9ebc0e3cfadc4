"""Per-request sampling on llama.cpp's native sampler chain, and logprobs from real logits.

The chain follows llama.cpp's own order: logit bias, penalties, top-k, top-p, min-p,
temperature, then a seeded draw (or greedy at temperature 0). Penalties see only generated
tokens, as OpenAI's presence and frequency penalties do.

A grammar (when the output is constrained) is asked lazily, as llama.cpp's own
``common_sampler_sample`` does: the chain draws first, the grammar judges that one token,
and only when it refuses is the vocabulary masked and the draw made again. A mask asks the
grammar only about the tokens it could allow by their first bytes (``Prefixes``: a few
hundred of the default model's 151,936 at a JSON object's structure), likeliest first
(1,024, then the next 16,384, then the rest). Asking costs every grammar stack times every
token asked; the whole vocabulary took 12 ms a step (median, up to 62) on the tool-call
schema of tests/engine/test_grammar_cost.py and 70-86 ms on slower cores, an enum of 1,000
values sharing a prefix 0.4-0.5 s, and the worker thread samples every sequence in turn, so
every stream in the batch paid it; by first bytes the same steps take 0.25 ms (up to 0.7).
Judging one token costs microseconds. The result is the
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
MASK_FIRST = 1024           # of the tokens a grammar could allow, a refused draw masks
#                             the likeliest this many first (inside a free string that can
#                             be most of the vocabulary)
MASK_GROWTH = 16            # then the next 16 times as many, and so on, likeliest first
ASK_SECOND_UNDER = 128      # a mask asks about two-character tokens when at most this
#                             many first bytes are allowed (inside a free string nearly all
#                             are, and the answers would narrow nothing)
GRAMMAR_BURST_TOKENS = 16   # a budget of this many tokens may be spent in one step (a
#                             mask inside a free string can still ask about most tokens)


class Sampler:
    """A llama.cpp sampler chain for one request; ``close()`` frees it.

    ``grammar_budget`` is the grammar's CPU time allowed per token, in seconds, on average
    (with a burst of ``GRAMMAR_BURST_TOKENS`` tokens' worth); 0 is no limit.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, vocab=None,
                 grammar_budget: float = 0.0, prefixes: Prefixes | None = None):
        self._grammar = (_grammar_stage(vocab, params.grammar) if params.grammar is not None
                         else None)
        self._prefixes = prefixes       # (needed when a grammar masks: the engine's)
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

        ``masked``: the grammar masks only the tokens it could allow by their first bytes
        (``Prefixes``), the ``MASK_FIRST`` likeliest of them first, and the chain draws among
        those when the grammar allows any; when it allows none, the next ``MASK_GROWTH``
        times as many likeliest, and so on to all of them. The best allowed token is always
        among those masked (so greedy is exact), and a draw loses only allowed tokens less
        likely than every token the grammar looked at.
        """
        array = self._all
        logits = logits_row(ctx, index, self._n_vocab)
        masking = 0.0
        if masked:
            assert self._prefixes is not None, "a grammar's mask needs the vocabulary's Prefixes"
            start = time.thread_time()
            open_ = self._prefixes.open(self._asks)
            masking += time.thread_time() - start
            scores = logits[open_]
            n, end, size = len(open_), 0, MASK_FIRST
            looked = np.zeros(n, dtype=bool)
            while end < n:          # each round: the next likeliest not looked at yet
                end = min(end + size, n)
                top = np.argpartition(-scores, end - 1)[:end] if end < n else np.arange(n)
                top = top[~looked[top]]
                looked[top] = True
                ids = open_[top]
                start = time.thread_time()
                self._fill(ids, scores[top])
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

    def _asks(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the grammar allows next (a mask over them)."""
        self._fill(ids, np.zeros(len(ids), np.float32))
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(self._all))
        return np.isfinite(self._cells["logit"][:len(ids)])

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


class Prefixes:
    """The tokens of a vocabulary by their first byte and their first two characters, so a
    mask asks the grammar about the tokens it could allow and not the whole vocabulary.

    The grammar reads a token's bytes in order and refuses it as soon as no rule can go on,
    so when it refuses the token that is exactly the bytes ``p``, it refuses every token
    that begins with ``p``. A mask first asks about the one-byte tokens (256 in a byte-level
    vocabulary, and in one with byte tokens), then about the tokens of at most two
    characters that begin with an allowed byte, and then only about the tokens under an
    allowed first byte and, where a token of their first two characters exists, an allowed
    one: at a JSON object's structure a few hundred of the default model's 151,936 tokens.
    Tokens that end generation are always asked (the grammar judges them by its state, not
    their text), and so are tokens whose first byte has no token of its own. One index
    serves every request on a model (0.2-0.5 s to make); ``eog``: the tokens that end
    generation (the tokenizer's ``eos_token_ids``).
    """

    def __init__(self, vocab, n_vocab: int, eog: frozenset[int]):
        buf = ctypes.create_string_buffer(256)
        pieces: list[bytes] = []
        for t in range(n_vocab):        # as the grammar reads them: special tokens as text
            n = llama_cpp.llama_token_to_piece(vocab, t, buf, len(buf), 0, True)
            pieces.append(buf.raw[:n] if n > 0 else b"")
        short: dict[bytes, int] = {}        # pieces of at most two characters: a token each
        for t, piece in enumerate(pieces):
            if piece and t not in eog and _two_characters(piece) == piece:
                short.setdefault(piece, t)
        # a token's class: 0 always asked, 1 + b its first byte b only, and past 256 the
        # first two characters it begins with (a token of those exists)
        keys: dict[bytes, int] = {}
        classes = np.zeros(n_vocab, np.int32)
        for t, piece in enumerate(pieces):
            if t in eog or piece[:1] not in short:
                continue
            two = _two_characters(piece)
            if len(two) > 1 and two in short:
                classes[t] = keys.setdefault(two, 257 + len(keys))
            else:
                classes[t] = 1 + piece[0]
        self._classes, self._n_classes = classes, 257 + len(keys)
        ones = sorted((p[0], t) for p, t in short.items() if len(p) == 1)
        self._ones = np.array([t for _, t in ones], np.int32)
        self._one_bytes = np.array([b for b, _ in ones], np.int32)
        under: dict[int, list[tuple[int, int]]] = {}
        for two, key in keys.items():
            under.setdefault(two[0], []).append((short[two], key))
        self._under = {b: np.array(pairs, np.int32) for b, pairs in under.items()}
        self._key_bytes = np.array([1 + two[0] for two in keys], np.int32)

    def open(self, asks) -> np.ndarray:
        """The ids (ascending) of the tokens the grammar could allow next; ``asks(ids)``
        says which of ``ids`` it does."""
        allowed = np.zeros(self._n_classes, dtype=bool)
        allowed[0] = True
        first = self._one_bytes[asks(self._ones)]
        allowed[1 + first] = True
        allowed[257:] = allowed[self._key_bytes]    # as their first byte, unless asked
        pairs = [self._under[b] for b in first.tolist() if b in self._under]
        if pairs and len(first) <= ASK_SECOND_UNDER:
            both = np.concatenate(pairs)
            allowed[both[:, 1]] = asks(both[:, 0])
        return np.flatnonzero(allowed[self._classes]).astype(np.int32)


def _two_characters(piece: bytes) -> bytes:
    """The bytes of ``piece``'s first two UTF-8 characters (a stray byte counts as one)."""
    end = 0
    for _ in range(2):
        if end >= len(piece):
            break
        lead = piece[end]
        end += 4 if lead >= 0xF0 else 3 if lead >= 0xE0 else 2 if lead >= 0xC0 else 1
    return piece[:end]


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
