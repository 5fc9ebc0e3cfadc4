"""Engine counters: read and written like a dict, kept in C integers."""

import pytest

from podium.engine.base import EngineStats


def test_counters_read_and_write_like_a_dict():
    stats = EngineStats("running", "generated_tokens")
    for _ in range(1000):
        stats["generated_tokens"] += 300
        stats["running"] += 1
    stats["running"] -= 1000
    assert stats == {"running": 0, "generated_tokens": 300_000}
    assert dict(stats) == {"running": 0, "generated_tokens": 300_000}
    assert stats.get("waiting", 7) == 7 and list(stats) == ["running", "generated_tokens"]
    with pytest.raises(KeyError):
        stats["waiting"] = 1          # a fixed set of names: a typo is an error, not a new key
    with pytest.raises(TypeError):
        del stats["running"]


def test_a_large_count_is_not_kept_as_an_object():
    """The number lives in the array; reading it makes a fresh int each time (the ints a
    dict would keep are what pinned memory after a burst)."""
    stats = EngineStats("generated_tokens")
    stats["generated_tokens"] = 10**9 + 7
    assert stats["generated_tokens"] == 10**9 + 7
    assert stats["generated_tokens"] is not stats["generated_tokens"]
