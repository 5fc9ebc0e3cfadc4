"""What a llama.cpp model will hold in memory, estimated from its GGUF file before it loads.

``estimate(path, n_ctx=..., n_seq=...)`` reads the file's metadata with llama.cpp itself (a
``vocab_only`` load: the header and the vocabulary, never the tensor data; ~0.3-0.5 s) and
adds up, for the context Podium's engine creates (``model.LlamaModel``: ``n_ctx`` tokens per
sequence, one KV stream per sequence, ``kv_unified`` off, llama.cpp's defaults otherwise:
f16 cache; flash attention off under ``--deterministic``, llama.cpp's ``auto`` otherwise):

- **weights**: the file's size (with its split siblings'). llama.cpp maps the file and
  the whole of its tensor data is resident once it has loaded (measured: the file-backed
  RSS grows by the tensor bytes, the header's few MiB excepted). With repacked weights
  (``--no-deterministic``) the repacked tensors are copied too: ``REPACK_SHARE`` of the
  weights is added (5.7% and 5.1% measured on the two Q4_K_M models below; a Q4_0 file
  repacks nearly all of its weights).
- **kv_cache**: per layer, K and V rows of ``n_head_kv * key_length`` (``value_length``)
  elements in the cache type, for every cell of every stream. llama.cpp pads the context to
  a multiple of 256, then each sequence's share again; it zeroes the cache when it makes
  it, so all of it is resident at once. Sliding-window layers (gemma2/3, cohere2, gpt-oss)
  get a smaller cache only with ``swa_full=False``: ``n_swa + n_ubatch`` cells per stream,
  rounded up to 256. llama.cpp's default, which Podium keeps, is ``swa_full=True``: every
  layer holds the full context (llama-cpp-python 0.3.36, checked in its logs:
  "using full-size SWA cache"; gemma3 270M at the server's defaults: 2304 MiB of KV
  cache, 429 MiB with ``swa_full=False``).
- **buffers**: what loading leaves on the heap (``VOCAB_AND_REST``), the compute buffer and
  the output buffer. llama.cpp reserves the compute buffer for a whole ``n_ubatch`` chunk
  of logits (4 * n_ubatch * (n_vocab + 2 * n_embd) bytes measured on both models, flash
  attention on), but pages become resident only where a decode writes: the logits rows it
  asks for. The engine asks for at most ``SCORED_ROWS`` (a prompt scored for logprobs) or
  one row per sequence, and the output buffer grows to as many rows. So: the vocabulary
  and the rest, twice that many rows of logits (compute and output), and the chunk's
  hidden states. Measured on the default model and Gemma 3 270M (bench/models.py
  estimate); a model whose feed-forward outweighs its vocabulary would need more.

Nothing here is a promise of llama.cpp's: tests/engine/test_estimate.py loads both models in
fresh processes and holds the estimate to within 15% of the resident memory they gain, its
shape to what llama.cpp reports after the load, and its KV cache to what llama.cpp logs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp

from podium.errors import ModelFilesError

MAX_SEQ = 256                   # llama.cpp's LLAMA_MAX_SEQ
MiB = 2**20
# What loading leaves on the heap besides the KV cache (the vocabulary, merges, threads):
# 45.7 MiB measured for qwen2 (152k tokens, 151k merges), 41.6 MiB for gemma3 (262k tokens)
VOCAB_AND_REST = 48 * MiB
SCORED_ROWS = 64                # logits rows of a scored prompt chunk (the engine's chunk)
REPACK_SHARE = 0.10             # weights copied when repacked (--no-deterministic)
CELL_PAD = 256                  # llama.cpp pads the context (and each stream) to this

# KV cache types llama.cpp accepts: (elements per block, bytes per block)
CACHE_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18),
    "q4_1": (32, 20), "iq4_nl": (32, 18), "q5_0": (32, 22), "q5_1": (32, 24),
}

# Which layers slide, as llama.cpp builds them in (set_swa_pattern(n): of every n layers the
# first n - 1 slide, the last is full; checked for gemma3 in its load log). Only counts with
# swa_full=False; an architecture not listed is counted as all full, the most it can hold.
SWA_PATTERNS: dict[str, int] = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gpt-oss": 2}


@dataclass(frozen=True)
class ModelShape:
    """The metadata an estimate needs, from the file's header as llama.cpp reads it."""

    architecture: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_embd: int
    head_dim_k: int             # key_length, else n_embd / n_head
    head_dim_v: int             # value_length, else n_embd / n_head
    n_ctx_train: int
    n_vocab: int
    n_swa: int                  # sliding window in tokens, 0: none
    swa_layers: int             # layers that use it (when known; else 0)
    file_bytes: int             # the file, with its split siblings
    recurrent: bool = False     # recurrent or hybrid: its state is not a KV cache


