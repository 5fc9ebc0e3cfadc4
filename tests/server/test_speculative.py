"""Speculative decoding's operator side (issue 42): --speculative (flag, environment, config
file, a [[models]] table's own) reaching the llama.cpp engine, and the draft counters seen in
/metrics (by model and source) and /health (the share accepted).

The engine's drafting is tested with the engine; here its counters are set by hand."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from podium.catalog import catalog
from podium.engine.base import ENGINE_STATS, EngineStats
from podium.server.served import make_engine
from podium.settings import Settings
from tests.conftest import SERVED

DRAFT_STATS = ("drafted_prediction", "accepted_prediction", "drafted_ngram", "accepted_ngram")


def test_the_setting_from_a_flag_the_environment_or_a_file(tmp_path):
    assert Settings().speculative == "ngram"
    assert Settings.from_sources(["--speculative", "off"], {}).speculative == "off"
    assert Settings.from_sources([], {"PODIUM_SPECULATIVE": "off"}).speculative == "off"
    config = tmp_path / "podium.toml"
    config.write_text('speculative = "off"\n')
    assert Settings.from_sources(["--config", str(config)], {}).speculative == "off"
    with pytest.raises(ValueError, match="--speculative must be one of ngram, off, not 'eagle'"):
        Settings.from_sources([], {"PODIUM_SPECULATIVE": "eagle"})
    with pytest.raises(SystemExit):
        Settings.from_sources(["--speculative", "eagle"], {})


def test_a_model_table_sets_its_own(tmp_path):
    config = tmp_path / "podium.toml"
    config.write_text('speculative = "off"\n'
                      '[[models]]\nname = "quoting"\nmodel = "a.gguf"\nspeculative = "ngram"\n'
                      '[[models]]\nname = "plain"\nmodel = "b.gguf"\n')
    quoting, plain = catalog(Settings.from_sources(["--config", str(config)], {}))
    assert (quoting.source.speculative, plain.source.speculative) == ("ngram", "off")
    config.write_text('[[models]]\nmodel = "a.gguf"\nspeculative = "always"\n')
    with pytest.raises(ValueError, match=r"\[\[models\]\] #1: --speculative must be one of"):
        catalog(Settings.from_sources(["--config", str(config)], {}))


def test_the_llamacpp_engine_is_made_with_the_models_setting(monkeypatch, tmp_path):
    import podium.engine.llamacpp.engine as llamacpp
    import podium.engine.llamacpp.model_files as model_files

    made: dict = {}
    real = inspect.signature(llamacpp.LlamaCppEngine)

    def engine(path, **options):
        made.update(real.bind(path, **options).arguments)      # as the engine takes them
        return SimpleNamespace(info=SimpleNamespace(context_length=4096))
    monkeypatch.setattr(llamacpp, "LlamaCppEngine", engine)
    monkeypatch.setattr(model_files, "resolve_model", lambda spec, file: tmp_path / "m.gguf")
    make_engine(Settings(speculative="off", prompt_cache_disk="0"), "m")
    assert made["speculative"] == "off"
    make_engine(Settings(prompt_cache_disk="0"), "m")
    assert made["speculative"] == "ngram"


def drafting(engine, **counts: int):
    """The engine's counters with the draft counters the llama.cpp engine keeps."""
    engine.stats = EngineStats(*ENGINE_STATS, *DRAFT_STATS)
    for name, value in counts.items():
        engine.stats[name] = value
    return engine


def test_metrics_count_draft_tokens_by_model_and_source(scripted, client_for):
    c = client_for(drafting(scripted(["ok"]), drafted_prediction=40, accepted_prediction=31,
                            drafted_ngram=12, accepted_ngram=3))
    text = c.get("/metrics").text
    for figure, source, value in (("drafted", "prediction", 40), ("accepted", "prediction", 31),
                                  ("rejected", "prediction", 9), ("drafted", "ngram", 12),
                                  ("accepted", "ngram", 3), ("rejected", "ngram", 9)):
        assert (f'podium_draft_tokens_{figure}_total{{model="{SERVED}",source="{source}"}} '
                f'{value}.0') in text
    assert "# TYPE podium_draft_tokens_rejected_total counter" in text


def test_health_gives_the_share_of_draft_tokens_accepted(scripted, client_for):
    engine = drafting(scripted(["ok"]))
    c = client_for(engine)
    model = c.get("/health").json()["models"][SERVED]
    assert model["draft_acceptance"] is None                # nothing drafted yet
    assert model["engine"]["drafted_ngram"] == 0
    engine.stats["drafted_prediction"], engine.stats["accepted_prediction"] = 40, 31
    engine.stats["drafted_ngram"], engine.stats["accepted_ngram"] = 12, 3
    assert c.get("/health").json()["models"][SERVED]["draft_acceptance"] == 0.654   # 34 / 52


def test_an_engine_without_draft_counters_has_no_draft_figures(client):
    client.post("/v1/chat/completions",
                json={"model": SERVED, "messages": [{"role": "user", "content": "hi"}]})
    r = client.get("/metrics")
    assert r.status_code == 200 and f'podium_model_loaded{{model="{SERVED}"}} 1.0' in r.text
    assert "podium_draft_tokens_drafted_total{" not in r.text
    model = client.get("/health").json()["models"][SERVED]
    assert model["draft_acceptance"] is None and "drafted_ngram" not in model["engine"]
