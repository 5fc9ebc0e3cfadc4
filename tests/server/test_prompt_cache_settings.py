"""The prompt cache's settings (issue 43): its size, folder and shortest prefix; the cache a
llama.cpp model gets from them, keyed to the model and the settings that change its KV; its
figures in /health and /metrics."""

from __future__ import annotations

import pytest

from podium.server.served import prompt_cache
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
    assert "prompt_cache" not in client.get("/health").json()["models"][SERVED]
