"""The prompt cache's host-memory and disk tiers: one sequence's KV state kept in process
memory or in a file (or both), found again by the token ids it holds (issue 43).

llama.cpp hands the engine a sequence's KV state as bytes (``llama_state_seq_get_data``) and
takes it back (``llama_state_seq_set_data``). A ``PromptCache`` keeps such blobs so that a
prefix prefilled once is restored after the slot that held it was taken (from memory or
disk), its model unloaded or the server restarted (from disk).

Two tiers, one index. The memory tier holds the ``bytes`` objects the engine handed over (no
copy), at most ``memory_bytes`` of them, least recently used out first; what it holds never
outlives the process (``close`` lets go of it) and is served without reading a file or a
checksum (it never left the process). The disk tier holds one file per entry, as below. An
entry may be in either or both: one saved with ``keep=False`` (OpenAI's ``in_memory``
retention) is in memory only and never looked for on disk; a disk entry the memory tier let
go of is still found on disk; a disk entry that is loaded is held in memory again (it has
just proved it is reused, so it is a better use of the tier than a state saved once). Each
tier supersedes within itself: a longer state of the same tokens makes the memory copies,
and later the files, of its prefixes redundant.

Finding a prefix. The token ids are cut into blocks of ``block`` ids; a block's hash covers
it and every block before it (sha256 of the previous hash and the block's ids as int32
little-endian). Every entry's hash at each of its block boundaries is in memory, so the
longest prefix of a prompt that some entry holds is a walk along the prompt's own chain,
stopping at the first hash no entry has: no file is read. An entry whose whole token list is
a prefix of the prompt (the last turn of a conversation that goes on) also matches up to its
own end, not just its last whole block: its key (the hash of its last, partial block) is
checked against the prompt's.

An entry file: a fixed header (magic, format version, lengths, the payload's sha256), the
model's fingerprint, the token ids, and the sha256 of all that; then the payload. The file is
named by the key of its token ids, in a folder named by a digest of the fingerprint (the
model file and every setting that changes the KV, given by the engine), so two models never
meet. The header is verified when the folder is scanned, the payload when it is loaded; a
file that fails either (truncated, a flipped byte, another model's, other tokens than its
name says) is a warning and is removed, and the caller prefills.

Writes happen behind, on a thread of the cache's own: ``save`` only queues them. A write goes to a
temporary file in the same folder (unique per process and write), is fsynced and renamed
into place, so a reader, in this process or another, sees a whole file or none. The folder
holds at most ``max_bytes``: the least recently used entries (a load touches the file's
mtime) go first. Several processes may share the folder: each re-reads it when its mtime
changes, a file another one removed is a miss, and a file another one is writing is not
seen until it is renamed.

No I/O error reaches the caller: a full disk, a read-only folder or an unreadable file is a
warning in the log (once per kind of failure, not once per save) and the save is dropped or
the load a miss.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import struct
import sys
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from podium.engine.base import EngineStats

log = logging.getLogger(__name__)

FORMAT = 1
MAGIC = b"PDKV"
SUFFIX = ".kv"
# magic, format, fingerprint bytes, token count, payload bytes, the payload's sha256
_FIXED = struct.Struct("<4sIIIQ32s")
_DIGEST = 32
_SEED = bytes(_DIGEST)              # the chain's hash before the first block
# A temporary file this old was left by a writer that died (a live one renames it within
# the time one write takes).
STALE_TEMP_NS = 3600 * 10**9
# Some filesystems stamp a folder's mtime from a coarse clock (a kernel tick, or 2 s on
# FAT): a change within that long of a scan may leave the mtime as the scan saw it, so the
# folder is read again until its mtime is older than this at the scan.
MTIME_SLACK_NS = 2 * 10**9

# entries, bytes, hits, ... evicted: the disk tier's (hits: loads read from a file; misses:
# loads neither tier served); memory_*: the memory tier's
STATS = ("entries", "bytes", "hits", "misses", "saves", "dropped", "too_big", "failed",
         "corrupt", "evicted", "memory_entries", "memory_bytes", "memory_hits",
         "memory_evicted", "memory_too_big",
         "read_us", "write_us")     # time spent reading (both tiers' hits) and writing files


class _Bad(Exception):
    """An entry file that must not be restored (the message says why)."""


@dataclass(slots=True)
class _Entry:
    key: bytes                  # the hash of all its token ids (the file is named by it)
    tokens: int                 # how many token ids it holds
    blocks: list[bytes]         # its chain hash at each whole block
    size: int                   # bytes on disk (0: not on disk)
    used: int                   # its file's mtime in ns: written or last loaded
    data: bytes | None = None   # its state, while the memory tier holds it

    @property
    def name(self) -> str:
        return _name(self.key)


def _name(key: bytes) -> str:
    return key.hex() + SUFFIX


@dataclass(slots=True)
class _Header:
    fingerprint: str
    ids: bytes                  # int32 little-endian
    payload: int                # bytes of payload after the header
    digest: bytes               # the payload's sha256


def _ids(tokens: Sequence[int]) -> bytes:
    """``tokens`` as int32 little-endian: the form hashed and stored."""
    ids = array("i", tokens)
    if sys.byteorder == "big":
        ids.byteswap()
    return ids.tobytes()


def _link(prev: bytes, piece: bytes | memoryview) -> bytes:
    h = hashlib.sha256(prev)
    h.update(piece)
    return h.digest()


def _chain(ids: bytes, block: int) -> tuple[list[bytes], bytes]:
    """The chain hash at each whole block of ``ids``, and the key of all of them (the last
    whole block's hash, or the hash of the partial block after it)."""
    step = 4 * block
    view = memoryview(ids)
    blocks: list[bytes] = []
    prev = _SEED
    whole = len(ids) - len(ids) % step
    for start in range(0, whole, step):
        prev = _link(prev, view[start:start + step])
        blocks.append(prev)
    return blocks, (_link(prev, view[whole:]) if whole < len(ids) else prev)


def encode_header(fingerprint: str, ids: bytes, payload: bytes) -> bytes:
    """The header of an entry holding ``payload``, the state of the token ``ids``."""
    fp = fingerprint.encode()
    head = _FIXED.pack(MAGIC, FORMAT, len(fp), len(ids) // 4, len(payload),
                       hashlib.sha256(payload).digest()) + fp + ids
    return head + hashlib.sha256(head).digest()


def _read_header(f: BinaryIO, size: int) -> _Header:
    """The header of the open entry file ``f`` of ``size`` bytes, checked against its digest
    and the file's size (a truncated or padded file is refused before its payload is read)."""
    fixed = f.read(_FIXED.size)
    if len(fixed) < _FIXED.size:
        raise _Bad("truncated header")
    magic, version, fp_len, n_tokens, payload, digest = _FIXED.unpack(fixed)
    if magic != MAGIC or version != FORMAT:
        raise _Bad(f"not a format {FORMAT} entry")
    rest = fp_len + 4 * n_tokens + _DIGEST
    if _FIXED.size + rest + payload != size:
        raise _Bad(f"{size} bytes, the header says {_FIXED.size + rest + payload}")
    tail = f.read(rest)
    if len(tail) < rest or hashlib.sha256(fixed + tail[:-_DIGEST]).digest() != tail[-_DIGEST:]:
        raise _Bad("header checksum mismatch")
    return _Header(tail[:fp_len].decode(errors="replace"), tail[fp_len:-_DIGEST], payload,
                   digest)


class PromptCache:
    """KV states in memory and on disk, keyed by the token ids they hold, for one model's
    fingerprint.

    ``longest``, ``load`` and ``save`` may be called from any thread (the engine's decode
    thread, its reader thread); ``save`` holds the state in memory and queues the write,
    for the cache's writer thread.
    """

    def __init__(self, directory: Path, fingerprint: str, *, max_bytes: int,
                 min_tokens: int = 256, block: int = 128, max_queued: int = 2,
                 memory_bytes: int = 0):
        """``max_bytes``: the disk tier's cap; ``memory_bytes``: the memory tier's (0: no
        memory tier). ``max_queued``: saves waiting for the writer at most (each holds its
        state in memory until written); one more is not written."""
        digest = hashlib.sha256(f"{FORMAT}\n{fingerprint}".encode()).hexdigest()[:32]
        self.directory = Path(directory) / digest
        self.fingerprint = fingerprint
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self.block = block
        self.max_queued = max_queued
        self.memory_bytes = memory_bytes
        self.stats = EngineStats(*STATS)
        # every entry of either tier, by key; those the memory tier holds, oldest use first
        self._entries: dict[bytes, _Entry] = {}
        self._memory: OrderedDict[bytes, _Entry] = OrderedDict()
        # A chain hash -> the keys of the entries holding that prefix; and of the entries
        # that end in the partial block after it.
        self._blocks: dict[bytes, set[bytes]] = {}
        self._ends: dict[bytes, set[bytes]] = {}
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._saves: deque[tuple[bytes, bytes]] = deque()
        self._rescan = False            # the writer is to read the folder again
        self._busy = False              # the writer is at work
        self._closing = False
        self._warned: set[tuple[str, int]] = set()
        self._temp_names = itertools.count()
        self._seen = (0, 0)             # the folder's mtime at the last scan, and its time
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._warn(("mkdir", e.errno or 0), f"prompt cache: cannot use {self.directory} "
                       f"({e}); nothing will be kept")
        else:
            self._scan()
        self._writer = threading.Thread(target=self._run, name="podium-prompt-cache",
                                        daemon=True)
        self._writer.start()

    # -- the boundary --------------------------------------------------------------------

    def longest(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of ``tokens`` some entry holds: whole blocks, or an
        entry's whole token list when it is a prefix; never all of ``tokens`` (the last
        token is always decoded by the engine). 0: none. In memory, no file is read; an
        entry another process wrote is seen from a call after the writer thread has read
        the folder again (this call notices that the folder changed)."""
        self._notice_changes()
        ids = _ids(tokens)
        with self._lock:
            return self._match(ids)[0]

    def load(self, tokens: Sequence[int]) -> tuple[int, bytes] | None:
        """An entry holding the longest prefix of ``tokens`` (as ``longest``): (how many
        leading tokens of ``tokens`` it holds, its state). The entry may hold more tokens
        after those: the engine keeps the first ones only. The smallest such entry the
        memory tier holds, as it is; else the smallest file, read and verified (then held in
        memory). None when there is none, when its file vanished (another process removed
        it), or when it fails a check (a warning; the file is removed). Counts a hit (of
        the tier that served it) or a miss."""
        ids = _ids(tokens)
        with self._lock:
            n, keys = self._match(ids)
            found = [self._entries[k] for k in keys]
            held = [(len(e.data), e.data, e) for e in found if e.data is not None]
            if held:
                _, data, entry = min(held, key=lambda h: h[0])
                self._memory.move_to_end(entry.key)
                self.stats["memory_hits"] += 1
                on_disk = entry.size > 0
            else:
                files = [e for e in found if e.size]
                if not files:
                    self.stats["misses"] += 1
                    return None
                entry = min(files, key=lambda e: e.size)
        if not held:
            start = time.perf_counter()
            read = self._read(entry, n, ids)
            if read is not None:
                with self._lock:
                    self.stats["read_us"] += int((time.perf_counter() - start) * 1e6)
            return read
        if on_disk:             # used: its file is not the disk tier's next to go
            self._touch(entry)
        return n, data

    def _read(self, entry: _Entry, n: int, ids: bytes) -> tuple[int, bytes] | None:
        """``load`` from ``entry``'s file: its first ``n`` token ids are ``ids``'."""
        path = self.directory / entry.name
        try:
            with open(path, "rb") as f:
                header = _read_header(f, os.fstat(f.fileno()).st_size)
                if header.fingerprint != self.fingerprint:
                    raise _Bad("another model's entry (fingerprint mismatch)")
                if header.ids[:4 * n] != ids[:4 * n]:
                    raise _Bad("its token ids are not the ones it is filed under")
                data = f.read(header.payload)
            if hashlib.sha256(data).digest() != header.digest:
                raise _Bad("payload checksum mismatch")
        except FileNotFoundError:
            self._lost(entry)
            return None
        except _Bad as bad:
            self._discard(path, entry, str(bad))
            return None
        except OSError as e:
            self._warn(("read", e.errno or 0), f"prompt cache: cannot read {path} ({e})")
            self._lost(entry)
            return None
        self._touch(entry)
        with self._lock:
            self.stats["hits"] += 1
            # not superseded or lost meanwhile, and not larger than the whole tier
            if self._entries.get(entry.key) is entry and len(data) <= self.memory_bytes:
                self._hold(entry, data)
        return n, data

    def _touch(self, entry: _Entry) -> None:
        """``entry``'s file was used now (the disk tier's LRU order, which other processes
        sharing the folder see too)."""
        now = time.time_ns()
        with contextlib.suppress(OSError):      # the LRU order only: a miss would be worse
            os.utime(self.directory / entry.name, ns=(now, now))
        entry.used = now

    def save(self, tokens: Sequence[int], data: bytes, *, keep: bool | None = None) -> bool:
        """Keep ``data``, the state of exactly ``tokens``, as it is (not copied). ``keep``:
        None, the server's policy: at least ``min_tokens`` tokens (fewer are not worth a
        write), held in memory when it fits and queued for the writer thread; True (a
        client asked to keep it): at least one block, the same tiers; False (a client asked
        for memory only): at least one block, held in memory, never written. A write is
        not queued (counted as dropped) when ``max_queued`` saves are already waiting.
        Whether the cache took it: held in memory, or queued for the writer."""
        if len(tokens) < (self.min_tokens if keep is None else self.block):
            return False
        ids = _ids(tokens)
        chain = _chain(ids, self.block) if self.memory_bytes else None
        with self._cond:
            if self._closing:
                self.stats["dropped"] += 1
                return False
            held = chain is not None and self._remember(ids, *chain, data)
            if keep is False:
                return held
            if len(self._saves) >= self.max_queued:
                self.stats["dropped"] += 1
                return held
            self._saves.append((ids, data))
            self._cond.notify_all()
            return True

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued save is written (or ``timeout`` seconds passed)."""
        with self._cond:
            self._cond.wait_for(lambda: not (self._saves or self._rescan or self._busy),
                                timeout)

    def close(self) -> None:
        """Write what is queued, then stop the writer thread and let go of the memory tier
        (its entries that are not on disk are gone); later saves are dropped."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._writer.join()
        with self._lock:
            for entry in list(self._memory.values()):
                self._release(entry)

    # -- the memory tier (under self._lock) ----------------------------------------------

    def _remember(self, ids: bytes, blocks: list[bytes], key: bytes, data: bytes) -> bool:
        """Hold ``data``, the state of the token ``ids`` (their chain ``blocks`` and
        ``key``), in the memory tier, and let go of the memory copies of the entries it
        extends; False when the tier cannot hold it."""
        entry = self._entries.get(key) or _Entry(key, len(ids) // 4, blocks, 0, 0)
        if not self._hold(entry, data):
            return False
        for prefix in self._prefixes(ids, blocks):
            self._release(prefix)
        return True

    def _hold(self, entry: _Entry, data: bytes) -> bool:
        """Put ``data``, ``entry``'s state, in the memory tier (``entry`` is added to the
        index if it is not in it), the least recently used entries out to make room; an
        entry it holds already is only marked used. False: larger than the whole tier."""
        if entry.data is not None:
            self._memory.move_to_end(entry.key)
            return True
        if len(data) > self.memory_bytes:
            if self.memory_bytes:
                self.stats["memory_too_big"] += 1
            return False
        while self.stats["memory_bytes"] + len(data) > self.memory_bytes:
            oldest = next(iter(self._memory.values()))
            self.stats["memory_evicted"] += 1
            self._release(oldest)
        if self._entries.get(entry.key) is not entry:
            self._index(entry)
        entry.data = data
        self._memory[entry.key] = entry
        self.stats["memory_entries"] += 1
        self.stats["memory_bytes"] += len(data)
        return True

    def _release(self, entry: _Entry) -> None:
        """The memory tier lets go of ``entry``'s state; an entry not on disk is gone."""
        if entry.data is None:
            return
        del self._memory[entry.key]
        self.stats["memory_entries"] -= 1
        self.stats["memory_bytes"] -= len(entry.data)
        entry.data = None
        if not entry.size:
            self._unindex(entry)

    # -- the index (under self._lock) ----------------------------------------------------

    def _match(self, ids: bytes) -> tuple[int, list[bytes]]:
        """How many leading token ids of ``ids`` the best entries hold, and their keys."""
        step = 4 * self.block
        limit = len(ids) // 4 - 1            # the last token is the engine's to decode
        view = memoryview(ids)
        depth, prev = 0, _SEED
        while (depth + 1) * self.block <= limit:
            h = _link(prev, view[depth * step:(depth + 1) * step])
            if h not in self._blocks:
                break
            depth, prev = depth + 1, h
        best = depth * self.block
        found = list(self._blocks[prev]) if depth else []
        tails: dict[int, bytes] = {}
        for key in self._ends.get(prev, ()):
            n = self._entries[key].tokens
            if n > limit:
                continue
            if n not in tails:
                tails[n] = _link(prev, view[depth * step:4 * n])
            if tails[n] == key:
                if n > best:
                    best, found = n, []
                if n == best:
                    found.append(key)
        return best, found

    def _add(self, entry: _Entry) -> None:
        """``entry``'s file is on disk: into the index, or onto the entry of the same key
        there (the memory tier may hold it)."""
        have = self._entries.get(entry.key)
        if have is None:
            self._index(entry)
            have = entry
        elif have.size:
            self.stats["entries"] -= 1
            self.stats["bytes"] -= have.size
        have.size, have.used = entry.size, entry.used
        self.stats["entries"] += 1
        self.stats["bytes"] += entry.size

    def _drop(self, entry: _Entry) -> None:
        """The entry of ``entry``'s key is no longer on disk: out of the index unless the
        memory tier holds it."""
        have = self._entries.get(entry.key)
        if have is None or not have.size:
            return
        self.stats["entries"] -= 1
        self.stats["bytes"] -= have.size
        have.size = 0
        if have.data is None:
            self._unindex(have)

    def _index(self, entry: _Entry) -> None:
        self._entries[entry.key] = entry
        for h in entry.blocks:
            self._blocks.setdefault(h, set()).add(entry.key)
        if entry.tokens % self.block:
            self._ends.setdefault(entry.blocks[-1] if entry.blocks else _SEED,
                                  set()).add(entry.key)

    def _unindex(self, entry: _Entry) -> None:
        if self._entries.get(entry.key) is not entry:
            return
        del self._entries[entry.key]
        for h in entry.blocks:
            holders = self._blocks[h]
            holders.discard(entry.key)
            if not holders:
                del self._blocks[h]
        if entry.tokens % self.block:
            end = entry.blocks[-1] if entry.blocks else _SEED
            self._ends[end].discard(entry.key)
            if not self._ends[end]:
                del self._ends[end]

    # -- failures --------------------------------------------------------------------------

    def _warn(self, kind: tuple[str, int], message: str) -> None:
        """Log ``message`` as a warning the first time this kind of failure happens (a
        read-only folder fails every save alike), later ones at debug level."""
        with self._lock:
            first = kind not in self._warned
            self._warned.add(kind)
        log.log(logging.WARNING if first else logging.DEBUG, message)

    def _lost(self, entry: _Entry) -> None:
        """``entry``'s file is gone or unreadable: out of the index, a miss."""
        with self._lock:
            self._drop(entry)
            self.stats["misses"] += 1

    def _discard(self, path: Path, entry: _Entry | None, reason: str) -> None:
        """``path`` must never be restored: a warning, and the file removed."""
        log.warning("prompt cache: dropped %s: %s", path, reason)
        with contextlib.suppress(OSError):
            path.unlink()
        with self._lock:
            if entry is not None:
                self._drop(entry)
                self.stats["misses"] += 1
            self.stats["corrupt"] += 1

    # -- the writer thread ---------------------------------------------------------------

    def _notice_changes(self) -> None:
        """Ask the writer to read the folder again when its mtime says it changed since the
        last scan (another process wrote or removed an entry)."""
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except OSError:
            return
        seen, scanned_at = self._seen
        if mtime != seen or scanned_at - seen < MTIME_SLACK_NS:
            with self._cond:
                if not (self._rescan or self._closing):
                    self._rescan = True
                    self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._saves or self._rescan or self._closing):
                    self._cond.wait()
                rescan = self._rescan and not self._closing
                self._rescan = False
                if not rescan and not self._saves:
                    self._cond.notify_all()
                    return
                job = None if rescan else self._saves.popleft()
                self._busy = True
            try:
                if job is None:
                    self._scan()
                else:
                    self._write(*job)
            except Exception:           # a bug here must not stop later saves for good
                log.exception("prompt cache: the writer failed")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _scan(self) -> None:
        """Bring the index up to the folder: read the header of each file not in it, drop
        the entries whose file is gone, remove temporary files writers left behind."""
        try:
            mtime = os.stat(self.directory).st_mtime_ns
            scanned_at = time.time_ns()
            listing = list(os.scandir(self.directory))
        except OSError as e:
            self._warn(("scan", e.errno or 0), f"prompt cache: cannot read {self.directory} "
                       f"({e})")
            return
        present = set()
        for item in listing:
            if item.name.startswith(".") and item.name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    if scanned_at - item.stat().st_mtime_ns > STALE_TEMP_NS:
                        os.unlink(item.path)
                continue
            if not item.name.endswith(SUFFIX):
                continue
            try:
                key = bytes.fromhex(item.name[:-len(SUFFIX)])
            except ValueError:
                continue
            present.add(key)
            with self._lock:
                have = self._entries.get(key)
                if have is not None and have.size:
                    continue
            entry = self._read_entry(Path(item.path), key)
            if entry is not None:
                with self._lock:
                    self._add(entry)
        with self._lock:
            for entry in [e for k, e in self._entries.items()
                          if e.size and k not in present]:
                self._drop(entry)
        self._seen = (mtime, scanned_at)

    def _read_entry(self, path: Path, key: bytes) -> _Entry | None:
        """The index entry for the file ``path`` from its header; None if it vanished, or
        if it is bad (then it is removed)."""
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                header = _read_header(f, st.st_size)
        except FileNotFoundError:
            return None
        except _Bad as bad:
            self._discard(path, None, str(bad))
            return None
        except OSError as e:
            self._warn(("read", e.errno or 0), f"prompt cache: cannot read {path} ({e})")
            return None
        if header.fingerprint != self.fingerprint:
            self._discard(path, None, "another model's entry (fingerprint mismatch)")
            return None
        blocks, own = _chain(header.ids, self.block)
        if own != key:
            self._discard(path, None, "its token ids are not the ones it is filed under")
            return None
        return _Entry(key, len(header.ids) // 4, blocks, st.st_size, st.st_mtime_ns)

    def _write(self, ids: bytes, data: bytes) -> None:
        blocks, key = _chain(ids, self.block)
        with self._lock:
            same = self._entries.get(key)
            if same is not None and not same.size:      # in memory only: written now
                same = None
        if same is not None:            # these very tokens are on disk already: used now
            now = time.time_ns()
            try:
                os.utime(self.directory / same.name, ns=(now, now))
                same.used = now
                return
            except FileNotFoundError:   # another process removed it: written again
                with self._lock:
                    self._drop(same)
            except OSError:
                return
        header = encode_header(self.fingerprint, ids, data)
        size = len(header) + len(data)
        if size > self.max_bytes:
            self._warn(("too_big", 0), f"prompt cache: a {size}-byte entry is larger than "
                       f"the cap of {self.max_bytes} bytes ({self.directory}); not kept")
            with self._lock:
                self.stats["too_big"] += 1
            return
        with self._lock:
            superseded = [e for e in self._prefixes(ids, blocks) if e.size]
        self._make_room(size - sum(e.size for e in superseded), superseded)
        path = self.directory / _name(key)
        temp = self.directory / f".{key.hex()}.{os.getpid()}.{next(self._temp_names)}.tmp"
        now, start = time.time_ns(), time.perf_counter()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)   # if someone removed it
            with open(temp, "xb") as f:
                f.write(header)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.utime(temp, ns=(now, now))
            os.replace(temp, path)
        except OSError as e:
            with contextlib.suppress(OSError):
                temp.unlink()
            self._warn(("write", e.errno or 0), f"prompt cache: cannot write {temp} ({e}); "
                       f"the prompt will be prefilled next time")
            with self._lock:
                self.stats["failed"] += 1
            return
        with self._lock:
            self._add(_Entry(key, len(ids) // 4, blocks, size, now))
            self.stats["saves"] += 1
            self.stats["write_us"] += int((time.perf_counter() - start) * 1e6)
        for entry in superseded:
            self._remove(entry)

    def _prefixes(self, ids: bytes, blocks: list[bytes]) -> list[_Entry]:
        """The entries whose token ids are a proper prefix of ``ids``: this one supersedes
        them (under self._lock)."""
        view = memoryview(ids)
        step = 4 * self.block
        found = []
        for depth, prev in enumerate([_SEED, *blocks]):
            if depth and depth * step < len(ids) and prev in self._entries:
                found.append(self._entries[prev])
            for key in self._ends.get(prev, ()):
                n = self._entries[key].tokens
                if 4 * n < len(ids) and _link(prev, view[depth * step:4 * n]) == key:
                    found.append(self._entries[key])
        return found

    def _make_room(self, size: int, leaving: list[_Entry]) -> None:
        """Evict the least recently used entries (not those ``leaving`` anyway) until
        ``size`` more bytes fit under the cap. The files' mtimes are read first: another
        process may have used an entry since."""
        with self._lock:
            if self.stats["bytes"] + size <= self.max_bytes:
                return
            keep = {e.key for e in leaving}
            candidates = [e for e in self._entries.values() if e.size and e.key not in keep]
        for entry in candidates:
            try:
                entry.used = os.stat(self.directory / entry.name).st_mtime_ns
            except OSError:
                with self._lock:
                    self._drop(entry)
        for entry in sorted(candidates, key=lambda e: e.used):
            with self._lock:
                if self.stats["bytes"] + size <= self.max_bytes:
                    return
                if not entry.size or self._entries.get(entry.key) is not entry:
                    continue
                self.stats["evicted"] += 1
            self._remove(entry)

    def _remove(self, entry: _Entry) -> None:
        path = self.directory / entry.name
        try:
            path.unlink()
        except FileNotFoundError:
            pass                        # another process removed it first
        except OSError as e:
            self._warn(("remove", e.errno or 0), f"prompt cache: cannot remove {path} ({e})")
        with self._lock:
            self._drop(entry)
