"""Closing a llama.cpp engine gives its memory back (issue 28: an unloaded model's memory is
freed, resident memory back within 10% of before the load).

In a fresh process (bench/models.py unload-measure, so this process's heap does not blur it),
the default model is loaded three times at the server's default settings (a 32768-token
context for each of 4 sequences: ~2 GiB resident), a few tokens generated, the engine closed
twice (an unload, then a shutdown) and collected. Before the close path gave the C heap back
(malloc_trim), every close left ~53 MiB of freed heap resident in glibc.

The allowance beside the 10%: what the first load leaves for good, whatever the model — the
code of libllama and libggml paged in (~3 MiB, shared with other processes, reclaimable) and
the top of the worker thread's malloc arena (~5 MiB, reused by the next model's worker).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from podium.engine.llamacpp.model_files import default_model_path

_spec = importlib.util.spec_from_file_location(
    "bench_models", Path(__file__).resolve().parents[2] / "bench" / "models.py")
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

MiB = 2**20
ONE_TIME = 16 * MiB


def test_close_gives_the_memory_back_and_nothing_accumulates():
    cycles = bench.unload_in_subprocess(default_model_path(), cycles=3)
    first = cycles[0]["before"]["VmRSS"]
    model = cycles[0]["loaded"]["VmRSS"] - first
    assert model > 1024 * MiB            # the weights and KV cache really were resident
    for c in cycles:
        assert c["generated"] == 8 and c["collected"]
        after, before = c["after"]["VmRSS"], c["before"]["VmRSS"]
        assert after - before <= 0.10 * before + ONE_TIME, cycles
        assert after - first <= 0.10 * first + ONE_TIME, cycles
    # three load/close cycles: no growth beyond 10% of what one model holds
    assert cycles[-1]["after"]["VmRSS"] - cycles[0]["after"]["VmRSS"] <= 0.10 * model
