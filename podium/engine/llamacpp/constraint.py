"""The llguidance side of one loaded model: its vocabulary as llguidance reads it, and the
grammars requests bring, compiled before they are admitted.

Reading the vocabulary takes about 0.6 s for the default model's 151,936 tokens: it is done
at the first constrained request, on that request's worker thread (``check``), and kept.
Compiling a grammar takes about a millisecond for a tool schema and can take 100 ms or more
for a large one (llguidance drops the GIL meanwhile): it too is done on the request's worker
thread, and the compiled matcher is kept (``MAX_COMPILED``, most recent first) so the decode
thread only copies it at admission. A grammar llguidance refuses for this vocabulary (a
special token the model does not have) is a 400 there, before the request is queued.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict

from llguidance import LLMatcher, LLTokenizer
from llguidance.llamacpp import lltokenizer_from_vocab

from podium.errors import InvalidRequestError
from podium.grammar import limits

MAX_COMPILED = 32       # compiled grammars kept per model (a tool schema's: tens of kB)


class Grammars:
    def __init__(self, vocab, n_vocab: int, eog: frozenset[int]):
        self._vocab, self._n_vocab, self._eog = vocab, n_vocab, sorted(eog)
        self._tokenizer: LLTokenizer | None = None
        self._lock = threading.Lock()
        self._compiled: OrderedDict[str, LLMatcher] = OrderedDict()

    def check(self, grammar: str) -> None:
        """Compile ``grammar`` for this model (a 400 naming its parameter when llguidance
        refuses it) and keep it for ``matcher``. Called off the decode thread."""
        self._compile(grammar)

    def matcher(self, grammar: str) -> LLMatcher:
        """A fresh matcher for ``grammar`` (a copy of the compiled one; compiled here, on the
        caller's thread, only if it was dropped meanwhile)."""
        with self._lock:
            made = self._compiled.get(grammar)
        return (made or self._compile(grammar)).deep_copy()

    def _compile(self, grammar: str) -> LLMatcher:
        made = LLMatcher(self._llg(), grammar, log_level=0, limits=limits())
        if made.is_error():
            raise InvalidRequestError(
                f"The output constraint cannot be used with this model: "
                f"{made.get_error().splitlines()[0][:300]}",
                param=getattr(grammar, "param", None))
        with self._lock:
            self._compiled[grammar] = made
            self._compiled.move_to_end(grammar)
            while len(self._compiled) > MAX_COMPILED:
                self._compiled.popitem(last=False)
        return made

    def _llg(self) -> LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                with warnings.catch_warnings():     # it calls llama_cpp's deprecated
                    warnings.simplefilter("ignore", DeprecationWarning)  # token_get_attr
                    self._tokenizer = lltokenizer_from_vocab(
                        self._vocab, n_vocab=self._n_vocab, eos_token=self._eog)
            return self._tokenizer
