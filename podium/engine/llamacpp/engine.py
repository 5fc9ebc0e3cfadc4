"""The embedded engine: llama.cpp in this process, batching every running request.

One worker thread owns the llama.cpp context (ctypes releases the GIL inside llama.cpp).
Its loop, once per step:

1. admits queued requests into free sequence slots (each slot is a llama.cpp sequence with
   its own region of the KV cache, ``--ctx-size`` tokens long), choosing the slot whose
   cached tokens share the longest prefix with the prompt, so the next turn of a
   conversation or a shared system prompt is not computed again;
2. drops aborted requests at once;
3. prefills one chunk of one waiting prompt (chunks of ``--batch-size`` tokens at absolute
   positions, so a long prompt never holds running streams for more than one chunk);
4. decodes one token for every running sequence in a single ``llama_decode``, then samples
   each with its own sampler chain (seed, penalties, logit bias, grammar).

New requests join between steps; finished ones leave at once. Requests beyond the slots wait
in a bounded queue; past it, 429.

Priority (``EngineRequest.priority``, higher first): waiting requests take free slots highest
priority first, first come first served within one. When no slot is free, a waiting request
preempts the running request of the lowest priority below its own (of those, the one with
the fewest tokens in its cache: the least work to redo): that one is parked, its sampler (seed, penalties, grammar
state) and its tokens so far kept, and waits at its place in the queue; when it is admitted
again its tokens are its prompt (the part its slot still caches is reused) and it goes on
from the token it had reached, so its stream continues without a gap or a repeat. A
request that arrives while a decode of only lower-priority rows runs (a batch prompt's
chunk takes about a second on 2 cores) interrupts it (``Interrupt``: llama.cpp stops at its
next graph node and takes that decode's tokens out of the KV cache) and is admitted at once;
the interrupted work is done again later, to the same numbers. So an interactive request
never waits behind batch work, whether batch work fills the slots or the queue, while batch
work alone still uses every slot. Among prompts being prefilled, the highest priority goes
first, and while one is, running sequences of a lower priority make no decode steps: its
first token is not held up by theirs; nor by a lower prompt's chunk once its own prompt is
in (its first decode comes before the next chunk). A request still prefilling a prompt it scores
(``prompt_logprobs``) is not preempted. What admission costs is per request; a decode step
is unchanged. The resumed request's prompt is prefilled in the same chunks as before, and
its generated tokens are decoded again one a step, as rows of the decode steps (several
tokens of one sequence in a decode give other numbers than one at a time on an AVX2 CPU: a
logit moved by 0.27), so with ``--deterministic`` each holds the numbers it had when it was
decoded: the request answers as it would have uninterrupted.

Numbers and batching: llama.cpp's CPU kernels give slightly different logits for a row
depending on how many rows share its matrix product (repacked weights switch from a
one-row to a four-row kernel at 4 rows, another kernel takes over at 8). So that an answer
depends on the request alone, prompt chunks sit at fixed absolute positions, the last prompt
token is decoded with the generated ones, and with ``--deterministic`` the repacked weights
are off, decode steps are cut into groups of at most 7 rows, and flash attention is off (its
CPU kernel splits a long KV range across threads when few rows attend, so past 256 cached
tokens a row's numbers depended on how many rows shared the step): then a request gives the
same tokens alone or in any crowd. ``--no-deterministic`` keeps repacked weights and whole batches:
faster at 8 streams, but a request crowded by 3 or more others may then differ from its lone
answer in a late token (3 of 6 requests did in tests/engine/test_batching.py's mix).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llama_cpp

from podium.engine.base import (ENGINE_STATS, CacheHint, Capabilities, Engine, EngineOutput,
                                EngineRequest, EngineStats, FinishReason, ModelInfo,
                                TokenLogprob)
from podium.engine.draft import MAX_DRAFT, NGRAM, PREDICTION, Drafts, StepCosts
from podium.engine.jobs import Job, JobOutputs
from podium.engine.llamacpp.model import Interrupt, LlamaModel, LlamaTokenizer, shut_down
from podium.engine.llamacpp.constraint import Grammars
from podium.engine.llamacpp.sampling import Sampler, logits_row, token_logprob
from podium.errors import InvalidRequestError, Overloaded

log = logging.getLogger(__name__)

INVARIANT_ROWS = 7      # rows per decode that keep every row's numbers as if alone
RESTORE_LOG_TOKENS = 1024   # a prompt cache restore this long gets a log line


@dataclass(eq=False)
class _Parked:
    """A preempted job's progress, to resume it where it was."""

    sampler: Sampler
    drafts: Drafts | None
    tokens: list[int]           # prompt and generated tokens; the last is not decoded yet
    generated: int
    cached_tokens: int          # still to report with its first output (0 once reported)
    cache_written: int


