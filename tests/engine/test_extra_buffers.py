"""Weights in llama.cpp's extra buffer types (repacked for the CPU's kernels) must never kill
the process: on an Intel Xeon VM with AMX, llama.cpp's AMX kernels died of an illegal
instruction (SIGILL) at the first prompt, with a Q8_0 embedding model and a Q4_K_M chat model
alike. Each check runs in a child process, so a crash fails the test instead of pytest."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from podium.engine.llamacpp.model import use_extra_buffers

CHILD = textwrap.dedent("""
    import asyncio, ctypes, math, sys
    from pathlib import Path
    import llama_cpp
    from podium.engine.llamacpp.embed import LlamaEmbedder
    from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer
    from podium.engine.llamacpp.model_files import EMBED_MODEL, default_model_path

    # a quantized embedding model (the packaged f16 MiniLM, made Q8_0), with extra buffers
    f16, q8 = default_model_path(EMBED_MODEL), Path(sys.argv[1]) / "minilm-q8_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    assert llama_cpp.llama_model_quantize(str(f16).encode(), str(q8).encode(), params) == 0
    text = " ".join(["a quiet harbour town in the early morning"] * 6)

    async def vectors(path):
        embedder = LlamaEmbedder(path, served_name="m", n_threads=2)
        ids = embedder.tokenizer.encode(text)
        try:
            lone = (await embedder.embed([ids]))[0]
            packed = await embedder.embed([ids] * 8)
        finally:
            await embedder.aclose()
        return lone, packed[3]

    (a, b), (c, _) = asyncio.run(vectors(q8)), asyncio.run(vectors(f16))
    cos = lambda x, y: sum(p * q for p, q in zip(x, y))     # (normalized)
    assert cos(a, c) > 0.99 and cos(b, c) > 0.99, (cos(a, c), cos(b, c))

    # the default chat model (Q4_K_M) with extra buffers (--no-deterministic): a prompt
    model = LlamaModel(default_model_path(), n_ctx=512, n_batch=512, n_threads=2,
                       extra_buffers=True)
    ids = LlamaTokenizer(model).encode(text * 2)
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    for i, token in enumerate(ids):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, i, 1
        batch.seq_id[i][0], batch.logits[i] = 0, i == len(ids) - 1
    batch.n_tokens = len(ids)
    assert llama_cpp.llama_decode(model.ctx, batch) == 0
    llama_cpp.llama_batch_free(batch)
    model.close()
    print("decoded", len(ids))
""")


def test_quantized_weights_in_extra_buffers_decode_without_killing_the_process(tmp_path):
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True,
                           text=True, timeout=600)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert child.stdout.startswith("decoded ")


def test_with_amx_kernels_no_weights_are_repacked(monkeypatch):
    from podium.engine.llamacpp import model

    monkeypatch.setattr(model, "_amx", False)
    assert use_extra_buffers(True) is True and use_extra_buffers(False) is False
    monkeypatch.setattr(model, "_amx", True)            # this CPU and build have them
    assert use_extra_buffers(True) is False
