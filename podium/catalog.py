"""Which models a server serves, each with its own settings.

From ``--model`` (repeatable, ``[NAME=]SPEC``), ``--models-dir`` and the config file's
``[[models]]`` tables, in that order. The server-wide settings are every model's defaults; a
table overrides them for its model (its engine, context, parsers, template ...). No model
at all: the default model. A server of one model loads it at start and keeps it, as it
always has; a server of several loads each on its first request.

A model whose GGUF file is here but whose header cannot be read (``engine.llamacpp.header``:
a malformed or hostile file) starts ``failed`` with the cause (``ModelConfig.error``), so
the model list says why at once; the others are served as ever.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from podium.models import ModelConfig
from podium.settings import Settings, split_name

# settings a [[models]] table may give its model (the rest are the server's)
PER_MODEL = frozenset({
    "model", "model_file", "engine", "ctx_size", "max_num_seqs", "max_queued_requests",
    "deterministic", "grammar_ms_per_token", "threads", "batch_size", "tool_parser",
    "reasoning_parser", "reasoning_field", "reasoning_budgets", "chat_template_file",
    "allow_request_chat_template", "harmony", "harmony_vocab_dir", "max_tokens_cap", "seed",
    "matryoshka_dimensions", "speculative",
    "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
    "distributed_executor_backend", "gpu_memory_utilization", "enforce_eager", "engine_arg"})
# a table's own keys, about the model rather than its settings
TABLE_KEYS = frozenset({"name", "aliases", "kind", "keep_alive", "pinned", "preload"})
KINDS = ("chat", "embedding", "rerank")


def catalog(settings: Settings) -> list[ModelConfig]:
    """One ``ModelConfig`` per model (``source``: its own ``Settings``). ValueError for a
    malformed table, a duplicate name, an alias naming no model."""
    wanted: list[tuple[str | None, dict[str, Any], dict[str, Any]]] = []
    for entry in settings.model:
        name, spec = split_name(entry)
        wanted.append((name, {"model": (spec,)}, {}))
    if settings.models_dir:
        wanted += [(name, {"model": (str(path),), **over}, {})
                   for name, path, over in scan(Path(settings.models_dir).expanduser())]
    for i, table in enumerate(settings.models):
        wanted.append(_table(table, f"[[models]] #{i + 1}"))
    if not wanted:
        wanted.append((None, {"model": ()}, {}))           # the default model
    single = len(wanted) == 1
    configs: list[ModelConfig] = []
    for name, overrides, own in wanted:
        mine = dataclasses.replace(settings, models=(), models_dir=None, preload=(),
                                   model_alias=(), **overrides)
        if name is None:
            name = (settings.served_model_name if single and settings.served_model_name
                    else default_name(mine))
        keep = own.get("keep_alive", None if single else settings.keep_alive)
        configs.append(ModelConfig(
            name, aliases=tuple(own.get("aliases", ())), kind=own.get("kind", "auto"),
            keep_alive=float(keep) or None if keep is not None else None,
            pinned=own.get("pinned", single),
            preload=own.get("preload", False) or name in settings.preload
            or "all" in settings.preload, source=mine, error=unreadable(mine)))
    names = {c.name for c in configs}
    if len(names) < len(configs):
        twice = sorted({c.name for c in configs if [d.name for d in configs].count(c.name) > 1})
        raise ValueError(f"two models are called {', '.join(map(repr, twice))}: name them "
                         f"(--model NAME=SPEC, or name = in [[models]])")
    _aliases(settings, configs)
    for name in settings.preload:
        if name != "all" and name not in names:
            raise ValueError(f"--preload {name}: no model is called that")
    return configs


def of_engine(settings: Settings, name: str, kind: str = "chat") -> list[ModelConfig]:
    """A server of one engine, loaded already: its one model, called ``name``."""
    configs = [ModelConfig(name, pinned=True, source=settings, kind=kind)]
    _aliases(settings, configs)
    return configs


def _aliases(settings: Settings, configs: list[ModelConfig]) -> None:
    """``--model-alias PATTERN=SERVED``: SERVED's model answers to PATTERN too."""
    for pattern, served in settings.aliases:
        config = next((c for c in configs if c.name == served), None)
        if config is None:
            raise ValueError(f"--model-alias {pattern}={served}: this server serves "
                             f"{', '.join(repr(c.name) for c in configs)}, not '{served}'")
        config.aliases += (pattern,)


