"""What the contract module does not see of the vLLM engine: vLLM's own bookkeeping after
aborts, the request fields only vLLM maps (logit bias, ignore_eos, penalties), and the
running / waiting split. Runs where vLLM is installed (one engine for the module)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time

import pytest

pytest.importorskip("vllm")

from podium.engine.base import CacheHint, EngineRequest, SamplingParams  # noqa: E402
from podium.engine.vllm.engine import VllmEngine  # noqa: E402

_ids = itertools.count()


@pytest.fixture(scope="module")
def engine(model_path):
    built = VllmEngine.from_gguf(model_path, served_name="m", max_model_len=1024,
                                 enforce_eager=True, max_num_seqs=2, max_queued=4,
                                 engine_args={"kv_cache_memory_bytes": 1 << 30})
    yield built
    asyncio.run(built.aclose())


def request(engine, text: str, **sampling) -> EngineRequest:
    sampling.setdefault("temperature", 0.0)
    prompt = engine.tokenizer.encode(
        f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    return EngineRequest(f"vllm-{next(_ids)}", prompt, SamplingParams(**sampling))


async def collect(outputs):
    return [o async for o in outputs]


def run(engine, req):
    async def outputs():
        return await asyncio.wait_for(collect(engine.generate(req)), 120)
    return asyncio.run(outputs())


def tokens(outs):
    return [t for o in outs for t in o.token_ids]


def unfinished(engine) -> int:
    """Requests vLLM's front-end still tracks (the engine core is told of each abort)."""
    return engine._llm.output_processor.get_num_unfinished_requests()


