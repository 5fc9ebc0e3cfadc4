"""Converting a sentence-transformers BERT folder into a GGUF that llama.cpp embeds with.

The folder is what ``SentenceTransformer.save`` writes: ``modules.json`` naming a Transformer
(``config.json``, ``model.safetensors``, ``tokenizer.json`` or ``vocab.txt``), a Pooling module
(``1_Pooling/config.json``) and optionally a Normalize module. The GGUF has llama.cpp's ``bert``
architecture: its hyperparameters, ``bert.pooling_type`` from the Pooling module, a WordPiece
vocabulary (``tokenizer.ggml.model = "bert"``) and the encoder's weights. GGUF has no key for
the Normalize module nor for sentence-transformers' own truncation length, so two keys of
Podium's record them: ``podium.normalize`` (the pooled vector is to be scaled to unit length)
and ``podium.max_seq_length`` (``sentence_bert_config.json``: longer inputs are cut there).

Weights: the matrices llama.cpp multiplies by (the attention and feed-forward weights) and the
token embeddings are written as f16, halving the file (90 MB of f32 to 45 MB) at a cost well
below the embeddings' agreement threshold (tests/engine/test_embed_model.py); biases, layer
norms, the position and token-type embeddings stay f32, as llama.cpp's BERT graph adds them to
f32 activations. ``dtype="f32"`` keeps every tensor f32.

The safetensors file is read with numpy alone (its header is bounded, its offsets checked):
neither torch nor the ``safetensors`` package is needed.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np

from podium.errors import ModelFilesError

MAX_HEADER_BYTES = 16 << 20          # a safetensors JSON header larger than this is refused
MAX_JSON_BYTES = 64 << 20            # tokenizer.json and the small config files
MATRYOSHKA_KEY = "podium.matryoshka_dimensions"     # the lengths vectors may be cut to

# safetensors dtype -> the numpy dtype of the stored bytes (BF16 is widened after reading)
_DTYPES: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "F64": np.dtype("<f8"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4")}

# Pooling module flags -> llama.cpp's pooling type (gguf.PoolingType: MEAN 1, CLS 2, LAST 3)
_POOLING_MODES = {"pooling_mode_mean_tokens": ("mean", 1),
                  "pooling_mode_cls_token": ("cls", 2),
                  "pooling_mode_lasttoken": ("last", 3)}

# tensors of a Hugging Face BertModel that an embedding model does not use
_UNUSED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")

# llama.cpp's token types (gguf.TokenType)
_NORMAL, _CONTROL = 1, 3
_PHANTOM_SPACE = "\u2581"


def declared_matryoshka(config: dict[str, Any]) -> str | None:
    """What a Hugging Face config.json declares: ``matryoshka_dimensions`` (a list) or
    ``is_matryoshka`` (any length), in --matryoshka-dimensions' spelling."""
    lengths = config.get("matryoshka_dimensions")
    if isinstance(lengths, list) and lengths and all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths):
        return ",".join(str(n) for n in lengths)
    return "any" if config.get("is_matryoshka") is True else None


def _fail(folder: Path, why: str) -> ModelFilesError:
    return ModelFilesError(f"Cannot convert {folder} to GGUF: {why}")