@dataclass(frozen=True)
class Estimate:
    shape: ModelShape
    n_ctx_seq: int              # cells per sequence llama.cpp allocates
    n_seq: int
    cache_type: str
    weights: int                # bytes
    kv_cache: int
    buffers: int                # compute and output buffers, what loading leaves behind
    notes: tuple[str, ...] = field(default=())

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.buffers

    def as_dict(self) -> dict[str, int | str]:
        return {"weights": self.weights, "kv_cache": self.kv_cache, "buffers": self.buffers,
                "total": self.total, "n_ctx_seq": self.n_ctx_seq, "n_seq": self.n_seq,
                "cache_type": self.cache_type}


def estimate(path: Path | str, *, n_ctx: int = 0, n_seq: int = 1, n_batch: int = 128,
             cache_type: str = "f16", cache_type_v: str | None = None,
             swa_full: bool = True, kv_unified: bool = False, repack: bool = False,
             shape: ModelShape | None = None) -> Estimate:
    """The memory ``path`` will hold once loaded as Podium's engine loads it.

    ``n_ctx``: tokens per sequence (``--ctx-size``; 0: the trained length), ``n_seq``:
    sequences (``--max-num-seqs``), ``n_batch``: ``--batch-size`` (llama.cpp's n_ubatch too),
    ``repack``: repacked weights (``--no-deterministic``). ``shape``: the file's metadata
    when already read (``read_shape``).
    """
    if not 1 <= n_seq <= MAX_SEQ:
        raise ValueError(f"n_seq must be 1..{MAX_SEQ}, not {n_seq}")
    if n_ctx < 0 or n_batch < 1:
        raise ValueError("n_ctx must be >= 0 and n_batch >= 1")
    for name in (cache_type, cache_type_v or cache_type):
        if name not in CACHE_TYPES:
            raise ValueError(f"unknown cache type {name!r} (one of {', '.join(CACHE_TYPES)})")
    shape = shape or read_shape(Path(path))
    n_ctx_seq, streams = context_cells(shape, n_ctx, n_seq, kv_unified)
    n_ubatch = min(n_batch, n_ctx_seq * streams)
    swa_layers, notes = _swa_layers(shape, swa_full)
    swa_cells = min(n_ctx_seq, _pad(shape.n_swa * (n_seq if kv_unified else 1) + n_ubatch))
    cells = (shape.n_layer - swa_layers) * n_ctx_seq + swa_layers * swa_cells
    row = (_row_bytes(cache_type, shape.n_head_kv * shape.head_dim_k)
           + _row_bytes(cache_type_v or cache_type, shape.n_head_kv * shape.head_dim_v))
    if shape.recurrent:
        notes += ("recurrent or hybrid model: its recurrent state is not counted",)
    weights = shape.file_bytes + (int(shape.file_bytes * REPACK_SHARE) if repack else 0)
    return Estimate(shape=shape, n_ctx_seq=n_ctx_seq, n_seq=n_seq, cache_type=cache_type,
                    weights=weights, kv_cache=row * streams * cells,
                    buffers=_buffers(shape, n_ubatch, n_seq), notes=notes)


