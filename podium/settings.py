"""One settings object, filled from command-line flags and ``PODIUM_*`` environment variables.

A flag wins over its environment variable, which wins over the default. Each field's
metadata holds its help text; the ``podium serve`` parser is generated from the fields, so
the two can never drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import functools
import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

ENV_PREFIX = "PODIUM_"
THREAD_WAITS = ("brief", "spin", "openmp", "sleep")     # engine/llamacpp/threads.py's WAITS
SPECULATIVE = ("ngram", "off")      # the llama.cpp engine's draft sources beside predictions
# the reasoning tokens each effort allows (--reasoning-budgets), by default
REASONING_BUDGETS = "none=0,minimal=0,low=1024,medium=4096,high=16384,xhigh=32768,max=32768"


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class Settings:
    host: str = _opt("127.0.0.1", "Address to listen on.")
    port: int = _opt(8000, "Port to listen on.")
    model: tuple[str, ...] = _opt(
        (), "A model to serve: a GGUF file path, a Hugging Face repo id (with --model-file, or "
        "'repo_id:file.gguf'), or an HF folder (--engine vllm), optionally named "
        "('NAME=SPEC'; default name: the file's or folder's). Repeat for several, each loaded "
        "on its first request; none: the default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M). "
        "PODIUM_MODEL takes a comma-separated list.", multiple=True, metavar="[NAME=]SPEC")
    model_file: str | None = _opt(None, "File name inside the Hugging Face repo given by --model.")
    models_dir: str | None = _opt(
        None, "Serve every .gguf file (the first part of a split one) and every Hugging Face "
        "folder (with a config.json; served with --engine vllm) in DIR, each under its file "
        "or folder name, loaded on its first request.", metavar="DIR")
    preload: tuple[str, ...] = _opt(
        (), "Load this model at start instead of on its first request (a failed load stops "
        "the start); repeat for several, 'all' for every one. A server of one model always "
        "loads it at start.", multiple=True, metavar="NAME")
    max_loaded_models: int = _opt(
        0, "Models loaded at once; loading another first unloads the least recently used "
        "idle one (0: no limit).")
    memory_budget: str | None = _opt(
        None, "Memory the loaded models may hold together, each counted by its estimate "
        "(weights plus KV cache, from the model file) before it loads: bytes, or with a K, M, "
        "G or T suffix (powers of 1024), or a percentage of the machine's memory; 0: no "
        "limit. Default 75%%: the rest is left to the OS, the server and its requests.",
        metavar="SIZE")
    load_timeout: float = _opt(
        60.0, "Seconds a request waits for room to load its model (busy models going idle) "
        "before a 503 with Retry-After.")
    keep_alive: float = _opt(
        300.0, "Seconds a model stays loaded after its last request when the server serves "
        "several (0: until evicted or unloaded); a server of one model keeps it.")
    served_model_name: str | None = _opt(
        None, "The model id clients use (default: derived from the model file name).")
    model_alias: tuple[str, ...] = _opt(
        (), "Requests naming a model that matches the glob PATTERN (case-sensitive, e.g. "
        "'claude-*') are served by SERVED, which must be the served model's name; answers "
        "echo the name asked for, /v1/models still lists only SERVED. Repeat for several; "
        "PODIUM_MODEL_ALIAS takes a comma-separated list.", multiple=True,
        metavar="PATTERN=SERVED")
    api_key: list[str] = _opt(
        (), "API key clients must send as a Bearer token; repeat for several. "
        "PODIUM_API_KEY takes a comma-separated list.", multiple=True)
    admin_key: list[str] = _opt(
        (), "API key of the server's operator: valid wherever an --api-key is (a tenant of "
        "its own), and the only key that may load and unload models by hand (POST "
        "/v1/models/{model}/load and /unload, Ollama's empty-prompt keep_alive 0); other "
        "keys' Ollama keep_alive may keep a model longer, never unload it sooner than its "
        "own keep-alive. With keys set and no admin key, nobody may; without any key, every "
        "client may. Repeat for several; PODIUM_ADMIN_KEY takes a comma-separated list.",
        multiple=True)
    cors_origins: list[str] = _opt(
        (), "Origins allowed by CORS ('*' for any); repeat for several.", multiple=True)
    ui: bool = _opt(
        True, "Serve the web UI (chat with the served models, and the server at a glance) "
        "to browsers at / (other clients' GET / stays Ollama's probe). It is static and "
        "calls the API with the key typed into it: it reaches nothing that key cannot.")
    max_body_bytes: int = _opt(8 * 1024 * 1024, "Largest request body accepted (413 beyond).")
    max_file_bytes: int = _opt(
        200 * 1024 * 1024, "Largest file a /v1/files upload may hold (413 beyond; "
        "--max-body-bytes does not apply to uploads, which are written to the store's "
        "database as they stream in). Default: the Batch API's 200 MB.")
    max_header_bytes: int = _opt(
        64 * 1024, "Largest request head (request line and headers) accepted; past it 431 "
        "and the connection is closed (0: no limit).")
    header_timeout: int = _opt(
        30, "Seconds a client has to send a whole request head, from connecting or from its "
        "first byte after the previous request; then the connection is closed (0: no limit).")
    body_timeout: int = _opt(
        30, "Seconds a request body may stall (no data, or that far behind --body-min-rate) "
        "before the connection is closed (0: no limit).")
    body_min_rate: int = _opt(
        1024, "Slowest average pace, in bytes a second, a request body may keep to (with "
        "--body-timeout seconds of slack; 0: any pace).")
    max_concurrent_requests: int = _opt(
        512, "Generating requests served at once; past it 429 with Retry-After (0: no limit).")
    rate_limit_per_minute: int = _opt(
        0, "Requests per minute per API key (or client address without keys); 0: no limit.")
    max_tokens_cap: int = _opt(
        0, "Largest max_tokens / max_output_tokens accepted, and the default (0: the context).")
    matryoshka_dimensions: str | None = _opt(
        None, "An embedding model's Matryoshka lengths: the dimensions it was trained to be "
        "shortened to (comma-separated), or 'any' (any length up to its own); a request's "
        "dimensions is cut to that length and normalized again, anything else a 400. "
        "Default: what the model's files declare (config.json's matryoshka_dimensions or "
        "is_matryoshka), else none.", metavar="N,N,...|any")
    max_embedding_tokens: int = _opt(
        300_000, "Most tokens one embeddings or rerank request may hold, its inputs' summed "
        "(after truncation; a rerank's query counted with each document); past it a 400 "
        "naming input (documents for rerank). OpenAI's own limit; 0: no limit.")
    shutdown_grace: int = _opt(
        20, "Seconds running streams get to finish after SIGTERM before they are ended.")
    stream_keepalive_seconds: float = _opt(
        10.0, "While a stream waits for its first token (queued, or a long prefill), send a "
        "keep-alive every this many seconds, so clients' idle timers do not drop it: a "
        "Responses 'response.in_progress' event (the response so far, numbered like the "
        "rest), a Messages 'ping' event, an SSE comment in Chat and "
        "Completions (0: none).")
    log_format: str = _opt("text", "Request log lines as text or json.")
    log_requests: bool = _opt(
        False, "Log request bodies and generated text (off: never logged).")
    allow_request_chat_template: bool = _opt(
        False, "Let requests carry their own 'chat_template' (refused with 400 otherwise).")
    chat_template_file: str | None = _opt(
        None, "A Jinja chat template file used instead of the model's own (a model file that "
        "carries none, or a broken one); its tool-call and reasoning formats are detected "
        "from it like a model's.")
    tool_parser: str = _opt(
        "auto", "Tool-call format: auto (from the chat template), none, hermes, qwen3_coder, "
        "glm45, llama3_json, pythonic, mistral, deepseek_v3, kimi_k2, json.")
    reasoning_parser: str = _opt(
        "auto", "Reasoning format: auto (from the chat template), none, think, mistral.")
    reasoning_field: str = _opt(
        "reasoning_content", "Where reasoning goes in chat answers: reasoning_content, "
        "reasoning, or both.")
    reasoning_budgets: str = _opt(
        REASONING_BUDGETS, "Reasoning tokens a request's effort allows before the engine "
        "ends the model's reasoning, as EFFORT=TOKENS pairs separated by commas (an effort "
        "not given keeps its default); an effort of 0 tokens turns thinking off where the "
        "chat template has a switch. Efforts: Chat's reasoning_effort, Responses' "
        "reasoning.effort, Anthropic's output_config.effort, Ollama's think.")
    harmony: bool = _opt(
        False, "Serve the model as a Harmony (gpt-oss) model even if it is not detected as "
        "one (detection: the gpt-oss architecture or a Harmony chat template).")
    harmony_vocab_dir: str | None = _opt(
        None, "Directory holding o200k_base.tiktoken for Harmony models (default: "
        "$TIKTOKEN_ENCODINGS_BASE, else built from the quicktok-v1 package into the cache).")
    store_url: str | None = _opt(
        None, "Database for stored responses (SQLAlchemy URL; default: SQLite in the data "
        "directory, $PODIUM_DATA_DIR or ~/.local/share/podium).")
    response_retention_days: int = _opt(
        30, "Delete finished stored responses older than this many days (0: keep all).")
    response_lease_seconds: float = _opt(
        15.0, "A running stored response's lease: its replica renews it every third of this; "
        "when it lapses (the replica died), any replica marks the response failed.")
    vector_store_embedding_model: str | None = _opt(
        None, "The served embedding model a vector store embeds with when its creator names "
        "none (Podium's embedding_model field); kept with the store. Default: the one "
        "embedding model the server serves (with none or several, creating a store without "
        "embedding_model is a 400).")
    strict_tools: bool = _opt(
        False, "Refuse (400) Responses tools Podium cannot run (web_search ...) instead of "
        "leaving them out with a warning.")
    mcp_allow: list[str] = _opt(
        (), "Let Responses requests use remote MCP servers whose URL starts with PREFIX (same "
        "scheme, host and port; paths under the prefix's); repeat for several. Without it "
        "every mcp tool is refused (400). PODIUM_MCP_ALLOW takes a comma-separated list.",
        multiple=True, metavar="PREFIX")
    mcp_timeout: float = _opt(
        30.0, "Seconds an MCP server gets to connect and list its tools, and for each call.")
    mcp_max_output: int = _opt(
        32768, "Characters of an MCP tool's output kept for the model; the rest is cut, the "
        "cut marked (0: no limit). A first cheap bound: --mcp-max-output-tokens follows.")
    mcp_max_output_tokens: int = _opt(
        4096, "Tokens of an MCP tool's output kept for the model (and never more than a "
        "quarter of the context); the rest is cut, the cut marked (0: no limit).")
    mcp_max_servers: int = _opt(
        8, "mcp tools (MCP servers) one Responses request may name; past it 400 naming the "
        "tool.")
    mcp_max_sessions: int = _opt(
        64, "MCP sessions open at once in this process, all requests together; a listing or "
        "call waits up to --mcp-timeout for a free one, then fails.")
    mcp_max_bytes: int = _opt(
        256 * 1024, "Bytes of one MCP HTTP response body or SSE message, counted as they "
        "arrive (before anything is parsed); past it the listing or call fails. The MCP SDK "
        "parses what passes on the event loop (about 0.25 ms per KiB of small parts).")
    mcp_max_tools: int = _opt(
        128, "Tools one MCP server's listing may offer (after allowed_tools); past it the "
        "listing fails.")
    mcp_max_pages: int = _opt(
        8, "Pages (next_cursor) of one MCP server's tool listing followed; past it the "
        "listing fails.")
    secret_key: str | None = _opt(
        None, "Key that seals reasoning handed to clients (encrypted_content, thinking "
        "signatures: encrypted and bound to the API key); default: one made once in the data "
        "directory. Replicas must share it.")
    max_seal_bytes: int = _opt(
        2 * 1024 * 1024, "Longest sealed reasoning (encrypted_content, a thinking signature) "
        "taken back from a client, in characters; longer is refused (400) before decoding.")
    # engine
    ctx_size: int = _opt(0, "Context window of each sequence in tokens (0, the default: the "
                         "model's trained length, 32768 for the default model, enough for "
                         "agent clients' long instructions).")
    max_num_seqs: int = _opt(4, "Sequences decoded together in one batch (each with its own "
                             "--ctx-size of KV cache).")
    batch_max_in_flight: int = _opt(
        0, "Requests of batches (/v1/batches) one replica runs at once, each at a lower "
        "priority than any interactive request (0: --max-num-seqs with the llama.cpp engine, "
        "whose interactive requests take a batch request's sequence at once; one less with "
        "vLLM, where they wait for a sequence to free).")
    max_queued_requests: int = _opt(
        256, "Requests waiting for a free sequence; past it 429 with Retry-After.")
    deterministic: bool = _opt(
        True, "Same request and seed, same tokens, however many others share the batch "
        "(repacked weights and flash attention off; --no-deterministic: faster batches with "
        "both on, but a request crowded by others may differ from its lone answer).")
    grammar_ms_per_token: float = _opt(
        10.0, "llama.cpp engine: CPU milliseconds a constrained request's grammar may spend "
        "per token, on average (a burst of 16 tokens' worth at once); past it the request ends "
        "with a 400 grammar_too_costly error instead of slowing every other stream (0: no "
        "limit).")
    threads: int = _opt(0, "CPU threads for decoding (0: the number of cores).")
    thread_wait: str = _opt(
        "brief", "llama.cpp engine: how its threads wait for each other inside a decode "
        "(OpenMP's wait): brief (spin 300 times, then sleep: full speed on a quiet machine, "
        "and no collapse when other work wants the cores), openmp (OpenMP's default, "
        "Podium's before: spin 300,000 times; collapses 50-100x beside other work), spin "
        "(never sleep), sleep (sleep at once: 40% slower alone). OMP_WAIT_POLICY or "
        "GOMP_SPINCOUNT set in the environment win over it.", choices=THREAD_WAITS)
    speculative: str = _opt(
        "ngram", "llama.cpp engine, with --no-deterministic: speculative decoding's drafts, "
        "verified in the decode beside each sequence's next token where the measured step "
        "cost says they pay: ngram (what followed the output's last few tokens earlier in the "
        "prompt or output, and a request's prediction), off (only a request's prediction "
        "drafts). With --deterministic nothing drafts (a verify batch's numbers differ from "
        "one token a step on llama.cpp's CPU kernels). vLLM ignores it: give it "
        "vLLM's own as an engine argument, e.g. speculative_config={\"method\": \"ngram\", "
        "\"num_speculative_tokens\": 3, \"prompt_lookup_max\": 3}.", choices=SPECULATIVE)
    prompt_cache_dir: str | None = _opt(
        None, "llama.cpp engine: where prompt prefixes' KV state is kept on disk, so a long "
        "prompt seen before (an agent's system prompt and tools) is restored instead of "
        "prefilled after its model was unloaded or the server restarted (default: "
        "prompt-cache in the data directory).")
    prompt_cache_disk: str = _opt(
        "8G", "Disk the prompt cache may fill (bytes, or a K, M, G or T size); the least "
        "recently used entries go first; 0: no prompt cache.", metavar="SIZE")
    prompt_cache_memory: str = _opt(
        "512M", "Process memory each loaded model's prompt cache may hold besides the disk "
        "(bytes, or a K, M, G or T size), counted in the model's memory estimate: restores "
        "without a read, and what a client asks to keep in memory only; the least recently "
        "used entries go first; 0: no memory tier (--prompt-cache-disk 0: neither tier).",
        metavar="SIZE")
    prompt_cache_min_tokens: int = _opt(
        1024, "Shortest prompt prefix the prompt cache keeps (tokens): shorter ones prefill "
        "in about a second.")
    batch_size: int = _opt(128, "Tokens per prompt-processing chunk; prefix reuse keeps whole "
                           "chunks, and a long prompt holds running streams one chunk at a time.")
    engine: str = _opt(
        "llamacpp", "Inference engine: llamacpp (embedded, the default) or vllm (vLLM's "
        "AsyncLLM, installed separately; --model is then a Hugging Face folder or hub id, or a "
        "GGUF file made into a bf16 folder once; --ctx-size is vLLM's max model length).")
    tensor_parallel_size: int = _opt(1, "vLLM: GPUs each layer is split across.")
    pipeline_parallel_size: int = _opt(1, "vLLM: stages (GPUs or nodes) the layers are split "
                                       "into.")
    data_parallel_size: int = _opt(1, "vLLM: model replicas, each with its own engine core.")
    distributed_executor_backend: str | None = _opt(
        None, "vLLM: mp (one node) or ray (a Ray cluster); default: vLLM's choice.")
    gpu_memory_utilization: str | None = _opt(
        None, "vLLM: fraction of GPU memory (on CPU: of RAM) vLLM may take, e.g. 0.9.")
    enforce_eager: bool = _opt(False, "vLLM: no compiled graphs (starts faster, decodes "
                               "slower).")
    engine_arg: list[str] = _opt(
        (), "vLLM: any other engine argument as KEY=VALUE (VALUE read as JSON when it is); "
        "repeat for several. PODIUM_ENGINE_ARG takes a comma-separated list (commas inside "
        "a JSON value do not split it).", multiple=True,
        metavar="KEY=VALUE")
    seed: int = _opt(-1, "Default sampling seed for requests without one (-1: random).")
    log_level: str = _opt("info", "Log level: debug, info, warning, error.")

    config: str | None = _opt(
        None, "A TOML file of settings (names as below, with _ or -), and [[models]] tables: "
        "one per model, with its name, its own settings (model, engine, ctx-size, "
        "tool-parser, chat-template-file ... as below), aliases, keep-alive and pinned "
        "(see the README).")
    models: tuple[dict[str, Any], ...] = field(default=(), metadata={"file_only": True})

    def __post_init__(self) -> None:
        for name in ("model", "model_alias", "preload"):
            value = getattr(self, name)
            setattr(self, name, (value,) if isinstance(value, str) else tuple(value or ()))
        if not isinstance(self.models, (list, tuple)):
            raise ValueError("models: give [[models]] tables in the config file")
        self.models = tuple(self.models)
        for entry in self.model_alias:  # a malformed entry fails here, before any loading
            _alias(entry)
        if not self.mcp_timeout > 0:
            raise ValueError(f"--mcp-timeout must be more than 0, not {self.mcp_timeout}")
        for name in ("mcp_max_servers", "mcp_max_sessions", "mcp_max_bytes", "mcp_max_tools",
                     "mcp_max_pages"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, not "
                                 f"{getattr(self, name)}")
        if self.thread_wait not in THREAD_WAITS:
            raise ValueError(f"--thread-wait must be one of {', '.join(THREAD_WAITS)}, not "
                             f"{self.thread_wait!r}")
        if self.speculative not in SPECULATIVE:
            raise ValueError(f"--speculative must be one of {', '.join(SPECULATIVE)}, not "
                             f"{self.speculative!r}")
        if self.stream_keepalive_seconds < 0:
            raise ValueError(f"--stream-keepalive-seconds must be 0 (none) or more, not "
                             f"{self.stream_keepalive_seconds}")
        if self.max_loaded_models < 0:
            raise ValueError(f"--max-loaded-models must be 0 (no limit) or more, not "
                             f"{self.max_loaded_models}")
        if self.keep_alive < 0 or not self.load_timeout > 0:
            raise ValueError("--keep-alive must be 0 or more and --load-timeout more than 0")
        self.budget_bytes()         # a malformed size fails here
        self.prompt_cache_bytes()
        self.prompt_cache_memory_bytes()
        if self.prompt_cache_min_tokens < 1:
            raise ValueError(f"--prompt-cache-min-tokens must be at least 1, not "
                             f"{self.prompt_cache_min_tokens}")
        self.effort_budgets()       # and a malformed table
        if not self.response_lease_seconds > 0:
            raise ValueError(f"--response-lease-seconds must be more than 0, not "
                             f"{self.response_lease_seconds}")

    @property
    def spec(self) -> str | None:
        """The one model this settings object describes (a model's own settings, or a
        server of one), without its name; None: the default model."""
        if len(self.model) > 1:
            raise ValueError("several --model: each model has settings of its own")
        return split_name(self.model[0])[1] if self.model else None

    def budget_bytes(self, memory: int | None = None) -> int:
        """``--memory-budget`` in bytes (0: no limit); ``memory``: the machine's."""
        raw = (self.memory_budget or "75%").strip()
        try:
            if raw.endswith("%"):
                share = float(raw[:-1])
                if not 0 <= share <= 100:
                    raise ValueError
                return int((memory if memory is not None else machine_memory()) * share / 100)
            return _size(raw)
        except ValueError:
            raise ValueError(f"--memory-budget {raw!r}: give bytes, a size such as 12G or "
                             f"800M, or a percentage such as 75%") from None

    def prompt_cache_bytes(self) -> int:
        """``--prompt-cache-disk`` in bytes (0: no prompt cache)."""
        return _size_option("--prompt-cache-disk", self.prompt_cache_disk)

    def prompt_cache_memory_bytes(self) -> int:
        """``--prompt-cache-memory`` in bytes (0: no memory tier)."""
        return _size_option("--prompt-cache-memory", self.prompt_cache_memory)

    def effort_budgets(self) -> Mapping[str, int]:
        """``--reasoning-budgets``: the reasoning tokens of each effort."""
        return effort_budgets(self.reasoning_budgets)

    @property
    def aliases(self) -> list[tuple[str, str]]:
        """The ``--model-alias`` entries as (pattern, served name) pairs, in order."""
        return [_alias(entry) for entry in self.model_alias]

    @classmethod
    def from_sources(cls, argv: list[str] | None = None,
                     environ: Mapping[str, str] | None = None) -> "Settings":
        """Flags over ``PODIUM_*`` environment variables over a config file over defaults."""
        environ = os.environ if environ is None else environ
        parsed = {k: v for k, v in vars(build_parser(cls).parse_args(argv or [])).items()
                  if v is not None}
        from_env = {f.name: _from_env(f, environ[ENV_PREFIX + f.name.upper()])
                    for f in dataclasses.fields(cls) if ENV_PREFIX + f.name.upper() in environ
                    and not f.metadata.get("file_only")}
        path = parsed.get("config") or from_env.get("config")
        values = _from_file(cls, path) if path else {}
        values.update(from_env)
        values.update(parsed)
        return cls(**values)

    def redacted(self) -> dict[str, Any]:
        """The effective settings, safe to log: keys and passwords masked."""
        out = dataclasses.asdict(self)
        out["api_key"] = ["***"] * len(self.api_key)
        out["admin_key"] = ["***"] * len(self.admin_key)
        out["secret_key"] = "***" if self.secret_key else None
        if self.store_url and "@" in self.store_url:
            scheme, _, rest = self.store_url.partition("://")
            out["store_url"] = f"{scheme}://***@{rest.rpartition('@')[2]}"
        return out


