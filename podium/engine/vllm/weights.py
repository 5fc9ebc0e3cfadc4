# mypy: disable-error-code="import-not-found, import-untyped"
# (vLLM, torch and transformers are installed only where the vLLM engine runs)
"""A GGUF model as a Hugging Face safetensors folder, for vLLM.

vLLM on CPU cannot load GGUF (its dequantization kernels need CUDA), so the default model is
served from a bf16 folder made from the GGUF once and cached beside it:
``<cache>/hf/<gguf name>-bf16/`` with config.json, model.safetensors, the tokenizer files,
the chat template and a generation_config.json whose ``eos_token_id`` lists every
end-of-generation token llama.cpp knows for the vocabulary (so both engines stop alike).

Needs torch, transformers and gguf (all present where vLLM is); nothing from the network.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from podium.engine.llamacpp.model_files import cache_dir
from podium.errors import ModelFilesError

log = logging.getLogger(__name__)

DONE = ".podium-complete"       # written last: a folder without it is a broken conversion


def hf_folder_path(gguf: Path, directory: Path | None = None) -> Path:
    return (directory or cache_dir() / "hf") / f"{gguf.stem}-bf16"


def hf_folder_from_gguf(gguf: Path, directory: Path | None = None) -> Path:
    """The cached HF folder for ``gguf``, converting it first if there is none yet."""
    target = hf_folder_path(gguf, directory)
    stamp = f"{gguf.name} {gguf.stat().st_size}"
    if (target / DONE).is_file() and (target / DONE).read_text() == stamp:
        return target
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        convert(gguf, partial)
        (partial / DONE).write_text(stamp)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` to bf16 safetensors and write the folder vLLM loads."""
    try:
        import torch
        from safetensors.torch import save_file
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    except ImportError as exc:
        raise ModelFilesError(f"Converting a GGUF model for vLLM needs torch, transformers and "
                              f"gguf: {exc}") from exc
    from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer

    log.info("converting %s to a bf16 safetensors folder for vLLM (once)", gguf)
    out.mkdir(parents=True)
    where, name = str(gguf.parent), gguf.name
    config = AutoConfig.from_pretrained(where, gguf_file=name)
    config.torch_dtype = torch.bfloat16
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton,
                                   torch_dtype=torch.bfloat16)["tensors"]
    expected = {k for k in skeleton.state_dict()
                if not (k == "lm_head.weight" and config.tie_word_embeddings)}
    missing = expected - set(tensors)
    if missing:
        raise ModelFilesError(f"{gguf} lacks tensors vLLM needs: {sorted(missing)[:5]}")
    save_file({k: v.contiguous() for k, v in tensors.items() if k in expected},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    tokenizer.save_pretrained(out)
    vocab = LlamaTokenizer(LlamaModel(gguf, vocab_only=True))
    eos = sorted(vocab.eos_token_ids)
    generation = {"eos_token_id": eos}
    if tokenizer.bos_token_id is not None:
        generation["bos_token_id"] = tokenizer.bos_token_id
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    if not tokenizer.chat_template:
        raise ModelFilesError(f"{gguf} has no chat template")
