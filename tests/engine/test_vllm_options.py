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


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM not installed")
def test_a_speculative_config_reaches_vllms_engine_args(model_path, monkeypatch):
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
    opts = options.check(settings("--engine-arg", f"speculative_config={json.dumps(SPECULATIVE)}"))
    loop = asyncio.new_event_loop()             # the engine's, closed here: nothing is left
    try:
        with pytest.raises(Started):
            VllmEngine.from_gguf(model_path, loop=loop, **opts)
    finally:
        loop.close()
    assert seen["args"].speculative_config == SPECULATIVE


@pytest.mark.parametrize("flags, message", [
    (["--engine", "tgi"], "--engine 'tgi': expected one of llamacpp, vllm"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size 0: must be at least 1"),
    (["--data-parallel-size", "-1"], "--data-parallel-size -1: must be at least 1"),
    (["--distributed-executor-backend", "slurm"], "--distributed-executor-backend 'slurm'"),
    (["--gpu-memory-utilization", "90%"], "expected a fraction in (0, 1]"),
    (["--gpu-memory-utilization", "1.5"], "expected a fraction in (0, 1]"),
    (["--engine-arg", "swap_space"], "expected KEY=VALUE"),
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
