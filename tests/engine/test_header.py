"""The GGUF header walk's bounds (podium/engine/llamacpp/header.py), against hostile files
built here: arrays nested 200,000 deep, tensor dimensions past 64 bits, counts the file
cannot hold, a real model file cut short; and a safetensors header nested too deep. Each is a
``ModelFilesError`` naming the cause, raised at once, in little memory: never a
RecursionError, MemoryError or OverflowError, and never a count a JSON encoder refuses."""

from __future__ import annotations

import json
import struct
import time
import tracemalloc
from pathlib import Path

import orjson
import pytest

from podium.engine.llamacpp import header as header_module
from podium.engine.llamacpp.header import (MAX_DEPTH, MAX_ELEMENTS, MAX_ITEMS, human_count,
                                           read_header, safetensors_parameters)
from podium.errors import ModelFilesError

ARRAY, STRING, U32 = 9, 8, 4


def text(value: str) -> bytes:
    raw = value.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf(tensors: int, keys: int, body: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, keys) + body


def arch() -> bytes:
    return text("general.architecture") + struct.pack("<I", STRING) + text("llama")


def nested_arrays(depth: int) -> bytes:
    """A key holding an array of one array of one array ... ``depth`` deep (12 bytes each)."""
    body = text("deep") + struct.pack("<I", ARRAY)
    body += struct.pack("<IQ", ARRAY, 1) * depth + struct.pack("<IQ", U32, 0)
    return gguf(0, 2, arch() + body)


def tensor(name: str, *dims: int) -> bytes:
    return (text(name) + struct.pack("<I", len(dims))
            + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", 0, 0))


def with_tensors(*tensors: bytes) -> bytes:
    return gguf(len(tensors), 1, arch() + b"".join(tensors))


def written(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def refused(path: Path, match: str) -> str:
    """The walk refuses ``path`` with ``match`` in its message, within a second and a MiB
    of Python allocations."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(ModelFilesError, match=match) as info:
            read_header(path)
        seconds = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seconds < 1.0 and peak < 1 << 20, (seconds, peak)
    assert info.value.message.startswith(path.name)
    return info.value.message


def test_arrays_nested_200000_deep_are_refused_at_the_depth_bound(tmp_path):
    path = written(tmp_path, nested_arrays(200_000))
    assert path.stat().st_size > 2_400_000
    message = refused(path, f"arrays nested more than {MAX_DEPTH} deep")
    assert "not a GGUF header llama.cpp reads" in message


def test_arrays_nested_within_the_bound_are_read(tmp_path):
    header = read_header(written(tmp_path, nested_arrays(MAX_DEPTH - 1)))
    assert header.array_lengths["deep"] == 1 and header.metadata["deep"] == []
    assert header.architecture == "llama"


@pytest.mark.parametrize("dims, match", [
    ((2**63,), "a tensor dimension of 9223372036854775808"),
    ((2**64 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1), "a tensor dimension of"),
    ((2**40, 2**40), f"a tensor of more than {MAX_ELEMENTS} elements"),
    ((2**31,) * 4, f"a tensor of more than {MAX_ELEMENTS} elements"),
])
def test_tensor_sizes_past_int64_are_refused(tmp_path, dims, match):
    refused(written(tmp_path, with_tensors(tensor("w", *dims))), match)


def test_all_tensors_together_stay_below_2_63(tmp_path):
    half = 2**62
    refused(written(tmp_path, with_tensors(tensor("a", half), tensor("b", half))),
            "tensors of more than .* elements in all")
    # at the bound: read, and every number it gives a JSON encoder fits in 64 bits
    header = read_header(written(tmp_path, with_tensors(
        tensor("a", half), tensor("b", half - 1)), "edge.gguf"))
    assert header.parameters == MAX_ELEMENTS and header.tensors == 2
    assert orjson.loads(orjson.dumps({"n": header.parameters}))["n"] == MAX_ELEMENTS
    assert len(human_count(header.parameters)) < 16        # not a 145-digit size


@pytest.mark.parametrize("data, match", [
    # an array of 2^25 strings (the most allowed) in a file of a few bytes
    (gguf(0, 1, text("k") + struct.pack("<IIQ", ARRAY, STRING, MAX_ITEMS)),
     f"{MAX_ITEMS} items in an array, more than the 8 bytes left"),
    (gguf(0, 1, text("k") + struct.pack("<IIQ", ARRAY, ARRAY, MAX_ITEMS)),
     "items in an array, more than the 8 bytes left"),
    (gguf(0, 1, text("k") + struct.pack("<IIQ", ARRAY, STRING, MAX_ITEMS + 1)),
     f"{MAX_ITEMS + 1} items in an array, more than {MAX_ITEMS}"),
    (gguf(2**20, 0, b"\0" * 64), "1048576 tensors, more than the"),
    (gguf(0, 2**16, b"\0" * 64), "65536 keys, more than the"),
    (gguf(0, 1, text("k") + struct.pack("<IQ", STRING, 2**24 + 1)),
     "16777217 bytes in a string, more than 16777216"),
    (gguf(0, 1, text("k") + struct.pack("<IQ", STRING, 2**24)), "a string runs past the end"),
    (gguf(1, 0, text("w") + struct.pack("<I", 9)), "a tensor of 9 dimensions"),
], ids=["strings", "arrays", "over-limit", "tensors", "keys", "long-string", "string-past-end",
    "dimensions"])
def test_counts_the_file_cannot_hold_fail_before_any_loop(tmp_path, data, match):
    refused(written(tmp_path, data + b"\0" * 8), match)


@pytest.mark.parametrize("cut", [0, 23, 24, 30, 4096, 1 << 20])
def test_a_real_model_cut_short_is_refused(tmp_path, model_path, cut):
    with open(model_path, "rb") as f:
        data = f.read(cut)
    message = refused(written(tmp_path, data), "not a GGUF header|cannot read|ends early|"
                                               "past the end|bytes left")
    assert "m.gguf" in message


def test_the_real_model_reads_and_its_failure_is_remembered(tmp_path, model_path,
                                                            monkeypatch):
    assert read_header(model_path).parameters == 630_167_424
    path = written(tmp_path, nested_arrays(50))
    first = refused(path, "nested")
    monkeypatch.setattr(header_module, "_read", lambda p: pytest.fail("walked again"))
    with pytest.raises(ModelFilesError) as again:
        read_header(path)
    assert again.value.message == first


def safetensors(folder: Path, header: bytes) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)


def test_safetensors_headers_are_bounded_too(tmp_path):
    folder = tmp_path / "hf"
    safetensors(folder, json.dumps({"w": {"dtype": "F16", "shape": [3, 4]},
                                    "__metadata__": {}}).encode())
    assert safetensors_parameters(folder) == 12
    for header, match in ((b"[" * 200_000 + b"]" * 200_000, "RecursionError"),
                          (b'{"w": {"shape": [%d, %d]}}' % (2**40, 2**40),
                           "more than 9223372036854775807 elements"),
                          (b'{"w": {"shape": [%d]}}' % 2**70, "a tensor dimension of"),
                          (b'{"w": {"shape": ["12"]}}', "a tensor dimension of"),
                          (b'[1]', "not a JSON object")):
        safetensors(folder, header)
        with pytest.raises(ModelFilesError, match=match):
            safetensors_parameters(folder)
