"""A GGUF model loaded through llama.cpp's C API (via llama-cpp-python's ctypes bindings).

``LlamaModel`` owns the model, its vocabulary and (unless ``vocab_only``) one inference
context, and frees them on ``close()``. ``LlamaTokenizer`` is the real tokenizer of that
vocabulary, shared by the embedded engine and the scripted test engine.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Mapping

import llama_cpp

from podium.engine.base import any_of, literal_pieces, restorer
from podium.errors import ModelFilesError
from podium.models import LOAD_PROGRESS

log = logging.getLogger("podium.llamacpp")

# ggml's log levels (ggml.h: none, debug, info, warn, error, cont) as logging's: llama.cpp's
# information (hundreds of lines a model load) is debug here, its warnings and errors stay
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING,
           4: logging.ERROR}
# what llama.cpp says when Podium interrupts a decode on purpose (``Interrupt``): status 1
# is GGML_STATUS_ABORTED, and llama_decode's 2 "aborted"
_EXPECTED = (b"failed with error 1\n", b"compute status: 1\n", b"removing memory module entries",
             b"failed to decode, ret = 2\n")
_last_level = logging.DEBUG


@llama_cpp.llama_log_callback
def _llama_log(level: int, text: bytes, _data) -> None:
    """llama.cpp's log lines into ``podium.llamacpp`` (llama-cpp-python's own callback prints
    warnings to stderr as they come, and reads the level numbers of an older ggml)."""
    global _last_level
    level = _last_level if level == 5 else _LEVELS.get(level, logging.DEBUG)
    _last_level = level
    if any(part in text for part in _EXPECTED):
        level = logging.DEBUG
    if log.isEnabledFor(level) and text.strip():
        log.log(level, "%s", text.decode("utf-8", "replace").rstrip())


def _progress(report: Callable[[float], None]):
    """llama.cpp's load progress callback, passing each fraction to ``report``. llama.cpp
    calls it per tensor as it places the weights, after reading the file's header and
    vocabulary. Where it copies them (repacked for the CPU's kernels: --no-deterministic)
    that is the reading of the weights; weights used in place from the memory map are placed
    within milliseconds at the end (their pages are read as decodes touch them), so there
    it goes from 0 to 1 at once (the default model: 292 calls in 1 ms, 0.52 s into the
    load; repacked, over 0.25-0.31 s).
    Never stops the load (a False would abort it)."""
    @llama_cpp.llama_progress_callback
    def progress(fraction: float, _data) -> bool:
        try:
            report(min(1.0, max(0.0, fraction)))
        except Exception:  # noqa: BLE001 - a report that fails must not fail the load
            log.debug("load progress report failed", exc_info=True)
        return True
    return progress


_backend_ready = False


def use_extra_buffers(wanted: bool) -> bool:
    """Whether a model may put its weights in llama.cpp's extra buffer types (repacked for
    the CPU's kernels): as ``wanted``, except on a CPU with AMX under a llama.cpp built with
    its AMX kernels. There those kernels take every quantized matrix product of a prompt, and
    with llama-cpp-python 0.3.36 on an Intel Xeon VM (Sapphire Rapids class) they killed the
    process with an illegal instruction (SIGILL, ``tilezero`` on an unconfigured tile) at
    the first prompt of 8 tokens, with Q4_K_M and Q8_0 models alike: a server must not die
    for a faster prefill."""
    return wanted and not _amx_kernels()


_amx: bool | None = None


def _amx_kernels() -> bool:
    """This llama.cpp has AMX kernels and this CPU runs AMX (so llama.cpp would use them)."""
    global _amx
    if _amx is None:
        built = b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()
        try:
            cpu = " amx_int8" in Path("/proc/cpuinfo").read_text()
        except OSError:
            cpu = False
        _amx = built and cpu
        if _amx:
            log.warning("this CPU has AMX and llama.cpp AMX kernels, which stopped the "
                        "process with an illegal instruction on such a machine: weights are "
                        "not repacked (--no-deterministic and embedding models included)")
    return _amx


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_log_set(_llama_log, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


class LlamaModel:
    def __init__(self, path: Path, *, vocab_only: bool = False, n_ctx: int = 0,
                 n_batch: int = 512, n_threads: int = 0, n_seq_max: int = 1,
                 extra_buffers: bool = True, embeddings: bool = False,
                 flash_attention: bool = True):
        _init_backend()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = vocab_only
        params.n_gpu_layers = 0
        # off: no repacked weights (see engine); never AMX's (``use_extra_buffers``)
        params.use_extra_bufts = use_extra_buffers(extra_buffers)
        report = None if vocab_only else LOAD_PROGRESS.get()
        if report is not None:
            params.progress_callback = _progress(report)    # (params holds it for the load)
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise ModelFilesError(f"llama.cpp could not load {path} (is it a GGUF file?)")
        self.path = path
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.metadata = self._read_metadata()
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.model)
        self.ctx = None
        self._more: list = []               # contexts of add_context, freed with the model
        if not vocab_only:
            # n_ctx is per sequence: each gets its own KV region (llama.cpp splits the total)
            self.ctx = self._new_context((n_ctx or self.n_ctx_train) * n_seq_max, n_batch,
                                         n_threads, n_seq_max, embeddings, flash_attention)
            self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)

    def _new_context(self, n_ctx: int, n_batch: int, n_threads: int, n_seq_max: int,
                     embeddings: bool = False, flash_attention: bool = True):
        params = llama_cpp.llama_context_default_params()
        if not flash_attention:     # (else llama.cpp's choice: on where the backend has it)
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.embeddings = embeddings          # pooled vectors (the model's pooling)
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max
        params.kv_unified = False
        if n_threads > 0:
            params.n_threads = params.n_threads_batch = n_threads
        ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not ctx:
            self.close()
            raise ModelFilesError(f"llama.cpp could not create a context of {n_ctx} tokens")
        return ctx

    def add_context(self, n_ctx: int, n_batch: int, n_threads: int, *,
                    embeddings: bool = False, flash_attention: bool = True):
        """Another context on the same weights (one sequence), freed by ``close``."""
        ctx = self._new_context(n_ctx, n_batch, n_threads, 1, embeddings, flash_attention)
        self._more.append(ctx)
        return ctx

    def _read_metadata(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for i in range(llama_cpp.llama_model_meta_count(self.model)):
            key = _read_string(lambda b, n: llama_cpp.llama_model_meta_key_by_index(
                self.model, i, b, n))
            out[key] = _read_string(lambda b, n: llama_cpp.llama_model_meta_val_str_by_index(
                self.model, i, b, n))
        return out

    def close(self) -> None:
        """Free the context and the model (the weights are unmapped), then give the heap
        they used back to the system (glibc keeps freed heap otherwise: +53 MB resident
        after the default model at the server's settings, see tests/engine/test_unload.py)."""
        for ctx in [self.ctx, *self._more]:
            if ctx:
                llama_cpp.llama_free(ctx)
        self.ctx, self._more = None, []
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
            release_heap()


class Interrupt:
    """Stops a ``llama_decode`` in progress, from any thread: once ``set``, the decode returns
    2 at its next graph node (within milliseconds) and llama.cpp takes out of the KV cache
    what that decode had put in; ``clear`` before the next one.

    llama.cpp asks its abort callback between graph nodes, on a compute thread, hundreds of
    times a decode. A Python callback would take the GIL each time (and wait behind the event
    loop for it); this one is the C library's ``strlen`` on a two-byte buffer: 0 (go on)
    until the first byte is set. Measured: a one-token decode 43.1 ms with it, 43.0 without.
    """

    def __init__(self, ctx) -> None:
        self._flag = ctypes.create_string_buffer(2)
        self._callback = ctypes.cast(_libc().strlen, llama_cpp.ggml_abort_callback)
        llama_cpp.llama_set_abort_callback(ctx, self._callback,
                                           ctypes.cast(self._flag, ctypes.c_void_p))

    def set(self) -> None:
        self._flag[0] = b"\x01"

    def clear(self) -> None:
        self._flag[0] = b"\x00"


def _libc() -> ctypes.CDLL:
    """The C library this process runs on (its ``strlen``)."""
    if os.name == "nt":
        return ctypes.cdll.msvcrt
    return ctypes.CDLL(None)


async def shut_down(worker: threading.Thread, batch, model: LlamaModel) -> None:
    """An engine's last step, off the event loop: its worker thread ends (it was told), then
    its batch and its model are freed."""
    def free() -> None:
        worker.join()
        llama_cpp.llama_batch_free(batch)
        model.close()
    await asyncio.to_thread(free)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None under another C library."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (AttributeError, OSError, ValueError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_trim = _malloc_trim()


def release_heap() -> None:
    """Return the freed pages of the C heap to the system, where the C library can.

    glibc keeps what is freed below its top (and, growing its mmap threshold with every
    large block freed, serves later large blocks from the heap too), so a freed model's
    context would stay resident. ``malloc_trim(0)`` releases every whole free page of every
    arena (~5 ms); what stays is the top of a thread's arena, reused by the next worker.
    """
    if _trim is not None:
        _trim(0)


def _read_string(call, size: int = 256) -> str:
    buf = ctypes.create_string_buffer(size)
    n = call(buf, size)
    if n >= size:
        buf = ctypes.create_string_buffer(n + 1)
        n = call(buf, n + 1)
    return buf.raw[:max(n, 0)].decode("utf-8", "replace")


# what _scan found, by file (path, size, mtime): a few KB each
_SCANS: "OrderedDict[tuple, tuple[frozenset[int], dict[str, int]]]" = OrderedDict()


class LlamaTokenizer:
    """The model's own tokenizer, from its GGUF vocabulary.

    ``encode`` parses special-token markup anywhere (a raw prompt is the model's own format);
    ``encode_literal`` parses only the markup a chat template wrote, and tokenizes a control
    token's text that a client sent as the text it is (llama.cpp's ``parse_special`` off:
    user-defined tokens such as ``<tool_call>`` are still found, as Hugging Face finds them).
    """

    def __init__(self, model: LlamaModel):
        self._model = model          # the vocabulary lives inside the model: keep it alive
        self._vocab = model.vocab
        self.vocab_size = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._pieces: dict[int, bytes] = {}
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.bos_token = self._text(llama_cpp.llama_vocab_bos(self._vocab))
        self.eos_token = self._text(llama_cpp.llama_vocab_eos(self._vocab))
        self.eos_token_ids, self._specials = self._scan(model.path)
        self.control_texts = self._controls()
        self.grammar_specials = self._grammar_specials()
        self._bos_id = llama_cpp.llama_vocab_bos(self._vocab)
        self._segments = Segments.for_vocab(self) if (
            llama_cpp.llama_vocab_type(self._vocab) == llama_cpp.LLAMA_VOCAB_TYPE_BPE
            and not llama_cpp.llama_vocab_get_add_eos(self._vocab)) else None
        self._cut: re.Pattern[str] | None = None     # for encode_literal without segments

    def specials(self) -> dict[str, int]:
        """The tokens llama.cpp finds in text as special (control, user-defined, unknown),
        by their text, and whether any strips the blanks beside it (``""`` maps to -1)."""
        return dict(self._specials)

    def _grammar_specials(self) -> frozenset[str]:
        """The specials a grammar names as tokens (``<tool_call>``): llguidance's reading of
        a llama.cpp vocabulary (``llguidance.llamacpp``) takes control tokens, and
        user-defined ones written like markup, as special tokens, not as their text."""
        out = set()
        for text, token in self._specials.items():
            ids = [token] if token >= 0 else self._tokenize(text)
            if not text or len(ids) != 1:
                continue
            attr = llama_cpp.llama_vocab_get_attr(self._vocab, ids[0])
            if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL or (
                    attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
                    and text.startswith("<") and text.endswith(">")):
                out.add(text)
        return frozenset(out)

    def _controls(self) -> frozenset[str]:
        """The specials llama.cpp does not find in text with ``parse_special`` off: control
        and unknown tokens (a text that strips blanks or is shared: what it parses as)."""
        kinds = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        out = set()
        for text, token in self._specials.items():
            ids = [token] if token >= 0 else self._tokenize(text)
            if text and len(ids) == 1 and llama_cpp.llama_vocab_get_attr(self._vocab,
                                                                         ids[0]) & kinds:
                out.add(text)
        return frozenset(out)

    def _scan(self, path: Path) -> tuple[frozenset[int], dict[str, int]]:
        """The end-of-generation ids and the specials: one pass over the vocabulary (two C
        calls a token: 0.13 s for a 152k vocabulary), remembered for the file, so a model
        loaded again (after an unload) skips it."""
        try:
            stat = path.stat()
            key: tuple | None = (str(path), stat.st_size, stat.st_mtime_ns)
        except OSError:
            key = None
        if key is not None and key in _SCANS:
            _SCANS.move_to_end(key)
            return _SCANS[key]
        kinds = (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
                 | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN)
        strips = llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP | llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP
        vocab, is_eog, get_attr = self._vocab, llama_cpp.llama_vocab_is_eog, \
            llama_cpp.llama_vocab_get_attr
        eog: list[int] = []
        specials: dict[str, int] = {}
        for t in range(self.vocab_size):
            if is_eog(vocab, t):
                eog.append(t)
            attr = get_attr(vocab, t)
            if attr & kinds:
                text = self._text(t)
                specials[text] = -1 if (attr & strips or text in specials) else t
        found = (frozenset(eog), specials)
        if key is not None:
            _SCANS[key] = found
            while len(_SCANS) > 16:
                _SCANS.popitem(last=False)
        return found

    def _text(self, token_id: int) -> str:
        if token_id < 0:
            return ""
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token_id)
        return raw.decode("utf-8", "replace") if raw else ""

    def encode(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids for ``text``; special-token markup in it is parsed as special tokens."""
        add_bos = add_special and self._add_bos and not (
            self.bos_token and text.startswith(self.bos_token))
        if self._segments is not None:
            ids = self._segments.encode(text)
            return [self._bos_id, *ids] if add_bos else ids
        return self._tokenize(text, add_bos)

    def encode_literal(self, text: str, literal: Mapping[str, str]) -> list[int]:
        """``encode(text)``, each key of ``literal`` standing for a control token's text that
        a client sent: the piece between two of the template's special tokens that holds one
        is tokenized, its text restored, with ``parse_special`` off. llama.cpp tokenizes the
        pieces between special tokens each on its own anyway, so these are the ids of the
        client's text as text, and a prompt without keys is ``encode``'s, id for id."""
        if not any(key in text for key in literal):
            return self.encode(text)
        restore = restorer(literal)
        add_bos = self._add_bos and not (self.bos_token and text.startswith(self.bos_token))
        if self._segments is not None:
            ids = self._segments.encode(text, restore)
        else:
            ids = self._by_pieces(text, restore)
        return [self._bos_id, *ids] if add_bos else ids

    def _by_pieces(self, text: str, restore: Callable[[str], tuple[str, int]]) -> list[int]:
        """``encode_literal`` without segments: the stretches between pieces holding keys
        go to llama.cpp whole (each starts or ends at a special token, as the pieces do)."""
        if self._cut is None:
            self._cut = any_of(t for t in self._specials if t)
        ids: list[int] = []
        for piece, is_literal in literal_pieces(text, self._cut, restore):
            if piece:
                ids += self._tokenize(piece, special=not is_literal)
        return ids

    def _tokenize(self, text: str, add_bos: bool = False, special: bool = True) -> list[int]:
        """llama.cpp's tokenizer on the whole of ``text`` (``special``: markup parsed)."""
        data = text.encode("utf-8", "replace")  # lone surrogates cannot reach C
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_bos,
                                     special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_bos,
                                         special)
        return list(buf[:n])

    def _plain(self, text: str) -> list[int]:
        return self._tokenize(text, special=False)

    def piece(self, token_id: int) -> bytes:
        """The bytes a token stands for; control tokens (end of turn ...) render as nothing."""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._render(token_id)
        return piece

    def _render(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            return b""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, -n, 0, False)
        return buf.raw[:n]

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self.piece(t) for t in token_ids).decode("utf-8", "replace")


