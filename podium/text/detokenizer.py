"""Incremental, UTF-8 safe detokenizer.

Byte-level tokenizers split characters (emoji, CJK) across tokens. Each token's raw bytes go
through Python's incremental UTF-8 decoder, which keeps an unfinished character's bytes until
the rest arrive, so a delta never carries a U+FFFD for a split character. The concatenated
deltas plus ``flush()`` equal a one-shot decode of all the bytes.

Most tokens are whole characters on their own: while the decoder holds nothing, such a token's
text is its piece decoded once and remembered (``texts``, shared by every request of one
tokenizer), so the common step is a dict lookup; the incremental decoder only sees the bytes
of split characters and what follows them until it is empty again.
"""

from __future__ import annotations

import codecs
import weakref
from typing import Any, Callable

# token id -> its text, for the tokens whose piece is complete UTF-8; one table per tokenizer
_TEXTS: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


def texts_of(tokenizer: Any) -> dict[int, str]:
    """The shared table of whole-character token texts for ``tokenizer`` (filled as met)."""
    try:
        return _TEXTS.setdefault(tokenizer, {})
    except TypeError:               # not weak-referenceable: a table of its own per call
        return {}


class Detokenizer:
    __slots__ = ("_piece", "_decoder", "_texts", "_clean")

    def __init__(self, piece: Callable[[int], bytes], texts: dict[int, str] | None = None):
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._texts = {} if texts is None else texts
        self._clean = True          # the decoder holds no bytes of an unfinished character

    def feed(self, token_id: int) -> str:
        """Text completed by this token (possibly empty)."""
        if self._clean:
            text = self._texts.get(token_id)
            if text is not None:
                return text
            piece = self._piece(token_id)
            try:
                text = piece.decode("utf-8")
            except UnicodeDecodeError:
                pass                # part of a character (or invalid): the decoder's job
            else:
                self._texts[token_id] = text
                return text
        else:
            piece = self._piece(token_id)
        decoder = self._decoder
        text = decoder.decode(piece)
        self._clean = not decoder.getstate()[0]
        return text

    def flush(self) -> str:
        """Whatever is left at the end: an unfinished character becomes U+FFFD."""
        self._clean = True
        return self._decoder.decode(b"", final=True)
