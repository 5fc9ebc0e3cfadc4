"""Which objects keep pymalloc arenas alive after a burst (a diagnostic, CPython 3.11 x86-64).

    python bench/scripted_server.py --census ...     (bench/load.py --census drives it)

In the server process, SIGUSR1 notes the arenas in use (the baseline); SIGUSR2 then prints,
to stderr, every live block of every pool in an arena that did not exist at baseline: its
size class and, when it is a Python object, its type, a short repr and what refers to it.

How: pymalloc carves 1 MiB arenas into 16 KiB pools; each pool starts with a header
(``struct pool_header`` in Objects/obmalloc.c: count, freeblock, next/prev pool, arena index,
size class, next offset, max next offset). Every 16 KiB-aligned address of the process's
anonymous writable mappings is read as such a header and kept when its fields agree with
each other (``maxnextoffset == POOL_SIZE - block size`` and so on). A pool's live blocks are
those below ``nextoffset`` that are not on its free list. It reads private structures of one
CPython build, which is why it is a benchmark tool and not part of Podium.
"""

from __future__ import annotations

import ctypes
import gc
import signal
import sys
import tracemalloc
from array import array
from collections import Counter

POOL_SIZE = 16 * 1024
HEADER = 48
ALIGN = 16


class _PoolHeader(ctypes.Structure):
    _fields_ = [("count", ctypes.c_uint), ("_pad", ctypes.c_uint),
                ("freeblock", ctypes.c_void_p), ("nextpool", ctypes.c_void_p),
                ("prevpool", ctypes.c_void_p), ("arenaindex", ctypes.c_uint),
                ("szidx", ctypes.c_uint), ("nextoffset", ctypes.c_uint),
                ("maxnextoffset", ctypes.c_uint)]


def _smaps() -> list[tuple[int, int, str, bool, int]]:
    """Each mapping of this process: start, end, kind ("heap": glibc's brk heap, "anon":
    pymalloc arenas, large allocations, thread stacks; "file"), writable, resident KB."""
    out = []
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                kind = "anon" if len(head) == 5 else "heap" if head[-1] == "[heap]" else "file"
                mapping = [lo, hi, kind, head[1].startswith("rw"), 0]
                out.append(mapping)
            elif head[0] == "Rss:":
                mapping[4] = int(head[1])
    return [tuple(m) for m in out]


def _regions() -> list[tuple[int, int]]:
    """The writable anonymous and heap mappings, where pymalloc's arenas can be."""
    return [(lo, hi) for lo, hi, kind, writable, _ in _smaps() if kind != "file" and writable]


def pools() -> array:
    """Address, arena index and size class of every pool in use, three numbers a pool, as far
    as the headers can be told apart (an array, so that the census makes few objects of its
    own in the pools it counts)."""
    found = array("Q")
    for lo, hi in _regions():
        addr = (lo + POOL_SIZE - 1) // POOL_SIZE * POOL_SIZE
        while addr + POOL_SIZE <= hi:
            h = _PoolHeader.from_address(addr)
            size = (h.szidx + 1) * ALIGN
            if (h.szidx < 32 and h.maxnextoffset == POOL_SIZE - size
                    and 0 < h.count <= (POOL_SIZE - HEADER) // size
                    and HEADER <= h.nextoffset <= POOL_SIZE and h.arenaindex < 1 << 16):
                found.extend((addr, h.arenaindex, h.szidx))
            addr += POOL_SIZE
    return found


def _live_blocks(addr: int) -> array:
    h = _PoolHeader.from_address(addr)
    size = (h.szidx + 1) * ALIGN
    free, p = set(), h.freeblock
    while p and len(free) < 2048:
        free.add(p)
        p = ctypes.c_void_p.from_address(p).value
    return array("Q", (b for b in range(addr + HEADER, addr + h.nextoffset, size)
                       if b not in free))


def _all_types() -> dict[int, type]:
    seen: dict[int, type] = {}
    stack = [object, type]
    stack += [type(o) for o in gc.get_objects()]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen[id(t)] = t
        try:
            stack += type.__subclasses__(t)
        except TypeError:
            pass
    return seen


def _object_at(block: int, types: dict[int, type]):
    """The Python object starting in ``block`` (after a GC header or not), if it is one."""
    for offset in (0, 16):
        addr = block + offset
        t = types.get(ctypes.c_void_p.from_address(addr + 8).value or 0)
        refs = ctypes.c_ssize_t.from_address(addr).value
        if t is not None and 0 < refs < 1 << 32:
            return ctypes.cast(addr, ctypes.py_object).value
    return None


