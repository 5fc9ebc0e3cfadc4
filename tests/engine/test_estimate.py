"""The memory a llama.cpp model will hold, estimated before it loads, against real loads.

The real part loads the default model and Gemma 3 270M in fresh processes
(bench/models.py measure), at 4096 tokens for one sequence and at the server's defaults (the
trained length for each of 4 sequences), and holds the estimate to within 15% of the resident
memory the process gains, and its metadata to what llama.cpp reports after the load.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import replace
from pathlib import Path

import pytest

from podium.engine.llamacpp.estimate import (ModelShape, context_cells, estimate, read_shape,
                                             resident_bytes, split_files)
from podium.engine.llamacpp.model_files import GEMMA_MODEL, default_model_path
from podium.errors import ModelFilesError
from podium.settings import Settings

_spec = importlib.util.spec_from_file_location(
    "bench_models", Path(__file__).resolve().parents[2] / "bench" / "models.py")
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

DEFAULTS = Settings()
SETTINGS = [(4096, 1), (DEFAULTS.ctx_size, DEFAULTS.max_num_seqs)]
MiB = 2**20

SHAPE = ModelShape(architecture="gemma3", n_layer=18, n_head=4, n_head_kv=1, n_embd=640,
                   head_dim_k=256, head_dim_v=256, n_ctx_train=32768, n_vocab=262144,
                   n_swa=512, swa_layers=15, file_bytes=253_113_024)


# -- without a model ------------------------------------------------------------------------

def test_context_padded_as_llama_cpp_pads_it():
    assert context_cells(SHAPE, 4096, 1) == (4096, 1)
    assert context_cells(SHAPE, 1000, 3) == (1024, 3)      # 3000 -> 3072 -> 1024 a stream
    assert context_cells(SHAPE, 0, 4) == (32768, 4)        # the trained length each
    assert context_cells(SHAPE, 100, 4, kv_unified=True) == (512, 1)


def test_kv_cache_bytes_per_cache_type():
    f16 = estimate("unused", n_ctx=4096, n_seq=1, shape=SHAPE)
    assert f16.kv_cache == 18 * 4096 * (2 * 256 * 2)       # layers x cells x (K + V) row
    q8 = estimate("unused", n_ctx=4096, n_seq=1, cache_type="q8_0", shape=SHAPE)
    assert q8.kv_cache == 18 * 4096 * 2 * (256 // 32 * 34)
    mixed = estimate("unused", n_ctx=4096, cache_type="q8_0", cache_type_v="f16", shape=SHAPE)
    assert mixed.kv_cache == 18 * 4096 * (256 // 32 * 34 + 256 * 2)
    with pytest.raises(ValueError, match="unknown cache type"):
        estimate("unused", cache_type="q3_k", shape=SHAPE)
    with pytest.raises(ValueError, match="n_seq"):
        estimate("unused", n_seq=0, shape=SHAPE)


def test_sliding_window_layers_smaller_only_without_swa_full():
    full = estimate("unused", n_ctx=4096, n_seq=2, shape=SHAPE)
    assert full.kv_cache == 2 * 18 * 4096 * 1024
    cut = estimate("unused", n_ctx=4096, n_seq=2, n_batch=128, swa_full=False, shape=SHAPE)
    # 3 full layers; 15 sliding ones of min(4096, 512 + 128) -> 768 cells, per stream
    assert cut.kv_cache == 2 * (3 * 4096 + 15 * 768) * 1024
    unknown = estimate("unused", n_ctx=4096, swa_full=False,
                       shape=replace(SHAPE, architecture="new", swa_layers=0))
    assert unknown.kv_cache == 18 * 4096 * 1024 and unknown.notes


def test_split_files(tmp_path):
    first = tmp_path / "m-00001-of-00002.gguf"
    first.write_bytes(b"x")
    meta = {"split.count": "2"}
    with pytest.raises(ModelFilesError, match="m-00002-of-00002.gguf"):
        split_files(first, meta)
    (tmp_path / "m-00002-of-00002.gguf").write_bytes(b"yy")
    assert [p.name for p in split_files(first, meta)] == [first.name, "m-00002-of-00002.gguf"]
    assert split_files(first, {}) == [first]


def test_resident_bytes():
    assert (resident_bytes() or 0) > 10 * MiB


# -- the two real models --------------------------------------------------------------------

@pytest.fixture(scope="module", params=["default", "gemma3"])
def model(request) -> Path:
    return default_model_path() if request.param == "default" else \
        default_model_path(GEMMA_MODEL)


_measured: dict[tuple[Path, int, int, bool], dict] = {}


def measured(path: Path, n_ctx: int, n_seq: int, swa_full: bool = True) -> dict:
    key = (path, n_ctx, n_seq, swa_full)
    if key not in _measured:
        _measured[key] = bench.measure_in_subprocess(path, n_ctx, n_seq, DEFAULTS.batch_size,
                                                     swa_full=swa_full)
    return _measured[key]


def test_metadata_is_what_llama_cpp_reports_after_loading(model):
    shape = read_shape(model)
    got = measured(model, *SETTINGS[0])
    reported = got["reported"]
    assert (shape.n_layer, shape.n_head, shape.n_head_kv, shape.n_embd, shape.n_swa,
            shape.n_ctx_train, shape.n_vocab) == (
        reported["n_layer"], reported["n_head"], reported["n_head_kv"], reported["n_embd"],
        reported["n_swa"], reported["n_ctx_train"], reported["n_vocab"])
    arch = got["metadata"]["general.architecture"]
    head_dim = int(got["metadata"].get(f"{arch}.attention.key_length",
                                       reported["n_embd"] // reported["n_head"]))
    assert shape.head_dim_k == head_dim
    # the weights: the tensor data llama.cpp maps, and the header beside it
    assert 0 < shape.file_bytes - reported["tensor_bytes"] < 0.05 * shape.file_bytes


@pytest.mark.parametrize("setting", SETTINGS, ids=["4096x1", "defaults"])
def test_kv_cache_is_what_llama_cpp_allocates(model, setting):
    n_ctx, n_seq = setting
    est = estimate(model, n_ctx=n_ctx, n_seq=n_seq, n_batch=DEFAULTS.batch_size)
    got = measured(model, n_ctx, n_seq)
    assert est.n_ctx_seq == got["reported"]["n_ctx_seq"]
    assert est.n_ctx_seq * n_seq == got["reported"]["n_ctx"]
    assert est.kv_cache == pytest.approx(kv_logged(got["log"]), abs=0.02 * MiB)


@pytest.mark.parametrize("setting", SETTINGS, ids=["4096x1", "defaults"])
def test_estimate_within_15_percent_of_resident_growth(model, setting):
    n_ctx, n_seq = setting
    est = estimate(model, n_ctx=n_ctx, n_seq=n_seq, n_batch=DEFAULTS.batch_size)
    got = measured(model, n_ctx, n_seq)
    grown = got["warm"]["VmRSS"] - got["before"]["VmRSS"]
    loaded = got["loaded"]["VmRSS"] - got["before"]["VmRSS"]
    print(f"\n{model.name} n_ctx={n_ctx} n_seq={n_seq}: estimate {est.total / MiB:.1f} MiB "
          f"(weights {est.weights / MiB:.1f}, KV {est.kv_cache / MiB:.1f}, buffers "
          f"{est.buffers / MiB:.1f}); measured {grown / MiB:.1f} MiB warm, "
          f"{loaded / MiB:.1f} MiB just loaded; ratio {est.total / grown:.3f}")
    assert est.total == pytest.approx(grown, rel=0.15)


def test_gemma_sliding_window_cache_without_swa_full():
    path = default_model_path(GEMMA_MODEL)
    est = estimate(path, n_ctx=4096, n_seq=1, n_batch=DEFAULTS.batch_size, swa_full=False)
    got = measured(path, 4096, 1, swa_full=False)
    assert est.kv_cache < estimate(path, n_ctx=4096, n_seq=1).kv_cache
    assert est.kv_cache == pytest.approx(kv_logged(got["log"]), abs=0.02 * MiB)


def kv_logged(log: list[str]) -> float:
    """Bytes of every KV cache llama.cpp says it made ('llama_kv_cache: size = X MiB')."""
    sizes = [float(m.group(1)) for line in log
             if (m := re.search(r"llama_kv_cache: size = +([\d.]+) MiB", line))]
    assert sizes, log
    return sum(sizes) * MiB
