"""A loaded model and what speaks to it; how a model's engine is made and estimated.

``Served`` is what ``Models`` (podium/models.py) holds for a loaded model: its engine, its
dialect (template, parsers or Harmony) and the per-model half of each API's service, all
made with the model's own settings. The app finds it by the request's ``model``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from podium.api.chat import ChatService
from podium.api.completions import CompletionService
from podium.api.embeddings import EmbeddingService, matryoshka
from podium.api.messages import MessagesService
from podium.api.responses.planner import Planner
from podium.api.tokenize import TokenizeService
from podium.dialect import Dialect
from podium.dialect import select as select_dialect
from podium.engine.base import Engine
from podium.models import ModelConfig
from podium.settings import Settings

if TYPE_CHECKING:
    from podium.api.conversations import ConversationsService
    from podium.engine.llamacpp.prompt_cache import PromptCache
    from podium.api.sealing import Sealer
    from podium.store.base import ResponseStore

log = logging.getLogger("podium.models")


@dataclass(eq=False)
class Served:
    name: str
    settings: Settings          # the model's own
    engine: Engine
    dialect: Dialect
    chat: ChatService
    completions: CompletionService
    messages: MessagesService
    planner: Planner            # the Responses API's, for this model
    tokens: TokenizeService     # /tokenize and /detokenize
    embeddings: EmbeddingService
    resident: int | None = None     # resident memory its load added (bytes), if measured

    async def aclose(self) -> None:
        """Unload: the engine closes and frees its memory; nothing here is used again."""
        await self.engine.aclose()


class Loader:
    """Makes a model's ``Served``: its engine (loaded off the event loop), its dialect, its
    services over the server's store, sealer and conversations."""

    def __init__(self, store: ResponseStore, sealer: Sealer,
                 conversations: ConversationsService,
                 make: Callable[[Settings, str, str], Engine] | None = None):
        """``make``: the engine maker (``make_engine``; a test gives its own)."""
        self._store, self._sealer, self._conversations = store, sealer, conversations
        self._make = make or make_engine

    async def load(self, config: ModelConfig) -> Served:
        if config.kind == "auto":
            config.kind = await asyncio.to_thread(detect_kind, config)
        started, before = time.monotonic(), resident_bytes()
        engine = await asyncio.to_thread(self._make, config.source, config.name, config.kind)
        try:
            served = self.serve(config, engine)
        except BaseException:
            await engine.aclose()
            raise
        after = resident_bytes()
        served.resident = after - before if after is not None and before is not None else None
        log.info("model %s: engine ready in %.2f s (context %d tokens; memory estimated "
                 "%.0f MiB, resident growth %s)", config.name, time.monotonic() - started,
                 engine.info.context_length, config.estimate / 2**20,
                 f"{served.resident / 2**20:.0f} MiB" if served.resident is not None
                 else "unknown")
        return served

    def serve(self, config: ModelConfig, engine: Engine) -> Served:
        """What speaks to ``engine``, a loaded model (a bad template or parser: ValueError)."""
        settings: Settings = config.source
        dialect = select_dialect(engine, settings)
        return Served(config.name, settings, engine, dialect,
                      ChatService(engine, dialect, settings),
                      CompletionService(engine, settings),
                      MessagesService(engine, dialect, settings, self._sealer),
                      Planner(engine, dialect, self._store, settings, self._sealer,
                              self._conversations),
                      TokenizeService(engine, dialect),
                      EmbeddingService(engine, _matryoshka(settings, engine),
                                       settings.max_embedding_tokens))


def make_engine(settings: Settings, name: str, kind: str = "chat",
                loop: asyncio.AbstractEventLoop | None = None) -> Engine:
    """The model's engine, loaded (blocking: seconds to minutes). vLLM lives on ``loop``
    (the server's, not running yet) when given, else on a loop of its own. ``kind``
    embedding: llama.cpp's embeddings context, or vLLM's pooling runner."""
    engine: Engine
    if settings.engine != "llamacpp":       # every option checked before vLLM starts
        from podium.engine.vllm.options import vllm_engine

        path, engine = vllm_engine(settings, name, loop=loop, kind=kind)
    elif kind in ("embedding", "rerank"):
        from podium.engine.llamacpp.embed import LlamaEmbedder
        from podium.engine.llamacpp.model_files import resolve_model

        path = resolve_model(settings.spec, settings.model_file)
        engine = LlamaEmbedder(path, served_name=name, n_threads=settings.threads)
    else:
        from podium.engine.llamacpp.engine import LlamaCppEngine
        from podium.engine.llamacpp.model_files import resolve_model

        path = resolve_model(settings.spec, settings.model_file)
        engine = LlamaCppEngine(path, served_name=name, prompt_cache=prompt_cache(settings, path),
                                n_ctx=settings.ctx_size, n_batch=settings.batch_size,
                                n_threads=settings.threads, max_num_seqs=settings.max_num_seqs,
                                max_queued=settings.max_queued_requests,
                                deterministic=settings.deterministic,
                                grammar_ms_per_token=settings.grammar_ms_per_token,
                                speculative=settings.speculative)
    log.info("model %s: %s (context %d tokens)", name, path, engine.info.context_length)
    return engine


