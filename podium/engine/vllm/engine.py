# mypy: disable-error-code="import-not-found, import-untyped"
# (vLLM, torch and transformers are installed only where the vLLM engine runs)
"""The vLLM engine: vLLM's ``AsyncLLM`` in this process, token ids in and out.

vLLM runs its engine core (scheduler, KV cache, model workers) in child processes; this
process keeps its ``AsyncLLM`` front-end, which lives on one event loop. ``podium serve``
hands the engine the server's own loop (``loop=``): the ``AsyncLLM`` starts on it, and a
request's outputs go from vLLM's output handler to the response in the same thread, as in
``vllm serve``. Without one (tests, scripts: callers on any loop, one per test), the
``AsyncLLM`` gets its own loop on a daemon thread, and requests cross over: ``generate``
counts the request at once (waiting) and hands it to that loop; outputs come back to the
caller's loop through an ``asyncio.Queue`` (one thread hand-over per output). Either way,
closing, cancelling or dropping the outputs cancels the request's task on the vLLM loop,
which aborts it in the engine core.

Podium keeps its own detokenizer, stop strings and parsers: requests go with
``detokenize=False`` and stop token ids only (Podium's end-of-generation ids, unless
``ignore_eos``). The stop token comes back with the last output and is counted
(``stopped_by_token``). A grammar (llguidance's Lark) goes as vLLM structured outputs,
through its ``guidance`` backend.

Priority: vLLM's scheduler runs with ``scheduling_policy="priority"``, and a request goes
with ``priority=-request.priority`` (vLLM runs the lowest value first, Podium the highest).
Its waiting queue is then ordered by priority, then arrival (equal priorities keep vLLM's
first come, first served order). vLLM preempts a running request of lower priority only
when the KV cache runs out, not for one of the ``max_num_seqs`` sequences, so a
high-priority request waits for the next sequence that frees (``Capabilities.preemption``
false): batch work must leave sequences free for interactive work by holding fewer.

Stats: ``running`` and ``waiting`` split the requests Podium has in flight by vLLM's
scheduler figures (from a stat logger); ``kv_tokens`` is what the KV cache holds: blocks in
use by running requests, or, when more, the full blocks the prefix cache keeps (tracked here
the way vLLM's cache does: a chain of block hashes, least recently used evicted first, since
vLLM counts cached free blocks as free).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.engine.base import (ENGINE_STATS, CacheHint, Capabilities, Engine, EngineOutput,
                                EngineRequest, EngineStats, FinishReason, ModelInfo,
                                TokenLogprob)
from podium.engine.jobs import Job, JobOutputs
from podium.engine.vllm.tokenizer import HfTokenizer
from podium.errors import EngineError, InvalidRequestError, Overloaded

log = logging.getLogger(__name__)

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}   # else: "abort"


@dataclass(eq=False)
class _Job(Job):
    ended: bool = False                         # its last output (or error) was sent
    task: asyncio.Task | None = None            # on the vLLM loop
    seen: list[int] = field(default_factory=list)   # the tokens it produced (prefix cache)
    here: bool = False                          # the caller's loop is the vLLM loop

    def emit(self, item: EngineOutput | BaseException) -> None:
        if self.here:
            self.outputs.put_nowait(item)
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)


class _Generation(JobOutputs[_Job]):
    """One request's outputs on the caller's loop; closing, cancelling or dropping them
    before the last output aborts it (the vLLM loop has ended it already otherwise)."""

    def __init__(self, job: _Job, engine: "VllmEngine"):
        super().__init__(job)
        self._engine = engine

    def _over(self, early: bool) -> None:
        if early:
            self._engine._cancel(self._job)


class _PrefixBlocks:
    """The full KV blocks vLLM's prefix cache keeps, by the same rule: a block is known by
    the hash of its tokens and of every block before it; least recently used goes first."""

    def __init__(self, block_size: int, capacity: int):
        self.block_size, self.capacity = block_size, capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def add(self, tokens: list[int]) -> None:
        parent, bs = 0, self.block_size
        for start in range(0, len(tokens) - bs + 1, bs):
            parent = hash((parent, tuple(tokens[start:start + bs])))
            self._blocks[parent] = None
            self._blocks.move_to_end(parent)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def tokens(self) -> int:
        return len(self._blocks) * self.block_size


def _stat_logger_class() -> Any:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class PodiumStatLogger(StatLoggerBase):
        """Hands vLLM's scheduler figures (one engine core of several, with data parallel)
        to the engine."""

        engine: "VllmEngine | None" = None

        def __init__(self, vllm_config: Any, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is not None and self.engine is not None:
                self.engine._record(engine_idx, scheduler_stats)

        def log_engine_initialized(self) -> None:
            pass

    return PodiumStatLogger


_EMBEDS = itertools.count()


class VllmEngine:
    # no sequence taken from running work; n-gram speculation is its own (speculative_config)
    capabilities = Capabilities(preemption=False, drafts=False)
    pair_overhead = 0                   # a reranker's special tokens around a pair

    def __init__(self, model: str | Path, *, served_name: str | None = None,
                 max_model_len: int | None = None, max_num_seqs: int = 4,
                 max_queued: int = 256, enforce_eager: bool = False,
                 tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                 data_parallel_size: int = 1, distributed_executor_backend: str | None = None,
                 gpu_memory_utilization: float | None = None,
                 engine_args: dict[str, Any] | None = None, startup_timeout: float = 900,
                 loop: asyncio.AbstractEventLoop | None = None, kind: str = "chat"):
        """``loop``: a loop that is not running yet (the server's) for vLLM to live on: it
        runs while the engine starts, and only callers on it may generate. Without one,
        vLLM gets a loop on a thread of its own, and callers may use any loop. ``kind``
        embedding: vLLM's pooling runner (the model's own pooling and normalization, from
        its sentence-transformers configuration); ``embed`` instead of ``generate``."""
        self.kind = kind
        self.tokenizer = HfTokenizer.from_folder(model)
        self._max_num_seqs, self._max_queued = max_num_seqs, max_queued
        self._eos = self.tokenizer.eos_token_ids
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()           # stats change on both loops' threads
        self._sched_running: dict[int, int] = {}
        self._kv_used: dict[int, float] = {}
        self.stats = EngineStats(*ENGINE_STATS)
        args: dict[str, Any] = dict(
            model=str(model), tokenizer=str(model), max_num_seqs=max_num_seqs,
            enforce_eager=enforce_eager, enable_prefix_caching=True,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            data_parallel_size=data_parallel_size, disable_log_stats=True,
            scheduling_policy="priority")
        if kind in ("embedding", "rerank"):
            args.update(runner="pooling", enable_prefix_caching=False)
        elif _thinks(self.tokenizer):
            # a <think> model: vLLM keeps a request's reasoning budget (thinking_token_budget)
            # once its reasoning parser knows the tags
            args["reasoning_parser"] = "deepseek_r1"
        if kind == "rerank":        # a cross-encoder: the pair as its tokenizer joins one
            self._pair = self.tokenizer.pair_layout()
            self.pair_overhead = sum(len(part) for part in self._pair[:3])
        if max_model_len:
            args["max_model_len"] = max_model_len
        if distributed_executor_backend:
            args["distributed_executor_backend"] = distributed_executor_backend
        if gpu_memory_utilization is not None:
            args["gpu_memory_utilization"] = gpu_memory_utilization
        args.update(engine_args or {})
        self._budgets = bool(args.get("reasoning_parser") or args.get("reasoning_config"))
        started = time.monotonic()
        self._thread: threading.Thread | None = None
        if loop is not None:
            self._loop = loop
            self._llm = loop.run_until_complete(asyncio.wait_for(self._start(args),
                                                                 startup_timeout))
        else:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever,
                                            name="podium-vllm", daemon=True)
            self._thread.start()
            try:
                self._llm = asyncio.run_coroutine_threadsafe(
                    self._start(args), self._loop).result(startup_timeout)
            except BaseException:
                self._loop.call_soon_threadsafe(self._loop.stop)
                raise
        log.info("vLLM engine started in %.1f s", time.monotonic() - started)
        config = self._llm.vllm_config
        cache = config.cache_config
        self._block_size = cache.block_size
        blocks = cache.num_gpu_blocks or 0
        self.stats["kv_capacity"] = blocks * self._block_size
        self._prefix = _PrefixBlocks(self._block_size, blocks)
        self.info = ModelInfo(served_name=served_name or Path(str(model)).name,
                              context_length=config.model_config.max_model_len,
                              chat_template=self.tokenizer.chat_template,
                              created=int(os.stat(model).st_mtime) if os.path.exists(model)
                              else int(time.time()),
                              metadata={"general.architecture": architecture(
                                  config.model_config.hf_config.model_type)})
        self.dimensions = getattr(config.model_config.hf_config, "hidden_size", None)

    @classmethod
    def from_gguf(cls, path: Path, **options: Any) -> "VllmEngine":
        """Serve a GGUF model through its bf16 safetensors folder (made once, cached)."""
        from podium.engine.vllm.weights import hf_folder_from_gguf

        return cls(hf_folder_from_gguf(path), **options)

    async def _start(self, args: dict[str, Any]) -> Any:
        """Build the ``AsyncLLM`` on its own loop (its output handler starts there)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")         # vLLM's and torch's import-time noise
            from vllm.config import StructuredOutputsConfig
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            # Podium's grammars are llguidance's (Lark with inline JSON schemas): vLLM's
            # guidance backend compiles them as the llama.cpp engine does
            args.setdefault("structured_outputs_config",
                            StructuredOutputsConfig(backend="guidance"))

            logger_class = _stat_logger_class()
            logger_class.engine = self
            try:
                engine_args = AsyncEngineArgs(**args)
            except TypeError as exc:
                raise ValueError(f"vLLM refused an engine argument: {exc}") from exc
            return AsyncLLM.from_engine_args(engine_args, stat_loggers=[logger_class])

    # -- the boundary ---------------------------------------------------------------------

    async def embed(self, inputs: list[list[int]], priority: int = 0) -> list[list[float]]:
        """One vector per input (an embedding model's engine): vLLM batches them. Each input
        is a request of vLLM's at ``-priority`` (the pooling runner's scheduler has the
        priority policy too), so it waits only for the step in progress, not for lower
        priorities' queued inputs."""
        if self.kind != "embedding":
            raise InvalidRequestError(f"'{self.info.served_name}' is a chat model: it does "
                                      f"not serve embeddings", param="model")
        for i, ids in enumerate(inputs):
            if not ids or len(ids) > self.info.context_length:
                raise InvalidRequestError(
                    f"input {i} has {len(ids)} tokens; this model takes 1 to "
                    f"{self.info.context_length}", param=f"input[{i}]")
        from vllm.pooling_params import PoolingParams

        tag = f"embed-{next(_EMBEDS)}"

        async def one(i: int, ids: list[int]) -> list[float]:
            last = None
            async for out in self._llm.encode({"prompt_token_ids": ids},
                                              PoolingParams(task="embed"), f"{tag}-{i}",
                                              priority=-priority):
                last = out
            assert last is not None
            return last.outputs.data.tolist()

        async def every() -> list[list[float]]:
            return list(await asyncio.gather(*(one(i, ids) for i, ids in enumerate(inputs))))

        if asyncio.get_running_loop() is self._loop:
            return await every()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(every(),
                                                                          self._loop))

    async def score(self, query: list[int], documents: list[list[int]], priority: int = 0
                    ) -> list[float]:
        """A cross-encoder's relevance of each document to the query: the pair joined as its
        tokenizer joins one (token types included), vLLM's classify pooling with the
        model's activation (a sigmoid for one label), applied once by vLLM. Each pair goes
        at ``-priority``, as ``embed``'s inputs."""
        if self.kind != "rerank":
            raise InvalidRequestError(f"'{self.info.served_name}' is not a reranker",
                                      param="model")
        from vllm.pooling_params import PoolingParams

        open_, middle, close, segment = self._pair
        tag = f"score-{next(_EMBEDS)}"

        async def one(i: int, doc: list[int]) -> float:
            params = PoolingParams(task="classify")
            if segment is not None:         # where the document's segment begins
                params.extra_kwargs = {"compressed_token_type_ids":
                                       len(open_) + len(query) + segment}
            last = None
            async for out in self._llm.encode(
                    {"prompt_token_ids": [*open_, *query, *middle, *doc, *close]}, params,
                    f"{tag}-{i}", priority=-priority):
                last = out
            assert last is not None
            return float(last.outputs.data.reshape(-1)[0])

        async def every() -> list[float]:
            return list(await asyncio.gather(*(one(i, d) for i, d in enumerate(documents))))

        if asyncio.get_running_loop() is self._loop:
            return await every()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(every(),
                                                                          self._loop))

    def check_grammar(self, grammar: str) -> None:
        pass                    # vLLM compiles it with its guidance backend when it starts

    def check_room(self, n: int = 1) -> None:
        """400 when ``n`` requests exceed ``max_num_seqs`` + ``max_queued``, 429 when they do
        not fit beside those in flight now."""
        if self.kind == "rerank":
            raise InvalidRequestError(f"'{self.info.served_name}' is a reranker: it serves "
                                      f"/v1/rerank, not text generation", param="model")
        if self.kind == "embedding":
            raise InvalidRequestError(f"'{self.info.served_name}' is an embedding model: it "
                                      f"serves /v1/embeddings, not text generation",
                                      param="model")
        capacity = self._max_num_seqs + self._max_queued
        if n > capacity:
            raise InvalidRequestError(
                f"This request needs {n} sequences at once; this server holds at most "
                f"{capacity} ({self._max_num_seqs} running, {self._max_queued} queued): ask "
                f"for fewer choices or prompts", param="n")
        if len(self._jobs) + n > capacity:
            raise Overloaded(f"The server is busy ({self.stats['running']} sequences running, "
                              f"{self.stats['waiting']} queued); retry shortly", retry_after=1)

    def generate(self, request: EngineRequest) -> _Generation:
        caller = asyncio.get_running_loop()
        here = caller is self._loop
        if self._thread is None and not here:
            raise RuntimeError("this vLLM engine serves only the loop it was started on")
        job = _Job(request, caller, asyncio.Queue(), here=here)
        with self._lock:
            self._jobs[request.request_id] = job
            self._split()
        if here:
            self._begin(job)
        else:
            self._loop.call_soon_threadsafe(self._begin, job)
        return _Generation(job, self)

    async def abort(self, request_id: str) -> None:
        job = self._jobs.get(request_id)
        if job is not None:
            self._cancel(job)

    async def aclose(self) -> None:
        for job in list(self._jobs.values()):
            self._cancel(job)
        if self._loop.is_closed():
            return

        async def shut() -> None:
            self._llm.shutdown()
            # vLLM closes its client sockets but leaves their ZMQ context to the garbage
            # collector (a ResourceWarning then, in whatever runs next): end it here
            resources = getattr(getattr(self._llm, "engine_core", None), "resources", None)
            ctx = getattr(resources, "ctx", None)
            if ctx is not None and not ctx.closed:
                await asyncio.wait_for(asyncio.to_thread(ctx.destroy, 0), 10)

        if self._thread is None:        # on the caller's loop, which its owner closes
            await shut()
            return
        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(shut(), self._loop))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join, 30)
            if not self._thread.is_alive():
                self._loop.close()

    # -- on the vLLM loop -----------------------------------------------------------------

    def _cancel(self, job: _Job) -> None:
        """From any thread: end ``job`` soon (its task is cancelled: vLLM aborts it)."""
        job.aborted = True
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._cancel_task, job)

    @staticmethod
    def _cancel_task(job: _Job) -> None:
        if job.task is not None and not job.task.done():
            job.task.cancel()

    def _begin(self, job: _Job) -> None:
        job.task = self._loop.create_task(self._serve(job))
        job.task.add_done_callback(lambda task: self._finished(job, task))

    def _finished(self, job: _Job, task: asyncio.Task) -> None:
        """However the task ended, the request ends once: an abort if it sent no last
        output (cancelled, even before it began), the error if it failed."""
        if job.ended:
            return
        error = None if task.cancelled() else task.exception()
        self._leave(job)
        job.emit(error if error is not None else EngineOutput([], finish_reason="abort"))

    def _leave(self, job: _Job) -> None:
        job.ended = True
        with self._lock:
            self._jobs.pop(job.request.request_id, None)
            self._split()
        if job.seen:
            self._prefix.add(job.request.prompt_token_ids + job.seen)
            self._kv_tokens()

    async def _serve(self, job: _Job) -> None:
        from vllm.inputs import TokensPrompt

        req = job.request
        if job.aborted:
            return                      # ``_finished`` sends the abort
        params = self._params(req)
        scoring_only = req.sampling.max_tokens <= 0
        with self._lock:
            self.stats["requests"] += 1
        if scoring_only and req.prompt_logprobs is None:
            self._leave(job)
            job.emit(EngineOutput([], None, "length"))
            return
        stops = req.sampling.stop_token_ids | (frozenset() if req.sampling.ignore_eos
                                               else self._eos)
        first = True
        prompt = TokensPrompt(prompt_token_ids=list(req.prompt_token_ids))
        async for out in self._llm.generate(prompt, params, req.request_id,
                                            priority=-req.priority):
            completion = out.outputs[0]
            ids = [] if scoring_only else list(completion.token_ids)
            finish: FinishReason | None = None
            if out.finished or scoring_only:
                finish = ("length" if scoring_only else
                          _FINISH.get(completion.finish_reason or "", "abort"))
            if finish == "abort" and not job.aborted:
                # vLLM ended it on its own (its structured-output backend refused the
                # grammar mid-way, say): a failure, not an unload
                raise EngineError(f"vLLM ended the request ({completion.finish_reason})")
            logprobs = None
            if req.logprobs is not None and not scoring_only:
                logprobs = [_token_logprob(t, pos, req.logprobs)
                            for t, pos in zip(ids, completion.logprobs or [])]
            prompt_lp = None
            if first and req.prompt_logprobs is not None:
                prompt_lp = [None if pos is None else _token_logprob(t, pos, req.prompt_logprobs)
                             for t, pos in zip(req.prompt_token_ids, out.prompt_logprobs or [])]
            result = EngineOutput(
                ids, logprobs, finish, prompt_lp,
                stopped_by_token=finish == "stop" and bool(ids) and ids[-1] in stops,
                cached_tokens=(out.num_cached_tokens or 0) if first else 0,
                cache_written=_written(out, req.cache) if first else 0)
            first = False
            job.seen += ids
            with self._lock:
                self.stats["generated_tokens"] += len(ids)
            if finish is not None:
                self._leave(job)
                job.emit(result)
                return
            job.emit(result)

    def _params(self, req: EngineRequest) -> Any:
        from vllm.sampling_params import (RequestOutputKind, SamplingParams,
                                          StructuredOutputsParams)

        s = req.sampling
        stops = set(s.stop_token_ids) | (set() if s.ignore_eos else set(self._eos))
        budget = None
        if s.reasoning is not None:
            if not self._budgets:
                raise InvalidRequestError(
                    "This model's reasoning budget cannot be kept by vLLM without a reasoning "
                    "parser (serve it with --engine-arg reasoning_parser=NAME)",
                    param="reasoning")
            budget = s.reasoning.tokens
        return SamplingParams(
            thinking_token_budget=budget,
            temperature=s.temperature, top_p=s.top_p, top_k=max(0, s.top_k), min_p=s.min_p,
            seed=s.seed, presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty, repetition_penalty=s.repetition_penalty,
            logit_bias=dict(s.logit_bias) or None, max_tokens=max(1, s.max_tokens),
            stop_token_ids=sorted(stops), ignore_eos=s.ignore_eos,
            logprobs=req.logprobs, prompt_logprobs=req.prompt_logprobs,
            structured_outputs=(StructuredOutputsParams(grammar=s.grammar)
                                if s.grammar else None),
            detokenize=False, skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA)

    # -- stats ----------------------------------------------------------------------------

    def _record(self, engine_idx: int, scheduler_stats: Any) -> None:
        """vLLM's scheduler figures after each step of one engine core."""
        with self._lock:
            self._sched_running[engine_idx] = scheduler_stats.num_running_reqs
            self._kv_used[engine_idx] = scheduler_stats.kv_cache_usage
            self._split()
        self._kv_tokens()

    def _split(self) -> None:
        """Podium's requests in flight, split into running and waiting by vLLM's count of
        the running ones (the rest are queued here or in vLLM's scheduler)."""
        live = len(self._jobs)
        running = min(live, sum(self._sched_running.values()))
        self.stats["running"] = running
        self.stats["waiting"] = live - running

    def _kv_tokens(self) -> None:
        capacity = self.stats["kv_capacity"]
        used = int(sum(self._kv_used.values()) / max(1, len(self._kv_used)) * capacity)
        self.stats["kv_tokens"] = min(capacity, max(used, self._prefix.tokens()))


