"""The prompt cache's disk tier (``podium.engine.llamacpp.prompt_cache``, issue 43), with no
model: the payloads are random bytes standing for a sequence's KV state. A bad file (cut
short, a flipped byte, another model's, other tokens than its name) is never restored, and no
I/O failure reaches the caller."""

from __future__ import annotations

import errno
import logging
import os
import random
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podium.engine.llamacpp import prompt_cache
from podium.engine.llamacpp.prompt_cache import PromptCache, encode_header

FP = "model.gguf size=491400064 mtime=1 ctx=4096 kv=f16 build=b1"
LOGGER = "podium.engine.llamacpp.prompt_cache"


@pytest.fixture
def make(tmp_path):
    """Caches on ``tmp_path`` (4-token blocks, 4 tokens worth a write), closed at the end."""
    made: list[PromptCache] = []

    def build(directory: Path | None = None, fingerprint: str = FP, **options) -> PromptCache:
        options = {"max_bytes": 1 << 30, "min_tokens": 4, "block": 4, **options}
        made.append(PromptCache(directory or tmp_path, fingerprint, **options))
        return made[-1]
    yield build
    for cache in made:
        cache.close()


def payload(n: int = 1000, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def files(cache: PromptCache) -> list[Path]:
    return sorted(cache.directory.glob("*.kv"))


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING]


T = list(range(100, 140))


def test_a_saved_state_is_found_and_read_back_also_after_a_restart(make, tmp_path):
    cache = make()
    data = payload()
    cache.save(T[:10], data)
    cache.flush()
    assert cache.longest(T[:10] + [7]) == 10          # its whole token list: a prefix
    assert cache.longest(T[:10]) == 8                 # never all: whole blocks of the rest
    assert cache.longest(T[:6] + [1, 2, 3, 4]) == 4   # diverges in the second block
    assert cache.longest([1, 2, 3, 4, 5]) == 0
    assert cache.load(T[:10] + [7]) == (10, data)
    assert cache.load(T[:10]) == (8, data)
    assert cache.load([1, 2, 3, 4, 5]) is None
    assert (cache.stats["hits"], cache.stats["misses"], cache.stats["saves"]) == (2, 1, 1)
    cache.close()
    again = make()
    assert again.stats["entries"] == 1
    assert again.stats["bytes"] == files(again)[0].stat().st_size
    assert again.load(T[:12]) == (10, data)


def test_the_longest_prefix_across_entries_and_the_smallest_file_holding_it(make):
    cache = make()
    first, second = T[:12] + [1] * 4, T[:20] + [2] * 4
    big, small = T[:8] + [3] * 40, T[:8] + [4] * 5
    for i, tokens in enumerate([first, second, big, small]):
        cache.save(tokens, payload(100 * (4 - i) if tokens is not big else 9000, seed=i))
        cache.flush()
    assert cache.longest(T[:20] + [9] * 8) == 20
    assert cache.load(T[:20] + [9] * 8) == (20, payload(300, seed=1))
    assert cache.longest(first + [9]) == 16
    assert cache.load(first + [9]) == (16, payload(400, seed=0))
    # Every entry holds T[:8]: the smallest one is read.
    assert cache.load(T[:8] + [9] * 9) == (8, payload(100, seed=3))


def test_a_saved_state_supersedes_the_ones_it_extends_and_the_same_tokens_are_kept_once(make):
    cache = make()
    cache.save(T[:6], payload(seed=1))
    cache.save(T[:12], payload(seed=2))
    cache.flush()
    cache.save(T[:12], payload(seed=3))
    cache.save(T[:14], payload(seed=4))
    cache.flush()
    assert len(files(cache)) == 1
    assert cache.stats["entries"] == 1
    assert cache.load(T[:20]) == (14, payload(seed=4))


def test_fewer_tokens_than_min_tokens_are_not_kept(make):
    cache = make(min_tokens=8)
    cache.save(T[:7], payload())
    cache.flush()
    assert files(cache) == [] and cache.stats["dropped"] == 0


