"""The engine boundary: what the API layer asks of an inference engine, and what it gets back.

An engine turns prompt token ids into a stream of new token ids. Everything textual
(detokenizing, stop strings, parsing) happens above this line, so engines stay small.

``Engine`` is all the services, ``/health`` and ``/metrics`` use; every engine satisfies it
(mypy checks each against it) and ``tests/engine/test_contract.py`` holds every engine to it,
within the ``Capabilities`` it declares.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import (AsyncIterator, Callable, Iterable, Iterator, Mapping,
                             MutableMapping)
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0: off
    min_p: float = 0.0                  # 0: off
    seed: int | None = None             # None: the engine picks one
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0     # 1: off
    logit_bias: dict[int, float] = field(default_factory=dict)
    max_tokens: int = 16
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    grammar: str | None = None          # llguidance grammar (podium.grammar) the output must match
    reasoning: ReasoningBudget | None = None    # reasoning the output may hold (engine/budget.py)
    # Predicted Outputs: the tokens the client expects the output to mostly be, offered to
    # the engine as drafts to verify (engine/draft.py); never changes the answer
    prediction: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class ReasoningBudget:
    """How much a choice may reason, in the family's own tokens (``engine/budget.py``):
    ``tokens`` of reasoning; ``inside``: the prompt opened it; ``open`` / ``ends``: the
    sequences with which the model opens and ends it itself; ``close``: what the engine
    writes to end it when the budget is spent."""

    tokens: int
    close: tuple[int, ...]
    ends: tuple[int, ...]
    open: tuple[int, ...] = ()
    inside: bool = False


@dataclass(frozen=True, slots=True)
class CacheHint:
    """What a client asked of the prompt cache (Anthropic's ``cache_control``, OpenAI's
    ``prompt_cache_breakpoint`` / ``prompt_cache_retention`` / ``prompt_cache_options``).

    ``until``: the prompt's first tokens a breakpoint marks worth keeping (None: none
    marked; the server's policy decides). ``retain``: True keeps the prompt in every tier
    the server has, disk included, however short (down to one block); False keeps it in
    memory only (OpenAI's ``in_memory``: nothing written to disk); None: the server's
    policy (``--prompt-cache-min-tokens``)."""

    until: int | None = None
    retain: bool | None = None


@dataclass(slots=True)
class EngineRequest:
    """One sequence to generate.

    ``priority``: higher runs first. A waiting request of higher priority takes the next
    sequence before every waiting request of lower priority (first come, first served within
    a priority). Interactive requests keep the default 0; batch work asks for less (below 0).
    An engine that ``Capabilities.preemption`` declares also takes a running lower-priority
    request's sequence at once when none is free (that request waits, then resumes where it
    was); one that does not starts it when the next sequence frees.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    logprobs: int | None = None         # None: no logprobs; k: chosen token plus top k
    prompt_logprobs: int | None = None  # same, for every prompt token after the first
    priority: int = 0                   # higher runs first (0: interactive; batch below)
    cache: CacheHint | None = None      # what the client asked of the prompt cache


@dataclass(slots=True)
class TokenLogprob:
    """The chosen token's log-probability and the ``top`` most likely alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class EngineOutput:
    """What one decode step produced for one request."""

    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None     # set on the request's last output
    prompt_logprobs: list[TokenLogprob | None] | None = None  # first output only, when asked
    stopped_by_token: bool = False      # the last token is EOS / a stop token: count it, no text
    cached_tokens: int = 0              # first output: prompt tokens reused from the KV cache
    cache_written: int = 0              # first output: prompt tokens it added to the prompt
    #                                     cache (a tier beyond the sequence's own KV region)
    # of the prediction's draft tokens, those this output accepted and those it rejected
    # (``SamplingParams.prediction``; summed over a choice's outputs)
    accepted_prediction: int = 0
    rejected_prediction: int = 0


class Tokenizer(Protocol):
    vocab_size: int
    bos_token: str
    eos_token: str
    eos_token_ids: frozenset[int]
    # the texts of the control tokens (end of turn, start of turn ...): special-token markup
    # that plain text never becomes, so client text holding one must not be read as it
    control_texts: frozenset[str]
    # the specials a constraint grammar names as tokens (``<tool_call>`` written as the one
    # token, not as its text): as the engine's grammar backend reads the vocabulary
    grammar_specials: frozenset[str]

    def encode(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids for ``text``, special-token markup in it parsed (a raw prompt)."""
    def encode_literal(self, text: str, literal: Mapping[str, str]) -> list[int]:
        """``encode(text)`` of a rendered chat prompt in which each key of ``literal`` (a
        character no client string held) stands for its value, a control token's text a
        client sent: tokenized as text, as if the client's text were alone, never as the token."""
    def piece(self, token_id: int) -> bytes: ...
    def decode(self, token_ids: list[int]) -> str: ...


