"""The default GGUF as the bf16 safetensors folder vLLM serves, and Podium's tokenizer over
its Hugging Face tokenizer (runs where torch, transformers and gguf are installed)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from podium.engine.vllm import weights  # noqa: E402
from podium.engine.vllm.tokenizer import HfTokenizer  # noqa: E402

TEXTS = ["<|im_start|>user\nHello wörld, 日本語 <tool_call>{\"a\": 1}</tool_call><|im_end|>\n",
         "  def f(x):\n\treturn x**2  # émoji 🎉", "<|endoftext|>plain"]


@pytest.fixture(scope="module")
def folder(model_path):
    return weights.hf_folder_from_gguf(model_path)       # converted once, then cached


def test_the_folder_holds_what_vllm_loads(folder):
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", weights.DONE} <= names
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["num_hidden_layers"] == 24
    assert config.get("quantization_config") is None
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        embed = f.get_slice("model.embed_tokens.weight")
        assert embed.get_shape() == [config["vocab_size"], config["hidden_size"]]
        assert str(embed.get_dtype()).lower() in ("bf16", "bfloat16")


def test_the_tokenizer_agrees_with_the_gguf_vocabulary(folder, tokenizer):
    hf = HfTokenizer.from_folder(folder)
    assert hf.vocab_size == tokenizer.vocab_size
    assert hf.eos_token_ids == tokenizer.eos_token_ids
    assert (hf.bos_token, hf.eos_token) == (tokenizer.bos_token, tokenizer.eos_token)
    assert hf.chat_template and "<|im_start|>" in hf.chat_template
    for text in TEXTS:
        ids = hf.encode(text)
        assert ids == tokenizer.encode(text)
        assert hf.decode(ids) == tokenizer.decode(ids)
    for token_id in list(range(0, 151_643, 97)) + sorted(tokenizer.eos_token_ids):
        assert hf.piece(token_id) == tokenizer.piece(token_id), token_id


def test_a_finished_folder_is_reused_and_an_unfinished_one_made_again(tmp_path, monkeypatch):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    made = []

    def convert(source, out):
        made.append(source)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(weights, "convert", convert)
    target = weights.hf_folder_from_gguf(gguf, tmp_path / "hf")
    assert target == tmp_path / "hf" / "tiny-bf16" and (target / "config.json").is_file()
    assert weights.hf_folder_from_gguf(gguf, tmp_path / "hf") == target and len(made) == 1
    (target / weights.DONE).unlink()                    # a conversion cut short
    weights.hf_folder_from_gguf(gguf, tmp_path / "hf")
    gguf.write_bytes(b"GGUF" + bytes(70))               # another file under the same name
    weights.hf_folder_from_gguf(gguf, tmp_path / "hf")
    assert len(made) == 3
    assert [p.name for p in (tmp_path / "hf").iterdir()] == ["tiny-bf16"]   # no leftovers


def test_a_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")

    def convert(source, out):
        out.mkdir(parents=True)
        raise RuntimeError("disk full")

    monkeypatch.setattr(weights, "convert", convert)
    with pytest.raises(RuntimeError):
        weights.hf_folder_from_gguf(gguf, tmp_path / "hf")
    assert list((tmp_path / "hf").iterdir()) == []
