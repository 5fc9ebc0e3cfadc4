"""The prompt cache in the llama.cpp engine on the real default model (issue 43): a prefix
prefilled once is restored from disk instead of prefilled, after its slot was taken, after
the engine was closed (an unload, a restart), with the same answer; a bad entry is a
prefill."""

from __future__ import annotations

import asyncio
import itertools
import logging

from podium.engine.base import CacheHint, EngineRequest, SamplingParams
from podium.engine.llamacpp.engine import LlamaCppEngine, kv_fingerprint
from podium.engine.llamacpp.prompt_cache import PromptCache

_ids = itertools.count()
BATCH = 64
LONG = "".join(f"Rule {i}: always answer in full sentences about topic {i}.\n"
               for i in range(40))


def make(model_path, directory, *, n_batch=BATCH, max_num_seqs=1, min_tokens=128):
    cache = PromptCache(directory, kv_fingerprint(model_path, n_ctx=1024, n_batch=n_batch,
                                                  deterministic=True),
                        max_bytes=1 << 30, min_tokens=min_tokens, block=n_batch)
    return LlamaCppEngine(model_path, served_name="m", n_ctx=1024, n_batch=n_batch,
                          max_num_seqs=max_num_seqs, deterministic=True, prompt_cache=cache)


def ask(engine, question, system=LONG):
    ids = engine.tokenizer.encode(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
                                  f"{question}<|im_end|>\n<|im_start|>assistant\n")
    req = EngineRequest(f"c{next(_ids)}", ids, SamplingParams(temperature=0.0, max_tokens=16))

    async def run():
        return [o async for o in engine.generate(req)]
    outs = asyncio.run(run())
    return [t for o in outs for t in o.token_ids], outs[0].cached_tokens, len(ids)


def prompt(engine, question, system=LONG):
    return engine.tokenizer.encode(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>"
                                   f"user\n{question}<|im_end|>\n<|im_start|>assistant\n")


def run(engine, ids, cache=None, **sampling):
    """Every output of one request of ``ids``."""
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 16, **sampling})
    req = EngineRequest(f"c{next(_ids)}", ids, params, cache=cache)

    async def go():
        return [o async for o in engine.generate(req)]
    return asyncio.run(go())


def entries(directory):
    return sorted(directory.rglob("*.kv"))


def close(engine):
    asyncio.run(engine.aclose())


def test_a_prefix_outlives_the_engine_and_gives_the_same_answer(model_path, tmp_path):
    first = make(model_path, tmp_path)
    try:
        answer, cached, length = ask(first, "Which rule is about topic 7?")
        assert cached == 0 and length > 600
    finally:
        close(first)
    assert first.stats["copy_us"] > 0 and first.prompt_cache.stats["write_us"] > 0
    second = make(model_path, tmp_path)        # a restart: a new engine, the same folder
    try:
        again, cached, _ = ask(second, "Which rule is about topic 7?")
        assert again == answer
        assert cached >= length - 2 * BATCH and cached % BATCH == 0
        assert second.stats["restored_tokens"] == cached
        assert second.stats["restore_us"] > 0 and second.prompt_cache.stats["read_us"] > 0
        # another question after the same system prompt: its prefix comes from disk too
        _, cached, _ = ask(second, "Which rule is about topic 30?")
        assert cached > 0
    finally:
        close(second)


def test_a_prefix_whose_slot_was_taken_comes_back_from_disk(model_path, tmp_path):
    engine = make(model_path, tmp_path)        # one slot: every other prompt takes it
    try:
        answer, _, _ = ask(engine, "Which rule is about topic 3?")
        ask(engine, "Say hi.", system="You are terse. " * 60)   # another long prefix
        again, cached, _ = ask(engine, "Which rule is about topic 3?")
        assert again == answer and cached > 0 and engine.stats["restored_tokens"] > 0
    finally:
        close(engine)


