"""``podium serve``: the command line."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.errors import ModelFilesError
from podium.settings import Settings

if TYPE_CHECKING:
    import uvicorn

    from podium.engine.base import Engine

USAGE = """usage: podium <command> [options]

commands:
  serve        serve the OpenAI API (default model when --model is not given)
  model-path   print the local path of the model --model names (assembling or
               downloading it first if needed)
  parse        print what Podium makes of a model's raw output (content, reasoning,
               tool calls, warnings); 'podium parse --help' for its options

'podium serve --help' lists every setting."""


def served_name(settings: Settings, path: Path) -> str:
    from podium.engine.llamacpp.model_files import DEFAULT_MODEL

    if settings.served_model_name:
        return settings.served_model_name
    if not settings.model:
        return DEFAULT_MODEL.served_name
    return path.stem


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
    from podium.engine.llamacpp.engine import LlamaCppEngine
    from podium.engine.llamacpp.model_files import resolve_model
    from podium.server.app import create_app
    from podium.server.lifecycle import Server

    engine: Engine
    if settings.engine != "llamacpp":       # every option checked before vLLM starts
        from podium.engine.vllm.options import vllm_engine

        path, engine = vllm_engine(settings, loop=runner.get_loop())
    else:
        path = resolve_model(settings.model, settings.model_file)
        name = served_name(settings, path)
        settings.check_aliases(name)  # before the weights load
        engine = LlamaCppEngine(path, served_name=name,
                                n_ctx=settings.ctx_size, n_batch=settings.batch_size,
                                n_threads=settings.threads, max_num_seqs=settings.max_num_seqs,
                                max_queued=settings.max_queued_requests,
                                deterministic=settings.deterministic,
                                grammar_ms_per_token=settings.grammar_ms_per_token)
    log = logging.getLogger("podium")
    log.info("serving %s as %r (context %d tokens)", path, engine.info.served_name,
             engine.info.context_length)
    log.info("settings: %s", json.dumps(settings.redacted()))
    app = create_app(settings, engine)
    runner.run(Server(uvicorn_config(settings, app), app.state.drain,
                      settings.shutdown_grace).serve())


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

            print(resolve_model(settings.model, settings.model_file))
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