def truncate(path: Path, cache: PromptCache) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) - 10])


def flip_a_payload_byte(path: Path, cache: PromptCache) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))


def claim_other_tokens(path: Path, cache: PromptCache) -> None:
    """A well-formed file (its checksums right) for other tokens, under this one's name."""
    ids = prompt_cache._ids([t + 1 for t in T[:10]])
    path.write_bytes(encode_header(FP, ids, payload()) + payload())


def another_models_entry(path: Path, cache: PromptCache) -> None:
    """The same tokens' state for another model, put where this model's entry is."""
    other = PromptCache(cache.directory.parent, "other.gguf", max_bytes=1 << 30, min_tokens=4,
                        block=4)
    other.save(T[:10], payload(seed=9))
    other.close()
    shutil.copyfile(files(other)[0], path)


DAMAGE = [truncate, flip_a_payload_byte, claim_other_tokens, another_models_entry]


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__)
@pytest.mark.parametrize("found_by", ["load", "a later start"])
def test_a_bad_entry_is_a_warning_a_miss_and_removed(make, caplog, damage, found_by):
    cache = make()
    cache.save(T[:10], payload())
    cache.flush()
    [path] = files(cache)
    damage(path, cache)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        if found_by == "a later start":
            cache.close()
            cache = make()
            # Only the payload's checksum waits for a load: the rest is in the header.
            assert path.exists() == (damage is flip_a_payload_byte)
        assert cache.load(T[:12]) is None
    [said] = warnings(caplog)
    assert str(path) in said
    assert not path.exists()
    assert cache.stats["corrupt"] == 1 and cache.stats["entries"] == 0
    assert cache.longest(T[:12]) == 0


