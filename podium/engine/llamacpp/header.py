"""A GGUF file's header, read without loading the model: what ``/api/tags`` and
``/api/show`` say about a model that may not be loaded.

``read_header(path)`` maps the file and walks its header: the key-value metadata (scalars
kept; arrays kept when short, else only their length: a vocabulary is 150k strings), then
the tensor descriptions (their element counts: the parameter count). Tensor data is never
touched; the walk is one pass over the header's bytes (a few MiB for a 150k-token
vocabulary: about 50 ms), remembered by path, size and modification time.

Everything a file can make the walk do is bounded: counts of keys, tensors, array items and
dimensions (each count also by the bytes left: an item takes at least ``_LEAST[...]`` bytes,
so a count the file cannot hold fails before any loop), the depth of arrays of arrays
(``MAX_DEPTH``: no recursion past it; llama.cpp reads none), the length of every string,
every dimension and every tensor's element count and their sum (below 2**63, as llama.cpp's
int64 counts: nothing a JSON encoder refuses), and every offset is checked against the
file's size. A file breaking a bound, or not a GGUF file, is a ``ModelFilesError`` naming
it and the cause, remembered like a header so a broken file is not walked again per request.
"""

from __future__ import annotations

import mmap
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podium.errors import ModelFilesError

MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 20
MAX_ITEMS = 1 << 25             # items in one array (vocabularies are ~2^18)
MAX_STRING = 16 << 20           # one string (chat templates are tens of KiB)
MAX_DIMS = 8                    # GGML_MAX_DIMS is 4
MAX_DEPTH = 4                   # arrays in arrays (the spec allows them; llama.cpp reads none)
MAX_ELEMENTS = 2**63 - 1        # a dimension, a tensor's elements, all tensors' (int64's max)
SHORT_ARRAY = 5                 # arrays kept whole up to this length (as Ollama shows them)
REMEMBERED = 32

# llama.cpp's llama_ftype (include/llama.h): general.file_type -> the name Ollama shows
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0"}

# fill-in-the-middle tokens (prefix, suffix, middle) as the code models' vocabularies spell
# them: Qwen2.5-Coder and CodeGemma, StarCoder, CodeLlama, DeepSeek-Coder
FIM_SETS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
            ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
            ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
            ("▁<PRE>", "▁<SUF>", "▁<MID>"),
            ("<PRE>", "<SUF>", "<MID>"),
            ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"))
_FIM_TOKENS = frozenset(t.encode() for s in FIM_SETS for t in s)
_FIM_LONGEST = max(len(t) for t in _FIM_TOKENS)
_FIM_FIRST = frozenset(t[0] for t in _FIM_TOKENS)
FIM_KEYS = ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.fim_mid_token_id")

# value types: struct format of a scalar (8: string, 9: array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# the fewest bytes one item takes: a string (its length), an array (its type and length), a
# tensor's description (name length, dimensions, type, offset), a key (name length, type, u8)
_LEAST = {"string": 8, "array": 12, "tensor": 8 + 4 + 4 + 8, "key": 8 + 4 + 1}


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, Any]            # key -> scalar, short array, or [] for a long one
    array_lengths: dict[str, int]       # every array's length
    parameters: int                     # elements of every tensor in this file
    tensors: int
    fim: bool = False                   # the vocabulary has fill-in-the-middle tokens
    fim_tokens: tuple[str, ...] = field(default=())

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def file_type(self) -> str:
        """The quantization's name (Q4_K_M ...), "" when the file does not say."""
        value = self.metadata.get("general.file_type")
        if isinstance(value, int) and not isinstance(value, bool):
            return FILE_TYPES.get(value, f"type {value}")
        return ""


_REMEMBERED: OrderedDict[tuple[str, int, int], Header | ModelFilesError] = OrderedDict()