def _read_json(path: Path, folder: Path) -> Any:
    if not path.is_file():
        raise _fail(folder, f"{path.relative_to(folder)} is missing")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise _fail(folder, f"{path.relative_to(folder)} is larger than {MAX_JSON_BYTES} bytes")
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a ``.safetensors`` file as a read-only numpy view of the file.

    The layout: an 8-byte little-endian header length, that many bytes of JSON naming each
    tensor's dtype, shape and byte range, then the data. BF16 is returned widened to f32.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ModelFilesError(f"{path} is not a safetensors file (too short)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise ModelFilesError(f"{path}: safetensors header of {header_len} bytes refused")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelFilesError(f"{path}: unreadable safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise ModelFilesError(f"{path}: the safetensors header is not an object")
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = [int(n) for n in info["shape"]]
            begin, end = (int(n) for n in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFilesError(f"{path}: tensor {name!r} has an unsupported or malformed "
                                  f"entry {info!r}") from exc
        if not 0 <= begin <= end <= len(data) or any(n < 0 for n in shape) \
                or math.prod(shape) * dtype.itemsize != end - begin:
            raise ModelFilesError(f"{path}: tensor {name!r} does not fit its byte range")
        array = data[begin:end].view(dtype).reshape(shape)
        if info["dtype"] == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = array
    return tensors


# a cross-encoder's head (BertForSequenceClassification): the pooler's dense layer and tanh,
# then the classifier; llama.cpp's rank pooling runs the same two as cls and cls.output
_RANK_HEAD = {"pooler.dense.weight": "cls.weight", "pooler.dense.bias": "cls.bias",
              "classifier.weight": "cls.output.weight", "classifier.bias": "cls.output.bias"}
RANK_POOLING = 4                     # llama.cpp's LLAMA_POOLING_TYPE_RANK


class SentenceTransformerFolder:
    """What the converter needs from a sentence-transformers folder, checked on reading: an
    embedding model (modules.json: Transformer, Pooling[, Normalize]) or a cross-encoder (a
    BertForSequenceClassification folder with one label, scored by llama.cpp's rank
    pooling)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.rank = False
        if not (folder / "modules.json").is_file():
            self._cross_encoder()
            return
        modules = _read_json(folder / "modules.json", folder)
        kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
        if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]):
            raise _fail(folder, f"modules {kinds} are not Transformer, Pooling[, Normalize] "
                                "(llama.cpp applies no other module)")
        transformer, pooling = modules[0], modules[1]
        self.model_dir = folder / transformer.get("path", "")
        self.normalize = kinds[2:] == ["Normalize"]
        self.pooling_name, self.pooling_type = self._pooling(
            _read_json(folder / pooling["path"] / "config.json", folder))
        self.config = _read_json(self.model_dir / "config.json", folder)
        st_config = self.model_dir / "sentence_bert_config.json"
        self.max_seq_length = (_read_json(st_config, folder).get("max_seq_length")
                               if st_config.is_file() else None)
        self._check_config()

    def _cross_encoder(self) -> None:
        self.model_dir, self.normalize, self.rank = self.folder, False, True
        self.pooling_name, self.pooling_type = "rank", RANK_POOLING
        self.config = c = _read_json(self.folder / "config.json", self.folder)
        if c.get("architectures") != ["BertForSequenceClassification"]:
            raise _fail(self.folder, "has no modules.json (a sentence-transformers model) and "
                                     "is not a BertForSequenceClassification cross-encoder")
        if len(c.get("id2label") or {"0": "LABEL_0"}) != 1:
            raise _fail(self.folder, "the cross-encoder gives several labels; a reranker "
                                     "gives one score")
        if c.get("type_vocab_size", 2) != 1:
            # llama.cpp's bert graph reads every token as segment A; a model trained with
            # the document as segment B would be scored silently wrong
            raise _fail(self.folder, "the cross-encoder reads the document as a second "
                                     "segment (type_vocab_size 2), which llama.cpp's bert "
                                     "graph does not give; serve the folder with engine = "
                                     "\"vllm\"")
        self.max_seq_length = None
        self._check_config()

    def _pooling(self, config: dict[str, Any]) -> tuple[str, int]:
        chosen = [key for key, on in config.items() if key.startswith("pooling_mode") and on]
        if len(chosen) != 1 or chosen[0] not in _POOLING_MODES:
            raise _fail(self.folder, f"pooling {chosen} is not one of "
                                     f"{sorted(_POOLING_MODES)} (what llama.cpp can pool)")
        return _POOLING_MODES[chosen[0]]

    def _check_config(self) -> None:
        c = self.config
        wanted = {"model_type": "bert", "position_embedding_type": "absolute",
                  "hidden_act": "gelu"}
        for key, value in wanted.items():
            if c.get(key, value) != value:
                raise _fail(self.folder, f"config.json {key} is {c.get(key)!r}, not {value!r}")
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "vocab_size"):
            if not isinstance(c.get(key), int) or c[key] <= 0:
                raise _fail(self.folder, f"config.json has no positive integer {key}")

    def vocabulary(self) -> tuple[list[str], dict[str, int], bool]:
        """The WordPiece tokens by id, the special tokens' ids, and whether text is lowercased."""
        tokenizer_json = self.model_dir / "tokenizer.json"
        special_names = {"cls": "[CLS]", "sep": "[SEP]", "unk": "[UNK]", "pad": "[PAD]",
                         "mask": "[MASK]"}
        config_path = self.model_dir / "tokenizer_config.json"
        tok_config = _read_json(config_path, self.folder) if config_path.is_file() else {}
        for kind in special_names:
            value = tok_config.get(f"{kind}_token")
            if isinstance(value, dict):               # an AddedToken written out
                value = value.get("content")
            if isinstance(value, str):
                special_names[kind] = value
        if tokenizer_json.is_file():
            spec = _read_json(tokenizer_json, self.folder)
            model = spec.get("model") or {}
            if model.get("type") != "WordPiece" or model.get("continuing_subword_prefix",
                                                                "##") != "##":
                raise _fail(self.folder, "tokenizer.json is not a WordPiece model with the "
                                         "'##' continuation prefix")
            by_token: dict[str, int] = dict(model["vocab"])
            normalizer = spec.get("normalizer") or {}
            lowercase = bool(normalizer.get("lowercase", True))
        else:
            lines = (self.model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
            by_token = {token: i for i, token in enumerate(lines)}
            lowercase = bool(tok_config.get("do_lower_case", True))
        tokens = [""] * len(by_token)
        for token, i in by_token.items():
            if not 0 <= i < len(tokens) or tokens[i]:
                raise _fail(self.folder, "the vocabulary's ids are not 0..n-1, each once")
            tokens[i] = token
        special = {}
        for kind, token in special_names.items():
            if token not in by_token:
                raise _fail(self.folder, f"the {kind} token {token!r} is not in the vocabulary")
            special[kind] = by_token[token]
        return tokens, special, lowercase


def gguf_tokens(tokens: list[str], control: set[int]) -> list[str]:
    """WordPiece tokens in llama.cpp's spelling: a word-initial piece starts with U+2581 (the
    'phantom space' its WordPiece tokenizer prepends to each word), a ``##`` continuation loses
    its prefix, and control tokens are kept as they are."""
    out = []
    for i, token in enumerate(tokens):
        if i in control:
            out.append(token)
        elif token.startswith("##") and len(token) > 2:
            out.append(token[2:])
        else:
            out.append(_PHANTOM_SPACE + token)
    return out


def _bert_tensor_names(n_layers: int, rank: bool = False) -> Callable[[str], str | None]:
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layers)

    def gguf_name(hf_name: str) -> str | None:
        hf_name = hf_name.removeprefix("bert.")
        if rank and hf_name in _RANK_HEAD:
            return _RANK_HEAD[hf_name]
        if hf_name.startswith(("classifier.", "pooler.")):
            return None             # not the graph's (a head only a reranker reads)
        return names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    return gguf_name


def convert(folder: Path, out: Path, *, dtype: str = "f16", name: str | None = None,
            license_name: str | None = None,
            progress: Callable[[int, int], None] | None = None) -> None:
    """Write the GGUF of the sentence-transformers model in ``folder`` to ``out``.

    ``progress(done, total)`` is called as the tensors are prepared (in bytes read).
    """
    import gguf

    if dtype not in ("f16", "f32"):
        raise ValueError(f"dtype must be 'f16' or 'f32', not {dtype!r}")
    model = SentenceTransformerFolder(folder)
    c = model.config
    n_layers = c["num_hidden_layers"]
    tokens, special, lowercase = model.vocabulary()
    if not lowercase:
        raise _fail(folder, "the tokenizer is cased, and llama.cpp's WordPiece tokenizer "
                            "lowercases every input")
    if len(tokens) != c["vocab_size"]:
        raise _fail(folder, f"the tokenizer has {len(tokens)} tokens, config.json "
                            f"vocab_size {c['vocab_size']}")
    weights_path = model.model_dir / "model.safetensors"
    if not weights_path.is_file():
        raise _fail(folder, "model.safetensors is missing (pytorch_model.bin is not read)")
    weights = read_safetensors(weights_path)

    gguf_name = _bert_tensor_names(n_layers, model.rank)
    expected = 5 + 16 * n_layers        # embeddings (3) + their norm (2); 16 per layer
    expected += len(_RANK_HEAD) if model.rank else 0
    prepared: list[tuple[str, np.ndarray]] = []
    total = sum(t.nbytes for t in weights.values())
    done = 0
    for hf_name, array in weights.items():
        done += array.nbytes
        if hf_name.removeprefix("bert.") in _UNUSED and not (
                model.rank and hf_name.removeprefix("bert.") in _RANK_HEAD):
            continue
        target = gguf_name(hf_name)
        if target is None:
            raise _fail(folder, f"tensor {hf_name!r} has no place in llama.cpp's bert graph")
        keep_f32 = (dtype == "f32" or array.ndim < 2
                    or target in ("position_embd.weight", "token_types.weight"))
        prepared.append((target, np.ascontiguousarray(
            array, dtype=np.float32 if keep_f32 else np.float16)))
        if progress:
            progress(done, total)
    if len(prepared) != expected or len({t for t, _ in prepared}) != expected:
        raise _fail(folder, f"{len(prepared)} tensors mapped, expected {expected} for "
                            f"{n_layers} layers")
    if progress:
        progress(total, total)

    writer = gguf.GGUFWriter(out, "bert")
    writer.add_type("model")
    if name:
        writer.add_name(name)
    if license_name:
        writer.add_license(license_name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16"
                         else gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(c["max_position_embeddings"])
    writer.add_embedding_length(c["hidden_size"])
    writer.add_feed_forward_length(c["intermediate_size"])
    writer.add_block_count(n_layers)
    writer.add_head_count(c["num_attention_heads"])
    writer.add_layer_norm_eps(float(c.get("layer_norm_eps", 1e-12)))
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(model.pooling_type))
    writer.add_bool("podium.normalize", model.normalize)
    if isinstance(model.max_seq_length, int) and model.max_seq_length > 0:
        writer.add_uint32("podium.max_seq_length", model.max_seq_length)
    matryoshka = declared_matryoshka(c)
    if matryoshka is not None:
        writer.add_string(MATRYOSHKA_KEY, matryoshka)

    control = set(special.values())
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(gguf_tokens(tokens, control))
    writer.add_token_types([_CONTROL if i in control else _NORMAL for i in range(len(tokens))])
    writer.add_token_type_count(int(c.get("type_vocab_size", 2)))
    # llama.cpp's BERT vocabulary takes the beginning token (CLS) from the bos key
    writer.add_bos_token_id(special["cls"])
    writer.add_sep_token_id(special["sep"])
    writer.add_unk_token_id(special["unk"])
    writer.add_pad_token_id(special["pad"])
    writer.add_mask_token_id(special["mask"])
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)
    writer.add_add_eos_token(False)

    for target, array in prepared:
        writer.add_tensor(target, array)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