def unwritable(tmp_path: Path) -> Path:
    """A folder this process cannot write in. Tests may run as root, whom ``chmod`` does
    not stop: then a path under a regular file."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        (folder / "probe").touch()
    except PermissionError:
        return folder
    (folder / "probe").unlink()
    (tmp_path / "file").write_bytes(b"")
    return tmp_path / "file" / "sub"


def test_a_read_only_folder_is_a_warning_never_an_exception(make, tmp_path, caplog):
    folder = unwritable(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            cache = make(folder)
            assert any(str(cache.directory) in said for said in warnings(caplog))
            caplog.clear()
            cache.save(T[:10], payload())
            cache.flush()
            assert any("cannot write" in said for said in warnings(caplog))
            assert cache.longest(T[:12]) == 0 and cache.load(T[:12]) is None
            assert cache.stats["failed"] == 1
            caplog.clear()
            cache.save(T[:11], payload())                  # the same failure: said once
            cache.flush()
            assert warnings(caplog) == [] and cache.stats["failed"] == 2
    finally:
        (tmp_path / "read-only").chmod(0o700)


def test_a_full_disk_is_a_warning_and_leaves_no_temporary_file(make, caplog, monkeypatch):
    cache = make()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(prompt_cache.os, "fsync", full)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cache.save(T[:10], payload())
        cache.flush()
    [said] = warnings(caplog)
    assert "No space left" in said
    assert list(cache.directory.iterdir()) == []
    assert cache.stats["failed"] == 1 and cache.stats["entries"] == 0


def test_an_entry_larger_than_the_cap_is_not_written(make, caplog):
    cache = make(max_bytes=1000)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cache.save(T[:10], payload(2000))
        cache.flush()
    [said] = warnings(caplog)
    assert "larger than the cap of 1000 bytes" in said
    assert files(cache) == [] and cache.stats["too_big"] == 1


def test_the_least_recently_used_entries_go_first(make):
    one = len(encode_header(FP, prompt_cache._ids([0] * 8), payload())) + 1000
    cache = make(max_bytes=3 * one + 10)

    def save(k: str) -> None:
        cache.save([ord(k)] * 8, payload(seed=ord(k)))
        cache.flush()

    def kept() -> str:
        return "".join(k for k in "ABCDE" if cache.longest([ord(k)] * 9))
    for k in "ABC":
        save(k)
    assert cache.load([ord("A")] * 9) is not None
    save("D")
    assert kept() == "ACD" and cache.stats["evicted"] == 1
    assert cache.load([ord("C")] * 9) is not None
    save("E")
    assert kept() == "CDE" and cache.stats["evicted"] == 2
    assert cache.stats["bytes"] == sum(p.stat().st_size for p in files(cache)) <= 3 * one + 10


def test_two_caches_on_one_folder_see_each_others_entries(make):
    writer, reader = make(), make()
    writer.save(T[:10], payload(seed=1))
    writer.flush()
    reader.longest(T[:12])          # notices the folder changed: its writer reads it again
    reader.flush()
    assert reader.longest(T[:12]) == 10
    # The writer supersedes that entry: to the reader, a file gone between its index and
    # its read is a miss (no warning), and the new entry is found after the next scan.
    writer.save(T[:11], payload(seed=2))
    writer.flush()
    assert reader.load(T[:12]) is None
    assert reader.stats["misses"] == 1 and reader.stats["corrupt"] == 0
    reader.longest(T[:12])
    reader.flush()
    assert reader.load(T[:12]) == (11, payload(seed=2))


def test_saves_from_many_threads_are_all_written(make):
    cache = make(max_queued=100)
    lists = {(t, i): [t] + T[:10 + i] for t in range(8) for i in range(10)}

    def saver(t: int) -> None:
        for i in range(10):
            cache.save(lists[t, i], payload(50 + i, seed=t * 100 + i))
    threads = [threading.Thread(target=saver, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cache.flush()
    # Each thread's saves extend one another: its last one supersedes the rest.
    assert cache.stats["saves"] == 80 and cache.stats["entries"] == 8
    for t in range(8):
        assert cache.load(lists[t, 9] + [0]) == (len(lists[t, 9]), payload(59, seed=t * 100 + 9))


def test_a_full_queue_drops_the_save_and_counts_it(make, monkeypatch):
    cache = make(max_queued=2)
    writing, go_on = threading.Event(), threading.Event()
    write = cache._write

    def held(ids: bytes, data: bytes) -> None:
        writing.set()
        go_on.wait(10)
        write(ids, data)
    monkeypatch.setattr(cache, "_write", held)
    cache.save([1] * 8, payload())
    assert writing.wait(10)
    cache.save([2] * 8, payload())
    cache.save([3] * 8, payload())
    cache.save([4] * 8, payload())
    assert cache.stats["dropped"] == 1
    go_on.set()
    cache.flush()
    assert cache.stats["saves"] == 3
    assert [cache.longest([k] * 9) for k in (1, 2, 3, 4)] == [8, 8, 8, 0]


def test_close_writes_what_is_queued_and_later_saves_are_dropped(make):
    cache = make(max_queued=10)
    for k in range(5):
        cache.save([k] * 8, payload(seed=k))
    cache.close()
    cache.save([9] * 8, payload())
    assert cache.stats["dropped"] == 1
    again = make()
    assert [again.load([k] * 9) for k in range(5)] == [(8, payload(seed=k)) for k in range(5)]
    assert again.stats["entries"] == 5


def brute_longest(kept: list[list[int]], prompt: list[int], block: int) -> int:
    """The longest prefix of ``prompt`` but its last token that a kept entry holds: its
    whole token list, or whole blocks of what they share."""
    limit = len(prompt) - 1
    best = 0
    for entry in kept:
        if len(entry) <= limit and prompt[:len(entry)] == entry:
            best = max(best, len(entry))
        common = 0
        while common < min(len(entry), limit) and entry[common] == prompt[common]:
            common += 1
        best = max(best, common - common % block)
    return best


@given(saved=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=14), max_size=6),
       prompt=st.lists(st.integers(0, 2), max_size=16), block=st.integers(1, 4))
@settings(max_examples=150, deadline=None)
def test_longest_is_the_longest_block_aligned_common_prefix(saved, prompt, block):
    kept: list[list[int]] = []
    for tokens in saved:
        if tokens not in kept:
            kept = [k for k in kept if tokens[:len(k)] != k] + [tokens]
    expected = brute_longest(kept, prompt, block)
    with tempfile.TemporaryDirectory() as folder:
        cache = PromptCache(Path(folder), FP, max_bytes=1 << 20, min_tokens=1, block=block)
        for i, tokens in enumerate(saved):
            cache.save(tokens, bytes([i]))
            cache.flush()
        cache.close()
        assert cache.stats["entries"] == len(kept)
        assert cache.longest(prompt) == expected
        fresh = PromptCache(Path(folder), FP, max_bytes=1 << 20, min_tokens=1, block=block)
        fresh.close()
        assert fresh.longest(prompt) == expected
        found = fresh.load(prompt)
        if expected:
            assert found is not None and found[0] == expected
            assert saved[found[1][0]][:expected] == prompt[:expected]
        else:
            assert found is None


# -- the memory tier ----------------------------------------------------------------------


def test_a_memory_only_state_is_served_as_it_was_given_and_never_written(make, tmp_path):
    cache = make(memory_bytes=10_000)
    data = payload()
    assert cache.save(T[:10], data, keep=False) is True
    assert cache.longest(T[:10] + [7]) == 10           # found at once: no write to wait for
    n, got = cache.load(T[:10] + [7])
    assert n == 10 and got is data                     # the very bytes handed over
    cache.flush()
    assert files(cache) == []
    assert (cache.stats["memory_hits"], cache.stats["hits"], cache.stats["saves"]) == (1, 0, 0)
    assert (cache.stats["memory_entries"], cache.stats["memory_bytes"]) == (1, 1000)
    assert (cache.stats["entries"], cache.stats["bytes"]) == (0, 0)
    cache.close()
    assert cache.longest(T[:12]) == 0 and cache.stats["memory_entries"] == 0
    assert make().longest(T[:12]) == 0                 # nothing outlives the process


def test_a_memory_hit_reads_no_file_even_when_the_entry_is_on_disk_too(make, monkeypatch):
    cache = make(memory_bytes=10_000)
    assert cache.save(T[:10], payload()) is True
    cache.flush()
    assert len(files(cache)) == 1 and cache.stats["memory_entries"] == 1

    def no_reading(*args, **kwargs):
        raise AssertionError("a file was read")
    monkeypatch.setattr(cache, "_read", no_reading)
    assert cache.load(T[:12]) == (10, payload())
    assert cache.stats["memory_hits"] == 1 and cache.stats["hits"] == 0


def test_the_memory_tier_lets_the_least_recently_used_go_by_bytes(make):
    cache = make(memory_bytes=2500)

    def kept() -> str:
        return "".join(k for k in "ABCD" if cache.longest([ord(k)] * 9))
    for k in "AB":
        assert cache.save([ord(k)] * 8, payload(1000, seed=ord(k)), keep=False)
    assert cache.load([ord("A")] * 9) is not None       # A used: B is the oldest now
    assert cache.save([ord("C")] * 8, payload(1000), keep=False)
    assert kept() == "AC" and cache.stats["memory_evicted"] == 1
    assert (cache.stats["memory_entries"], cache.stats["memory_bytes"]) == (2, 2000)
    # Two small ones make room for one twice their size...
    assert cache.save([ord("D")] * 8, payload(2000), keep=False)
    assert kept() == "D" and cache.stats["memory_evicted"] == 3
    # ...and one larger than the whole tier is not held, nor anything let go for it.
    assert cache.save([ord("E")] * 8, payload(3000), keep=False) is False
    assert kept() == "D" and cache.stats["memory_too_big"] == 1
    assert cache.stats["memory_bytes"] == 2000


def test_a_disk_entry_the_memory_tier_let_go_of_is_read_from_disk_and_held_again(make):
    cache = make(memory_bytes=1500)
    a, b = [1] * 8, [2] * 8
    cache.save(a, payload(1000, seed=1))
    cache.save(b, payload(1000, seed=2))               # A out of memory; both on disk
    cache.flush()
    assert cache.stats["entries"] == 2 and cache.stats["memory_entries"] == 1
    assert cache.load(a + [0]) == (8, payload(1000, seed=1))
    assert cache.stats["hits"] == 1 and cache.stats["memory_hits"] == 0
    # The load put A back in memory (B out): the next one reads no file.
    assert cache.load(a + [0]) == (8, payload(1000, seed=1))
    assert cache.stats["hits"] == 1 and cache.stats["memory_hits"] == 1
    assert cache.load(b + [0]) == (8, payload(1000, seed=2))
    assert cache.stats["hits"] == 2


def test_a_held_state_outlives_its_file(make):
    """A file removed behind the cache's back (another server's eviction, an operator) costs
    the disk tier its entry; the memory tier's copy never left the process and still
    serves."""
    cache = make(memory_bytes=10_000)
    cache.save(T[:10], payload())
    cache.flush()
    [path] = files(cache)
    path.unlink()
    cache.longest(T[:12])           # notices the folder changed: its writer reads it again
    cache.flush()
    assert cache.stats["entries"] == 0 and cache.stats["memory_entries"] == 1
    assert cache.load(T[:12]) == (10, payload())
    assert cache.stats["memory_hits"] == 1 and cache.stats["misses"] == 0


def test_what_each_keep_asks_for(make):
    cache = make(memory_bytes=10_000, min_tokens=8)
    # None: the server's policy, min_tokens at least
    assert cache.save(T[:7], payload(seed=1)) is False
    # True: a client's breakpoint, one block suffices, memory and disk
    assert cache.save([1] * 5, payload(seed=2), keep=True) is True
    assert cache.save([2] * 3, payload(seed=3), keep=True) is False    # under a block
    # False: memory only, one block suffices
    assert cache.save([3] * 4, payload(seed=4), keep=False) is True
    cache.flush()
    assert cache.stats["saves"] == 1 and len(files(cache)) == 1
    assert cache.stats["memory_entries"] == 2
    cache.close()
    again = make(memory_bytes=10_000, min_tokens=8)
    assert again.load([1] * 6) == (5, payload(seed=2))
    assert [again.longest(t * 9) for t in ([2], [3])] == [0, 0]
    assert again.longest(T[:8]) == 0


def test_no_memory_tier_with_a_cap_of_0(make):
    cache = make()                  # memory_bytes=0, the default
    assert cache.save(T[:10], payload(), keep=False) is False
    assert cache.longest(T[:12]) == 0
    assert cache.save(T[:10], payload()) is True       # the disk's, as before
    cache.flush()
    assert cache.load(T[:12]) == (10, payload())
    assert cache.load(T[:12]) == (10, payload())
    assert cache.stats["hits"] == 2
    assert all(cache.stats[k] == 0 for k in prompt_cache.STATS if k.startswith("memory_"))


def test_each_tier_supersedes_only_within_itself(make):
    cache = make(memory_bytes=10_000)
    cache.save(T[:6], payload(seed=1))
    cache.flush()
    cache.save(T[:12], payload(seed=2), keep=False)
    cache.flush()
    # Its memory copy of T[:6] is let go of; the file of T[:6] stays (the memory-only state
    # does not outlive the process, the file does).
    assert cache.stats["memory_entries"] == 1 and len(files(cache)) == 1
    assert cache.load(T[:20]) == (12, payload(seed=2))
    cache.save(T[:14], payload(seed=3))
    cache.flush()
    assert cache.stats["memory_entries"] == 1 and cache.stats["entries"] == 1
    assert cache.load(T[:20]) == (14, payload(seed=3))
    assert [p.name for p in files(cache)] == [prompt_cache._chain(prompt_cache._ids(T[:14]),
                                                                    4)[1].hex() + ".kv"]


def test_whether_a_save_was_taken(make, monkeypatch):
    cache = make(memory_bytes=1000, max_queued=1)
    writing, go_on = threading.Event(), threading.Event()
    write = cache._write

    def held(ids: bytes, data: bytes) -> None:
        writing.set()
        go_on.wait(10)
        write(ids, data)
    monkeypatch.setattr(cache, "_write", held)
    assert cache.save([1] * 8, payload(500)) is True
    assert writing.wait(10)
    assert cache.save([2] * 8, payload(500)) is True       # queued (and held)
    assert cache.save([3] * 8, payload(500)) is True       # not queued, but held
    assert cache.save([4] * 8, payload(2000)) is False     # neither
    assert cache.stats["dropped"] == 2
    go_on.set()
    cache.close()
    assert cache.save([5] * 8, payload(500), keep=False) is False
    assert cache.stats["saves"] == 2 and cache.stats["memory_bytes"] == 0


def test_close_writes_what_is_queued_and_lets_the_memory_tier_go(make):
    cache = make(memory_bytes=10_000, max_queued=10)
    cache.save([1] * 8, payload(seed=1), keep=False)
    cache.save([2] * 8, payload(seed=2))
    cache.close()
    assert cache.stats["memory_entries"] == cache.stats["memory_bytes"] == 0
    assert cache.longest([1] * 9) == 0 and cache.longest([2] * 9) == 8
    again = make(memory_bytes=10_000)
    assert again.load([2] * 9) == (8, payload(seed=2)) and again.longest([1] * 9) == 0


def test_saves_and_loads_from_many_threads_keep_the_tiers_consistent(make):
    cache = make(memory_bytes=3000, max_queued=4)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        rng = random.Random(t)
        try:
            for i in range(60):
                tokens = [rng.randrange(3) for _ in range(rng.randrange(4, 16))]
                if rng.random() < 0.5:
                    cache.save(tokens, payload(rng.randrange(200, 1200), seed=i),
                               keep=rng.choice([None, True, False]))
                else:
                    found = cache.load(tokens + [9])
                    assert found is None or found[0] <= len(tokens)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cache.flush()
    assert errors == []
    held = list(cache._memory.values())
    assert cache.stats["memory_bytes"] == sum(len(e.data or b"") for e in held) <= 3000
    assert cache.stats["memory_entries"] == len(held)
    assert all(cache._entries[e.key] is e for e in held)
    assert all(e.data is not None or e.size for e in cache._entries.values())
    assert cache.stats["entries"] == len(files(cache)) \
        == sum(1 for e in cache._entries.values() if e.size)
    assert cache.stats["bytes"] == sum(p.stat().st_size for p in files(cache))


@given(saved=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=14), max_size=6),
       prompt=st.lists(st.integers(0, 2), max_size=16), block=st.integers(1, 4))
@settings(max_examples=150, deadline=None)
def test_the_memory_tier_finds_what_the_disk_tier_would(saved, prompt, block):
    """Memory-only saves (states under a block are not taken) with room for all: the same
    longest prefix as the disk tier's, and nothing after ``close``."""
    taken = [tokens for tokens in saved if len(tokens) >= block]
    kept: list[list[int]] = []
    for tokens in taken:        # a save, even of a state held already, supersedes its prefixes
        kept = [k for k in kept if k == tokens or tokens[:len(k)] != k]
        if tokens not in kept:
            kept.append(tokens)
    expected = brute_longest(kept, prompt, block)
    with tempfile.TemporaryDirectory() as folder:
        cache = PromptCache(Path(folder), FP, max_bytes=1 << 20, min_tokens=1, block=block,
                            memory_bytes=1 << 20)
        for i, tokens in enumerate(saved):
            assert cache.save(tokens, bytes([i]), keep=False) == (len(tokens) >= block)
        assert cache.stats["memory_entries"] == len(kept)
        assert cache.longest(prompt) == expected
        found = cache.load(prompt)
        if expected:
            assert found is not None and found[0] == expected
            assert saved[found[1][0]][:expected] == prompt[:expected]
        else:
            assert found is None
        cache.close()
        assert cache.longest(prompt) == 0 and not list(Path(folder).rglob("*.kv"))
