"""The prompt cache in the llama.cpp engine on the real default model (issue 43): a prefix
prefilled once is restored from disk instead of prefilled, after its slot was taken, after
the engine was closed (an unload, a restart), with the same answer; a bad entry is a
prefill."""

from __future__ import annotations

import asyncio
import itertools
import logging

from podium.engine.base import EngineRequest, SamplingParams
from podium.engine.llamacpp.engine import LlamaCppEngine, kv_fingerprint
from podium.engine.llamacpp.prompt_cache import PromptCache

_ids = itertools.count()
BATCH = 64
LONG = "".join(f"Rule {i}: always answer in full sentences about topic {i}.\n"
               for i in range(40))


def make(model_path, directory, *, n_batch=BATCH, max_num_seqs=1):
    cache = PromptCache(directory, kv_fingerprint(model_path, n_ctx=1024, n_batch=n_batch,
                                                  deterministic=True),
                        max_bytes=1 << 30, min_tokens=128, block=n_batch)
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


def close(engine):
    asyncio.run(engine.aclose())


def test_a_prefix_outlives_the_engine_and_gives_the_same_answer(model_path, tmp_path):
    first = make(model_path, tmp_path)
    try:
        answer, cached, length = ask(first, "Which rule is about topic 7?")
        assert cached == 0 and length > 600
    finally:
        close(first)
    second = make(model_path, tmp_path)        # a restart: a new engine, the same folder
    try:
        again, cached, _ = ask(second, "Which rule is about topic 7?")
        assert again == answer
        assert cached >= length - 2 * BATCH and cached % BATCH == 0
        assert second.stats["restored_tokens"] == cached
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
