"""``podium serve --engine vllm``: every option checked, with a clear error, before vLLM
starts (these tests never start it)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import warnings

import pytest

from podium.catalog import catalog
from podium.engine.vllm import options
from podium.settings import Settings

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def settings(*flags: str) -> Settings:
    return Settings.from_sources(["--engine", "vllm", *flags], {})


def test_the_vllm_flags_reach_the_engine_options():
    s = settings("--tensor-parallel-size", "2", "--pipeline-parallel-size", "3",
                 "--data-parallel-size", "4", "--distributed-executor-backend", "mp",
                 "--gpu-memory-utilization", "0.5", "--enforce-eager", "--ctx-size", "4096",
                 "--max-num-seqs", "8", "--max-queued-requests", "16")
    opts = {k: v for k, v in options.check(s).items() if k != "engine_args"}
    assert opts == dict(max_model_len=4096, max_num_seqs=8, max_queued=16, enforce_eager=True,
                        tensor_parallel_size=2, pipeline_parallel_size=3,
                        data_parallel_size=4, distributed_executor_backend="mp",
                        gpu_memory_utilization=0.5)
    assert options.check(settings())["max_model_len"] is None        # the model's own


def test_engine_args_are_read_as_json_when_they_are():
    s = settings("--engine-arg", "swap_space=4", "--engine-arg", "enable-chunked-prefill=false",
                 "--engine-arg", "served_model_name=abc")
    if not HAS_VLLM:            # names are checked against vLLM's own where it is installed
        assert options.check(s)["engine_args"] == {
            "swap_space": 4, "enable_chunked_prefill": False, "served_model_name": "abc"}
    env = Settings.from_sources(["--engine", "vllm"],
                                {"PODIUM_ENGINE_ARG": "seed=1, block_size=16"})
    assert options.check(env)["engine_args"] == {"seed": 1, "block_size": 16}


# vLLM's own n-gram speculation (--speculative is the llama.cpp engine's; vLLM ignores it)
SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


def test_a_speculative_config_is_an_engine_arg_read_as_json(tmp_path):
    arg = f"speculative_config={json.dumps(SPECULATIVE)}"
    s = settings("--engine-arg", arg, "--speculative", "off")
    assert options.check(s)["engine_args"] == {"speculative_config": SPECULATIVE}
    config = tmp_path / "podium.toml"               # a model's own, in its [[models]] table
    config.write_text(f'[[models]]\nname = "q"\nmodel = "Qwen/Qwen2.5-0.5B-Instruct"\n'
                      f'engine = "vllm"\nengine-arg = [{json.dumps(arg)}]\n')
    [model] = catalog(Settings.from_sources(["--config", str(config)], {}))
    assert options.check(model.source)["engine_args"] == {"speculative_config": SPECULATIVE}


def engine_args_seen(model_path, monkeypatch, *flags: str):
    """The ``AsyncEngineArgs`` vLLM is started with under ``flags``: the engine is made up to
    the point where vLLM would start, and nothing runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # vLLM's and torch's import-time noise
        from vllm.v1.engine.async_llm import AsyncLLM

    from podium.engine.vllm.engine import VllmEngine

    class Started(Exception):
        """Where vLLM would start: its engine arguments are seen, nothing runs."""

    seen = {}

    def from_engine_args(engine_args, **_):
        seen["args"] = engine_args
        raise Started
    monkeypatch.setattr(AsyncLLM, "from_engine_args", from_engine_args)
    opts = options.check(settings(*flags))
    loop = asyncio.new_event_loop()             # the engine's, closed here: nothing is left
    try:
        with pytest.raises(Started):
            VllmEngine.from_gguf(model_path, loop=loop, **opts)
    finally:
        loop.close()
    return seen["args"]


