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
    template = engine.info.chat_template
    if settings.chat_template_file:
        template = read_template(settings.chat_template_file)
    return TemplateDialect.for_model(engine.tokenizer, template, settings)


MAX_TEMPLATE_BYTES = 1 << 20


def read_template(path: str) -> str:
    """``--chat-template-file``'s text; ValueError (a start-up error) naming the file when it
    cannot be read, is not UTF-8 text, is empty or is over 1 MiB."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"--chat-template-file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_TEMPLATE_BYTES:
        raise ValueError(f"--chat-template-file {path}: over {MAX_TEMPLATE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"--chat-template-file {path}: not UTF-8 text") from None
    if not text.strip():
        raise ValueError(f"--chat-template-file {path}: empty")
    return text