def build_parser(cls: type = Settings, parser: argparse.ArgumentParser | None = None
                 ) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="podium serve")
    for f in dataclasses.fields(cls):
        if f.metadata.get("file_only"):
            continue
        flag = "--" + f.name.replace("_", "-")
        env = ENV_PREFIX + f.name.upper()
        help_text = f"{f.metadata['help']} [env {env}; default {f.default!r}]"
        if f.metadata.get("multiple"):
            parser.add_argument(flag, action="append", default=None, help=help_text,
                                metavar=f.metadata.get("metavar"))
        elif f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)
        else:
            parser.add_argument(flag, type=_KINDS.get(f.type, str), default=None,
                                help=help_text, choices=f.metadata.get("choices"))
    return parser


def split_name(entry: str) -> tuple[str | None, str]:
    """``NAME=SPEC`` or ``SPEC`` (a path or repo id holding '=' keeps it when what precedes
    it looks like a path)."""
    name, eq, spec = entry.partition("=")
    if eq and name and not any(c in name for c in "/:~\\") and spec:
        return name.strip(), spec.strip()
    return None, entry.strip()


def machine_memory() -> int:
    """The machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _alias(entry: str) -> tuple[str, str]:
    pattern, eq, served = (part.strip() for part in entry.partition("="))
    if not eq or not pattern or not served:
        raise ValueError(f"--model-alias {entry!r}: expected PATTERN=SERVED, e.g. "
                         "'claude-*=my-model'")
    return pattern, served


@functools.lru_cache(maxsize=64)
def effort_budgets(given: str) -> Mapping[str, int]:
    """A ``--reasoning-budgets`` table over the defaults (ValueError: malformed); read once
    per table (every request asks), and read-only."""
    budgets = dict(_budget_entry(entry, REASONING_BUDGETS)
                   for entry in REASONING_BUDGETS.split(","))
    for entry in filter(str.strip, given.split(",")):
        effort, tokens = _budget_entry(entry, given)
        if effort not in budgets:
            raise ValueError(f"--reasoning-budgets {given!r}: unknown effort {effort!r} "
                             f"(efforts: {', '.join(budgets)})")
        budgets[effort] = tokens
    return MappingProxyType(budgets)


def _budget_entry(entry: str, given: str) -> tuple[str, int]:
    effort, eq, tokens = (part.strip() for part in entry.partition("="))
    if not eq or not effort or not (tokens.isascii() and tokens.isdigit()):
        raise ValueError(f"--reasoning-budgets {given!r}: {entry.strip()!r} is not "
                         f"EFFORT=TOKENS with TOKENS 0 or more, e.g. 'low=1024,high=16384'")
    return effort, int(tokens)


def _from_file(cls: type, path: str) -> dict[str, Any]:
    import tomllib

    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read config file {path}: {exc}") from exc
    names = {f.name for f in dataclasses.fields(cls)}
    values = {key.replace("-", "_"): value for key, value in raw.items()}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"unknown settings in {path}: {', '.join(unknown)}")
    return values


_KINDS: dict[Any, Any] = {"int": int, int: int, "float": float, float: float}


def _from_env(f: dataclasses.Field, raw: str) -> Any:
    if f.metadata.get("multiple"):
        return [part.strip() for part in _top_level_split(raw) if part.strip()]
    if f.type in ("bool", bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    return _KINDS.get(f.type, str)(raw)


def _top_level_split(raw: str) -> list[str]:
    """A comma-separated list's items, commas inside brackets, braces or a double-quoted
    string not splitting (``a=1,b={"x": 1, "y": [2, 3]}`` is two items)."""
    parts, depth, start, quoted, escaped = [], 0, 0, False, False
    for i, char in enumerate(raw):
        if quoted:
            quoted = char != '"' or escaped
            escaped = char == "\\" and not escaped
        elif char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            parts.append(raw[start:i])
            start = i + 1
    parts.append(raw[start:])
    return parts


def _size_option(flag: str, raw: str) -> int:
    """A size option's bytes; a ValueError naming ``flag`` if ``raw`` is none."""
    try:
        return _size(raw.strip())
    except ValueError:
        raise ValueError(f"{flag} {raw!r}: give bytes or a size such as 8G or 500M") from None


def _size(raw: str) -> int:
    """Bytes from ``12G``, ``12GB``, ``12GiB``, ``800M`` or a plain number (powers of 1024);
    ValueError for anything else or a negative size."""
    number = raw.upper().removesuffix("B").removesuffix("I")
    unit = number[-1:]
    scale = 1024 ** ("KMGT".index(unit) + 1) if unit and unit in "KMGT" else 1
    number = number[:-1] if scale > 1 else number
    value = float(number) * scale
    if value < 0:
        raise ValueError(raw)
    return int(value)