def vllm_config(engine_args):
    """What vLLM makes of its engine arguments on start (its ``VllmConfig``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return engine_args.create_engine_config()


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed")
def test_a_speculative_config_reaches_vllms_engine_args(model_path, monkeypatch):
    args = engine_args_seen(model_path, monkeypatch,
                            "--engine-arg", f"speculative_config={json.dumps(SPECULATIVE)}")
    assert args.speculative_config == SPECULATIVE


# vLLM's KV offload tiers (issue 43: Podium keeps no second cache for vLLM). The native
# connector's host-memory tier with a disk tier behind it; vLLM's shorthand for the host tier
# alone; and LMCache's connector (the lmcache package, not installed here: checked as far as
# vLLM's config).
TIERED = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {
              "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8 << 30,
              "secondary_tiers": [{"type": "fs", "root_dir": "/var/cache/vllm-kv"}]}}
LMCACHE = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}


def test_kv_offload_options_are_engine_args_read_as_json(tmp_path):
    s = settings("--engine-arg", f"kv_transfer_config={json.dumps(TIERED)}",
                 "--engine-arg", "kv_offloading_size=8", "--engine-arg",
                 "kv_offloading_backend=native", "--engine-arg", "enable_prefix_caching=true")
    assert options.check(s)["engine_args"] == {
        "kv_transfer_config": TIERED, "kv_offloading_size": 8,
        "kv_offloading_backend": "native", "enable_prefix_caching": True}
    config = tmp_path / "podium.toml"               # a model's own, in its [[models]] table
    arg = f"kv_transfer_config={json.dumps(LMCACHE)}"
    config.write_text(f'[[models]]\nname = "q"\nmodel = "Qwen/Qwen2.5-0.5B-Instruct"\n'
                      f'engine = "vllm"\nengine-arg = [{json.dumps(arg)}]\n')
    [model] = catalog(Settings.from_sources(["--config", str(config)], {}))
    assert options.check(model.source)["engine_args"] == {"kv_transfer_config": LMCACHE}
    # PODIUM_ENGINE_ARG is a comma-separated list; the commas inside a JSON value do not cut it
    env = Settings.from_sources(["--engine", "vllm"], {
        "PODIUM_ENGINE_ARG": f"kv_offloading_size=8,kv_transfer_config={json.dumps(TIERED)}, "
                             f"enable_prefix_caching=true"})
    assert options.check(env)["engine_args"] == {
        "kv_offloading_size": 8, "kv_transfer_config": TIERED, "enable_prefix_caching": True}


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed")
@pytest.mark.parametrize("given", [TIERED, LMCACHE])
def test_a_kv_transfer_config_reaches_vllm_intact(model_path, monkeypatch, given):
    args = engine_args_seen(model_path, monkeypatch,
                            "--engine-arg", f"kv_transfer_config={json.dumps(given)}")
    assert args.kv_transfer_config == given
    assert args.enable_prefix_caching is True       # Podium's: the first tier stays on
    made = vllm_config(args).kv_transfer_config     # vLLM's own KVTransferConfig
    assert (made.kv_connector, made.kv_role) == (given["kv_connector"], "kv_both")
    assert made.kv_connector_extra_config == given.get("kv_connector_extra_config", {})


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed")
def test_kv_offloading_size_reaches_vllm_as_its_host_memory_tier(model_path, monkeypatch):
    args = engine_args_seen(model_path, monkeypatch, "--engine-arg", "kv_offloading_size=2",
                            "--engine-arg", "kv_offloading_backend=native")
    assert (args.kv_offloading_size, args.kv_offloading_backend) == (2, "native")
    config = vllm_config(args)
    assert config.cache_config.kv_offloading_size == 2
    made = config.kv_transfer_config            # vLLM's shorthand, made into its connector
    assert made.kv_connector in ("OffloadingConnector", "SimpleCPUOffloadConnector")
    assert made.kv_connector_extra_config["cpu_bytes_to_use"] == 2 << 30


@pytest.mark.parametrize("flags, message", [
    (["--engine", "tgi"], "--engine 'tgi': expected one of llamacpp, vllm"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size 0: must be at least 1"),
    (["--data-parallel-size", "-1"], "--data-parallel-size -1: must be at least 1"),
    (["--distributed-executor-backend", "slurm"], "--distributed-executor-backend 'slurm'"),
    (["--gpu-memory-utilization", "90%"], "expected a fraction in (0, 1]"),
    (["--gpu-memory-utilization", "1.5"], "expected a fraction in (0, 1]"),
    (["--engine-arg", "swap_space"], "expected KEY=VALUE"),
    (["--engine-arg", 'kv_transfer_config={"kv_connector": "OffloadingConnector",}'],
     "kv_transfer_config is not valid JSON (Expecting property name enclosed in double "
     "quotes: line 1 column 40 (char 39))"),
    (["--engine-arg", "speculative_config=[ngram"], "speculative_config is not valid JSON"),
    (["--ctx-size", "-5"], "--ctx-size -5"),
])
def test_a_bad_option_is_named(flags, message):
    s = Settings.from_sources(["--engine", "vllm", *flags], {})
    with pytest.raises(ValueError) as err:
        options.check(s)
    assert message in str(err.value)


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed")
def test_an_unknown_engine_arg_is_named():
    with pytest.raises(ValueError, match="vLLM has no engine argument 'no_such_thing'"):
        options.check(settings("--engine-arg", "no_such_thing=1"))


def test_serve_reports_a_bad_option_before_anything_loads():
    args = ["serve", "--engine", "vllm", "--tensor-parallel-size", "0"]
    done = subprocess.run([sys.executable, "-m", "podium", *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "--tensor-parallel-size 0: must be at least 1" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_serve_says_when_vllm_is_not_installed():
    done = subprocess.run([sys.executable, "-m", "podium", "serve", "--engine", "vllm"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--engine vllm: vLLM is not installed" in done.stderr


def test_model_folder_takes_a_folder_a_gguf_or_a_hub_id(tmp_path, monkeypatch):
    folder = tmp_path / "my-model"
    folder.mkdir()
    with pytest.raises(Exception, match="no config.json"):
        options.model_folder(settings("--model", str(folder)))
    (folder / "config.json").write_text("{}")
    assert options.model_folder(settings("--model", str(folder))) == (str(folder), "my-model")
    assert options.model_folder(settings("--model", "Qwen/Qwen2.5-0.5B-Instruct",
                                         "--served-model-name", "q")) == (
        "Qwen/Qwen2.5-0.5B-Instruct", "q")
    gguf = tmp_path / "m-Q4.gguf"
    gguf.write_bytes(b"GGUF")
    import podium.engine.vllm.weights as weights
    monkeypatch.setattr(weights, "hf_folder_from_gguf", lambda path: tmp_path / "made")
    assert options.model_folder(settings("--model", str(gguf))) == (str(tmp_path / "made"),
                                                                    "m-Q4")
    with pytest.raises(Exception, match="Hugging Face model folder, a .gguf file or a hub id"):
        options.model_folder(settings("--model", str(tmp_path / "missing.bin")))


def test_the_architecture_is_named_as_in_gguf_for_dialect_detection():
    from podium.engine.base import ModelInfo
    from podium.engine.vllm.engine import architecture
    from podium.harmony.format import is_harmony

    assert [architecture(t) for t in ("gpt_oss", "qwen2", "qwen3_moe", "llama")] == [
        "gpt-oss", "qwen2", "qwen3moe", "llama"]
    info = ModelInfo("m", 1024, None, 0, {"general.architecture": architecture("gpt_oss")})
    assert is_harmony(info)