def any_of(texts: Iterable[str]) -> re.Pattern[str]:
    """A pattern finding any of ``texts``, the longest where several start at one place,
    as its one group (``split`` keeps what it finds). Built as a trie (one branch per next
    character), so that Gemma's 6,000 control tokens cost about what a few do: a plain
    alternation tries each at every ``<``."""
    trie: dict[str, dict] = {}
    for text in texts:
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node[""] = {}
    return re.compile("(" + (_branches(trie) or "(?!)") + ")")


def restorer(literal: Mapping[str, str]) -> Callable[[str], tuple[str, int]]:
    """A function giving a piece with ``literal``'s keys put back as their texts, and how
    many it put back."""
    pattern = re.compile("|".join(map(re.escape, sorted(literal, key=len, reverse=True))))

    def restore(piece: str) -> tuple[str, int]:
        if pattern.search(piece) is None:       # most pieces: no copy, no callback
            return piece, 0
        return pattern.subn(lambda match: literal[match.group()], piece)
    return restore


def literal_pieces(text: str, cut: re.Pattern[str],
                   restore: Callable[[str], tuple[str, int]]) -> Iterator[tuple[str, bool]]:
    """``text`` (a rendered prompt) as stretches to tokenize with special tokens parsed
    (False) and pieces holding a client's control-token text (True, that text restored):
    the pieces between two special tokens (``cut``'s) that hold one stand alone, the
    stretches between them are joined whole. What ``Tokenizer.encode_literal`` tokenizes."""
    pending: list[str] = []
    for i, part in enumerate(cut.split(text)):      # text, special, text, ..., text
        if i % 2 == 0 and part:
            plain, found = restore(part)
            if found:
                yield "".join(pending), False
                yield plain, True
                pending = []
                continue
        pending.append(part)
    yield "".join(pending), False


def _branches(node: dict[str, dict]) -> str:
    parts = [re.escape(char) + _branches(child) for char, child in sorted(node.items()) if char]
    if not parts:
        return ""
    body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
    if "" in node:                      # a text ends here: longer ones first, greedily
        return body + "?" if len(parts) == 1 and len(parts[0]) == 1 else f"(?:{body})?"
    return body