def prompt_cache(settings: Settings, path: Path) -> PromptCache | None:
    """The llama.cpp model's prompt cache (``--prompt-cache-disk``; None: off): on disk
    under ``--prompt-cache-dir``, its entries keyed to this model and these settings, and in
    memory up to ``--prompt-cache-memory``."""
    limit = settings.prompt_cache_bytes()
    if not limit:
        return None
    from podium.engine.llamacpp.engine import kv_fingerprint
    from podium.engine.llamacpp.prompt_cache import PromptCache
    from podium.store.sql import data_dir

    directory = Path(settings.prompt_cache_dir) if settings.prompt_cache_dir else \
        data_dir() / "prompt-cache"
    return PromptCache(directory, kv_fingerprint(path, n_ctx=settings.ctx_size,
                                                 n_batch=settings.batch_size,
                                                 deterministic=settings.deterministic),
                       max_bytes=limit, min_tokens=settings.prompt_cache_min_tokens,
                       block=settings.batch_size,
                       memory_bytes=settings.prompt_cache_memory_bytes())


def prompt_cache_memory(config: ModelConfig) -> int:
    """The memory a model's prompt cache may hold (bytes): ``--prompt-cache-memory`` for a
    llama.cpp chat model with a prompt cache (a model whose kind is still ``auto`` counts
    it: better too high an estimate than too low); 0 for others."""
    settings: Settings = config.source
    if settings.engine != "llamacpp" or config.kind in ("embedding", "rerank") \
            or not settings.prompt_cache_bytes():
        return 0
    return settings.prompt_cache_memory_bytes()


def estimate(config: ModelConfig) -> int:
    """The memory a llama.cpp model will hold once loaded (bytes, from its file's metadata,
    and its prompt cache's memory tier; blocking, about a tenth of a second); 0 for vLLM,
    whose memory is its own settings' share (--gpu-memory-utilization)."""
    settings: Settings = config.source
    if settings.engine != "llamacpp":
        return 0
    from podium.engine.llamacpp.estimate import estimate as llama_estimate
    from podium.engine.llamacpp.model import use_extra_buffers
    from podium.engine.llamacpp.model_files import resolve_model

    path = resolve_model(settings.spec, settings.model_file)
    return llama_estimate(path, n_ctx=settings.ctx_size, n_seq=max(1, settings.max_num_seqs),
                          n_batch=settings.batch_size,
                          repack=use_extra_buffers(not settings.deterministic)).total \
        + prompt_cache_memory(config)


def detect_kind(config: ModelConfig) -> str:
    """What a model is for, from its files: a GGUF that declares a pooling (mean, CLS, last
    token), or a sentence-transformers folder (a Pooling module; vLLM), is an embedding
    model; a GGUF with rank pooling, or a ...ForSequenceClassification folder (a
    cross-encoder; vLLM), a reranker; the rest chat models."""
    settings: Settings = config.source
    if settings.engine != "llamacpp":           # a sentence-transformers folder: embedding
        folder = Path(settings.spec or "").expanduser()
        modules = folder / "modules.json"
        if folder.is_dir() and modules.is_file() and "Pooling" in modules.read_text()[:65536]:
            return "embedding"
        hf_config = folder / "config.json"
        if folder.is_dir() and hf_config.is_file() and hf_config.stat().st_size <= 1 << 20:
            try:
                architectures = json.loads(hf_config.read_bytes()).get("architectures") or []
            except (ValueError, AttributeError):
                architectures = []
            if any(str(a).endswith("ForSequenceClassification") for a in architectures):
                return "rerank"                 # a cross-encoder: vLLM's score runner
        return "chat"
    from podium.engine.llamacpp.model import LlamaModel
    from podium.engine.llamacpp.model_files import resolve_model

    model = LlamaModel(resolve_model(settings.spec, settings.model_file), vocab_only=True)
    try:
        arch = model.metadata.get("general.architecture", "")
        pooling = model.metadata.get(f"{arch}.pooling_type")
    finally:
        model.close()
    return {"1": "embedding", "2": "embedding", "3": "embedding", "4": "rerank"}.get(
        pooling or "", "chat")


def _matryoshka(settings: Settings, engine: Engine) -> tuple[int, ...] | None:
    """The lengths an embedding model's vectors may be shortened to: the setting, else its
    GGUF's key (convert.py's), else its Hugging Face folder's config.json."""
    if getattr(engine, "kind", "chat") != "embedding":
        return None
    from podium.engine.llamacpp.convert import MATRYOSHKA_KEY, declared_matryoshka

    declared = engine.info.metadata.get(MATRYOSHKA_KEY)
    config = Path(settings.spec or "").expanduser() / "config.json"
    if declared is None and settings.engine != "llamacpp" and config.is_file() \
            and config.stat().st_size <= 1 << 20:
        try:
            declared = declared_matryoshka(json.loads(config.read_bytes()))
        except ValueError:
            declared = None
    return matryoshka(settings.matryoshka_dimensions, declared)


def resident_bytes() -> int | None:
    """This process's resident memory (Linux), else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
