"""``podium serve``: the command line."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from podium.errors import ModelFilesError
from podium.settings import Settings

if TYPE_CHECKING:
    import uvicorn

    from podium.engine.base import Engine
    from podium.models import ModelConfig

USAGE = """usage: podium <command> [options]

commands:
  serve        serve the OpenAI API (default model when --model is not given)
  model-path   print the local path of the model --model names (assembling or
               downloading it first if needed)
  parse        print what Podium makes of a model's raw output (content, reasoning,
               tool calls, warnings); 'podium parse --help' for its options

'podium serve --help' lists every setting."""


def uvicorn_config(settings: Settings, app: Any) -> uvicorn.Config:
    """The uvicorn configuration ``podium serve`` runs ``app`` with."""
    import uvicorn

    from podium.server.http import HTTPLimits, guarded_http

    limits = HTTPLimits(settings.max_header_bytes, settings.header_timeout,
                        settings.body_timeout, settings.body_min_rate)
    return uvicorn.Config(app, host=settings.host, port=settings.port,
                          log_level=settings.log_level, access_log=False,
                          timeout_graceful_shutdown=settings.shutdown_grace + 5,
                          http=guarded_http(limits))


def serve(settings: Settings) -> None:
    from podium.parsing.registry import check_names

    check_names(settings.tool_parser, settings.reasoning_parser)
    # One loop for the server and, with vLLM, the engine's front-end (no thread hop per
    # token); made as uvicorn would make it, and run as uvicorn's Server.run runs it.
    config_loop = uvicorn_config(settings, None).get_loop_factory()
    with asyncio.Runner(loop_factory=config_loop) as runner:
        _serve(settings, runner)


def _serve(settings: Settings, runner: asyncio.Runner) -> None:
    from podium.engine.llamacpp import threads
    threads.configure(settings.thread_wait)     # before llama.cpp (and OpenMP) loads
    from podium.catalog import catalog
    from podium.server.app import create_app
    from podium.server.lifecycle import Server
    from podium.server.served import make_engine, resident_bytes

    log = logging.getLogger("podium")
    configs = catalog(settings)         # every setting checked before anything loads
    for config in configs:
        _prepare(config)
    log.info("settings: %s", json.dumps(settings.redacted()))
    # a pinned model (a server of one: its model) loads now, before the server listens;
    # vLLM on the server's loop (no thread hop per token)
    loaded: dict[str, Engine] = {}
    resident: dict[str, int] = {}
    for config in configs:
        if config.pinned:
            before = resident_bytes()
            loaded[config.name] = make_engine(config.source, config.name, config.kind,
                                              loop=runner.get_loop())
            after = resident_bytes()
            if before is not None and after is not None:
                resident[config.name] = after - before
                log.info("model %s: estimated %.0f MiB, resident %.0f MiB after its load",
                         config.name, config.estimate / 2**20, (after - before) / 2**20)
    app = create_app(settings, configs, loaded)
    for name, size in resident.items():
        app.state.models.entry(name).engine.resident = size
    runner.run(Server(uvicorn_config(settings, app), app.state.drain,
                      settings.shutdown_grace).serve())


def _prepare(config: ModelConfig) -> None:
    """The model's kind (when ``auto``) and memory estimate, from its file, before the server
    starts (a failure: estimated again when it loads). A model whose header the catalog
    could not read is left as it is, failed: llama.cpp is not handed a file known to be
    malformed (a pinned one still loads, and fails, as before)."""
    from podium.server.served import detect_kind, estimate

    log = logging.getLogger("podium")
    if config.error and not config.pinned:
        log.warning("model %s: %s", config.name, config.error)
        return
    try:
        if config.kind == "auto":
            config.kind = detect_kind(config)
        config.estimate = estimate(config)
    except Exception as exc:  # noqa: BLE001 - estimated again when it loads
        if config.pinned:
            raise
        log.warning("model %s: no memory estimate yet (%s)", config.name, exc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "parse":
        from podium.cli_parse import main as parse

        return parse(argv[1:])
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in ("serve", "model-path"):
        print(USAGE, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        settings = Settings.from_sources(argv[1:])
    except ValueError as exc:  # a malformed setting (--model-alias, a config file ...)
        print(f"podium: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if argv[0] == "model-path":
            from podium.engine.llamacpp.model_files import resolve_model

            print(resolve_model(settings.spec, settings.model_file))
        else:
            serve(settings)
    except ModelFilesError as exc:
        print(f"podium: {exc.message}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"podium: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
