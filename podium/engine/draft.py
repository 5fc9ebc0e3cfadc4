"""Draft tokens for one sequence: guesses at what it writes next, for the engine to verify
(issue 42: speculative decoding).

Two sources. A request's **prediction** (OpenAI's Predicted Outputs: the text the client
expects the answer to mostly be, an edited file before its edit): the draft is the
prediction from where the output last matched it; after a mismatch (the edit itself) the
follower waits until the output's last few tokens are found again in the prediction, and
goes on from there. **N-grams** over the prompt and the output so far (prompt lookup): the
draft is what followed the last earlier place where the output's last three (else two)
tokens appeared, so a model quoting its input, or repeating itself, is drafted for.

A draft never changes the answer: the engine decodes the draft tokens together with the
sequence's next token, draws at each position from that position's logits exactly as it would
have without drafts, and keeps a draft token only when the draw is that token (the first
draw that differs is the sequence's next token, the rest of the draft is discarded).

How long a draft is adapts per sequence (``Drafts.verified``): it grows while drafts are
accepted whole, falls to what was accepted when one is cut, and a sequence whose drafts keep
failing stops drafting for a while, twice as long after each further failure. Whether a draft
pays at all is the engine's measured step cost against the sequence's acceptance rate
(``StepCosts.best_length``): on a CPU each row of a decode costs a good part of a whole step
(bench/verify_numerics.py), so a draft is only made where its expected accepted tokens
outweigh the rows it adds to the step.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

PREDICTION = "prediction"
NGRAM = "ngram"
SOURCES = (PREDICTION, NGRAM)

MAX_DRAFT = 16          # draft tokens in one verify, at most (the engine may allow fewer)
START_LENGTH = 4        # a new sequence's first drafts
ALIGN = 4               # output tokens matched to find the prediction again after an edit
MISSES = 3              # drafts rejected whole in a row before a pause
MAX_PAUSE = 64          # steps, at most, a failing sequence pauses drafting
ROW_PRIOR = 0.35        # a decode's extra row, as a share of a one-row decode, until measured
#                         (2 cores, default model, --no-deterministic: 2 rows 1.75x, then
#                         about 0.35 a row up to 16, bench/verify_numerics.py)
PROBE_EVERY = 16        # a draft that nearly pays is tried anyway once in this many, so the
#                         costs of its row counts are measured, not only estimated


class Prediction:
    """Follows the output through a prediction: ``ahead`` is where the next output token is
    expected in it, or None while the output is away from it (an edit)."""

    __slots__ = ("tokens", "ahead", "_reached", "_index", "_tail")

    def __init__(self, tokens: Sequence[int]):
        self.tokens = tuple(tokens)
        # found at the output's first token, not assumed at the prediction's: an answer
        # opening with a code fence the file lacks would reject the first draft
        self.ahead: int | None = None
        self._reached = 0                   # where the output last left the prediction
        self._tail: list[int] = []          # the output's last ALIGN tokens
        # every run of 1..ALIGN tokens -> where it ends in the prediction, ascending: made
        # at the first edit (most outputs that follow a prediction never need it)
        self._index: dict[tuple[int, ...], list[int]] | None = None

    def feed(self, token: int) -> None:
        """The output's next token."""
        tail = self._tail
        tail.append(token)
        if len(tail) > ALIGN:
            del tail[0]
        at, tokens = self.ahead, self.tokens
        if at is not None and at < len(tokens) and tokens[at] == token:
            self.ahead = self._reached = at + 1
            return
        self.ahead = self._realign(self._reached)

    def _realign(self, at: int) -> int | None:
        """Where the prediction goes on after the output's last tokens, the longest run of
        them found (at least two tokens, or the output's first token at the prediction's
        start), preferring the first place at or past where the output left the
        prediction."""
        tail, index = self._tail, self._index
        if index is None:
            index = self._index = {}
            for n in range(1, ALIGN + 1):
                for end in range(n, len(self.tokens) + 1):
                    index.setdefault(self.tokens[end - n:end], []).append(end)
        if len(tail) == 1:
            return 1 if self.tokens[:1] == (tail[0],) else None
        for n in range(len(tail), 1, -1):
            ends = index.get(tuple(tail[-n:]))
            if not ends:
                continue
            i = bisect_left(ends, at)
            return ends[i] if i < len(ends) else ends[-1]
        return None

    def draft(self, limit: int) -> list[int]:
        at = self.ahead
        return [] if at is None else list(self.tokens[at:at + limit])


class NGrams:
    """Prompt lookup: the continuation of the latest earlier occurrence of the context's last
    three (else two) tokens."""

    __slots__ = ("context", "_last", "_next3", "_next2")

    def __init__(self, prompt: Sequence[int]):
        self.context: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}     # n-gram -> where its latest ended
        self._next3: int | None = None      # where the current trigram's last match ended
        self._next2: int | None = None
        for token in prompt:
            self.feed(token)

    def feed(self, token: int) -> None:
        context, last = self.context, self._last
        context.append(token)
        end = len(context)
        if end >= 3:
            key3 = (context[-3], context[-2], token)
            self._next3 = last.get(key3)
            last[key3] = end
        if end >= 2:
            key2 = (context[-2], token)
            self._next2 = last.get(key2)
            last[key2] = end

    def draft(self, limit: int) -> list[int]:
        start = self._next3 if self._next3 is not None else self._next2
        if start is None:
            return []
        return self.context[start:start + limit]


