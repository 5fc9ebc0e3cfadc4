"""A llama.cpp model load reports how far it is (``podium.models.LOAD_PROGRESS``): the
fraction llama.cpp's load callback gives, rising to 1, on the real default model. Nothing is
reported without a listener or for a vocabulary-only load, and a listener that fails does
not fail the load."""

from __future__ import annotations

from pathlib import Path

from podium.engine.llamacpp.model import LlamaModel
from podium.models import LOAD_PROGRESS


def load(model_path: Path, report, **options) -> LlamaModel:
    token = LOAD_PROGRESS.set(report)
    try:
        return LlamaModel(model_path, n_ctx=256, n_batch=64, n_threads=1, **options)
    finally:
        LOAD_PROGRESS.reset(token)


def test_a_load_reports_its_progress_up_to_one(model_path):
    seen: list[float] = []
    load(model_path, seen.append).close()
    assert len(seen) > 10                           # one a tensor, not one at the end
    assert seen == sorted(seen) and 0 <= seen[0] < 0.5 and seen[-1] == 1.0


def test_a_vocabulary_load_reports_nothing(model_path):
    seen: list[float] = []
    load(model_path, seen.append, vocab_only=True).close()
    assert seen == []


def test_a_failing_listener_does_not_stop_the_load(model_path):
    def broken(fraction: float) -> None:
        raise RuntimeError("listener gone")

    model = load(model_path, broken)
    try:
        assert model.ctx is not None and model.n_ctx >= 256
    finally:
        model.close()