@dataclass(eq=False)
class _Job(Job):
    order: int = 0                      # arrival (the worker's count): FIFO in a priority
    parked: _Parked | None = None
    # its prompt's longest prefix in the prompt cache, being read off the decode thread:
    # (tokens, state) or None once read
    restoring: Future[tuple[int, bytes] | None] | None = None


def _rank(job: _Job) -> tuple[int, int]:
    return -job.request.priority, job.order


class _Generation(JobOutputs[Job]):
    """One queued request's outputs. However they end (the last output, an error, closed,
    cancelled or dropped unread), the job is flagged aborted and leaves ``active``: the
    worker drops it at its next step, whether it is still queued or running."""

    def __init__(self, job: Job, active: dict[str, Job]):
        super().__init__(job)
        self._active = active

    def _over(self, early: bool) -> None:
        self._job.aborted = True
        self._active.pop(self._job.request.request_id, None)


@dataclass(eq=False)
class _Slot:
    """One llama.cpp sequence: the tokens its KV region holds, and the job it serves."""

    seq: int
    cached: list[int] = field(default_factory=list)
    job: Job | None = None
    sampler: Sampler | None = None
    drafts: Drafts | None = None                        # its draft sources (engine/draft.py)
    pending: list[int] = field(default_factory=list)    # prompt tokens still to prefill
    next_token: int = -1                                # the token the next step decodes
    generated: int = 0
    prompt_logprobs: list[TokenLogprob | None] | None = None
    cached_tokens: int = 0
    cache_written: int = 0          # prompt tokens its prefill added to the prompt cache
    # what the client asked of the prompt cache for the tokens it caches (its last job's
    # ``CacheHint``, as ``PromptCache.save``'s ``keep``)
    keep: bool | None = None
    last_used: int = 0
    chunk: int = 0                  # prefill chunk size for the job (smaller when scoring)
    split: int = 0                  # where the prompt's prefill ends; after it, a resumed
    #                                 job's generated tokens, decoded again as decode rows

    @property
    def prefilling(self) -> bool:
        """Still in its prompt (a resumed job past ``split`` decodes with the others)."""
        return bool(self.pending) and len(self.cached) < self.split


