"""What a server serves: --model (repeatable), --models-dir, [[models]] tables, the budget."""

from __future__ import annotations

import pytest

from podium.catalog import catalog, scan
from podium.settings import Settings


def gguf(folder, name: str):
    path = folder / name
    path.write_bytes(b"GGUF")
    return path


def test_several_models_named_or_by_file(tmp_path):
    a, b = gguf(tmp_path, "coder-7b.Q4.gguf"), gguf(tmp_path, "chat.gguf")
    configs = catalog(Settings.from_sources(["--model", str(a), "--model", f"talk={b}",
                                             "--keep-alive", "60", "--preload", "talk"], {}))
    assert [(c.name, c.source.spec) for c in configs] == [("coder-7b.Q4", str(a)),
                                                          ("talk", str(b))]
    assert [(c.pinned, c.preload, c.keep_alive) for c in configs] == [
        (False, False, 60.0), (False, True, 60.0)]          # several: on demand, kept 60 s
    [one] = catalog(Settings(model=f"talk={b}"))
    assert one.pinned and one.keep_alive is None            # one: at start, kept


def test_a_name_given_twice_or_an_alias_to_nothing_is_refused(tmp_path):
    a = gguf(tmp_path, "m.gguf")
    with pytest.raises(ValueError, match="two models are called 'm'"):
        catalog(Settings(model=(str(a), str(a))))
    with pytest.raises(ValueError, match="this server serves 'x', 'y', not 'z'"):
        catalog(Settings(model=(f"x={a}", f"y={a}"), model_alias=("gpt-*=z",)))
    with pytest.raises(ValueError, match="--preload q: no model"):
        catalog(Settings(model=(f"x={a}", f"y={a}"), preload=("q",)))


def test_models_dir_serves_each_gguf_once_and_each_hf_folder(tmp_path):
    for name in ("b.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf",
                 "mmproj-x.gguf", "notes.txt"):
        gguf(tmp_path, name)
    (tmp_path / "qwen-hf").mkdir()
    (tmp_path / "qwen-hf" / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    assert [(name, path.name, over) for name, path, over in scan(tmp_path)] == [
        ("b", "b.gguf", {}), ("big", "big-00001-of-00002.gguf", {}),
        ("qwen-hf", "qwen-hf", {"engine": "vllm"})]
    configs = catalog(Settings(models_dir=str(tmp_path)))
    assert [c.name for c in configs] == ["b", "big", "qwen-hf"]
    assert configs[2].source.engine == "vllm"
    with pytest.raises(ValueError, match="not a folder"):
        catalog(Settings(models_dir=str(tmp_path / "nowhere")))


def test_model_tables_take_their_own_settings_over_the_servers(tmp_path):
    a = gguf(tmp_path, "a.gguf")
    config = tmp_path / "podium.toml"
    config.write_text(f'''
ctx-size = 4096
tool-parser = "hermes"
[[models]]
name = "coder"
model = "{a}"
ctx-size = 16384
aliases = ["gpt-*", "o3"]
keep-alive = 30
[[models]]
name = "small"
model = "{a}"
reasoning-parser = "think"
pinned = true
''')
    coder, small = catalog(Settings.from_sources(["--config", str(config)], {}))
    assert (coder.source.ctx_size, coder.source.tool_parser, coder.aliases,
            coder.keep_alive) == (16384, "hermes", ("gpt-*", "o3"), 30.0)
    assert (small.source.ctx_size, small.source.reasoning_parser, small.pinned,
            small.keep_alive) == (4096, "think", True, 300.0)
    assert coder.source.models == () and coder.source.spec == str(a)


@pytest.mark.parametrize("table, error", [
    ('model = "x"\nport = 9', "unknown model settings port"),
    ('model = "x"\nctx-size = "big"', "ctx-size = 'big' is not a int"),
    ('model = "x"\nkeep-alive = -1', "keep-alive must be seconds"),
    ('model = "x"\npinned = "yes"', "pinned must be true or false"),
    ('model = "x"\nkind = "vision"', "kind must be one of chat, embedding"),
    ('model = "x"\naliases = "gpt-*"', "aliases must be a list"),
    ('model = 3', "model must be a path or repo id"),
    ('name = ""\nmodel = "x"', "name must be a non-empty string"),
])
def test_a_malformed_table_names_itself_and_the_setting(tmp_path, table, error):
    config = tmp_path / "podium.toml"
    config.write_text(f"[[models]]\n{table}\n")
    with pytest.raises(ValueError, match=r"\[\[models\]\] #1: " + error):
        catalog(Settings.from_sources(["--config", str(config)], {}))


@pytest.mark.parametrize("given, expected", [
    ("0", 0), ("1024", 1024), ("800M", 800 * 2**20), ("12G", 12 * 2**30),
    ("12GiB", 12 * 2**30), ("1.5g", int(1.5 * 2**30)), ("50%", 8 * 2**30),
    (None, 12 * 2**30)])                                    # default: 75%
def test_memory_budget_sizes(given, expected):
    assert Settings(memory_budget=given).budget_bytes(memory=16 * 2**30) == expected


@pytest.mark.parametrize("given", ["lots", "-1G", "150%", "12X"])
def test_a_malformed_memory_budget_is_a_start_up_error(given):
    with pytest.raises(ValueError, match="--memory-budget"):
        Settings(memory_budget=given)


def test_models_come_only_from_tables(tmp_path):
    assert Settings.from_sources([], {"PODIUM_MODELS": "x"}).models == ()   # not a variable
    config = tmp_path / "podium.toml"
    config.write_text('models = "x"\n')
    with pytest.raises(ValueError, match=r"\[\[models\]\] tables"):
        Settings.from_sources(["--config", str(config)], {})


def test_packaged_models_by_name():
    from podium.engine.llamacpp.model_files import EMBED_MODEL, default_model_path, resolve_model

    chat, embed = catalog(Settings(model=("qwen2.5-coder-0.5b-instruct", "all-minilm-l6-v2")))
    assert (chat.name, embed.name) == ("qwen2.5-coder-0.5b-instruct", "all-minilm-l6-v2")
    assert resolve_model("all-minilm-l6-v2") == default_model_path(EMBED_MODEL)
