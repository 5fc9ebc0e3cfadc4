"""Work a client abandoned mid-prefill is kept: agent clients drop a stream that shows nothing
for minutes and send the same prompt again, and the retry must not prefill it all again."""

import asyncio
import time

from podium.engine.base import EngineRequest, SamplingParams
from podium.engine.llamacpp.engine import LlamaCppEngine

CHUNK = 64


def test_a_retry_reuses_the_prefix_an_aborted_request_prefilled(model_path):
    engine = LlamaCppEngine(model_path, served_name="m", n_ctx=4096, n_batch=CHUNK,
                            max_num_seqs=2)
    text = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(150))
    prompt = engine.tokenizer.encode(text)
    assert len(prompt) > 1500

    def request(rid):
        return EngineRequest(rid, list(prompt), SamplingParams(temperature=0, max_tokens=1))

    async def consume(generation):
        async for _ in generation:
            pass

    async def scenario():
        client = asyncio.create_task(consume(engine.generate(request("first"))))
        deadline = time.monotonic() + 300    # a busy machine prefills slowly
        while engine.stats["kv_tokens"] < len(prompt) // 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)        # until about a third of the prompt is in
        prefilled = engine.stats["kv_tokens"]
        client.cancel()                      # the client gave up, and retries at once
        await asyncio.gather(client, return_exceptions=True)
        outputs = [o async for o in engine.generate(request("retry"))]
        return prefilled, outputs[0].cached_tokens

    try:
        prefilled, reused = asyncio.run(scenario())
    finally:
        asyncio.run(engine.aclose())
    assert len(prompt) // 3 <= prefilled < len(prompt) - CHUNK     # it was cut mid-prefill
    assert reused >= prefilled - CHUNK and reused % CHUNK == 0, (prefilled, reused)
