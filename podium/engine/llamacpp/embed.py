"""An embedding model on llama.cpp: an embeddings context with the model's own pooling.

``LlamaEmbedder.embed(inputs)`` takes token ids and gives one vector per input. A worker thread
packs the queued inputs of every request into one decode (up to ``n_seq`` sequences and
``n_batch`` tokens; an encoder model reads a whole sequence in one pass, so ``n_batch`` is at
least the model's context), reads each sequence's pooled vector (the pooling llama.cpp takes
from the file: mean, CLS or last token), normalizes it when the model does, and hands each
request its vectors once all of its inputs are done.

Priority and fairness: each decode takes its inputs from the requests of the highest
priority waiting, one input from each in turn (round-robin; lower priorities fill what room
is left). An interactive request (0) queued behind a batch request's 2,048 inputs (-1) waits
only for the decode in progress; so does a 1-input request queued behind another request's
2,048 inputs of its own priority: it shares the next decode, instead of waiting minutes for
the whole list.

Leaving: a request whose caller stopped waiting (its client gone: its task cancelled) is
dropped when the next decode is packed, so at most the decode in progress is spent on it.

Why 512 tokens a decode, not more: llama.cpp attends over every token of a decode at once
(other sequences' masked out, but computed), so attention grows with the square of the
decode's tokens while the matrix products grow linearly. For all-MiniLM-L6-v2 and inputs of
64 tokens on 2 cores, 8 inputs a decode (512 tokens) embedded 88-89 inputs/s, 16 81-82,
32 56-71, 1 69-84 (docs/performance.md, "Embeddings").

Why two contexts: llama.cpp's flash attention makes a decode of several inputs 2-3 times
faster (it skips what the mask hides) and a decode of one input ~15% slower. A decode of
one input runs in a second context without it (one sequence of the model's context: a few
MB for MiniLM); its vector differs from the packed one in the last bits (cosine 0.9999997).
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp

from podium.engine.base import ENGINE_STATS, Capabilities, EngineStats, ModelInfo
from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer, shut_down
from podium.errors import InvalidRequestError, RateLimited

log = logging.getLogger(__name__)

NORMALIZE_KEY = "podium.normalize"      # written by convert.py: the model's Normalize module
MAX_SEQ_KEY = "podium.max_seq_length"   # and its max_seq_length
POOLINGS = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def _pair_tokens(vocab) -> tuple[list[int], list[int], list[int]]:  # noqa: ANN001
    """The special tokens around a query and a document in a reranker's input, from the
    vocabulary's own flags: the beginning token if it adds one; between the two, its end
    token if it adds one and its separator if it adds one; after the document, its end token
    (else its separator). BERT: [CLS] q [SEP] d [SEP]; XLM-RoBERTa: <s> q </s> </s> d </s>."""
    bos, eos, sep = (llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab),
                     llama_cpp.llama_vocab_sep(vocab))
    add_eos = llama_cpp.llama_vocab_get_add_eos(vocab) and eos >= 0
    add_sep = llama_cpp.llama_vocab_get_add_sep(vocab) and sep >= 0
    open_ = [bos] if llama_cpp.llama_vocab_get_add_bos(vocab) and bos >= 0 else []
    middle = ([eos] if add_eos else []) + ([sep] if add_sep else [])
    close = [eos] if add_eos else [sep] if add_sep else []
    return open_, middle, close


@dataclass(eq=False)
class _Job:
    inputs: list[list[int]]
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future
    priority: int = 0
    vectors: list[list[float] | None] = field(default_factory=list)
    left: int = 0
    failed: bool = False            # nothing more of it is wanted (its caller left, or it failed)
    taken: int = 0                  # inputs handed to a decode so far (worker thread only)


class LlamaEmbedder:
    capabilities = Capabilities(sampling=False, grammar=False, logprobs=False,
                                prefix_cache=False)
    kind = "embedding"      # "rerank" for a model with llama.cpp's rank pooling
    pair_overhead = 0       # a reranker's special tokens around a query and a document

    def __init__(self, path: Path, *, served_name: str, n_seq: int = 32, n_batch: int = 512,
                 n_threads: int = 0, max_queued: int = 4096):
        probe = LlamaModel(path, vocab_only=True)       # (its n_ctx_train reads 0)
        arch = probe.metadata.get("general.architecture", "")
        n_ctx = int(probe.metadata.get(f"{arch}.context_length", "512"))
        # the longest input the model was trained on as an embedder (sentence-transformers'
        # max_seq_length, which convert.py keeps): 256 for MiniLM, whose positions go to 512
        n_ctx = min(n_ctx, int(probe.metadata.get(MAX_SEQ_KEY, n_ctx)))
        probe.close()
        self._n_batch = max(n_batch, n_ctx)
        self._model = LlamaModel(path, n_ctx=n_ctx, n_batch=self._n_batch, n_threads=n_threads,
                                 n_seq_max=n_seq, embeddings=True)
        # one input alone decodes faster without flash attention, several packed far slower
        self._single = self._model.add_context(n_ctx, n_ctx, n_threads, embeddings=True,
                                               flash_attention=False)
        self.tokenizer = LlamaTokenizer(self._model)
        meta = self._model.metadata
        self.pooling = POOLINGS.get(llama_cpp.llama_pooling_type(self._model.ctx), "mean")
        if self.pooling == "none":
            self._model.close()
            raise ValueError(f"{path} has no pooling: it gives a vector per token, not one "
                             f"per input")
        self.normalize = meta.get(NORMALIZE_KEY, "true").lower() in ("true", "1")
        self.dimensions = llama_cpp.llama_model_n_embd(self._model.model)
        if self.pooling == "rank":          # a reranker: its head's scores, as they are
            self.kind, self.normalize = "rerank", False
            self.dimensions = llama_cpp.llama_model_n_cls_out(self._model.model)
            self._pair = _pair_tokens(self._model.vocab)
            self.pair_overhead = sum(len(part) for part in self._pair)
        self.info = ModelInfo(served_name=served_name, context_length=n_ctx,
                              chat_template=None, created=int(path.stat().st_mtime),
                              metadata=meta)
        self._n_seq = n_seq
        self._max_queued = max_queued
        self._queued = 0                    # inputs waiting (event loop only)
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._closing = False
        self.decodes = 0                    # batches decoded (how well inputs were packed)
        self.stats = EngineStats(*ENGINE_STATS)
        self._worker = threading.Thread(target=self._run, name="podium-embed", daemon=True)
        self._worker.start()

    # -- the boundary -------------------------------------------------------------------

    async def embed(self, inputs: list[list[int]], priority: int = 0) -> list[list[float]]:
        """One vector per input (each at most the model's context, non-empty), embedded
        before every waiting input of lower ``priority``."""
        if self._closing:
            raise RuntimeError("the model was unloaded")
        for i, ids in enumerate(inputs):
            if not ids or len(ids) > self.info.context_length:
                raise InvalidRequestError(
                    f"input {i} has {len(ids)} tokens; this model takes 1 to "
                    f"{self.info.context_length}", param=f"input[{i}]")
        if self._queued + len(inputs) > self._max_queued:
            raise RateLimited(f"{self._queued} inputs are waiting to be embedded; try again "
                              f"shortly")
        loop = asyncio.get_running_loop()
        job = _Job(inputs, loop, loop.create_future(), priority, [None] * len(inputs),
                   len(inputs))
        self._queued += len(inputs)
        self.stats["waiting"] += len(inputs)
        self._jobs.put(job)
        try:
            return await job.done
        finally:
            self._queued -= len(inputs)
            self.stats["waiting"] -= len(inputs)
            # However the wait ended, nothing more is wanted: a caller who left (its task
            # cancelled) cancelled ``job.done`` too, so "not done" cannot tell it apart.
            job.failed = True

    async def score(self, query: list[int], documents: list[list[int]], priority: int = 0
                    ) -> list[float]:
        """A reranker's relevance of each document to the query, in [0, 1]: the pair read
        as the model was trained (``[CLS] query [SEP] document [SEP]``, or ``<s> query </s>
        </s> document </s>``) and the sigmoid of its head's first output, applied once
        (llama.cpp gives the raw logit). Ids without the model's special tokens; the pairs
        are embedded at ``priority``."""
        if self.kind != "rerank":
            raise InvalidRequestError(f"'{self.info.served_name}' is an embedding model, not "
                                      f"a reranker", param="model")
        open_, middle, close = self._pair
        pairs = [[*open_, *query, *middle, *doc, *close] for doc in documents]
        return [1 / (1 + math.exp(-max(-60.0, min(60.0, out[0]))))
                for out in await self.embed(pairs, priority)]

    def check_grammar(self, grammar: str) -> None:
        pass                    # check_room refuses generation on this model first

    def check_room(self, n: int = 1) -> None:
        if self.kind == "rerank":
            raise InvalidRequestError(f"'{self.info.served_name}' is a reranker: it serves "
                                      f"/v1/rerank, not text generation", param="model")
        raise InvalidRequestError(f"'{self.info.served_name}' is an embedding model: it "
                                  f"serves /v1/embeddings, not text generation",
                                  param="model")

    def generate(self, request):            # noqa: ANN001 - refused (check_room first)
        self.check_room()

    async def abort(self, request_id: str) -> None:
        return None

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._jobs.put(None)
        await shut_down(self._worker, self._batch, self._model)

    # -- the worker thread --------------------------------------------------------------

    def _run(self) -> None:
        waiting = _Waiting()
        while self._take_new(waiting):
            pack = waiting.pack(self._n_seq, self._n_batch)
            if pack:
                self._embed_pack(pack)
        self._fail_all(waiting)

    def _take_new(self, waiting: _Waiting) -> bool:
        """The requests queued since the last decode added to ``waiting`` (waiting for one
        when there is nothing to do); False once the embedder closes."""
        block = not waiting
        try:
            while True:
                job = self._jobs.get(block=block)
                block = False
                if job is None:
                    return False
                waiting.add(job)
        except queue.Empty:
            return True

    def _embed_pack(self, pack: list[tuple[_Job, int]]) -> None:
        try:
            vectors = self._decode([job.inputs[i] for job, i in pack])
        except Exception as exc:  # noqa: BLE001 - the requests are told
            log.exception("embedding decode failed")
            for job, _ in pack:
                job.failed = True
                self._settle(job, exc)
            return
        for (job, i), vector in zip(pack, vectors):
            job.vectors[i] = vector
            job.left -= 1
            if job.left == 0 and not job.failed:    # (a caller gone: its loop may be too)
                self._settle(job, None)

    def _decode(self, inputs: list[list[int]]) -> list[list[float]]:
        ctx, b = self._single if len(inputs) == 1 else self._model.ctx, self._batch
        memory = llama_cpp.llama_get_memory(ctx)
        if memory:
            llama_cpp.llama_memory_clear(memory, True)
        n = 0
        for seq, ids in enumerate(inputs):
            for pos, token in enumerate(ids):
                b.token[n], b.pos[n], b.n_seq_id[n] = token, pos, 1
                b.seq_id[n][0], b.logits[n] = seq, True
                n += 1
        b.n_tokens = n
        if llama_cpp.llama_decode(ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        self.decodes += 1
        out = []
        for seq in range(len(inputs)):
            ptr = llama_cpp.llama_get_embeddings_seq(ctx, seq)
            vector = list(ptr[:self.dimensions])
            if self.normalize:
                norm = math.sqrt(sum(x * x for x in vector)) or 1.0
                vector = [x / norm for x in vector]
            out.append(vector)
        self.stats["requests"] += len(inputs)
        return out

    def _settle(self, job: _Job, exc: BaseException | None) -> None:
        def settle() -> None:
            if job.done.done():
                return
            if exc is not None:
                job.done.set_exception(exc)
            else:
                job.done.set_result(job.vectors)
        job.loop.call_soon_threadsafe(settle)

    def _fail_all(self, waiting: _Waiting) -> None:
        for job in waiting.jobs():
            self._settle(job, RuntimeError("the model was unloaded"))


class _Waiting:
    """The requests whose inputs wait to be embedded (the worker thread's alone): a queue
    of requests per priority. A decode is packed from the highest priority down, one input
    of each request in turn, so every request waiting at a priority advances at the same
    pace, however many inputs it brought. Packing costs O(inputs taken + requests dropped)."""

    def __init__(self) -> None:
        self._levels: dict[int, deque[_Job]] = {}

    def __bool__(self) -> bool:
        return bool(self._levels)

    def add(self, job: _Job) -> None:
        self._levels.setdefault(job.priority, deque()).append(job)

    def jobs(self) -> list[_Job]:
        return [job for level in self._levels.values() for job in level]

    def pack(self, n_seq: int, n_batch: int) -> list[tuple[_Job, int]]:
        """The next decode's (request, input index) pairs: at most ``n_seq`` inputs of at
        most ``n_batch`` tokens together. Requests no longer wanted are dropped here; an
        input that does not fit ends the pack and leads the next one."""
        pack: list[tuple[_Job, int]] = []
        tokens = 0
        for priority in sorted(self._levels, reverse=True):
            level = self._levels[priority]
            while level and len(pack) < n_seq:
                job = level[0]
                if job.failed:
                    level.popleft()
                    continue
                n = len(job.inputs[job.taken])
                if tokens + n > n_batch:
                    break
                pack.append((job, job.taken))
                job.taken, tokens = job.taken + 1, tokens + n
                if job.taken == len(job.inputs):
                    level.popleft()
                else:
                    level.rotate(-1)        # its next input after every other request's
            if not level:
                del self._levels[priority]
            if len(pack) == n_seq or (level and not level[0].failed):
                break
        return pack