def architecture(model_type: str) -> str:
    """A Hugging Face ``model_type`` as the GGUF architecture name Podium's detection reads
    (``gpt_oss`` is ``gpt-oss``: Harmony; ``qwen3_moe`` is ``qwen3moe``)."""
    return {"gpt_oss": "gpt-oss"}.get(model_type, model_type.replace("_", ""))


def _written(out: Any, hint: CacheHint | None) -> int:
    """What a request added to vLLM's prefix cache, as ``EngineOutput.cache_written``: the
    prompt tokens vLLM counts as its prefix-cache writes for it (whole blocks; a vLLM before
    0.32 says nothing: 0), no more than a client's breakpoint marks (``hint.until``)."""
    written = getattr(out, "num_cache_creation_tokens", None) or 0
    if hint is not None and hint.until is not None:
        written = min(written, max(0, hint.until - (out.num_cached_tokens or 0)))
    return written


def _token_logprob(token: int, position: dict[int, Any], k: int) -> TokenLogprob:
    """One position of vLLM's logprobs (the chosen token and the top ``k``, each with its
    rank) as Podium's: the chosen token's log-probability and the ``k`` most likely."""
    top = sorted(((t, lp.logprob) for t, lp in position.items()
                  if lp.rank is not None and lp.rank <= k), key=lambda p: -p[1])[:k]
    chosen = position.get(token)
    return TokenLogprob(token, chosen.logprob if chosen is not None else float("-inf"), top)


if TYPE_CHECKING:
    def _is_an_engine(engine: VllmEngine) -> Engine:
        return engine                   # mypy: VllmEngine satisfies the boundary


def _thinks(tokenizer: HfTokenizer) -> bool:
    """The model reasons in ``<think>`` tags of its own tokens (Qwen3, DeepSeek-R1): what
    vLLM's ``deepseek_r1`` reasoning parser reads."""
    from podium.parsing.registry import detect_reasoning_parser
    if detect_reasoning_parser(tokenizer.chat_template) != "think":
        return False
    return all(len(tokenizer.encode(tag, add_special=False)) == 1
               for tag in ("<think>", "</think>"))