class Segments:
    """A prompt tokenized piece by piece, the pieces remembered.

    llama.cpp cuts text at its special tokens (``<|im_start|>``, ``<tool_call>`` ...) before
    its BPE runs, and tokenizes each piece between them on its own: with a BPE vocabulary
    nothing carries from one piece to the next. So a prompt's ids are its pieces' ids, and
    what a conversation sends again with every turn (the system prompt, the tools, the
    earlier turns) is looked up instead of tokenized again (~0.9 us a token on this
    machine: most of preparing a request). Used only where the cut is unambiguous: no
    special token strips the blanks beside it, none is empty or shares its text, and no two
    can overlap in a text (then every way of finding them finds the same places).

    A piece that holds a client's control-token text (``encode_literal``) is tokenized with
    specials off and remembered by its restored text: no other piece holds a special
    token's text, and where a text holds no control token's both ways give the same ids.
    """

    MAX_SPECIALS = 1024             # the overlap check is quadratic: a bigger set goes without
    LIMIT_CHARS = 4_000_000         # text remembered (ids beside it); the oldest go first

    def __init__(self, specials: dict[str, int], tokenize: Callable[[str], list[int]],
                 plain: Callable[[str], list[int]] | None = None):
        self._specials = specials
        self._cut = re.compile("(" + "|".join(
            re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")")
        self._tokenize = tokenize
        self._plain = plain or tokenize
        self._table: dict[str, tuple[int, ...]] = {}
        self._chars = 0
        self._lock = threading.Lock()

    @classmethod
    def for_vocab(cls, tokenizer: "LlamaTokenizer") -> "Segments | None":
        specials = tokenizer.specials()
        if not specials or not unambiguous(specials, cls.MAX_SPECIALS):
            return None
        return cls(specials, tokenizer._tokenize, tokenizer._plain)

    def encode(self, text: str,
               restore: Callable[[str], tuple[str, int]] | None = None) -> list[int]:
        """``text``'s ids; ``restore`` gives a piece's client text back (and how many
        control-token texts it put back: a piece with any is tokenized with specials off)."""
        ids: list[int] = []
        table = self._table
        for i, part in enumerate(self._cut.split(text)):  # text, special, text, ..., text
            if i % 2:
                ids.append(self._specials[part])
            elif part:
                tokenize = self._tokenize
                if restore is not None:
                    part, found = restore(part)
                    tokenize = self._plain if found else tokenize
                known = table.get(part)
                if known is None:
                    known = tuple(tokenize(part))
                    self._remember(part, known)
                ids += known
        return ids

    def _remember(self, part: str, ids: tuple[int, ...]) -> None:
        if len(part) > self.LIMIT_CHARS // 16:
            return                      # one huge piece would push everything else out
        with self._lock:                # requests are prepared on the loop and on workers
            table = self._table
            while self._chars + len(part) > self.LIMIT_CHARS and table:
                oldest = next(iter(table))
                del table[oldest]
                self._chars -= len(oldest)
            if part not in table:
                table[part] = ids
                self._chars += len(part)


def unambiguous(specials: dict[str, int], limit: int) -> bool:
    """No special token is empty, strips blanks or shares its text (-1), and no two can
    overlap: none inside another, no end of one the start of another."""
    texts = list(specials)
    if len(texts) > limit or any(not t or specials[t] < 0 for t in texts):
        return False
    for i, a in enumerate(texts):
        for j, b in enumerate(texts):
            if i != j and (a in b or any(a.endswith(b[:k])
                                             for k in range(1, min(len(a), len(b))))):
                return False
    return True
