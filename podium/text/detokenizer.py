"""Incremental, UTF-8 safe detokenizer.

Byte-level tokenizers split characters (emoji, CJK) across tokens. Each token's raw bytes go
through Python's incremental UTF-8 decoder, which keeps an unfinished character's bytes until
the rest arrive, so a delta never carries a U+FFFD for a split character. Work per token is
one piece lookup and one decode of a few bytes; the concatenated deltas plus ``flush()`` equal
a one-shot decode of all the bytes.
"""

from __future__ import annotations

import codecs
from typing import Callable


class Detokenizer:
    __slots__ = ("_piece", "_decoder")

    def __init__(self, piece: Callable[[int], bytes]):
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token_id: int) -> str:
        """Text completed by this token (possibly empty)."""
        return self._decoder.decode(self._piece(token_id))

    def flush(self) -> str:
        """Whatever is left at the end: an unfinished character becomes U+FFFD."""
        return self._decoder.decode(b"", final=True)