class LlamaCppEngine:
    capabilities = Capabilities()       # sampling, grammars, logprobs, prefix caching: all

    def __init__(self, path: Path, *, served_name: str, n_ctx: int = 8192, n_batch: int = 128,
                 n_threads: int = 0, max_num_seqs: int = 4, max_queued: int = 256,
                 deterministic: bool = True, grammar_ms_per_token: float = 10.0,
                 speculative: str = "ngram", prompt_cache: Any = None):
        self._slots = [_Slot(i) for i in range(max(1, max_num_seqs))]
        self._model = LlamaModel(path, n_ctx=n_ctx, n_batch=n_batch,
                                 n_threads=n_threads or os.cpu_count() or 1,
                                 n_seq_max=len(self._slots), extra_buffers=not deterministic,
                                 flash_attention=not deterministic)
        self.tokenizer = LlamaTokenizer(self._model)
        self._n_ctx = llama_cpp.llama_n_ctx_seq(self._model.ctx)
        self.info = ModelInfo(served_name=served_name, context_length=self._n_ctx,
                              chat_template=self._model.metadata.get("tokenizer.chat_template"),
                              created=int(path.stat().st_mtime), metadata=self._model.metadata)
        self._n_batch = n_batch
        self._n_vocab = self.tokenizer.vocab_size
        self._rows = INVARIANT_ROWS if deterministic else n_batch
        self._costs = StepCosts(min(self._rows, n_batch))
        self._max_queued = max_queued
        self._grammar_ms = grammar_ms_per_token
        # the prompt cache's disk tier (prompt_cache.PromptCache, made for this model by its
        # caller), and the thread that reads its entries (never the decode thread)
        self._cache = prompt_cache
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="podium-prompt-cache")
        # drafts only where they cannot change an answer --deterministic promises: llama.cpp's
        # CPU kernels give a verify batch's rows other numbers than one row a step (up to
        # 0.47 of a logit on a 2-core AVX2 machine, bench/verify_numerics.py)
        self._drafting = not deterministic
        self._ngram = self._drafting and speculative == "ngram"
        self.capabilities = Capabilities(drafts=self._drafting)
        self._grammars = Grammars(self._model.vocab, self._n_vocab,
                                  self.tokenizer.eos_token_ids)
        self._batch = llama_cpp.llama_batch_init(max(n_batch, len(self._slots)), 0, 1)
        self._mem = llama_cpp.llama_get_memory(self._model.ctx)
        self._interrupt = Interrupt(self._model.ctx)
        self._decoding: int | None = None   # the top priority of the decode in progress
        self._arrived: int | None = None    # the top priority queued since the worker looked
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._waiting: list[_Job] = []      # taken from the queue, no slot free yet: by rank
        self._arrivals = 0
        self._active: dict[str, Job] = {}
        self._clock = 0
        self._closing = False
        self.stats = EngineStats(*ENGINE_STATS, "interrupted",     # decodes undone
                                 "restored_tokens",     # from the prompt cache
                                 "restore_us", "copy_us",   # its states into / out of llama.cpp
                                 *(f"{what}_{source}" for source in (PREDICTION, NGRAM)
                                   for what in ("drafted", "accepted")))
        self.stats["kv_capacity"] = self._n_ctx * len(self._slots)
        self._stats_lock = threading.Lock()
        self._worker = threading.Thread(target=self._run, name="podium-llamacpp", daemon=True)
        self._worker.start()

    @property
    def prompt_cache(self) -> Any:
        """The model's prompt cache (``prompt_cache.PromptCache``; None: off): its ``stats``
        are /health's and /metrics' figures."""
        return self._cache

    # -- the boundary -------------------------------------------------------------------

    def check_room(self, n: int = 1) -> None:
        """Before anything streams: 400 when ``n`` sequences could never be held at once,
        429 when they cannot be queued now.

        Called on the event loop, with the ``generate`` calls that follow in the same step
        (no await between them), so the check and the enqueueing are one atomic step: the
        worker thread only ever frees room.
        """
        capacity = self._max_queued + len(self._slots)
        if n > capacity:
            raise InvalidRequestError(
                f"This request needs {n} sequences at once; this server holds at most "
                f"{capacity} ({len(self._slots)} running, {self._max_queued} queued): ask "
                f"for fewer choices or prompts", param="n")
        if self.stats["waiting"] + n > self._max_queued + self._free_slots():
            raise Overloaded(f"The server is busy ({self.stats['running']} sequences running, "
                              f"{self.stats['waiting']} queued); retry shortly", retry_after=1)

    def check_grammar(self, grammar: str) -> None:
        self._grammars.check(grammar)

    def _free_slots(self) -> int:
        return max(0, len(self._slots) - self.stats["running"])

    def generate(self, request: EngineRequest) -> "_Generation":
        """Queue ``request`` now, and return its outputs as an async iterator (closing it, or
        dropping it, aborts the request)."""
        job = _Job(request, asyncio.get_running_loop(), asyncio.Queue())
        self._active[request.request_id] = job
        self._count_waiting(+1)
        self._jobs.put(job)
        arrived = self._arrived
        self._arrived = request.priority if arrived is None else max(arrived, request.priority)
        decoding = self._decoding
        if decoding is not None and request.priority > decoding:
            self._interrupt.set()       # that decode is undone; the worker admits this next
        return _Generation(job, self._active)

    async def abort(self, request_id: str) -> None:
        job = self._active.get(request_id)
        if job is not None:
            job.aborted = True

    async def aclose(self) -> None:
        """End every request ("abort"), stop the worker and free the model: its weights,
        context and batch, and the heap they used (off the event loop: ~150 ms for the
        default model). A second call returns at once and frees nothing twice."""
        for job in list(self._active.values()):
            job.aborted = True
        if self._closing:
            return
        self._closing = True
        self._jobs.put(None)
        await shut_down(self._worker, self._batch, self._model)
        self._reader.shutdown(wait=False, cancel_futures=True)
        if self._cache is not None:         # its writes (the slots' last states) finish
            await asyncio.to_thread(self._cache.close)

    # -- the worker thread ------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closing:
            busy = any(s.job is not None for s in self._slots)
            reading = bool(self._waiting) and all(j.restoring is not None
                                                  and not j.restoring.done()
                                                  for j in self._waiting)
            if not self._take_jobs(block=not busy and not self._waiting,
                                   wait=0.005 if reading and not busy else 0.0):
                break
            self._drop_aborted()        # first: a retry admitted now finds their caches free
            self._admit()
            try:
                self._step()
            except Exception as exc:  # noqa: BLE001 - reported to the requests, not raised
                log.exception("decode step failed")
                for slot in self._slots:
                    if slot.job is not None:
                        slot.job.emit(exc)
                        self._release(slot, keep=False)
        for slot in self._slots:
            if slot.job is not None:
                slot.job.emit(EngineOutput([], finish_reason="abort"))
                self._release(slot, keep=False)
        for job in self._waiting:
            self._unpark(job)
            job.emit(EngineOutput([], finish_reason="abort"))
        if self._cache is not None:         # what the slots hold outlives the model
            for slot in self._slots:
                self._keep_prefix(slot, slot.keep)

    def _count_waiting(self, delta: int) -> None:
        with self._stats_lock:          # changed from the event loop and the worker thread
            self.stats["waiting"] += delta

    def _take_jobs(self, block: bool, wait: float = 0.0) -> bool:
        """Move queued jobs to the waiting list, in rank order (waiting for one, or up to
        ``wait`` seconds for one); False when the engine is closing."""
        count = len(self._waiting)
        self._arrived = None            # before the queue is read: a later arrival sets it
        try:
            item = (self._jobs.get() if block else self._jobs.get(timeout=wait) if wait
                    else self._jobs.get_nowait())
            while True:
                if item is None:
                    return False
                item.order, self._arrivals = self._arrivals, self._arrivals + 1
                self._waiting.append(item)
                item = self._jobs.get_nowait()
        except queue.Empty:
            return True
        finally:
            if len(self._waiting) > count:
                self._waiting.sort(key=_rank)

    def _admit(self) -> None:
        """Give free slots to waiting jobs, highest rank first, reusing cached prefixes;
        with none free, a job takes a lower-priority job's slot (``_preempt``)."""
        still: list[_Job] = []
        parked: list[_Job] = []
        stuck = False
        for job in self._waiting:
            if job.aborted:
                self._count_waiting(-1)
                self._unpark(job)
                job.emit(EngineOutput([], finish_reason="abort"))
                continue
            free = [] if stuck else ([s for s in self._slots if s.job is None]
                                     or self._preempt(job, parked))
            if not free:        # the jobs after this one rank no higher: no slot for them
                stuck = True
                still.append(job)
                continue
            if self._reading(job, free):        # its cached prefix comes first
                still.append(job)
                continue
            try:
                self._start(job, free)
            except Exception as exc:  # noqa: BLE001 - a bad request fails alone
                job.emit(exc)
            finally:        # after running counts it: check_room never sees the job in neither
                self._count_waiting(-1)
        self._waiting = sorted(still + parked, key=_rank) if parked else still

    def _preempt(self, job: _Job, parked: list[_Job]) -> list[_Slot]:
        """The slot of the running job of the lowest priority below ``job``'s (the fewest
        tokens to redo of them), its job parked (added to ``parked``); [] when none is
        below."""
        below = [s for s in self._slots if s.job is not None and s.prompt_logprobs is None
                 and s.job.request.priority < job.request.priority]
        if not below:
            return []
        slot = min(below, key=lambda s: (_priority(s), len(s.cached)))
        victim = slot.job
        assert isinstance(victim, _Job) and slot.sampler is not None
        victim.parked = _Parked(slot.sampler, slot.drafts,
                                slot.cached + slot.pending + [slot.next_token],
                                slot.generated, slot.cached_tokens, slot.cache_written)
        slot.sampler = slot.drafts = None   # the parked job's now: not closed with the slot
        self._release(slot)             # what it decoded stays cached in the slot
        self._count_waiting(+1)
        parked.append(victim)
        return [slot]

    @staticmethod
    def _unpark(job: _Job) -> None:
        if job.parked is not None:
            job.parked.sampler.close()
            job.parked = None

    def _start(self, job: _Job, free: list[_Slot]) -> None:
        """Run ``job`` in the free slot that caches most of its tokens: a new job's prompt,
        or a parked job's tokens so far (it goes on where it was)."""
        req, parked = job.request, job.parked
        job.parked = None
        prompt = req.prompt_token_ids if parked is None else parked.tokens
        scoring = parked is None and req.prompt_logprobs is not None
        step = self._n_batch if not scoring else min(self._n_batch, 64)
        reuse = [(0 if scoring else _aligned_prefix(s.cached, prompt, step), s) for s in free]
        keep, slot = max(reuse, key=lambda pair: (pair[0], -pair[1].last_used))
        restored = job.restoring.result() if job.restoring is not None else None
        job.restoring = None
        if restored is not None and restored[0] // step * step > keep:
            slot = min(free, key=lambda s: s.last_used)     # the least recently used
            self._keep_prefix(slot, slot.keep)      # what it held outlives it
            keep = self._restore(slot, prompt, restored, step)
        else:
            if len(slot.cached) - keep >= self._n_batch:    # a chunk or more to overwrite:
                self._keep_prefix(slot, slot.keep)          # what it held is kept first
            if not llama_cpp.llama_memory_seq_rm(self._mem, slot.seq, keep, -1):
                llama_cpp.llama_memory_seq_rm(self._mem, slot.seq, 0, -1)
                keep = 0
        slot.cached = slot.cached[:keep]
        slot.chunk = step
        if parked is None:
            grammar = req.sampling.grammar
            slot.sampler = Sampler(req.sampling, self._n_vocab,
                                   self._grammars.matcher(grammar) if grammar else None,
                                   grammar_budget=self._grammar_ms / 1000)
            prediction = req.sampling.prediction
            slot.drafts = (Drafts(prompt, prediction, self._ngram) if self._drafting and (
                prediction or self._ngram) and not scoring else None)
            slot.generated, slot.cached_tokens, slot.cache_written = 0, keep, 0
            self.stats["requests"] += 1
        else:
            slot.sampler, slot.drafts = parked.sampler, parked.drafts
            slot.generated = parked.generated
            slot.cached_tokens = parked.cached_tokens
            slot.cache_written = parked.cache_written
        slot.keep = _keep(req.cache)
        slot.job = job
        slot.pending = list(prompt[keep:-1])
        slot.next_token = prompt[-1]
        slot.split = len(req.prompt_token_ids) - 1
        slot.prompt_logprobs = [None] if scoring else None
        self._clock += 1
        slot.last_used = self._clock
        self.stats["running"] += 1
        if req.sampling.max_tokens <= 0 and not scoring and parked is None:
            self._release(slot)
            job.emit(EngineOutput([], None, "length", cached_tokens=keep))

    def _reading(self, job: _Job, free: list[_Slot]) -> bool:
        """Whether ``job`` waits for its prompt's cached prefix to be read: one the prompt
        cache holds at least a chunk longer than any free slot's is read on the cache's
        thread (``PromptCache.load``) while the other jobs go on; the job is started once
        it is in (or failed: then it is prefilled)."""
        if job.restoring is not None:
            return not job.restoring.done()
        cache, req = self._cache, job.request
        if cache is None or job.parked is not None or req.prompt_logprobs is not None:
            return False
        prompt = req.prompt_token_ids
        have = cache.longest(prompt)
        if have < max(_aligned_prefix(s.cached, prompt, self._n_batch) for s in free) + \
                self._n_batch:
            return False
        job.restoring = self._reader.submit(cache.load, prompt)
        return True

    def _restore(self, slot: _Slot, prompt: list[int], entry: tuple[int, bytes],
                 step: int) -> int:
        """Put a prompt cache entry's state into ``slot``'s sequence (a copy: about 2 ms per
        1,000 tokens); its whole chunks of ``prompt`` stay. How many tokens it holds now (0
        when llama.cpp refused the state: the prompt is prefilled)."""
        held, data = entry
        seq = slot.seq
        llama_cpp.llama_memory_seq_rm(self._mem, seq, 0, -1)
        slot.cached = []
        start = time.perf_counter()
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        done = llama_cpp.llama_state_seq_set_data(self._model.ctx, buf, len(data), seq)
        self.stats["restore_us"] += int((time.perf_counter() - start) * 1e6)
        if done != len(data):
            log.warning("prompt cache: llama.cpp refused a cached state of %d tokens; "
                        "prefilling instead", held)
            llama_cpp.llama_memory_seq_rm(self._mem, seq, 0, -1)
            return 0
        keep = held // step * step
        llama_cpp.llama_memory_seq_rm(self._mem, seq, keep, -1)
        slot.cached = list(prompt[:keep])
        self.stats["restored_tokens"] += keep
        if keep >= RESTORE_LOG_TOKENS:
            log.info("prompt cache: restored %d tokens into sequence %d", keep, seq)
        return keep

    def _keep_prefix(self, slot: _Slot, keep: bool | None = None) -> bool:
        """Hand the prompt cache ``slot``'s cached tokens and their KV state, unless it
        already holds them (the copy is the only work here: the cache writes it behind).
        ``keep``: as ``PromptCache.save``'s (a client's ask; None: the server's policy).
        Whether the cache took a new entry."""
        cache, tokens = self._cache, slot.cached
        if cache is None or len(tokens) < (cache.min_tokens if keep is None else cache.block) \
                or cache.longest(tokens + [-1]) >= len(tokens) // cache.block * cache.block:
            return False
        start = time.perf_counter()
        size = llama_cpp.llama_state_seq_get_size(self._model.ctx, slot.seq)
        buf = (ctypes.c_uint8 * size)()
        copied = llama_cpp.llama_state_seq_get_data(self._model.ctx, buf, size, slot.seq)
        data = bytes(buf)
        self.stats["copy_us"] += int((time.perf_counter() - start) * 1e6)
        if copied != size:
            log.warning("prompt cache: llama.cpp gave no state for %d tokens", len(tokens))
            return False
        return bool(cache.save(list(tokens), data, keep=keep))

    def _drop_aborted(self) -> None:
        """Free the slots of aborted jobs; what they prefilled stays cached for reuse (an
        agent client that gave up mid-prefill retries the same prompt at once)."""
        for slot in self._slots:
            if slot.job is not None and slot.job.aborted:
                job = slot.job
                self._release(slot)
                job.emit(EngineOutput([], finish_reason="abort"))

    def _step(self) -> None:
        """A chunk of the first prompt, then a token for each running sequence; cut short by
        an interrupted decode (the loop admits the request that interrupted it first)."""
        busy = [s for s in self._slots if s.job is not None]
        prefilling = [s for s in busy if s.prefilling]
        ready = [s for s in busy if not s.prefilling]
        first = min(prefilling, key=_prefill_rank, default=None)
        if first is not None and any(s.generated == 0 and _priority(s) > _priority(first)
                                     for s in ready):
            first = None        # a higher sequence's first token comes before another chunk
        if first is not None:
            # sequences of a lower priority than the prompt being prefilled wait: its first
            # token comes a decode of theirs sooner per chunk (batch work holds back)
            ready = [s for s in ready if _priority(s) >= _priority(first)
                     ] if self._prefill_chunk(first) else []
        for start in range(0, len(ready), self._rows):
            if not self._decode_step(ready[start:start + self._rows]):
                break
        self.stats["kv_tokens"] = sum(len(s.cached) for s in self._slots)

    def _prefill_chunk(self, slot: _Slot) -> bool:
        """One chunk of ``slot``'s prompt, ending at the next multiple of the chunk size or at
        the prompt's end. False when interrupted (the chunk stays to do)."""
        scores, job = slot.prompt_logprobs, slot.job
        assert job is not None                  # the worker prefills busy slots only
        start = len(slot.cached)
        n = min(slot.split - start, slot.chunk - start % slot.chunk)
        chunk = slot.pending[:n]
        if not self._decode([(slot, tok, scores is not None) for tok in chunk]):
            return False
        if scores is not None:
            prompt, top = job.request.prompt_token_ids, job.request.prompt_logprobs or 0
            scores += [token_logprob(logits_row(self._model.ctx, i, self._n_vocab),
                                     prompt[start + i + 1], top) for i in range(n)]
        del slot.pending[:n]
        if len(slot.cached) == slot.split and self._cache is not None:
            # a prompt just prefilled: kept for the next time; what the client marked and
            # this request wrote is reported with its first token
            hint, held = job.request.cache, len(slot.cached)
            if self._keep_prefix(slot, slot.keep):
                until = hint.until if hint is not None and hint.until is not None else held
                slot.cache_written = max(0, min(until, held) - slot.cached_tokens)
        return True

    def _decode_step(self, slots: list[_Slot]) -> bool:
        """One new token for each of ``slots``, and for a sequence with a draft the draft
        tokens verified too: one decode, then each one's own sampler draws at each of its
        rows in turn, as many as match its draft and one more; a resumed job's slot decodes
        the next of the tokens it had generated instead (one a step, as they were first
        decoded: several of one sequence in a decode give other numbers on some CPUs).
        False when interrupted (nothing sampled)."""
        drafts = self._drafts(slots)
        rows: list[tuple[_Slot, int, bool]] = []
        for slot, draft in zip(slots, drafts):
            if slot.pending:
                rows.append((slot, slot.pending[0], False))
                continue
            rows.append((slot, slot.next_token, True))
            rows += [(slot, token, True) for token in draft]
        start = time.perf_counter()
        if not self._decode(rows):
            return False
        self._costs.note(len(rows), time.perf_counter() - start)
        at = 0
        for slot, draft in zip(slots, drafts):
            if slot.pending:            # replayed: nothing to sample
                del slot.pending[0]
                at += 1
                continue
            self._verify(slot, at, draft)
            at += 1 + len(draft)
        return True

    def _drafts(self, slots: list[_Slot]) -> list[list[int]]:
        """Each slot's draft for this step: what its controls force next (a reasoning
        budget's close, the grammar's only way on), else what its draft sources propose, as
        long as the measured step cost says it pays (``StepCosts.best_length``); within the
        rows this decode has to spare (none when the running sequences fill it) and the
        slot's own room."""
        rows = len(slots)
        spare = min(self._rows, self._n_batch) - rows
        out: list[list[int]] = [[] for _ in slots]
        if spare <= 0 or not self._drafting:
            return out
        for i, slot in enumerate(slots):
            sampler, job = slot.sampler, slot.job
            if (spare <= 0 or slot.pending or sampler is None or job is None
                    or slot.prompt_logprobs is not None):
                continue
            # (short of the context's end, so no row's length check sees the rows after it)
            room = min(spare, MAX_DRAFT, job.request.sampling.max_tokens - slot.generated - 1,
                       self._n_ctx - len(slot.cached) - 3)
            if room <= 0:
                continue
            draft = sampler.forced_ahead()[:room]
            drafts = slot.drafts
            if not draft and drafts is not None:
                source = drafts.ready()
                length = self._costs.best_length(rows, room, drafts.rate(source)) if source else 0
                draft = sampler.allowed(drafts.propose(length)) if length else []
            out[i] = draft
            spare -= len(draft)
            rows += len(draft)
        return out

    def _verify(self, slot: _Slot, base: int, draft: list[int]) -> None:
        """Draw ``slot``'s tokens from its rows from ``base`` on: the next token, then while
        each draw equals the draft's token there, the next (a draft never changes what is
        drawn: each draw is the one the sequence would make without it). Then what the
        rejected draft tokens left in the KV cache goes."""
        job, drafts = slot.job, slot.drafts
        assert job is not None
        source = drafts.source if drafts is not None and draft else ""
        keep = len(slot.cached) - len(draft)        # the next token's row and before
        outs: list[EngineOutput] = []
        accepted = 0
        for j in range(len(draft) + 1):
            out = self._sample(slot, base + j)
            if out is None:                 # the request failed (emitted already)
                break
            outs.append(out)
            token = out.token_ids[0]
            if drafts is not None:
                drafts.feed(token)
            if j < len(draft) and token == draft[j]:
                accepted += 1
                if out.finish_reason is None:
                    continue
            break
        if draft:
            keep += accepted
            if len(slot.cached) > keep:
                llama_cpp.llama_memory_seq_rm(self._mem, slot.seq, keep, -1)
                del slot.cached[keep:]
            if source:
                assert drafts is not None
                drafts.verified(len(draft), accepted)
                self.stats[f"drafted_{source}"] += len(draft)
                self.stats[f"accepted_{source}"] += accepted
                if source == PREDICTION and outs:
                    outs[-1].accepted_prediction = accepted
                    outs[-1].rejected_prediction = len(draft) - accepted
        for out in outs:
            job.emit(out)

    def _sample(self, slot: _Slot, index: int) -> EngineOutput | None:
        """The slot's next token, drawn from output ``index`` of the last decode, as its
        output (not yet emitted); its slot released when the output is the last. None when
        the request failed: its error is emitted and its slot released."""
        job, sampler = slot.job, slot.sampler
        assert job is not None and sampler is not None     # busy slots only
        req, params = job.request, job.request.sampling
        ctx = self._model.ctx
        if slot.prompt_logprobs is not None and params.max_tokens <= 0:
            out = EngineOutput([], None, "length", slot.prompt_logprobs)
            self._release(slot)
            job.emit(out)
            return None
        try:
            token = sampler.sample(ctx, index)
            logprobs = None
            if req.logprobs is not None:
                logprobs = [token_logprob(logits_row(ctx, index, self._n_vocab), token,
                                          req.logprobs)]
        except Exception as exc:  # noqa: BLE001 - this request fails, the batch goes on
            log.exception("sampling failed for %s", req.request_id)
            self._release(slot, keep=False)
            job.emit(exc)
            return None
        if sampler.over_budget:     # ended before it slows the batch again
            self._release(slot)
            job.emit(self._grammar_refusal(sampler, params))
            return None
        slot.generated += 1
        self.stats["generated_tokens"] += 1
        finish: FinishReason | None = None
        if token in params.stop_token_ids or (token in self.tokenizer.eos_token_ids and not (
                params.ignore_eos and not sampler.constrained)):
            finish = "stop"
        elif slot.generated >= params.max_tokens or len(slot.cached) + 1 >= self._n_ctx:
            finish = "length"
        out = EngineOutput([token], logprobs, finish, slot.prompt_logprobs,
                           stopped_by_token=finish == "stop", cached_tokens=slot.cached_tokens,
                           cache_written=slot.cache_written)
        slot.prompt_logprobs, slot.cached_tokens, slot.cache_written = None, 0, 0
        if finish is not None:
            self._release(slot)       # first, so the counters are right when it arrives
        else:
            slot.next_token = token
        return out

    def _grammar_refusal(self, sampler: Sampler, params) -> InvalidRequestError:
        return InvalidRequestError(
            f"The output constraint costs too much to apply: its grammar took "
            f"{sampler.grammar_seconds * 1000:.0f} ms of sampling for one token, past this "
            f"server's budget of {self._grammar_ms:g} ms a token (--grammar-ms-per-token), "
            f"and every other stream waits for it. Use a schema with fewer alternatives "
            f"open at once (a shorter enum, or values that differ from their first "
            f"characters)", param=getattr(params.grammar, "param", None),
            code="grammar_too_costly")

    def _decode(self, rows: list[tuple[_Slot, int, bool]]) -> bool:
        """One ``llama_decode`` of (slot, token, wants logits) rows at each slot's next
        position. False when a request of a higher priority than every row's arrived during
        it (``generate``): then nothing of it stays, in the KV cache or in ``cached``, and
        done again it gives the same numbers (the same tokens at the same positions)."""
        b = self._batch
        b.n_tokens = len(rows)
        starts: dict[int, tuple[_Slot, int]] = {}
        for i, (slot, tok, want) in enumerate(rows):
            starts.setdefault(slot.seq, (slot, len(slot.cached)))
            b.token[i] = tok
            b.pos[i] = len(slot.cached)
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = slot.seq
            b.logits[i] = want
            slot.cached.append(tok)
        # first the priority, then the flag, then what arrived: a request queued before
        # this decode is seen here (``_arrived``), one queued during it sets the flag
        top = self._decoding = max(_priority(s) for s, _, _ in rows)
        self._interrupt.clear()
        arrived = self._arrived
        rc = 2 if arrived is not None and arrived > top else llama_cpp.llama_decode(
            self._model.ctx, b)
        self._decoding = None
        if rc == 2:                         # interrupted
            for slot, start in starts.values():
                llama_cpp.llama_memory_seq_rm(self._mem, slot.seq, start, -1)
                del slot.cached[start:]
            self.stats["interrupted"] += 1
            return False
        if rc != 0:
            for slot, _, _ in rows:       # their caches no longer match what we recorded
                llama_cpp.llama_memory_seq_rm(self._mem, slot.seq, 0, -1)
                slot.cached = []
            raise RuntimeError(f"llama_decode returned {rc}")
        return True

    def _release(self, slot: _Slot, keep: bool = True) -> None:
        """The slot's job is over; its cached tokens stay for the next prompt that shares
        them (unless ``keep`` is false)."""
        if slot.sampler is not None:
            slot.sampler.close()
        slot.job, slot.sampler, slot.pending = None, None, []
        if not keep:
            llama_cpp.llama_memory_seq_rm(self._mem, slot.seq, 0, -1)
            slot.cached = []
        self.stats["running"] -= 1