@dataclass(slots=True)
class ModelInfo:
    served_name: str
    context_length: int
    chat_template: str | None
    created: int
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an engine does with the parts of a request a stand-in may not honour. An engine
    that declares a capability false still takes the request, and behaves as stated here."""

    sampling: bool = True       # temperature, seed, penalties, logit bias choose the tokens;
                                # false: the tokens are fixed (the same for every seed)
    grammar: bool = True        # ``SamplingParams.grammar`` constrains the output; false: ignored
    logprobs: bool = True       # from the model's distribution, ``k`` alternatives; false: each
                                # token certain (0.0), itself its only alternative
    prefix_cache: bool = True   # ``cached_tokens`` counts prompt tokens reused; false: always 0
    preemption: bool = True     # a request waiting for a sequence takes a lower-priority
                                # running one's at once (within one engine step); false: it
                                # waits for the next sequence that frees
    drafts: bool = True         # ``SamplingParams.prediction`` is verified as drafts (its
                                # figures counted); false: ignored, nothing accepted


# The figures every engine keeps (``/health`` shows them all, ``/metrics`` reads them):
# requests running and waiting now, KV cache tokens held now and at most, and totals of
# requests started and tokens generated.
ENGINE_STATS = ("running", "waiting", "kv_tokens", "kv_capacity", "requests", "generated_tokens")


class EngineStats(MutableMapping[str, int]):
    """An engine's counters (``/health`` shows them), a fixed set of names read and written
    like a dict, the numbers kept in C integers.

    A dict of ints would, after a burst of traffic, hold int objects made at its end, each
    keeping one of the burst's 1 MiB memory arenas from going back to the OS
    (docs/architecture.md, "Memory after a burst").
    """

    __slots__ = ("_index", "_cells")

    def __init__(self, *names: str):
        self._index = {name: i for i, name in enumerate(names)}
        self._cells = array("q", bytes(8 * len(names)))

    def __getitem__(self, name: str) -> int:
        return self._cells[self._index[name]]

    def __setitem__(self, name: str, value: int) -> None:
        self._cells[self._index[name]] = value

    def cell(self, name: str) -> tuple[array, int]:
        """Where ``name`` is kept (``cells[i] += n``): for a loop that counts every step."""
        return self._cells, self._index[name]

    def __delitem__(self, name: str) -> None:
        raise TypeError("engine counters cannot be removed")

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"EngineStats({dict(self)})"


class Generation(Protocol):
    """One request's outputs, in order, the last carrying a finish reason: an async iterator
    (an async generator is one) that can be closed."""

    def __aiter__(self) -> AsyncIterator[EngineOutput]: ...
    async def __anext__(self) -> EngineOutput: ...
    async def aclose(self) -> None:
        """End the request now (it is aborted if it has not finished)."""


class Engine(Protocol):
    """An inference engine, as the services see it.

    A request lives from ``generate`` (queued at once: it counts as waiting) until its last
    output, an ``abort``, or its ``Generation`` being closed or dropped unread; then
    ``stats["running"]`` and ``stats["waiting"]`` no longer count it.
    """

    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def info(self) -> ModelInfo: ...
    @property
    def capabilities(self) -> Capabilities: ...
    @property
    def stats(self) -> EngineStats:
        """At least the ``ENGINE_STATS`` figures."""

    def check_room(self, n: int) -> None:
        """Raise ``InvalidRequestError`` (400) if ``n`` requests could never be held at once,
        ``RateLimited`` (429) if they cannot be queued now. Callers queue them (``generate``)
        in the same event-loop step, with no await between."""
    def check_grammar(self, grammar: str) -> None:
        """Make ``grammar`` (``SamplingParams.grammar``) ready to constrain this model's
        output, on the caller's thread (a request's worker thread, never the event loop):
        ``InvalidRequestError`` (400) when it cannot."""
    def generate(self, request: EngineRequest) -> Generation:
        """Queue ``request`` now; its outputs. Closing them early, or dropping them unread,
        aborts the request."""
    async def abort(self, request_id: str) -> None:
        """End the request soon: its last output has finish reason ``"abort"``."""
    async def aclose(self) -> None: ...


@runtime_checkable
class Embedder(Protocol):
    """An engine serving an embedding model (``kind`` ``"embedding"``): ``embed`` instead of
    ``generate`` (whose ``check_room`` is a 400 saying what the model is for).

    ``embed`` gives one vector per input (token ids, 1 to ``info.context_length`` of them,
    else ``InvalidRequestError`` naming ``input[i]``), pooled and normalized as the model
    does, each the same whether it was embedded alone or batched with other requests'
    inputs (tests/engine/test_embedder.py holds every embedder to this).

    ``priority``: as ``EngineRequest.priority``, higher first: a request's inputs are
    embedded before every waiting input of lower priority (first come, first served within
    a priority), so an interactive request does not wait behind a batch's queued inputs."""

    kind: str
    dimensions: int | None

    async def embed(self, inputs: list[list[int]], priority: int = 0
                    ) -> list[list[float]]: ...


@runtime_checkable
class Reranker(Protocol):
    """An engine serving a reranker (``kind`` ``"rerank"``): a model with its own relevance
    head (llama.cpp's rank pooling; a cross-encoder on vLLM).

    ``score`` takes the query's and the documents' token ids without special tokens, puts
    the model's own around each pair (``pair_overhead`` tokens of them: the caller fits each
    pair in the context with those counted), and gives each document's relevance in [0, 1]:
    the model's activation applied once. ``priority``: as ``Embedder.embed``'s (higher first)."""

    kind: str
    pair_overhead: int

    async def score(self, query: list[int], documents: list[list[int]], priority: int = 0
                    ) -> list[float]: ...
