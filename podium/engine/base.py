"""The engine boundary: what the API layer asks of an inference engine, and what it gets back.

An engine turns prompt token ids into a stream of new token ids. Everything textual
(detokenizing, stop strings, parsing) happens above this line, so engines stay small.
"""

from __future__ import annotations

from array import array
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator, Literal, Protocol

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
    grammar: str | None = None          # GBNF (root rule "root") the output must match


@dataclass(slots=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    logprobs: int | None = None         # None: no logprobs; k: chosen token plus top k
    prompt_logprobs: int | None = None  # same, for every prompt token after the first


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


class Tokenizer(Protocol):
    vocab_size: int
    bos_token: str
    eos_token: str
    eos_token_ids: frozenset[int]

    def encode(self, text: str, *, add_special: bool = True) -> list[int]: ...
    def piece(self, token_id: int) -> bytes: ...
    def decode(self, token_ids: list[int]) -> str: ...


@dataclass(slots=True)
class ModelInfo:
    served_name: str
    context_length: int
    chat_template: str | None
    created: int
    metadata: dict[str, str] = field(default_factory=dict)


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

    def __delitem__(self, name: str) -> None:
        raise TypeError("engine counters cannot be removed")

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"EngineStats({dict(self)})"


class Engine(Protocol):
    tokenizer: Tokenizer
    info: ModelInfo
    stats: EngineStats                  # running, waiting, requests, generated_tokens, ...

    def check_room(self, n: int) -> None:
        """Raise ``InvalidRequestError`` (400) if ``n`` requests could never be held at once,
        ``RateLimited`` (429) if they cannot be queued now. Callers queue them (``generate``)
        in the same event-loop step, with no await between."""
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """The request's outputs; closing the iterator early aborts the request."""
    async def abort(self, request_id: str) -> None: ...
    async def aclose(self) -> None: ...
