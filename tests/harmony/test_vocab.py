"""The o200k vocabulary for openai-harmony, built offline from quicktok-v1 and verified."""

import hashlib
import struct

import pytest

from podium.errors import ModelFilesError
from podium.harmony import vocab


def test_binary_format_round_trip():
    binary = struct.pack("<I", 2)
    for rank, token in ((1, b"b"), (0, b"ab")):
        binary += struct.pack("<H", len(token)) + token + struct.pack("<I", rank)
    assert vocab.tiktoken_lines(binary) == b"YWI= 0\nYg== 1\n"


def test_builds_the_published_file_and_harmony_loads_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    directory = vocab.ensure_vocabulary(tmp_path)
    data = (directory / vocab.FILE_NAME).read_bytes()
    assert hashlib.sha256(data).hexdigest() == vocab.SHA256
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    assert encoding.decode_utf8(encoding.encode("hello world")) == "hello world"


def test_missing_package_is_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    monkeypatch.setattr(vocab.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelFilesError, match="pip install 'podium\\[harmony\\]'"):
        vocab.ensure_vocabulary(tmp_path / "empty")


def test_a_configured_directory_is_used_as_is(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path / "elsewhere"))
    (tmp_path / vocab.FILE_NAME).write_bytes(b"YWI= 0\n")
    assert vocab.ensure_vocabulary(tmp_path) == tmp_path
    import os
    assert os.environ["TIKTOKEN_ENCODINGS_BASE"] == str(tmp_path)


def test_serving_harmony_without_a_vocabulary_is_a_clear_error(tmp_path, monkeypatch, scripted):
    from podium.server.app import create_app
    from podium.settings import Settings

    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    monkeypatch.setattr(vocab.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelFilesError, match="TIKTOKEN_ENCODINGS_BASE"):
        create_app(Settings(harmony=True, harmony_vocab_dir=str(tmp_path / "none")),
                   scripted(["x"]))