def default_name(settings: Settings) -> str:
    """The name a model is served under when not given one: the default model's, else its
    file's or folder's (a hub repo's: the file picked from it, fetched first)."""
    from podium.engine.llamacpp.model_files import DEFAULT_MODEL, resolve_model

    spec = settings.spec
    if not spec:
        return DEFAULT_MODEL.served_name
    from podium.engine.llamacpp.model_files import EMBED_MODEL, GEMMA_MODEL

    if spec in (DEFAULT_MODEL.served_name, GEMMA_MODEL.served_name, EMBED_MODEL.served_name):
        return spec                                             # a packaged model's name
    if settings.engine != "llamacpp":
        path = Path(spec).expanduser()
        if path.is_dir() or path.suffix == ".gguf":
            return path.name if path.is_dir() else path.stem
        return spec.rstrip("/").split("/")[-1]                 # a hub id
    return resolve_model(spec, settings.model_file).stem


def unreadable(settings: Settings) -> str | None:
    """Why the model's local GGUF file cannot be served, from its header (read once and
    remembered: ``/api/tags`` reads it again for free); None when it reads, or when the
    model is no local GGUF file (a packaged name, a hub repo, a folder)."""
    from podium.engine.llamacpp.header import read_header
    from podium.errors import ModelFilesError

    path = Path(settings.spec or "").expanduser()
    if settings.engine != "llamacpp" or not settings.spec or not path.is_file():
        return None
    try:
        read_header(path)
    except ModelFilesError as exc:
        return exc.message
    return None


def scan(folder: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """``--models-dir``: (name, path, settings) of every .gguf file (a split one by its first
    part) and every Hugging Face folder (config.json: vLLM) in ``folder``."""
    if not folder.is_dir():
        raise ValueError(f"--models-dir {folder}: not a folder")
    found: list[tuple[str, Path, dict[str, Any]]] = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix == ".gguf":
            stem = path.stem
            if "-of-" in stem and stem.rsplit("-", 3)[-3:-2] != ["00001"]:
                continue                            # a later part of a split file
            if stem.startswith("mmproj"):
                continue                            # a vision projector, not a model
            found.append((stem.split("-00001-of-")[0], path, {}))
        elif path.is_dir() and (path / "config.json").is_file():
            found.append((path.name, path, {"engine": "vllm"}))
    return found


def _table(table: Any, where: str) -> tuple[str | None, dict[str, Any], dict[str, Any]]:
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table")
    values = {key.replace("-", "_"): value for key, value in table.items()}
    unknown = sorted(set(values) - PER_MODEL - TABLE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown model settings {', '.join(unknown)} (a model "
                         f"takes name, aliases, kind, keep-alive, pinned, preload and "
                         f"{', '.join(sorted(PER_MODEL))})")
    own = {key: values.pop(key) for key in TABLE_KEYS & set(values)}
    name = own.pop("name", None)
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"{where}: name must be a non-empty string")
    aliases = own.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise ValueError(f"{where}: aliases must be a list of names or globs")
    if own.get("kind", "chat") not in KINDS:
        raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}")
    keep = own.get("keep_alive", 0)
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or keep < 0:
        raise ValueError(f"{where}: keep-alive must be seconds, 0 or more (0: kept)")
    for flag in ("pinned", "preload"):
        if not isinstance(own.get(flag, False), bool):
            raise ValueError(f"{where}: {flag} must be true or false")
    if "model" in values:
        spec = values["model"]
        if not isinstance(spec, str) or not spec:
            raise ValueError(f"{where}: model must be a path or repo id")
        values["model"] = (spec,)
    else:
        values["model"] = ()
    kinds = {f.name: f.type for f in dataclasses.fields(Settings)}
    for key, value in values.items():
        if key != "model" and not _typed(kinds[key], value):
            raise ValueError(f"{where}: {key.replace('_', '-')} = {value!r} is not a "
                             f"{kinds[key]}")
    try:
        dataclasses.replace(Settings(), **values)          # ranges, as a flag's
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    return name, values, own


def _typed(kind: Any, value: Any) -> bool:
    """Whether a TOML value suits a setting of type ``kind`` (the field's annotation)."""
    kind = str(kind)
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    if kind == "float":
        return isinstance(value, (int, float))
    if kind.startswith(("tuple", "list")):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, str)
