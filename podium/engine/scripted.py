"""A deterministic engine that replays scripted replies: a test and benchmark harness.

Replies are text or token ids; text goes through a real tokenizer (the GGUF vocabulary of the
model being imitated), so everything above the engine boundary (detokenizer, stop strings,
parsers, renderers) runs exactly as with a real model. It honours max tokens, stop token ids
and aborts, reports a prediction's draft tokens accepted and rejected as a drafting engine
would (``verifies``; the tokens are the script's either way), and can be paced (seconds per
step, tokens per step). Given ``max_num_seqs`` it runs that many requests at once, queues
``max_queued`` more and refuses the rest, as the embedded engine does; by default it takes
any number. Queued requests run as the embedded engine runs them: highest priority first,
first come first served within one, and one that finds every place taken by lower-priority
requests preempts the lowest (the latest of them to start), which gives its place up at its
next step and resumes where it was when its turn comes again. Its ``Capabilities`` say what
a script cannot do: sampling, grammars, real log-probabilities, prefix caching. It is not a
product path: ``podium serve`` never builds one.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import re
import weakref
from collections import deque
from pathlib import Path
from typing import (TYPE_CHECKING, Any, AsyncGenerator, Awaitable, Callable, Container,
                    Iterable, Sequence)

from podium.engine.base import (ENGINE_STATS, Capabilities, Engine, EngineOutput, EngineRequest,
                                EngineStats, FinishReason, ModelInfo, ReasoningBudget,
                                TokenLogprob, Tokenizer)
from podium.engine.budget import BudgetKeeper
from podium.engine.draft import Drafts
from podium.errors import InvalidRequestError, Overloaded

Reply = str | list[int]

DRAFT = 6               # draft tokens in one verify, at most, when a prediction is given


class _Place:
    """A request's place in the engine: waiting, then running, then gone, once, however the
    request ends (its last output, closed, or dropped unread: its frame, the only holder of
    its place, is freed then)."""

    __slots__ = ("engine", "state", "aborted", "halt", "rank", "started", "__weakref__")

    def __init__(self, engine: "ScriptedEngine", rank: tuple[int, int]):
        self.engine, self.state, self.aborted = engine, "waiting", False
        self.halt = False               # aborted, or asked to give its place up: next step
        self.rank = rank                # (-priority, arrival): the lowest runs first
        self.started = 0

    def __del__(self) -> None:
        self.engine._leave(self)


class ScriptedEngine:
    capabilities = Capabilities(sampling=False, grammar=False, logprobs=False,
                                prefix_cache=False)

    def __init__(self, tokenizer: Tokenizer, info: ModelInfo,
                 replies: Callable[[EngineRequest], Reply] | Iterable[Reply], *,
                 delay: float = 0.0, tokens_per_step: int = 1, keep_requests: int = 64,
                 max_num_seqs: int | None = None, max_queued: int = 0):
        self.tokenizer = tokenizer
        self.info = info
        if callable(replies):
            self._reply = replies
        else:
            cycle = itertools.cycle(list(replies))
            self._reply = lambda _request: next(cycle)
        self.delay = delay
        self.tokens_per_step = max(1, tokens_per_step)
        self._eos = min(tokenizer.eos_token_ids) if tokenizer.eos_token_ids else None
        self._max_num_seqs, self._max_queued = max_num_seqs, max_queued
        self._places: weakref.WeakValueDictionary[str, _Place] = weakref.WeakValueDictionary()
        self._freed: list[asyncio.Future[None]] = []    # requests waiting for a place to run
        self._queue: list[tuple[tuple[int, int], weakref.ref[_Place]]] = []   # a heap, by rank
        self._arrivals, self._starts = itertools.count(), itertools.count(1)
        # the most recent requests that ran, for tests (a benchmark keeps none: survivors of
        # a load would pin allocator arenas and distort its memory figures)
        self.requests: deque[EngineRequest] = deque(maxlen=keep_requests)
        self.stats = EngineStats(*ENGINE_STATS)
        # a benchmark's barrier: awaited by each request before its first step
        self.start_gate: Callable[[], Awaitable[object]] | None = None

    @classmethod
    def from_gguf(cls, path: Path, replies: Callable[[EngineRequest], Reply] | Iterable[Reply],
                  *, served_name: str = "scripted", context_length: int = 8192,
                  **options: Any) -> "ScriptedEngine":
        from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer

        model = LlamaModel(path, vocab_only=True)   # kept alive by the tokenizer
        tokenizer = LlamaTokenizer(model)
        info = ModelInfo(served_name, context_length,
                         model.metadata.get("tokenizer.chat_template"), created=0,
                         metadata=model.metadata)
        return cls(tokenizer, info, replies, **options)

    def _script(self, request: EngineRequest) -> list[int]:
        reply, budget = self._reply(request), request.sampling.reasoning
        if isinstance(reply, str):
            encode = functools.partial(self.tokenizer.encode, add_special=False)
            ids = encode(reply)
            if budget is not None:      # the reply's own tags as the engine's tokens for them
                ids = []                # (see within_budget), whatever BPE makes of the text
                tags = {self.tokenizer.decode(list(seq)): seq
                        for seq in (budget.open, budget.ends) if seq}
                for piece in re.split(f"({'|'.join(map(re.escape, tags))})", reply):
                    ids += list(tags[piece]) if piece in tags else encode(piece)
        else:
            ids = reply
        return list(ids) + ([self._eos] if self._eos is not None else [])

    def check_grammar(self, grammar: str) -> None:
        pass                    # a script is not constrained (capabilities.grammar)

    def check_room(self, n: int = 1) -> None:
        """400 when ``n`` requests exceed ``max_num_seqs`` + ``max_queued``, 429 when they
        do not fit beside those already queued or running; no limit without ``max_num_seqs``."""
        if self._max_num_seqs is None:
            return
        capacity = self._max_num_seqs + self._max_queued
        if n > capacity:
            raise InvalidRequestError(f"This request needs {n} sequences at once; this server "
                                      f"holds at most {capacity}", param="n")
        if self.stats["running"] + self.stats["waiting"] + n > capacity:
            raise Overloaded(f"The server is busy ({self.stats['running']} sequences running, "
                              f"{self.stats['waiting']} queued); retry shortly", retry_after=1)

    def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        place = self._places[request.request_id] = _Place(
            self, (-request.priority, next(self._arrivals)))
        self.stats["waiting"] += 1
        return self._run(request, place)

    async def _run(self, request: EngineRequest, place: _Place
                   ) -> AsyncGenerator[EngineOutput, None]:
        try:
            await self._turn(place)
            if place.aborted:
                yield EngineOutput([], finish_reason="abort")
                return
            if self.start_gate is not None:
                await self.start_gate()
            self._run_now(place)
            self.requests.append(request)
            self.stats["requests"] += 1
            # the replay, in this generator: one hop per output, not two
            script = self._script(request)
            if request.sampling.reasoning is not None:
                script = within_budget(script, request.sampling.reasoning)
            params, produced, k = request.sampling, 0, request.logprobs
            prompt_lp: list[TokenLogprob | None] | None = None
            if request.prompt_logprobs is not None:
                top = request.prompt_logprobs
                prompt_lp = [None] + [TokenLogprob(t, 0.0, [(t, 0.0)][:top])
                                      for t in request.prompt_token_ids[1:]]
            if params.max_tokens <= 0:
                yield EngineOutput([], None, "length", prompt_lp)
                return
            stops, eos, max_tokens = params.stop_token_ids, self._eos, params.max_tokens
            eos_stops = not params.ignore_eos
            per_step, delay, stats, sleep = self.tokens_per_step, self.delay, self.stats, asyncio.sleep
            generated, at = stats.cell("generated_tokens")
            drafted = None
            if params.prediction:
                ends = stops | {eos} if eos is not None and eos_stops else stops
                drafted = verifies(script, request.prompt_token_ids, params.prediction, ends,
                                   max_tokens)
            # one token a step, no logprobs, no prediction: the step that is neither the
            # first nor the last is a bare EngineOutput (the benchmarks' path; the loop
            # below does the same)
            plain = per_step == 1 and k is None and drafted is None
            # a client's cache breakpoint: reported as written with the first output (what
            # a real engine with a prompt cache writes for a first sight of the prompt)
            cache = request.cache
            written = cache.until or 0 if cache is not None and cache.retain is not False else 0
            while True:
                await sleep(delay)
                if place.halt:
                    if not place.aborted:
                        await self._give_way(place)
                    if place.aborted:
                        yield EngineOutput([], finish_reason="abort")
                        return
                if plain and prompt_lp is None and not written and produced < len(script) - 1:
                    token = script[produced]
                    if not (token in stops or (token == eos and eos_stops)
                            or produced + 1 >= max_tokens):
                        produced += 1
                        generated[at] += 1
                        yield EngineOutput([token])
                        continue
                step: list[int] = []
                finish: FinishReason | None = None
                begun = produced
                for token in script[produced:produced + per_step]:
                    step.append(token)
                    produced += 1
                    if token in stops or (token == eos and eos_stops):
                        finish = "stop"
                    elif produced >= max_tokens:
                        finish = "length"
                    if finish:
                        break
                if not step:
                    finish = "stop"
                generated[at] += len(step)
                logprobs = ([TokenLogprob(t, 0.0, [(t, 0.0)][:k]) for t in step]
                            if k is not None else None)
                out = EngineOutput(step, logprobs, finish, prompt_lp,
                                   stopped_by_token=finish == "stop" and bool(step))
                if drafted is not None:     # the verifies that began in this step
                    out.accepted_prediction = sum(drafted[0][begun:produced])
                    out.rejected_prediction = sum(drafted[1][begun:produced])
                out.cache_written, written = written, 0
                yield out
                prompt_lp = None
                if finish:
                    return
        finally:
            self._leave(place)

    def _full(self) -> bool:
        return self._max_num_seqs is not None and self.stats["running"] >= self._max_num_seqs

    async def _turn(self, place: _Place) -> None:
        """Wait until ``place`` may run (or is aborted): a place free and no waiting request
        ranking before it. A request joins the queue when it is first read (a generator
        runs no sooner), so one never read holds nobody up."""
        if self._max_num_seqs is not None:
            heapq.heappush(self._queue, (place.rank, weakref.ref(place)))
        while not place.aborted and not self._may_run(place):
            freed = asyncio.get_running_loop().create_future()
            self._freed.append(freed)
            await freed

    def _may_run(self, place: _Place) -> bool:
        if self._max_num_seqs is None:
            return True
        if self._head() is not place:
            return False
        if not self._full():
            heapq.heappop(self._queue)
            return True
        self._preempt(place)
        return False

    def _head(self) -> _Place | None:
        """The waiting request that ranks first (requests gone or aborted dropped)."""
        while self._queue:
            place = self._queue[0][1]()
            if place is not None and place.state == "waiting" and not place.aborted:
                return place
            heapq.heappop(self._queue)
        return None

    def _preempt(self, place: _Place) -> None:
        """Ask the running request that ranks lowest below ``place`` (the latest to start of
        them) to give its place up, unless one is already giving it up."""
        running = [p for p in self._places.values() if p.state == "running"]
        if any(p.halt and not p.aborted for p in running):
            return
        below = [p for p in running if p.rank[0] > place.rank[0]]
        if below:
            max(below, key=lambda p: (p.rank[0], p.started)).halt = True

    def _run_now(self, place: _Place) -> None:
        place.state = "running"
        place.started = next(self._starts)
        self.stats["waiting"] -= 1
        self.stats["running"] += 1

    async def _give_way(self, place: _Place) -> None:
        """Preempted: wait in the queue (at its rank) until its turn comes again."""
        place.state, place.halt = "waiting", False
        self.stats["running"] -= 1
        self.stats["waiting"] += 1
        self._wake()
        await self._turn(place)
        if not place.aborted:
            self._run_now(place)

    def _leave(self, place: _Place) -> None:
        if place.state == "gone":
            return
        self.stats[place.state] -= 1        # "waiting" or "running": the figure counting it
        place.state = "gone"
        self._wake()

    def _wake(self) -> None:
        """Let every waiting request look again (whether it may run, or was aborted)."""
        freed, self._freed = self._freed, []
        for future in freed:
            if not future.done() and not future.get_loop().is_closed():
                future.set_result(None)

    async def abort(self, request_id: str) -> None:
        place = self._places.get(request_id)
        if place is not None:
            place.aborted = place.halt = True
            self._wake()

    async def aclose(self) -> None:
        return None


if TYPE_CHECKING:
    def _is_an_engine(engine: ScriptedEngine) -> Engine:
        return engine                   # mypy: ScriptedEngine satisfies the boundary


def verifies(script: list[int], prompt: list[int], prediction: Sequence[int],
             stops: Container[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """The prediction's draft tokens accepted and rejected as an engine drafting from it
    (``engine/draft.py``'s ``Drafts``) would verify them while writing ``script``, each
    verify's figures at where in ``script`` its first token is (0 elsewhere).

    Before each step a draft is proposed (at most ``DRAFT`` tokens, and room left for the
    step's own token within ``max_tokens``); the script's next tokens are the draws: the
    draft is accepted while it is what the script writes (up to a stop token, which ends the
    output), then the step writes the draw after the accepted tokens. The tokens written are
    the script's either way, as they are without a prediction."""
    accepted, rejected = [0] * len(script), [0] * len(script)
    drafts = Drafts(prompt, prediction, ngram=False)
    at, end = 0, min(len(script), max_tokens)
    while at < end:
        draft = drafts.propose(min(DRAFT, end - at - 1))
        n = 0
        while n < len(draft) and draft[n] == script[at + n]:
            n += 1
            if script[at + n - 1] in stops:
                break
        ended = n > 0 and script[at + n - 1] in stops
        written = script[at:at + n if ended else at + n + 1]
        for token in written:
            drafts.feed(token)
        drafts.verified(len(draft), n)
        accepted[at], rejected[at] = n, len(draft) - n
        if ended or written[-1] in stops:
            break
        at += len(written)
    return accepted, rejected


def within_budget(script: list[int], budget: ReasoningBudget) -> list[int]:
    """``script`` as an engine keeping ``budget`` writes it: where the budget ends the
    script's reasoning, the close written in its place, and the script going on after its own
    end of reasoning (its answer)."""
    keeper, out, i = BudgetKeeper(budget), [], 0
    while i < len(script) or keeper.forced() is not None:
        forced = keeper.forced()
        if forced is None:
            token, i = script[i], i + 1
        else:
            token = forced
        keeper.feed(token)
        out.append(token)
        if forced is not None and keeper.forced() is None:     # the close is written
            i = _after(script, i, budget.close) or _after(script, i, budget.ends) or i
    return out


def _after(script: list[int], start: int, seq: tuple[int, ...]) -> int | None:
    """Where ``script`` goes on after the first ``seq`` from ``start`` (None: none)."""
    n = len(seq)
    return next((j + n for j in range(start, len(script) - n + 1)
                 if tuple(script[j:j + n]) == seq), None)