def read_header(path: Path) -> Header:
    """The header of the GGUF file ``path`` (remembered while the file is unchanged, and so
    is its failure: a broken file costs one walk, not one per listing)."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelFilesError(f"Model file not found: {path} ({exc.strerror})") from None
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    found = _REMEMBERED.get(key)
    if found is None:
        try:
            found = _read(path)
        except OSError as exc:                  # not remembered: it may pass (permissions)
            raise ModelFilesError(f"{path.name}: cannot read its header: {exc}") from None
        except ModelFilesError as exc:          # what the file holds: remembered
            found = exc
        _REMEMBERED[key] = found
        while len(_REMEMBERED) > REMEMBERED:
            _REMEMBERED.popitem(last=False)
    _REMEMBERED.move_to_end(key)
    if isinstance(found, ModelFilesError):
        raise ModelFilesError(found.message)
    return found


def _read(path: Path) -> Header:
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _Walk(data, path.name).header()
    except ValueError as exc:                   # mmap of an empty file
        raise ModelFilesError(f"{path.name}: cannot read its header: {exc}") from None


class _Walk:
    """One pass over a header in ``data`` (the mapped file)."""

    def __init__(self, data: mmap.mmap, name: str):
        self.data, self.name, self.at = data, name, 0
        self.size = len(data)
        self.fim: set[bytes] = set()

    def fail(self, what: str) -> ModelFilesError:
        return ModelFilesError(f"{self.name}: not a GGUF header llama.cpp reads ({what}, at "
                               f"byte {self.at})")

    def take(self, fmt: str, n: int) -> Any:
        if self.at + n > self.size:
            raise self.fail("ends early")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += n
        return value

    def count(self, limit: int, what: str, least: int = 0) -> int:
        """A count here, at most ``limit``, of items of at least ``least`` bytes each: more
        than the bytes left can hold fails now, before anything loops over them."""
        n = self.take("<Q", 8)
        if n > limit:
            raise self.fail(f"{n} {what}, more than {limit}")
        if n * least > self.size - self.at:
            raise self.fail(f"{n} {what}, more than the {self.size - self.at} bytes left "
                            f"can hold")
        return n

    def raw_string(self) -> tuple[int, int]:
        """(start, length) of the string here, skipped."""
        n = self.count(MAX_STRING, "bytes in a string")
        start = self.at
        if start + n > self.size:
            raise self.fail("a string runs past the end of the file")
        self.at += n
        return start, n

    def string(self) -> str:
        start, n = self.raw_string()
        return bytes(self.data[start:start + n]).decode("utf-8", "replace")

    def scalar(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise self.fail(f"value type {kind}")
        return self.take(fmt, struct.calcsize(fmt))

    def array(self, key: str, depth: int = 1) -> tuple[list[Any], int]:
        """The array here (``depth``: arrays it is inside, plus one): kept when short, else
        only its length."""
        if depth > MAX_DEPTH:
            raise self.fail(f"arrays nested more than {MAX_DEPTH} deep")
        kind = self.take("<I", 4)
        least = _LEAST["array"] if kind == _ARRAY else _LEAST["string"] if kind == _STRING \
            else struct.calcsize(_SCALARS.get(kind, "<B"))
        n = self.count(MAX_ITEMS, "items in an array", least)
        if n <= SHORT_ARRAY and kind != _ARRAY:
            return [self.scalar(kind) for _ in range(n)], n
        if kind == _STRING:
            watch = key == "tokenizer.ggml.tokens"
            data = self.data
            for _ in range(n):
                start, length = self.raw_string()
                if watch and 0 < length <= _FIM_LONGEST and data[start] in _FIM_FIRST:
                    token = bytes(data[start:start + length])
                    if token in _FIM_TOKENS:
                        self.fim.add(token)
        elif kind == _ARRAY:
            for _ in range(n):
                self.array("", depth + 1)
        else:
            fmt = _SCALARS.get(kind)
            if fmt is None:
                raise self.fail(f"array item type {kind}")
            self.at += n * struct.calcsize(fmt)
            if self.at > self.size:
                raise self.fail("an array runs past the end of the file")
        return [], n

    def tensor(self) -> int:
        """The elements of the tensor described here (each dimension, and their product,
        at most ``MAX_ELEMENTS``, as llama.cpp checks them)."""
        self.raw_string()                                       # its name
        dims = self.take("<I", 4)
        if dims > MAX_DIMS:
            raise self.fail(f"a tensor of {dims} dimensions")
        elements = 1
        for _ in range(dims):
            dim = self.take("<Q", 8)
            if dim > MAX_ELEMENTS:
                raise self.fail(f"a tensor dimension of {dim}, more than {MAX_ELEMENTS}")
            elements *= dim
            if elements > MAX_ELEMENTS:
                raise self.fail(f"a tensor of more than {MAX_ELEMENTS} elements")
        self.take("<I", 4)                                      # its type
        self.take("<Q", 8)                                      # its data's offset
        return elements

    def header(self) -> Header:
        if self.size < 24 or self.data[:4] != b"GGUF":
            raise self.fail("no GGUF magic")
        self.at = 4
        version = self.take("<I", 4)
        if version not in (2, 3):
            raise self.fail(f"version {version}")
        tensors = self.count(MAX_TENSORS, "tensors", _LEAST["tensor"])
        keys = self.count(MAX_KEYS, "keys", _LEAST["key"])
        metadata: dict[str, Any] = {}
        lengths: dict[str, int] = {}
        for _ in range(keys):
            key = self.string()
            kind = self.take("<I", 4)
            if kind == _ARRAY:
                metadata[key], lengths[key] = self.array(key)
            else:
                metadata[key] = self.scalar(kind)
        parameters = 0
        for _ in range(tensors):
            parameters += self.tensor()
            if parameters > MAX_ELEMENTS:
                raise self.fail(f"tensors of more than {MAX_ELEMENTS} elements in all")
        fim = all(k in metadata for k in FIM_KEYS) or any(
            all(t.encode() in self.fim for t in s) for s in FIM_SETS)
        return Header(version, metadata, lengths, parameters, tensors, fim,
                      tuple(sorted(t.decode() for t in self.fim)))


def human_count(n: int) -> str:
    """A parameter count as Ollama writes it: 494.03M, 7.2B, 8B, 270M, 33K."""
    for unit, size, digits in (("B", 10**9, 1), ("M", 10**6, 2)):
        if n >= size:
            value = n / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{digits}f}{unit}"
    return f"{n / 1000:.0f}K" if n >= 1000 else str(n)


MAX_SAFETENSORS_HEADER = 64 << 20       # a safetensors JSON header larger than this is refused
MAX_SHARDS = 256


def safetensors_parameters(folder: Path) -> int:
    """Elements of every tensor in a Hugging Face folder's ``*.safetensors`` files, from
    their JSON headers alone (each bounded; at most ``MAX_SHARDS`` files; each dimension and
    every sum at most ``MAX_ELEMENTS``); 0 when none."""
    total = 0
    for path in sorted(folder.glob("*.safetensors"))[:MAX_SHARDS]:
        for name, tensor in _safetensors_header(path).items():
            if name != "__metadata__" and isinstance(tensor, dict):
                total += _elements(tensor.get("shape"), path.name)
                if total > MAX_ELEMENTS:
                    raise ModelFilesError(f"{path.name}: tensors of more than "
                                          f"{MAX_ELEMENTS} elements in all")
    return total


def _safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's JSON header (at most ``MAX_SAFETENSORS_HEADER`` bytes)."""
    import json

    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelFilesError(f"{path.name}: not a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_SAFETENSORS_HEADER:
            raise ModelFilesError(f"{path.name}: a header of {length} bytes")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:     # RecursionError: JSON nested too deep
        raise ModelFilesError(f"{path.name}: its header is not JSON safetensors reads "
                              f"({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(header, dict):
        raise ModelFilesError(f"{path.name}: its header is not a JSON object")
    return header


def _elements(shape: Any, name: str) -> int:
    """A safetensors tensor's element count: its shape's product (each dimension an integer
    of 0..``MAX_ELEMENTS``, at most ``MAX_DIMS`` of them, the product at most that too)."""
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise ModelFilesError(f"{name}: a tensor's shape is not a list of at most "
                              f"{MAX_DIMS} dimensions")
    elements = 1
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim <= MAX_ELEMENTS:
            raise ModelFilesError(f"{name}: a tensor dimension of {str(dim)[:40]}, not an "
                                  f"integer of 0..{MAX_ELEMENTS}")
        elements *= dim
        if elements > MAX_ELEMENTS:
            raise ModelFilesError(f"{name}: a tensor of more than {MAX_ELEMENTS} elements")
    return elements
