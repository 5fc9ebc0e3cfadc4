import os
import subprocess
import sys
from pathlib import Path

import pytest

from podium.cli import served_name
from podium.settings import Settings


def podium(*args, **kw):
    return subprocess.run([sys.executable, "-m", "podium", *args], capture_output=True,
                          text=True, timeout=60, **kw)


def test_flags_win_over_environment_over_defaults():
    env = {"PODIUM_PORT": "9000", "PODIUM_API_KEY": "a, b", "PODIUM_HOST": "0.0.0.0",
           "PODIUM_ALLOW_REQUEST_CHAT_TEMPLATE": "true"}
    s = Settings.from_sources(["--port", "9100", "--cors-origins", "*"], env)
    assert (s.port, s.host, s.api_key, s.cors_origins) == (9100, "0.0.0.0", ["a", "b"], ["*"])
    assert s.allow_request_chat_template is True
    assert Settings.from_sources([], {}).port == 8000
    assert Settings.from_sources(["--api-key", "x", "--api-key", "y"], {}).api_key == ["x", "y"]


def test_served_name():
    assert served_name(Settings(), Path("/c/x.gguf")) == "qwen2.5-coder-0.5b-instruct"
    assert served_name(Settings(model="/m/llama-3.2-1b.Q4.gguf"),
                       Path("/m/llama-3.2-1b.Q4.gguf")) == "llama-3.2-1b.Q4"
    assert served_name(Settings(model="x", served_model_name="mine"), Path("x")) == "mine"


def test_serve_help_documents_every_setting():
    out = podium("serve", "--help").stdout
    for flag in ("--host", "--port", "--model", "--served-model-name", "--api-key",
                 "--ctx-size", "--threads", "--cors-origins", "PODIUM_API_KEY",
                 "--model-alias", "PODIUM_MODEL_ALIAS"):
        assert flag in out


def test_model_alias_flag_repeats_and_environment_takes_a_list():
    flags = ["--model-alias", "claude-*=m", "--model-alias", "gpt-?o = m"]
    s = Settings.from_sources(flags, {"PODIUM_MODEL_ALIAS": "x=y"})
    assert s.model_alias == ("claude-*=m", "gpt-?o = m")
    assert s.aliases == [("claude-*", "m"), ("gpt-?o", "m")]
    s = Settings.from_sources([], {"PODIUM_MODEL_ALIAS": "claude-*=m, gpt-*=m,"})
    assert s.model_alias == ("claude-*=m", "gpt-*=m")
    assert (s.alias_for("claude-haiku-4-5"), s.alias_for("Claude-x"), s.alias_for("o3")) == (
        "m", None, None)
    assert Settings.from_sources([], {}).model_alias == ()


@pytest.mark.parametrize("entry", ["claude-haiku", "=m", "claude-*=", " = "])
def test_malformed_model_alias_is_a_start_up_error(entry):
    with pytest.raises(ValueError, match="expected PATTERN=SERVED"):
        Settings(model_alias=(entry,))
    r = podium("serve", "--model-alias", entry)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"podium: --model-alias {entry!r}: expected PATTERN=SERVED" in r.stderr
    r = podium("serve", env={**os.environ, "PODIUM_MODEL_ALIAS": f"a=b,{entry}"})
    assert r.returncode == 2 and "expected PATTERN=SERVED" in r.stderr


def test_model_alias_to_a_model_not_served_is_a_start_up_error(model_path):
    r = podium("serve", "--model-alias", "claude-*=claude-sonnet-4-5")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert ("podium: --model-alias claude-*=claude-sonnet-4-5: this server serves "
            "'qwen2.5-coder-0.5b-instruct', not 'claude-sonnet-4-5'") in r.stderr


def test_missing_model_file_is_a_clear_message_not_a_traceback():
    r = podium("serve", "--model", "/nowhere/model.gguf")
    assert r.returncode == 1
    assert "Model file not found: /nowhere/model.gguf" in r.stderr
    assert "Traceback" not in r.stderr


def test_model_path_prints_the_assembled_default_model(model_path):
    r = podium("model-path")
    assert r.returncode == 0 and r.stdout.strip() == str(model_path)


def test_unknown_command_shows_usage():
    r = podium("frobnicate")
    assert r.returncode == 2 and "podium serve" in r.stderr
