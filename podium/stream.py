"""The choice-stream contract: one choice's engine outputs in, semantic events out.

Its own module, below both ``dialect`` (whose dialects make the streams) and ``generation``
(which runs them), so neither imports the other to name it. The events are
``podium.parsing.events``'s.
"""

from __future__ import annotations

from typing import Protocol

from podium.engine.base import EngineOutput
from podium.parsing.events import Event


class ChoiceStream(Protocol):
    """One choice's engine outputs in, semantic events out: ``TextStream`` (detokenizer, stop
    strings, output parsers) for template dialects and Completions, ``HarmonyPipeline`` for
    Harmony. The choice's last output yields its ``Finish`` and then its ``Usage``;
    ``finish()`` gives the ``Usage`` of a choice cut short (nothing once it was given)."""

    @property
    def finished(self) -> bool:
        """The choice ended (a finish reason, or a stop string)."""

    def feed(self, out: EngineOutput) -> list[Event]: ...
    def finish(self) -> list[Event]: ...
