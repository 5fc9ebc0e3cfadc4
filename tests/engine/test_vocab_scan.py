"""The vocabulary's end-of-generation ids and specials are found once per file and
remembered: a model loaded again (after an unload) does not scan its vocabulary again."""

import os
import shutil

import llama_cpp

from podium.engine.llamacpp import model as model_module
from podium.engine.llamacpp.model import LlamaModel, LlamaTokenizer


def test_a_reloaded_model_takes_what_the_first_scan_found(model_path, tmp_path):
    copy = tmp_path / "m.gguf"
    shutil.copyfile(model_path, copy)
    first_model = LlamaModel(copy, vocab_only=True)
    first = LlamaTokenizer(first_model)
    vocab = first_model.vocab
    expected = {t for t in range(first.vocab_size) if llama_cpp.llama_vocab_is_eog(vocab, t)}
    assert first.eos_token_ids == expected and "<|im_end|>" in first.specials()
    key = next(k for k in model_module._SCANS if k[0] == str(copy))
    again = LlamaTokenizer(LlamaModel(copy, vocab_only=True))
    assert again.eos_token_ids == first.eos_token_ids and again.specials() == first.specials()
    assert model_module._SCANS[key] == (again.eos_token_ids, again.specials())
    os.utime(copy, ns=(0, 0))                   # another file at the same path: scanned anew
    LlamaTokenizer(LlamaModel(copy, vocab_only=True))
    assert sum(k[0] == str(copy) for k in model_module._SCANS) == 2
