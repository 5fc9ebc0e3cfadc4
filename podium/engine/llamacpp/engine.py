"""The embedded engine: llama.cpp in this process, decoding on a worker thread.

Requests are served one at a time, in arrival order, through a single sequence of the
context (continuous batching is a later step). A request never interrupts another: new ones
wait their turn. The decode loop runs on its own thread (ctypes releases the GIL during
llama.cpp calls); each step hands its output to the request's asyncio queue on the event loop.
The KV cache keeps the previous request's tokens, so a prompt extending it (the next turn of a
conversation) only decodes its new suffix.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

import llama_cpp

from podium.engine.base import EngineOutput, EngineRequest, ModelInfo, TokenLogprob
from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
from podium.engine.llamacpp.sampling import Sampler, logits_row, token_logprob
from podium.errors import EngineError

log = logging.getLogger(__name__)
_SEQ = 0


@dataclass(eq=False)
class _Job:
    request: EngineRequest
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue
    aborted: bool = False
    generated: int = field(default=0)

    def emit(self, item: EngineOutput | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)


class LlamaCppEngine:
    def __init__(self, path: Path, *, served_name: str, n_ctx: int = 8192, n_batch: int = 512,
                 n_threads: int = 0):
        self._model = LlamaModel(path, n_ctx=n_ctx, n_batch=n_batch,
                                 n_threads=n_threads or os.cpu_count() or 1)
        self.tokenizer = LlamaTokenizer(self._model)
        self.info = ModelInfo(served_name=served_name, context_length=self._model.n_ctx,
                              chat_template=self._model.metadata.get("tokenizer.chat_template"),
                              created=int(path.stat().st_mtime), metadata=self._model.metadata)
        self._n_batch = n_batch
        self._n_vocab = self.tokenizer.vocab_size
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._cached: list[int] = []          # the tokens whose KV entries sit in the cache
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._active: dict[str, _Job] = {}
        self.stats = {"running": 0, "waiting": 0, "generated_tokens": 0, "requests": 0,
                      "kv_tokens": 0}
        self._worker = threading.Thread(target=self._run, name="podium-llamacpp", daemon=True)
        self._worker.start()

    # -- the boundary -------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        job = _Job(request, asyncio.get_running_loop(), asyncio.Queue())
        self._active[request.request_id] = job
        self.stats["waiting"] += 1
        self._jobs.put(job)
        try:
            while True:
                item = await job.outputs.get()
                if isinstance(item, BaseException):
                    raise EngineError(f"The engine failed: {item}") from item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            job.aborted = True   # a consumer that stops early (disconnect) ends the job
            self._active.pop(request.request_id, None)

    async def abort(self, request_id: str) -> None:
        job = self._active.get(request_id)
        if job is not None:
            job.aborted = True

    async def aclose(self) -> None:
        for job in list(self._active.values()):
            job.aborted = True
        self._jobs.put(None)
        await asyncio.to_thread(self._worker.join)
        llama_cpp.llama_batch_free(self._batch)
        self._model.close()

    # -- the worker thread ------------------------------------------------------------------

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            self.stats["waiting"] -= 1
            if job.aborted:
                continue
            self.stats["running"] += 1
            self.stats["requests"] += 1
            try:
                self._serve(job)
            except Exception as exc:  # noqa: BLE001 - reported to the request, not raised here
                log.exception("decode failed for %s", job.request.request_id)
                self._cached = []
                llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._model.ctx), True)
                job.emit(exc)
            finally:
                self.stats["running"] -= 1

    def _serve(self, job: _Job) -> None:
        req = job.request
        sampler = Sampler(req.sampling, self._n_vocab, self._model.vocab)
        try:
            prompt_logprobs = self._prefill(req.prompt_token_ids, req.prompt_logprobs)
            self._decode_loop(job, sampler, prompt_logprobs)
        finally:
            sampler.close()

    def _decode_loop(self, job: _Job, sampler: Sampler,
                     prompt_logprobs: list[TokenLogprob | None] | None) -> None:
        req, params = job.request, job.request.sampling
        ctx, eog = self._model.ctx, self.tokenizer.eos_token_ids
        if params.max_tokens <= 0:     # scoring only (completions with echo)
            job.emit(EngineOutput([], None, "length", prompt_logprobs))
            return
        while True:
            if job.aborted:
                job.emit(EngineOutput([], finish_reason="abort"))
                return
            token = sampler.sample(ctx, -1)
            logprobs = None
            if req.logprobs is not None:
                logprobs = [token_logprob(logits_row(ctx, -1, self._n_vocab), token,
                                          req.logprobs)]
            job.generated += 1
            self.stats["generated_tokens"] += 1
            finish = None
            if token in params.stop_token_ids or (token in eog and not params.ignore_eos):
                finish = "stop"
            elif job.generated >= params.max_tokens or len(self._cached) + 1 >= self._model.n_ctx:
                finish = "length"
            job.emit(EngineOutput([token], logprobs, finish, prompt_logprobs,
                                  stopped_by_token=finish == "stop"))
            prompt_logprobs = None
            if finish is not None:
                return
            self._decode([token], len(self._cached), logits="last")

    def _prefill(self, prompt: list[int], prompt_logprobs: int | None
                 ) -> list[TokenLogprob | None] | None:
        """Bring the KV cache to ``prompt``, reusing the longest common prefix.

        llama.cpp's numbers depend on how tokens are batched (a token decoded alone and the
        same token inside a batch give logits a few tenths apart). So that an answer depends
        on the prompt alone, not on what the cache happened to hold, batches are aligned to
        absolute positions (multiples of the batch size), reuse only keeps whole aligned
        batches, and the last prompt token is always decoded on its own, like every
        generated token.
        """
        step = self._n_batch if prompt_logprobs is None else min(self._n_batch, 64)
        keep = 0 if prompt_logprobs is not None else _common_prefix(self._cached, prompt)
        keep = min(keep, len(prompt) - 1) // step * step
        mem = llama_cpp.llama_get_memory(self._model.ctx)
        if not llama_cpp.llama_memory_seq_rm(mem, _SEQ, keep, -1):
            llama_cpp.llama_memory_clear(mem, True)
            keep = 0
        self._cached = self._cached[:keep]
        scored: list[TokenLogprob | None] | None = [None] if prompt_logprobs is not None else None
        body = len(prompt) - 1
        for start in range(keep, body, step):
            end = min(start + step, body)
            self._decode(prompt[start:end], start, logits="all" if scored is not None else "none")
            if scored is not None:
                scored += self._score_chunk(prompt, start, end - start, prompt_logprobs)
        self._decode(prompt[body:], body, logits="last")
        return scored

    def _score_chunk(self, prompt: list[int], start: int, n: int, top: int
                     ) -> list[TokenLogprob]:
        return [token_logprob(logits_row(self._model.ctx, i, self._n_vocab), prompt[start + i + 1],
                              top) for i in range(n)]

    def _decode(self, tokens: list[int], pos: int, *, logits: str) -> None:
        """One ``llama_decode``; ``logits`` says which outputs to keep: none, last or all."""
        b = self._batch
        b.n_tokens = len(tokens)
        last = len(tokens) - 1
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = _SEQ
            b.logits[i] = logits == "all" or (logits == "last" and i == last)
        rc = llama_cpp.llama_decode(self._model.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self._cached.extend(tokens)
        self.stats["kv_tokens"] = len(self._cached)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i