def kv_fingerprint(path: Path, *, n_ctx: int, n_batch: int, deterministic: bool) -> str:
    """What a prompt cache entry's KV state depends on beyond its tokens: the model file
    (its path, size and modification time), the context and chunk sizes (prefill chunks sit
    at fixed positions), the numerics (--deterministic: repacked weights and flash attention)
    and llama.cpp's build. An entry made under another fingerprint is never restored."""
    st = path.stat()
    return (f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|ctx={n_ctx}|batch={n_batch}|"
            f"deterministic={deterministic}|llama_cpp={llama_cpp.__version__}|kv=f16")


def _keep(hint: CacheHint | None) -> bool | None:
    """A request's ``CacheHint`` as ``PromptCache.save``'s ``keep``: its retention when it
    says one; a breakpoint alone asks to keep (however short); else the server's policy."""
    if hint is None:
        return None
    return hint.retain if hint.retain is not None else (True if hint.until is not None
                                                        else None)


def _priority(slot: _Slot) -> int:
    return slot.job.request.priority if slot.job else 0


def _prefill_rank(slot: _Slot) -> tuple[int, int]:
    """Which prompt prefills first: the highest priority, then the first started."""
    return -_priority(slot), slot.last_used


def _aligned_prefix(cached: list[int], prompt: list[int], step: int) -> int:
    """How much of ``cached`` a prompt can reuse: the common prefix, in whole chunks, and
    never the prompt's last token (it is decoded with the generated ones)."""
    n = min(len(cached), len(prompt) - 1)
    i = 0
    while i < n and cached[i] == prompt[i]:
        i += 1
    return i // step * step


if TYPE_CHECKING:
    def _is_an_engine(engine: LlamaCppEngine) -> Engine:
        return engine                   # mypy: LlamaCppEngine satisfies the boundary
