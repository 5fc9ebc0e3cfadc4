# mypy: disable-error-code="import-not-found, import-untyped"
# (vLLM, torch and transformers are installed only where the vLLM engine runs)
"""Podium's ``Tokenizer`` over a Hugging Face tokenizer (the one vLLM loads from the same
folder, so both sides agree on every id)."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from podium.engine.base import any_of, literal_pieces, restorer


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character a byte-level BPE token uses for
    each byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class HfTokenizer:
    """encode / piece / decode over ``transformers``' fast tokenizer. Control tokens (the
    special ones: end of turn ...) render as nothing, as with the GGUF vocabulary; added
    tokens that are not special (``<tool_call>``) render as their text.

    ``encode`` parses every added token's text (a raw prompt); ``encode_literal`` tokenizes a
    special one's text that a client sent as text (``split_special_tokens``), as llama.cpp
    does with ``parse_special`` off. Its pieces are tokenized one call each: exact where the
    tokenizer handles the text between added tokens piece by piece anyway (byte-level BPE:
    Qwen, Llama 3...); a Metaspace tokenizer that puts its "▁" only at the start of a text
    would put one before a client's piece too."""

    def __init__(self, tokenizer: Any, eos_token_ids: frozenset[int]):
        self._tok = tokenizer
        self.vocab_size = len(tokenizer)
        self.bos_token = tokenizer.bos_token or ""
        self.eos_token = tokenizer.eos_token or ""
        self.eos_token_ids = eos_token_ids
        self.chat_template: str | None = tokenizer.chat_template
        added = tokenizer.added_tokens_decoder          # id -> AddedToken
        self._control = {i for i, t in added.items() if t.special} | set(eos_token_ids)
        self._added = {i: t.content for i, t in added.items() if not t.special}
        self.control_texts = frozenset(t.content for t in added.values()
                                       if t.special and t.content)
        self._cut: re.Pattern[str] | None = None
        self._byte_level = "ByteLevel" in json.dumps(
            json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {})
        # what llguidance (vLLM's guidance backend) takes as special tokens: added tokens
        # marked special, and those written like markup (``<tool_call>``)
        self.grammar_specials = frozenset(
            t.content for t in added.values() if t.content and (
                t.special or t.content.startswith("<") and t.content.endswith(">")))
        self._pieces: dict[int, bytes] = {}

    @classmethod
    def from_folder(cls, folder: str | Path) -> "HfTokenizer":
        from transformers import AutoTokenizer, GenerationConfig

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        try:
            extra = GenerationConfig.from_pretrained(str(folder)).eos_token_id
        except OSError:                 # no generation_config.json
            extra = None
        if extra is not None:
            eos |= {extra} if isinstance(extra, int) else set(extra)
        return cls(tokenizer, frozenset(eos))

    def encode(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids for ``text``; special-token markup in it is parsed as special tokens."""
        ids = self._tok.encode(text, add_special_tokens=add_special)
        bos = self._tok.bos_token_id
        if add_special and bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos:
            ids = ids[1:]               # the text began with the BOS token itself
        return ids

    def encode_literal(self, text: str, literal: Mapping[str, str]) -> list[int]:
        """``encode(text)``, each key of ``literal`` standing for a special token's text a
        client sent: a piece between added tokens that holds one goes to the tokenizer alone,
        its text restored, special tokens split; the stretches between such pieces go whole."""
        if not any(key in text for key in literal):
            return self.encode(text)
        if self._cut is None:
            self._cut = any_of(t.content for t in self._tok.added_tokens_decoder.values()
                               if t.content)
        ids = self._head(text)
        for piece, literal_text in literal_pieces(text, self._cut, restorer(literal)):
            ids += self._plain(piece, split=literal_text)
        return ids

    def _head(self, text: str) -> list[int]:
        """What ``encode`` puts before a text (the BOS), unless the text begins with it."""
        head = self._tok.encode("", add_special_tokens=True)
        bos = self._tok.bos_token_id
        return [] if bos is not None and head[:1] == [bos] and self.bos_token and \
            text.startswith(self.bos_token) else head

    def _plain(self, text: str, split: bool = False) -> list[int]:
        if not text:
            return []
        return self._tok.encode(text, add_special_tokens=False, split_special_tokens=split)

    def pair_layout(self) -> tuple[list[int], list[int], list[int], int | None]:
        """How the tokenizer joins a pair of texts (a cross-encoder's query and document):
        the special ids before the first, between the two and after the second, and where
        the second segment's token types begin, counted from the start of the second text's
        separator (None: no token types, or all zero). Read off the tokenizer's own pair
        encoding of two words."""
        first = self._tok.encode("query", add_special_tokens=False)
        second = self._tok.encode("document", add_special_tokens=False)
        pair = self._tok("query", "document")
        ids, types = list(pair["input_ids"]), pair.get("token_type_ids")
        for i in range(len(ids) - len(first) + 1):
            if ids[i:i + len(first)] == first:
                break
        else:
            raise ValueError("the tokenizer's pair encoding does not hold the first text")
        rest = i + len(first)
        for j in range(rest, len(ids) - len(second) + 1):
            if ids[j:j + len(second)] == second:
                break
        else:
            raise ValueError("the tokenizer's pair encoding does not hold the second text")
        segment = None
        if types and 1 in types:
            segment = list(types).index(1) - rest
        return ids[:i], ids[rest:j], ids[j + len(second):], segment

    def piece(self, token_id: int) -> bytes:
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._render(token_id)
        return piece

    def _render(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size or token_id in self._control:
            return b""
        if token_id in self._added:
            return self._added[token_id].encode()
        token = self._tok.convert_ids_to_tokens(token_id)
        if token is None:
            return b""
        if self._byte_level:
            table = _byte_decoder()
            return bytes(table[c] for c in token if c in table)
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            return bytes([int(token[3:5], 16)])         # sentencepiece byte fallback
        return token.replace("\u2581", " ").encode()

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self.piece(t) for t in token_ids).decode("utf-8", "replace")