def context_cells(shape: ModelShape, n_ctx: int, n_seq: int,
                  kv_unified: bool = False) -> tuple[int, int]:
    """(cells per stream, streams) llama.cpp allocates for ``n_ctx`` tokens per sequence.

    Podium asks for ``n_ctx * n_seq`` tokens (model.LlamaModel); llama.cpp pads that to 256,
    then, one stream per sequence, pads each stream's share to 256 again.
    """
    total = _pad((n_ctx or shape.n_ctx_train) * n_seq)
    if kv_unified:
        return total, 1
    return _pad(total // n_seq), n_seq


def _buffers(shape: ModelShape, n_ubatch: int, n_seq: int) -> int:
    """Compute and output buffers and the rest, by the rule in the module docstring."""
    rows = min(n_ubatch, max(SCORED_ROWS, n_seq))
    logits = 4 * shape.n_vocab * rows
    return VOCAB_AND_REST + 2 * logits + 4 * n_ubatch * 2 * shape.n_embd


def _swa_layers(shape: ModelShape, swa_full: bool) -> tuple[int, tuple[str, ...]]:
    if shape.n_swa <= 0 or swa_full:
        return 0, ()
    if shape.swa_layers:
        return shape.swa_layers, ()
    return 0, (f"sliding-window layers of {shape.architecture} unknown: counted as full",)


def _row_bytes(cache_type: str, elements: int) -> int:
    block, size = CACHE_TYPES[cache_type]
    return -(-elements // block) * size


def _pad(n: int) -> int:
    return -(-n // CELL_PAD) * CELL_PAD


# -- reading the file ---------------------------------------------------------------------

def read_shape(path: Path) -> ModelShape:
    """The file's shape, read by llama.cpp without its tensor data (``vocab_only``)."""
    from podium.engine.llamacpp.model import LlamaModel

    if not path.is_file():
        raise ModelFilesError(f"Model file not found: {path}")
    model = LlamaModel(path, vocab_only=True)
    try:
        return _shape(model.model, model.metadata, path)
    finally:
        model.close()


def _shape(model, meta: dict[str, str], path: Path) -> ModelShape:
    """The shape from the file's metadata strings (a ``vocab_only`` model has no hparams:
    llama.cpp's ``llama_model_n_*`` answer 0 for it). llama.cpp leaves arrays out of these
    strings: a per-layer ``head_count_kv`` is then taken as ``head_count``, the most it can be."""
    arch = meta.get("general.architecture", "")
    key = f"{arch}."
    n_layer = _int(meta, key + "block_count", 0)
    n_embd = _int(meta, key + "embedding_length", 0)
    n_head = _int(meta, key + "attention.head_count", 0)
    if not (arch and n_layer and n_embd and n_head):
        raise ModelFilesError(f"{path.name}: no layer count, width or head count in its "
                              f"metadata (architecture {arch!r})")
    head_dim = n_embd // n_head
    n_swa = _int(meta, key + "attention.sliding_window", 0)
    pattern = SWA_PATTERNS.get(arch, 0)
    swa_layers = sum(il % pattern < pattern - 1 for il in range(n_layer)) if pattern else 0
    return ModelShape(
        architecture=arch, n_layer=n_layer, n_head=n_head,
        n_head_kv=_int(meta, key + "attention.head_count_kv", n_head), n_embd=n_embd,
        head_dim_k=_int(meta, key + "attention.key_length", head_dim),
        head_dim_v=_int(meta, key + "attention.value_length", head_dim),
        n_ctx_train=_int(meta, key + "context_length", 0),
        n_vocab=llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)),
        n_swa=n_swa, swa_layers=swa_layers if n_swa > 0 else 0,
        file_bytes=sum(p.stat().st_size for p in split_files(path, meta)),
        recurrent=any(k.startswith((key + "ssm.", key + "wkv.", key + "shortconv."))
                      for k in meta))


def _int(meta: dict[str, str], key: str, default: int) -> int:
    value = meta.get(key, "")
    return int(value) if value.isdigit() and len(value) <= 18 else default


_SPLIT = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


def split_files(path: Path, meta: dict[str, str]) -> list[Path]:
    """The files of a split GGUF model (``name-00001-of-00003.gguf`` ...), else ``[path]``."""
    count = _int(meta, "split.count", 1)
    found = _SPLIT.match(path.name)
    if count <= 1 or not found or int(found.group(3)) != count:
        return [path]
    files = [path.with_name(f"{found.group(1)}-{i:05d}-of-{count:05d}.gguf")
             for i in range(1, count + 1)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelFilesError(f"Split model {path.name} lacks {', '.join(missing)}")
    return files


def resident_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc``), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
