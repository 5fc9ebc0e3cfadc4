"""Dialects: how the loaded model is prompted and read (see ``base``)."""

from __future__ import annotations

from podium.dialect.base import Dialect, Prompt
from podium.engine.base import Engine
from podium.settings import Settings

__all__ = ["Dialect", "Prompt", "select"]


def select(engine: Engine, settings: Settings) -> Dialect:
    """The dialect of the engine's model: Harmony for gpt-oss (or ``--harmony``), else its
    chat template with the families it implies (or the ones the settings name)."""
    from podium.harmony.format import Harmony, is_harmony
    if settings.harmony or is_harmony(engine.info):
        from podium.dialect.harmony import HarmonyDialect
        return HarmonyDialect(Harmony(settings.harmony_vocab_dir))
    from podium.dialect.template import TemplateDialect
    return TemplateDialect.for_model(engine.tokenizer, engine.info.chat_template, settings)
