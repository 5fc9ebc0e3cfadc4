"""The prompt cache's settings (issue 43): its sizes (disk and memory), folder and shortest
prefix; the cache a llama.cpp model gets from them, keyed to the model and the settings that
change its KV; its memory tier in the model's estimate; its figures in /health and
/metrics."""

from __future__ import annotations

import random

import pytest

from podium.engine.base import ENGINE_STATS, EngineStats
from podium.engine.llamacpp.prompt_cache import PromptCache
from podium.models import ModelConfig
from podium.server.served import estimate, prompt_cache
from podium.settings import Settings
from tests.conftest import SERVED


def test_sizes_and_bounds_are_checked():
    assert Settings().prompt_cache_bytes() == 8 << 30
    assert Settings.from_sources(["--prompt-cache-disk", "500M"], {}).prompt_cache_bytes() \
        == 500 << 20
    assert Settings.from_sources([], {"PODIUM_PROMPT_CACHE_DISK": "0"}).prompt_cache_bytes() == 0
    with pytest.raises(ValueError, match="--prompt-cache-disk 'lots'"):
        Settings.from_sources(["--prompt-cache-disk", "lots"], {})
    with pytest.raises(ValueError, match="--prompt-cache-min-tokens must be at least 1"):
        Settings.from_sources(["--prompt-cache-min-tokens", "0"], {})
    # the size parser is --memory-budget's too: unchanged for it
    assert Settings(memory_budget="12G").budget_bytes() == 12 << 30


def test_the_memory_tiers_size():
    assert Settings().prompt_cache_memory_bytes() == 512 << 20
    assert Settings.from_sources(["--prompt-cache-memory", "2G"], {}
                                 ).prompt_cache_memory_bytes() == 2 << 30
    assert Settings.from_sources([], {"PODIUM_PROMPT_CACHE_MEMORY": "0"}
                                 ).prompt_cache_memory_bytes() == 0
    with pytest.raises(ValueError, match="--prompt-cache-memory 'plenty'"):
        Settings.from_sources(["--prompt-cache-memory", "plenty"], {})
    with pytest.raises(ValueError, match="--prompt-cache-memory '-1M'"):
        Settings(prompt_cache_memory="-1M")


def test_a_models_cache_gets_the_memory_tier(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    made = [prompt_cache(Settings(prompt_cache_dir=str(tmp_path), prompt_cache_memory=size),
                         model) for size in ("512M", "0")]
    try:
        assert [c.memory_bytes for c in made] == [512 << 20, 0]
    finally:
        for cache in made:
            cache.close()
    # no disk: no prompt cache, memory tier included
    assert prompt_cache(Settings(prompt_cache_disk="0", prompt_cache_memory="1G"), model) is None


def test_the_memory_tier_is_counted_in_the_models_estimate():
    def estimated(kind: str = "chat", **settings) -> int:
        return estimate(ModelConfig("m", kind=kind, source=Settings(**settings)))
    base = estimated(prompt_cache_memory="0")
    assert base > 100 << 20
    assert estimated(prompt_cache_memory="1G") == base + (1 << 30)
    assert estimated() == base + (512 << 20)                    # the default
    assert estimated("auto") == base + (512 << 20)              # not known yet: counted
    # no prompt cache, or a model that never has one: nothing to count
    assert estimated(prompt_cache_disk="0", prompt_cache_memory="1G") == base
    assert estimated("embedding", prompt_cache_memory="1G") == base


def test_a_model_gets_a_cache_keyed_to_its_file_and_its_kv_settings(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert prompt_cache(Settings(prompt_cache_disk="0"), model) is None
    made = []
    try:
        for flags in ([], ["--batch-size", "64"], ["--no-deterministic"], []):
            settings = Settings.from_sources(
                ["--prompt-cache-dir", str(tmp_path / "cache"), "--prompt-cache-min-tokens",
                 "300", *flags], {})
            made.append(prompt_cache(settings, model))
        assert made[0].min_tokens == 300 and made[0].max_bytes == 8 << 30
        assert made[1].block == 64
        folders = [c.directory for c in made]
        assert folders[0] == folders[3] and len(set(folders)) == 3     # other KV, other folder
        assert all(f.parent == tmp_path / "cache" for f in folders)
    finally:
        for cache in made:
            cache.close()


def test_the_default_folder_is_in_the_data_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("PODIUM_DATA_DIR", str(tmp_path / "data"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    cache = prompt_cache(Settings(), model)
    try:
        assert cache.directory.parent == tmp_path / "data" / "prompt-cache"
    finally:
        cache.close()


def test_an_engine_without_a_prompt_cache_reports_zeros(client):
    client.post("/v1/chat/completions",
                json={"model": SERVED, "messages": [{"role": "user", "content": "hi"}]})
    text = client.get("/metrics").text
    assert f'podium_prompt_cache_hits_total{{model="{SERVED}"}} 0.0' in text
    assert f'podium_prompt_cache_memory_hits_total{{model="{SERVED}"}} 0.0' in text
    assert f'podium_prompt_cache_memory_bytes{{model="{SERVED}"}} 0.0' in text
    assert "prompt_cache" not in client.get("/health").json()["models"][SERVED]


def test_both_tiers_figures_in_health_and_metrics(scripted, client_for, tmp_path):
    engine = scripted(["Hello"])
    cache = PromptCache(tmp_path, "fp", max_bytes=1 << 20, min_tokens=4, block=4,
                        memory_bytes=1500)
    engine.prompt_cache = cache             # as the llama.cpp engine's
    engine.stats = EngineStats(*ENGINE_STATS, "restored_tokens")
    try:
        state = random.Random(0).randbytes(1000)
        cache.save([1] * 8, state)                          # memory and disk
        cache.save([2] * 8, state, keep=False)              # memory only: [1] out of memory
        cache.flush()
        assert cache.load([2] * 9) == (8, state)            # from memory
        assert cache.load([1] * 9) == (8, state)            # from disk ([2] out of memory)
        engine.stats["restored_tokens"] = 16
        client = client_for(engine)
        figures = client.get("/health").json()["models"][SERVED]["prompt_cache"]
        file_size = next(cache.directory.glob("*.kv")).stat().st_size
        assert {k: figures[k] for k in ("entries", "bytes", "hits", "memory_entries",
                                        "memory_bytes", "memory_hits", "misses",
                                        "restored_tokens")} == {
            "entries": 1, "bytes": file_size, "hits": 1, "memory_entries": 1,
            "memory_bytes": 1000, "memory_hits": 1, "misses": 0, "restored_tokens": 16}
        text = client.get("/metrics").text
        for name, value in (("entries", 1), ("bytes", file_size), ("hits_total", 1),
                            ("memory_entries", 1), ("memory_bytes", 1000),
                            ("memory_hits_total", 1), ("misses_total", 0),
                            ("restored_tokens_total", 16)):
            assert f'podium_prompt_cache_{name}{{model="{SERVED}"}} {float(value)}' in text
        # the time it took: a file read and a file written, in seconds; no engine copies
        assert figures["read_seconds"] > 0 and figures["write_seconds"] > 0
        assert figures["restore_seconds"] == figures["copy_seconds"] == 0
        for name in ("read", "write", "restore", "copy"):
            assert f'podium_prompt_cache_{name}_seconds_total{{model="{SERVED}"}}' in text
    finally:
        cache.close()
