"""Ollama's model routes over Podium's catalog: ``/api/tags`` (every configured model),
``/api/show`` (one model's details, template, capabilities) and ``/api/ps`` (the loaded
ones, with when each expires).

What Ollama reads from its own store comes from the model's files, never from loading it:
a GGUF's header (``engine.llamacpp.header``: architecture, parameter count from its tensor
shapes, quantization from ``general.file_type``, chat template, fill-in-the-middle tokens),
or a Hugging Face folder's ``config.json`` and safetensors headers (vLLM). Reading a file
is blocking (up to a tenth of a second for a 150k-token vocabulary, then remembered), so
``describe`` runs on a worker thread. A model whose files are not here (a hub repo not
fetched yet) is still listed, with what is known (its name). One whose file is here but
cannot be read (a malformed header: the walk's bounds say why) is listed too, with its size
and the cause as ``error``, and ``/api/show`` of it is a 422 saying the cause: one broken
file never makes a listing fail for every client.

``digest`` is the SHA-256 of the file's size and its first and last MiB (a folder: of its
``config.json`` and its files' names and sizes): cheap, the same for two copies of one file,
and different for a fine-tune of the same base (its weights, at the end of the file,
differ) or a requantization (its header differs). Ollama's is the hash of its manifest;
clients show its first 12 hex digits as the model's id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from podium.engine.llamacpp.header import human_count, read_header, safetensors_parameters
from podium.errors import ModelFilesError, PodiumError
from podium.models import Entry, ModelConfig, Models
from podium.settings import Settings

log = logging.getLogger(__name__)

MiB = 1 << 20
MAX_FOLDER_FILES = 1000
# Ollama's "never expires" (keep_alive < 0): now plus Go's longest duration, ~292 years
NEVER = timedelta(microseconds=(2**63 - 1) // 1000)
# GitHub Copilot Chat names the model by general.basename; Ollama echoes the name asked
COPILOT_AGENT = "GitHubCopilotChat/"


class ModelFilesUnreadable(PodiumError):
    """``/api/show`` of a model whose file is here but cannot be read (422, the cause in the
    message): not 404 (the model is served; Ollama's clients read a 404 from show as "pull
    it first"), not a 5xx (nothing failed in this request, and retrying does not mend the
    file: a 5xx is logged as the server's error and some clients retry it)."""

    status_code = 422
    error_type = "invalid_request_error"
    default_code = "model_files_unreadable"


@dataclass(frozen=True)
class Described:
    """What a model's files say about it (empty where they could not be read)."""

    path: Path | None = None
    size: int = 0
    modified: float = 0.0
    digest: str = ""
    format: str = "gguf"
    family: str = ""
    parameters: int = 0
    quantization: str = ""
    info: dict[str, Any] = field(default_factory=dict)     # Ollama's model_info
    template: str | None = None
    fim_tokens: tuple[str, ...] = ()   # its fill-in-the-middle tokens
    pooling: bool = False       # the file declares a pooling: an embedding model
    error: str = ""             # why its file, here, cannot be read ("" when it can)

    def details(self) -> dict[str, Any]:
        return {"parent_model": "", "format": self.format, "family": self.family,
                "families": [self.family] if self.family else None,
                "parameter_size": human_count(self.parameters) if self.parameters else "",
                "quantization_level": self.quantization}


def describe(config: ModelConfig) -> Described:
    """The model's files, described (blocking: run it on a worker thread)."""
    settings: Settings = config.source
    path = None
    try:
        path = local_path(settings)
        if path is None:
            return Described()
        return _folder(path) if path.is_dir() else _gguf(path)
    except Exception as exc:  # noqa: BLE001 - one model's unreadable files are its own
        cause = exc.message if isinstance(exc, ModelFilesError) else (
            f"{type(exc).__name__}: {exc}")
        log.warning("model %s: its files could not be described: %s", config.name, cause)
        return _unreadable(path, cause) if path is not None else Described()


def _unreadable(path: Path, cause: str) -> Described:
    """A file (or folder) that is here but cannot be read: what its ``stat`` says, and why."""
    try:
        stat = path.stat()
    except OSError:
        return Described(path=path, error=cause)
    return Described(path=path, size=stat.st_size if path.is_file() else 0,
                     modified=stat.st_mtime, error=cause)


def local_path(settings: Settings) -> Path | None:
    """The model's file or folder, if it is on this machine: listing a model never
    downloads it (a hub repo is described once it is in the Hugging Face cache)."""
    from podium.engine.llamacpp.model_files import (DEFAULT_MODEL, EMBED_MODEL, GEMMA_MODEL,
                                                    resolve_model, split_repo_spec)

    spec = settings.spec
    if not spec or spec in (DEFAULT_MODEL.served_name, GEMMA_MODEL.served_name,
                            EMBED_MODEL.served_name):
        return resolve_model(spec, settings.model_file)
    path = Path(spec).expanduser()
    if path.exists():
        return path
    repo, file_name = split_repo_spec(spec, settings.model_file)
    wanted = "config.json" if settings.engine != "llamacpp" else file_name
    if wanted is None:
        return None
    import huggingface_hub

    cached = huggingface_hub.try_to_load_from_cache(repo, wanted)
    if not isinstance(cached, str):
        return None
    return Path(cached).parent if wanted == "config.json" else Path(cached)


def _gguf(path: Path) -> Described:
    header = read_header(path)
    stat = path.stat()
    meta = header.metadata
    arch = header.architecture
    info = {k: v for k, v in meta.items()
            if k not in ("general.name", "tokenizer.chat_template")}
    info["general.parameter_count"] = header.parameters
    template = meta.get("tokenizer.chat_template")
    return Described(
        path=path, size=stat.st_size, modified=stat.st_mtime, digest=_file_digest(path),
        family=arch, parameters=header.parameters, quantization=header.file_type,
        info=info, template=template if isinstance(template, str) else None,
        fim_tokens=header.fim_tokens, pooling=meta.get(f"{arch}.pooling_type") in (1, 2, 3))


_DIGESTS: dict[tuple[str, int, int], str] = {}


def _file_digest(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        sha = hashlib.sha256(str(stat.st_size).encode())
        with open(path, "rb") as f:
            sha.update(f.read(MiB))
            if stat.st_size > 2 * MiB:
                f.seek(-MiB, os.SEEK_END)
                sha.update(f.read(MiB))
        if len(_DIGESTS) > 256:
            _DIGESTS.clear()
        _DIGESTS[key] = sha.hexdigest()
    return _DIGESTS[key]


def _folder(folder: Path) -> Described:
    """A Hugging Face folder (vLLM): config.json's architecture and dtype, the parameters
    in its safetensors headers."""
    with open(folder / "config.json", "rb") as f:
        raw = f.read(MiB)
    config = json.loads(raw)
    if not isinstance(config, dict):
        raise ValueError("config.json is not an object")
    files = sorted(p for p in folder.iterdir() if p.is_file())[:MAX_FOLDER_FILES]
    sha = hashlib.sha256(raw)
    for p in files:
        sha.update(f"{p.name}\0{p.stat().st_size}\0".encode())
    family = str(config.get("model_type", ""))
    quant = config.get("quantization_config")
    dtype = (quant.get("quant_method") if isinstance(quant, dict) else None) or config.get(
        "torch_dtype") or config.get("dtype") or ""
    info: dict[str, Any] = {"general.architecture": family}
    for key, ours in (("max_position_embeddings", "context_length"),
                      ("hidden_size", "embedding_length"), ("num_hidden_layers", "block_count")):
        if isinstance(config.get(key), int):
            info[f"{family}.{ours}"] = config[key]
    parameters = safetensors_parameters(folder)
    info["general.parameter_count"] = parameters
    return Described(
        path=folder, size=sum(p.stat().st_size for p in files),
        modified=max((p.stat().st_mtime for p in files), default=0.0),
        digest=sha.hexdigest(), format="safetensors", family=family, parameters=parameters,
        quantization=str(dtype).upper().replace("BFLOAT16", "BF16").replace(
            "FLOAT16", "F16").replace("FLOAT32", "F32"), info=info)


def when(seconds: float | None) -> str:
    """A time as Ollama writes it (RFC 3339, local offset); None: Ollama's "never"."""
    moment = (datetime.now(timezone.utc) + NEVER if seconds is None
              else datetime.fromtimestamp(seconds, timezone.utc))
    return moment.astimezone().isoformat()


# -- the routes' answers ------------------------------------------------------------------

def listed(entry: Entry, about: Described) -> dict[str, Any]:
    """``/api/tags``'s object for a model (``error``, beside Ollama's fields, when its file
    cannot be read: why)."""
    out = {"name": entry.name, "model": entry.name, "modified_at": when(about.modified),
           "size": about.size, "digest": about.digest, "details": about.details()}
    if about.error:
        out["error"] = about.error
    return out


def kind_of(entry: Entry, about: Described) -> str:
    """Its kind, known before it loads: its table's, or (auto) from its file."""
    if entry.config.kind != "auto":
        return entry.config.kind
    if about.format == "safetensors":
        from podium.server.served import detect_kind
        return detect_kind(entry.config)
    return "embedding" if about.pooling else "chat"


def template_of(entry: Entry, about: Described) -> str | None:
    """The chat template the model is served with: ``chat-template-file``'s, else the
    loaded engine's, else the file's."""
    settings: Settings = entry.config.source
    if settings.chat_template_file:
        from podium.dialect import read_template
        try:
            return read_template(settings.chat_template_file)
        except ValueError:
            return None
    if entry.state == "loaded":
        return entry.engine.engine.info.chat_template
    return about.template


def capabilities(entry: Entry, about: Described, kind: str, template: str | None
                 ) -> list[str]:
    """Ollama's capabilities: ``embedding`` for an embedding model; for a chat model
    ``completion``, ``tools`` (its template takes tools, or Harmony), ``thinking`` (it has a
    reasoning parser, named or detected: for a loaded model, its dialect's, the rule
    ``/api/chat``'s ``think`` applies), ``insert`` (its vocabulary has the
    fill-in-the-middle tokens ``/api/generate``'s ``suffix`` writes). Never ``vision``:
    Podium serves text."""
    if kind == "embedding":
        return ["embedding"]
    from podium.parsing.registry import detect_reasoning_parser

    settings: Settings = entry.config.source
    text = template or ""
    harmony = settings.harmony or about.family == "gpt-oss" or (
        "<|channel|>" in text and "<|message|>" in text)
    reasoning = (detect_reasoning_parser(text) if settings.reasoning_parser == "auto"
                 else settings.reasoning_parser)
    found = ["completion"]
    if harmony or (settings.tool_parser != "none" and "tools" in text):
        found.append("tools")
    from podium.api.ollama.chat import FIM, can_think
    if (can_think(entry.engine.dialect) if entry.state == "loaded"
            else harmony or reasoning != "none"):
        found.append("thinking")
    if set(FIM) <= set(about.fim_tokens):
        found.append("insert")
    return found


def shown(entry: Entry, about: Described, asked: str, agent: str) -> dict[str, Any]:
    """``/api/show``'s object for a model (``asked``: the name the client used); 422 if its
    file cannot be read."""
    if about.error:
        raise ModelFilesUnreadable(f"The model '{asked}' cannot be shown: its file cannot "
                                   f"be read ({about.error})", param="model")
    kind = kind_of(entry, about)
    template = template_of(entry, about)
    info = dict(about.info)
    if agent.startswith(COPILOT_AGENT):
        info["general.basename"] = asked
    settings: Settings = entry.config.source
    context = (entry.engine.engine.info.context_length if entry.state == "loaded"
               else settings.ctx_size or info.get(f"{about.family}.context_length"))
    body: dict[str, Any] = {
        "license": str(info.get("general.license", "")),
        "modelfile": f"# Podium serves this model from {about.path or settings.spec}\n",
        "parameters": f"{'num_ctx':<30} {context}" if context else "",
        "template": template or "", "details": about.details(), "model_info": info,
        "capabilities": capabilities(entry, about, kind, template),
        "modified_at": when(about.modified)}
    return body


def running(models: Models, entry: Entry, about: Described) -> dict[str, Any]:
    """``/api/ps``'s object for a loaded model: its memory (measured across its load,
    else estimated, else its file's size), all of it in RAM (``size_vram`` 0: llama.cpp
    runs on the CPU here), and when its idle unload is due."""
    served = entry.engine
    size = served.resident or entry.config.estimate or about.size
    expires = models.expires_at(entry)
    return {"name": entry.name, "model": entry.name, "size": size, "digest": about.digest,
            "details": about.details(),
            "expires_at": when(None if expires is None or math.isinf(expires) else expires),
            "size_vram": 0, "context_length": served.engine.info.context_length}