def test_another_settings_entry_is_never_restored(model_path, tmp_path):
    first = make(model_path, tmp_path, n_batch=BATCH)
    try:
        ask(first, "Which rule is about topic 7?")
    finally:
        close(first)
    other = make(model_path, tmp_path, n_batch=2 * BATCH)   # other chunks, other numbers
    try:
        _, cached, _ = ask(other, "Which rule is about topic 7?")
        assert cached == 0 and other.stats["restored_tokens"] == 0
    finally:
        close(other)


def test_a_corrupt_entry_is_a_warning_and_a_prefill(model_path, tmp_path, caplog):
    first = make(model_path, tmp_path)
    try:
        answer, _, _ = ask(first, "Which rule is about topic 7?")
    finally:
        close(first)
    for path in tmp_path.rglob("*.kv"):
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF                  # a flipped byte in the KV state
        path.write_bytes(bytes(data))
    second = make(model_path, tmp_path)
    try:
        with caplog.at_level(logging.WARNING):
            again, cached, _ = ask(second, "Which rule is about topic 7?")
        assert again == answer and cached == 0
        assert any("checksum" in r.getMessage() for r in caplog.records)
    finally:
        close(second)


def test_a_breakpoint_keeps_a_prefix_the_policy_would_not_and_reports_it(model_path,
                                                                          tmp_path):
    """A client's breakpoint (Anthropic's cache_control) keeps a prompt shorter than
    --prompt-cache-min-tokens, and its first output says how much of the marked part this
    request wrote; the prompt seen again reads it and writes nothing."""
    engine = make(model_path, tmp_path, min_tokens=100_000)
    try:
        ids = prompt(engine, "Which rule is about topic 7?")
        outs = run(engine, ids)                         # the server's policy: too short
        engine._cache.flush()
        assert outs[0].cache_written == 0 and entries(tmp_path) == []
        other = prompt(engine, "Which rule is about topic 9?", system="Be brief.\n" + LONG)
        outs = run(engine, other, CacheHint(until=300))
        engine._cache.flush()
        assert outs[0].cached_tokens == 0 and outs[0].cache_written == 300
        assert len(entries(tmp_path)) == 1
    finally:
        close(engine)
    again = make(model_path, tmp_path, min_tokens=100_000)     # a restart
    try:
        outs = run(again, other, CacheHint(until=300))
        assert outs[0].cached_tokens >= len(other) - 2 * BATCH and outs[0].cache_written == 0
    finally:
        close(again)


def test_in_memory_retention_writes_nothing_to_disk(model_path, tmp_path):
    engine = make(model_path, tmp_path)
    try:
        outs = run(engine, prompt(engine, "Which rule is about topic 7?"),
                   CacheHint(until=300, retain=False))
        engine._cache.flush()
        assert entries(tmp_path) == []
        assert outs[0].cache_written == (300 if engine._cache.memory_bytes else 0)
    finally:
        close(engine)
    assert entries(tmp_path) == []          # not at the unload either


def test_a_slots_tokens_are_kept_before_another_prompt_overwrites_them(model_path, tmp_path):
    """The answer a slot decoded is kept with its prompt when another conversation takes
    the slot: the conversation's next turn reads its prompt and the answer back."""
    engine = make(model_path, tmp_path)        # one slot
    try:
        first = prompt(engine, "List the rules.")
        outs = run(engine, first, max_tokens=2 * BATCH + 8, ignore_eos=True)
        answer = [t for o in outs for t in o.token_ids]
        assert len(answer) == 2 * BATCH + 8
        run(engine, prompt(engine, "Say hi.", system="You are terse. " * 60))  # takes it
        turn = first + answer + engine.tokenizer.encode(
            "<|im_end|>\n<|im_start|>user\nAnd the next one?<|im_end|>\n"
            "<|im_start|>assistant\n")
        outs = run(engine, turn)
        # the prompt alone would give at most len(first) - 1 in whole chunks
        assert outs[0].cached_tokens >= (len(first) + len(answer) - 1) // BATCH * BATCH
        assert outs[0].cached_tokens > len(first)
    finally:
        close(engine)