def resident() -> str:
    """Resident memory by kind of mapping."""
    sizes: Counter[str] = Counter()
    for _, _, kind, _, kb in _smaps():
        sizes[kind] += kb
    return ", ".join(f"{k} {v / 1024:.1f} MB" for k, v in sorted(sizes.items()))


def mappings() -> dict[tuple[int, int], int]:
    """Resident KB of each anonymous or heap mapping, by (start, end)."""
    return {(lo, hi): kb for lo, hi, kind, _, kb in _smaps() if kind != "file"}


class Census:
    def __init__(self) -> None:
        self.baseline: dict[int, tuple[int, int]] = {}
        self.maps: dict[tuple[int, int], int] = {}

    def arenas(self) -> dict[int, tuple[int, int]]:
        span: dict[int, tuple[int, int]] = {}
        found = pools()
        for i in range(0, len(found), 3):
            addr, arena = found[i], found[i + 1]
            lo, hi = span.get(arena, (addr, addr))
            span[arena] = (min(lo, addr), max(hi, addr))
        return span

    def note_baseline(self, *_: object) -> None:
        gc.collect()
        self.baseline = self.arenas()
        self.maps = mappings()
        print(f"census: baseline {len(self.baseline)} arenas; resident: {resident()}",
              file=sys.stderr)

    def report(self, *_: object) -> None:
        gc.collect()
        print(f"census: resident: {resident()}", file=sys.stderr)
        types = _all_types()                 # made first: its own ints are told apart below
        found = pools()
        outside = array("Q")
        for i in range(0, len(found), 3):
            addr, arena = found[i], found[i + 1]
            lo, hi = self.baseline.get(arena, (addr - (1 << 21), addr - (1 << 21)))
            if max(hi, addr) - min(lo, addr) >= 1 << 20:     # not in the baseline's arena
                outside.extend(found[i:i + 3])
        arenas = {outside[i + 1] for i in range(0, len(outside), 3)}
        kinds: Counter[str] = Counter()
        by_arena: dict[int, Counter[str]] = {}
        lines = []
        for i in range(0, len(outside), 3):
            addr, arena, szidx = outside[i:i + 3]
            for block in _live_blocks(addr):
                obj = _object_at(block, types)
                if type(obj) is int and obj in types:   # a key of the census's own table
                    continue
                kind = f"{(szidx + 1) * ALIGN} B " + (type(obj).__name__ if obj is not None
                                                      else "raw")
                if obj is not None and len(lines) < 60:
                    owners = gc.get_referrers(obj)
                    lines.append(f"  arena {arena:>3} {kind}: {_short(obj)} <- "
                                 f"{[_short(o, 60) for o in owners[:3]]}{_made_at(obj)}")
                    del owners
                kinds[kind] += 1
                by_arena.setdefault(arena, Counter())[kind] += 1
                del obj
        print(f"census: {len(outside) // 3} pools in {len(arenas)} arenas new since baseline; "
              f"live blocks by size and kind: {dict(kinds.most_common(30))}", file=sys.stderr)
        for arena, counts in sorted(by_arena.items()):
            print(f"  arena {arena}: {dict(counts.most_common(8))}", file=sys.stderr)
        print("\n".join(lines), file=sys.stderr, flush=True)
        grown = []
        for (lo, hi), kb in mappings().items():
            before = sum(v for (a, b), v in self.maps.items() if a < hi and b > lo)
            if kb - before >= 64:
                pools_in = sum(1 for i in range(0, len(found), 3) if lo <= found[i] < hi)
                grown.append(f"  {hi - lo >> 10} KB mapping: resident {before} -> {kb} KB, "
                             f"{pools_in} pools in use")
        print("census: mappings grown since baseline:\n" + "\n".join(grown), file=sys.stderr)
        print("census: done", file=sys.stderr, flush=True)


def _made_at(obj: object) -> str:
    """Where the object was allocated, when tracemalloc runs (PYTHONTRACEMALLOC=N)."""
    trace = tracemalloc.get_object_traceback(obj) if tracemalloc.is_tracing() else None
    return "".join(f"\n      {f.filename}:{f.lineno}" for f in trace) if trace else ""


def _short(obj: object, n: int = 100) -> str:
    try:
        text = f"{type(obj).__name__} {obj!r}"
    except Exception:  # noqa: BLE001 - a half-built object
        text = type(obj).__name__
    return text[:n]


def install() -> Census:
    census = Census()
    signal.signal(signal.SIGUSR1, census.note_baseline)
    signal.signal(signal.SIGUSR2, census.report)
    return census