class Drafts:
    """One sequence's draft sources and how long its drafts should be now."""

    __slots__ = ("prediction", "ngrams", "length", "source", "_misses", "_pause", "_paused",
                 "_hits", "_fails")

    def __init__(self, prompt: Sequence[int], prediction: Sequence[int] | None = None,
                 ngram: bool = True):
        self.prediction = Prediction(prediction) if prediction else None
        self.ngrams = NGrams(prompt) if ngram else None
        self.length = START_LENGTH
        self.source = ""                # the last draft's source
        self._misses = 0                # drafts rejected whole, in a row
        self._pause = 0                 # steps still without drafts
        self._paused = 0                # the last pause's length
        # per source, draft tokens accepted and drafts cut short, recent ones weighing most
        # (``rate``): a prediction starts at 3/4, n-grams at 3/5
        self._hits = {PREDICTION: 3.0, NGRAM: 3.0}
        self._fails = {PREDICTION: 1.0, NGRAM: 2.0}

    def rate(self, source: str) -> float:
        """The chance that a draft token of ``source`` is accepted, given the one before it
        was."""
        return self._hits[source] / (self._hits[source] + self._fails[source])

    def ready(self) -> str:
        """The source the next draft would come from ("" when neither has one, or paused)."""
        if self._pause > 0:
            return ""
        if self.prediction is not None and self.prediction.ahead is not None \
                and self.prediction.ahead < len(self.prediction.tokens):
            return PREDICTION
        if self.ngrams is not None and self.ngrams.draft(1):
            return NGRAM
        return ""

    def feed(self, token: int) -> None:
        """A token the sequence wrote (sampled, forced, or a draft accepted)."""
        if self.prediction is not None:
            self.prediction.feed(token)
        if self.ngrams is not None:
            self.ngrams.feed(token)

    def propose(self, limit: int) -> list[int]:
        """The draft for the next verify, at most ``limit`` tokens ([] while paused)."""
        if self._pause > 0:
            self._pause -= 1
            return []
        limit = min(limit, self.length)
        if limit <= 0:
            return []
        if self.prediction is not None:
            tokens = self.prediction.draft(limit)
            if tokens:
                self.source = PREDICTION
                return tokens
        if self.ngrams is not None:
            tokens = self.ngrams.draft(limit)
            if tokens:
                self.source = NGRAM
                return tokens
        return []

    def verified(self, drafted: int, accepted: int) -> None:
        """The last draft's outcome: ``accepted`` of its ``drafted`` tokens were kept."""
        if drafted <= 0:
            return
        source = self.source
        self._hits[source] = self._hits[source] * 0.8 + accepted
        self._fails[source] = self._fails[source] * 0.8 + (accepted < drafted)
        if accepted >= drafted:
            self.length = min(MAX_DRAFT, self.length * 2)
        else:
            self.length = max(1, accepted + 1)
        if accepted > 0:
            self._misses = self._paused = 0
            return
        self._misses += 1
        if self._misses >= MISSES:
            self._paused = min(MAX_PAUSE, max(2, self._paused * 2))
            self._pause = self._paused
            self._misses = 0


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a verify of a ``k``-token draft writes on average: the next token, and each
    draft token while all before it were accepted (each with chance ``rate``)."""
    if rate >= 1.0:
        return k + 1.0
    return (1.0 - rate ** (k + 1)) / (1.0 - rate)


class StepCosts:
    """What a decode of ``n`` rows costs on this machine, measured (a moving average per row
    count; a count not measured yet is estimated from the nearest fewer rows measured, at
    ``ROW_PRIOR`` of a one-row step per extra row)."""

    __slots__ = ("_seconds", "_near")

    def __init__(self, max_rows: int):
        self._seconds = [0.0] * (max_rows + 1)
        self._near = 0                  # drafts that nearly paid, not made

    def note(self, rows: int, seconds: float) -> None:
        s = self._seconds
        if rows < len(s):
            s[rows] = seconds if s[rows] == 0.0 else s[rows] * 0.9 + seconds * 0.1

    def cost(self, rows: int) -> float:
        s = self._seconds
        rows = min(rows, len(s) - 1)
        if s[rows]:
            return s[rows]
        below = next((n for n in range(rows - 1, 0, -1) if s[n]), 0)
        above = next((n for n in range(rows + 1, len(s)) if s[n]), 0)
        if below and above:             # between two measured counts: on the line
            return s[below] + (s[above] - s[below]) * (rows - below) / (above - below)
        if not below and not above:
            return 1.0 + ROW_PRIOR * (rows - 1)     # nothing measured: in one-row steps
        known = below or above
        one = s[1] or s[known] / (1.0 + ROW_PRIOR * (known - 1))
        return s[known] + one * ROW_PRIOR * (rows - known)

    def best_length(self, rows: int, room: int, rate: float) -> int:
        """The draft length (0 to ``room``) for one sequence of a step that decodes ``rows``
        rows without it that writes the most tokens per second across the step: its
        expected tokens against what the extra rows cost every sequence in it."""
        base = rows / self.cost(rows)
        best, length, near, reach = base, 0, 0.0, 0
        for k in range(1, room + 1):
            value = (rows - 1 + expected_tokens(rate, k)) / self.cost(rows + k)
            if value > best:
                best, length = value, k
            elif value > near:
                near, reach = value, k
        if not length and near >= 0.85 * base:      # nearly pays: measure it now and then
            self._near += 1
            if self._near % PROBE_EVERY == 0:
                return reach
        return length