async def settle(engine, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while engine.stats["running"] or engine.stats["waiting"] or unfinished(engine):
        assert time.monotonic() < deadline, (dict(engine.stats), unfinished(engine))
        await asyncio.sleep(0.01)


def test_every_way_of_ending_early_leaves_vllm_with_nothing_unfinished(engine):
    async def scenario():
        # end of turn ignored: the model's greedy "long story" is 13 tokens, which a fast
        # CPU finished before the cancel below came
        long = dict(max_tokens=300, ignore_eos=True)
        closed = engine.generate(request(engine, "Write a long story.", **long))
        await closed.__anext__()
        await closed.aclose()
        aborted = request(engine, "Write a long story.", **long)
        outputs = engine.generate(aborted)
        await outputs.__anext__()
        await engine.abort(aborted.request_id)
        assert (await collect(outputs))[-1].finish_reason == "abort"
        dropped = engine.generate(request(engine, "Write a long story.", **long))
        await dropped.__anext__()
        del dropped
        gc.collect()
        reader = asyncio.create_task(collect(engine.generate(
            request(engine, "Write a long story.", **long))))
        await asyncio.sleep(0.5)
        reader.cancel()                         # the consuming task cancelled
        with pytest.raises(asyncio.CancelledError):
            await reader
        await settle(engine)

    asyncio.run(scenario())
    assert unfinished(engine) == 0


def test_running_and_waiting_follow_vllms_scheduler(engine):
    async def scenario():
        streams = [engine.generate(request(engine, f"Story {i}.", max_tokens=300,
                                           ignore_eos=True)) for i in range(4)]
        for s in streams[:2]:
            await s.__anext__()
        deadline = time.monotonic() + 10
        while (engine.stats["running"], engine.stats["waiting"]) != (2, 2):
            assert time.monotonic() < deadline, dict(engine.stats)
            await asyncio.sleep(0.01)
        for s in streams:
            await s.aclose()
        await settle(engine)

    asyncio.run(scenario())


def test_logit_bias_ignore_eos_and_penalties_reach_vllm(engine):
    forced = engine.tokenizer.encode("banana", add_special=False)[0]
    outs = run(engine, request(engine, "Say hi.", max_tokens=3, logit_bias={forced: 100.0}))
    assert tokens(outs) == [forced] * 3
    eos = min(engine.tokenizer.eos_token_ids)
    outs = run(engine, request(engine, "Say hi.", max_tokens=12, ignore_eos=True,
                               logit_bias={eos: 100.0}))     # EOS every step, never the end
    assert len(tokens(outs)) == 12 and outs[-1].finish_reason == "length"
    assert not outs[-1].stopped_by_token
    plain = tokens(run(engine, request(engine, "Repeat 'la' many times.", max_tokens=20)))
    penalized = tokens(run(engine, request(
        engine, "Repeat 'la' many times.", max_tokens=20, repetition_penalty=2.0,
        presence_penalty=1.5, frequency_penalty=1.5)))
    assert penalized != plain


def test_the_prefix_cache_is_counted_in_kv_tokens_when_idle(engine):
    text = " ".join(f"Fact {i}: lighthouses guide ships at night." for i in range(40))
    run(engine, request(engine, text, max_tokens=2))
    assert engine.stats["running"] == 0
    assert engine.stats["kv_tokens"] >= 256                 # whole 128-token blocks kept
    assert engine.stats["kv_tokens"] <= engine.stats["kv_capacity"]


def test_what_a_request_wrote_to_the_prefix_cache_is_reported_up_to_its_breakpoint(engine):
    """vLLM's own count of a request's prefix-cache writes is its ``cache_written`` (first
    output only), no more than a client's breakpoint marks; the same prompt again reads
    them (``cached_tokens``) and writes none."""
    text = " ".join(f"Rule {i}: lighthouses keep their lamps lit at night." for i in range(30))
    first = request(engine, text, max_tokens=2)
    first.cache = CacheHint(until=len(first.prompt_token_ids) - 1)
    outs = run(engine, first)
    assert 0 < outs[0].cache_written <= len(first.prompt_token_ids) - 1
    assert all(o.cache_written == 0 for o in outs[1:])
    marked = request(engine, "Another question. " + text, max_tokens=2)
    marked.cache = CacheHint(until=20)                  # a breakpoint early in the prompt
    assert run(engine, marked)[0].cache_written <= 20
    again = request(engine, text, max_tokens=2)
    again.cache = CacheHint(until=len(again.prompt_token_ids) - 1)
    outs = run(engine, again)
    assert outs[0].cached_tokens > 0 and outs[0].cache_written == 0


# ---- a cross-encoder (reranker) on vLLM's classify pooling ----------------------------------

def _tiny_cross_encoder(folder) -> None:
    """A random BertForSequenceClassification of one label with its own WordPiece tokenizer,
    saved as sentence-transformers' CrossEncoder saves one (no reranker is on PyPI)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "a",
             "mat", "dog", "ran", "in", "park", "hello", "world", "bread", "oven", "!", ","]
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(str(folder))
    torch.manual_seed(3)
    config = BertConfig(vocab_size=len(words), hidden_size=128, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=256,
                        max_position_embeddings=128, type_vocab_size=2, num_labels=1)
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():               # scores spread out, and segment B unlike segment A
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
        model.bert.embeddings.token_type_embeddings.weight.normal_(0, 1.0)
    model.save_pretrained(str(folder), safe_serialization=True)


def test_a_cross_encoder_scores_as_transformers_does(tmp_path):
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    folder = tmp_path / "ce"
    _tiny_cross_encoder(folder)
    query, docs = "the cat sat", ["a cat sat on the mat !", "hello world", "the dog ran"]
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = BertForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        batch = tok([query] * len(docs), docs, return_tensors="pt", padding=True)
        want = torch.sigmoid(model(**batch).logits[:, 0]).tolist()
        flat = dict(batch, token_type_ids=torch.zeros_like(batch["token_type_ids"]))
        one_segment = torch.sigmoid(model(**flat).logits[:, 0]).tolist()
    # vLLM computes in bfloat16 on CPU: measured 1.3e-3 from transformers' float32 scores;
    # reading the document as segment A would be further off than that allows
    assert max(abs(a - b) for a, b in zip(want, one_segment)) > 2e-2, (want, one_segment)
    assert max(want) - min(want) > 1e-2, want           # the documents tell apart

    engine = VllmEngine(folder, served_name="r", kind="rerank", max_model_len=128,
                        enforce_eager=True, engine_args={"kv_cache_memory_bytes": 64 << 20})
    try:
        assert engine.pair_overhead == 3                    # [CLS] q [SEP] d [SEP]
        q = engine.tokenizer.encode(query, add_special=False)
        got = asyncio.run(engine.score(q, [engine.tokenizer.encode(d, add_special=False)
                                           for d in docs]))
        assert max(abs(a - b) for a, b in zip(got, want)) < 5e-3, (got, want)
        with pytest.raises(Exception, match="reranker"):
            engine.check_room()
    finally:
        asyncio.run(engine.aclose())


def test_a_request_vllm_ends_on_its_own_is_an_engine_error_not_an_unload(engine):
    """vLLM's guidance backend ends a request whose grammar leads nowhere mid-way (here:
    markup written as text, which vLLM's tokenizer reads back as the special token): that
    is the engine failing (500), not the model unloaded under it (503)."""
    from podium.errors import EngineError
    req = request(engine, "Call a tool.", max_tokens=8,
                  grammar='start: "<tool_call>" "x"\n')
    with pytest.raises(EngineError):
        run(engine, req)
    asyncio.run(settle(engine))
