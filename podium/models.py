"""The models a server serves: loaded on demand, unloaded when idle, within a memory budget.

``Models`` holds one ``Entry`` per configured model and decides when each is loaded and
unloaded; it knows a model only as what ``load`` returns and its ``aclose`` frees.

- **On demand.** ``use(name)`` (an async context manager) gives the model's engine, loading
  it first when needed. Every request that arrives while a model loads waits for that one
  load. A failed load answers each of them with ``ModelLoadFailed`` (naming the model and
  the cause), leaves the model ``failed`` with the cause, and the next request tries again.
- **A budget, never a busy model.** Before a load, idle models are unloaded, least recently
  used first, until the new one fits both ``max_loaded`` and ``budget`` (bytes, against each
  model's ``estimate``). A model with a request inside ``use`` is busy and never unloaded. If
  it still cannot fit, the load waits up to ``load_timeout`` for models to go idle, then
  raises ``ModelUnavailable`` (503, Retry-After); a model whose estimate is over the whole
  budget is refused at once (400).
- **Idle unload.** A model unused for its ``keep_alive`` seconds is unloaded (None: kept).
  A request may set it for its model (``keep_alive``, Ollama's per-request value): the last
  one given counts from the moment the model next goes idle, until the model unloads; 0
  unloads it as soon as no request holds it. A pinned model has no idle deadline: only a 0
  (an explicit unload, like ``unload``) changes anything for it. A tenant's value (a
  request whose key is not the operator's) is a hint that may keep a model longer, never
  let it go sooner than its own keep-alive: its 0 unloads nothing. ``expires_at`` says
  when an idle model is due to go.
- **Unload** (``unload``, idle or eviction) stops admitting the model's requests, waits for
  those inside to finish (up to ``grace`` seconds), then closes its engine: requests still
  running then end with ``ModelUnloaded`` in their API's shape (``generation.cut_short``),
  never a silent cut. Requests arriving meanwhile wait for the unload to end, then load the
  model afresh; the wait is bounded by ``load_timeout`` (then 503 ``model_unavailable``).

Each load and unload is one log line with its reason. A load's progress (``Entry.progress``,
0..1) is what its loader reports through ``LOAD_PROGRESS`` while it runs, where the loader
can tell (llama.cpp's model load can; vLLM's cannot: None).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import math
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Literal, Protocol

from podium import telemetry
from podium.errors import InvalidRequestError, ModelNotFound, PodiumError

log = logging.getLogger(__name__)

State = Literal["unloaded", "loading", "loaded", "unloading", "failed"]

# Where the load under way reports how far it is (a fraction, 0..1), from whichever thread
# runs it: set around each load (asyncio.to_thread carries it into the loader's thread), so
# a loader that knows its progress reports it without every loader's signature taking it.
LOAD_PROGRESS: ContextVar[Callable[[float], None] | None] = ContextVar("podium_load_progress",
                                                                       default=None)


class ModelUnavailable(PodiumError):
    """The model cannot be loaded now: no room frees up in time (503, Retry-After)."""

    status_code = 503
    default_code = "model_unavailable"

    def __init__(self, message: str, *, retry_after: int = 5):
        super().__init__(message, headers={"retry-after": str(retry_after)})


class ModelLoadFailed(PodiumError):
    """The model's load failed (503): the message names the model and the cause; the next
    request tries again."""

    status_code = 503
    default_code = "model_load_failed"


class Loaded(Protocol):
    """What a load makes (the server's ``Served``: an engine and what speaks to it)."""

    async def aclose(self) -> None: ...


@dataclass
class ModelConfig:
    name: str
    aliases: tuple[str, ...] = ()       # other names, or globs ('claude-*'), it answers to
    estimate: int = 0                   # bytes it will hold once loaded (0: unknown)
    keep_alive: float | None = None     # idle seconds before it is unloaded (None: never)
    pinned: bool = False                # loaded at start, never unloaded for room
    preload: bool = False               # loaded at start
    kind: str = "chat"
    source: Any = None                  # what the loader loads (the model's own settings)
    error: str | None = None            # why its file cannot be read (catalog): it starts
                                        # failed with this cause; a request still tries it


@dataclass(eq=False)
class Entry:
    config: ModelConfig
    state: State = "unloaded"
    engine: Any = None                  # what the load made (a Loaded), while loaded
    error: str | None = None            # why its last load failed
    active: int = 0                     # requests holding it (acquire .. release)
    waiters: int = 0                    # requests waiting for its load: busy too
    last_used: float = 0.0
    loads: int = 0
    unloads: int = 0
    load_seconds: float = 0.0
    resident: int | None = None         # memory measured across its last load (bytes)
    keep: float | None = None           # a request's keep-alive (seconds; inf: no idle
                                        # unload; 0: unload once idle) until it unloads
    deadline: float | None = None       # wall-clock time its idle unload is due
    progress: float | None = None       # how far its load under way is (0..1; None: unknown)
    _loading: asyncio.Future | None = field(default=None, repr=False)
    _idle: asyncio.Handle | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.config.name


class Models:
    def __init__(self, configs: list[ModelConfig], load: Callable[[ModelConfig],
                                                                 Awaitable[Any]], *,
                 max_loaded: int = 0, budget: int = 0, load_timeout: float = 60.0,
                 grace: float = 30.0,
                 estimate: Callable[[ModelConfig], Awaitable[int]] | None = None):
        """``load`` makes a model's engine (loaded, a ``Loaded``); ``estimate``, when given,
        estimates a model whose estimate is still unknown before its load makes room;
        ``max_loaded`` / ``budget``: 0 is no limit."""
        self._entries = {c.name: Entry(c, "failed" if c.error else "unloaded", error=c.error)
                         for c in configs}
        self._names: dict[str, Entry] = {}
        self._globs: list[tuple[str, Entry]] = []
        for entry in self._entries.values():
            for name in (entry.name, *entry.config.aliases):
                if name in self._names:
                    raise ValueError(f"two models are called {name!r}")
                if name != entry.name and any(c in name for c in "*?["):
                    self._globs.append((name, entry))
                else:
                    self._names[name] = entry
        self._load = load
        self._estimate = estimate
        self.max_loaded, self.budget = max_loaded, budget
        self.load_timeout, self.grace = load_timeout, grace
        self._changed = asyncio.Condition()     # a model went idle, or was unloaded
        self._deciding = asyncio.Lock()
        self._waiting = 0                       # loads waiting for room
        for entry in self._entries.values():
            if budget and entry.config.estimate > budget:
                if entry.config.pinned:
                    raise ValueError(f"model {entry.name!r} needs about "
                                     f"{entry.config.estimate} bytes, more than the whole "
                                     f"budget of {budget}")

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def entry(self, name: str) -> Entry:
        """The model called ``name`` (or an alias of it, or matching an alias glob, the first
        in order); 404 ``model_not_found``."""
        entry = self._names.get(name)
        if entry is None and name.endswith(":latest"):     # Ollama's default tag: 'm:latest'
            entry = self._names.get(name[:-len(":latest")])     # is 'm'
        if entry is None:
            entry = next((e for pattern, e in self._globs
                          if fnmatch.fnmatchcase(name, pattern)), None)
        if entry is None:
            served = ", ".join(repr(n) for n in sorted(self._entries))
            raise ModelNotFound(f"The model '{name}' does not exist; this server serves "
                                f"{served}", param="model")
        return entry

    def adopt(self, name: str, loaded: Any, seconds: float = 0.0) -> None:
        """``loaded`` is the model called ``name``, loaded already (at start, before the
        server's loop runs)."""
        entry = self._entries[name]
        entry.engine, entry.state, entry.error = loaded, "loaded", None
        entry.loads += 1
        entry.load_seconds += seconds
        entry.last_used = time.monotonic()

    async def start(self) -> None:
        """Load the pinned and preloaded models not adopted yet (a failure stops the
        start); start the idle timers of those adopted."""
        for entry in self._entries.values():
            if entry.state == "loaded":
                self._went_idle(entry)
            elif entry.config.pinned or entry.config.preload:
                await self._ensure(entry, "pinned" if entry.config.pinned else "preload")

    @contextlib.asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[Any]:
        """The model's engine for one request, loaded if needed; busy until the block ends."""
        entry = await self.acquire(name)
        try:
            yield entry.engine
        finally:
            self.release(entry)

    async def acquire(self, name: str) -> Entry:
        """The entry of the model ``name`` names, loaded (``entry.engine``) and busy until
        ``release``: loaded first when needed, waiting for a load under way."""
        entry = self.entry(name)
        record = telemetry.current()
        if record is not None:
            record.model = name
        if entry.state == "loaded" and entry._idle is None:    # the common case, at once
            entry.active += 1
            return entry
        if self.budget and entry.config.estimate > self.budget:
            raise InvalidRequestError(
                f"The model '{entry.name}' needs about {_mb(entry.config.estimate)} MB, more "
                f"than this server's whole memory budget ({_mb(self.budget)} MB)",
                param="model")
        entry.waiters += 1      # busy from now: a model just loaded for it is not evicted
        try:                    # before this request has taken it
            while True:
                engine = await self._ensure(entry, "request")
                if entry.state == "loaded" and entry.engine is engine:
                    break           # (else it was unloaded between the load and now)
        except BaseException:
            entry.waiters -= 1
            if entry.waiters == 0 and entry.active == 0 and entry.state == "loaded":
                self._went_idle(entry)          # the last waiter left: idle after all
            raise
        entry.waiters -= 1
        entry.active += 1
        self._stop_idle(entry)
        return entry

    def hold(self, entry: Entry) -> Callable[[], None]:
        """One more user of a model already held (a background response outliving its
        request): busy until the returned release is called."""
        entry.active += 1
        return lambda: self.release(entry)

    def release(self, entry: Entry) -> None:
        entry.active -= 1
        entry.last_used = time.monotonic()
        if entry.active == 0 and entry.waiters == 0:
            self._went_idle(entry)

    async def load(self, name: str) -> None:
        await self._ensure(self.entry(name), "asked")

    def keep_alive(self, name: str, seconds: float, *, tenant: bool = False) -> None:
        """A request's keep-alive for the model ``name``: once no request holds it, it is
        unloaded after ``seconds`` (``math.inf``: kept; 0: at once), counted from then (from
        now if it is idle already); it holds until the model unloads. A pinned model keeps
        no idle deadline: only 0 counts for it. A ``tenant``'s (not the operator's) is at
        least the model's own keep-alive: other keys' requests share the model, so a tenant
        may keep it longer, never make it go sooner (its 0 is the model's own)."""
        entry = self.entry(name)
        if tenant:
            own = entry.config.keep_alive
            seconds = max(seconds, math.inf if own is None else own)
        if entry.config.pinned and seconds != 0:
            return
        entry.keep = seconds
        if entry.state == "loaded" and entry.active == 0 and entry.waiters == 0:
            self._stop_idle(entry)
            self._went_idle(entry)

    async def unload_when_idle(self, name: str) -> None:
        """Unload the model ``name`` now if no request holds it (waiting for the unload),
        else as soon as the last one ends (a keep-alive of 0)."""
        entry = self.entry(name)
        entry.keep = 0
        if entry.state == "loaded" and entry.active == 0 and entry.waiters == 0:
            await self._unload(entry, "keep-alive 0")

    def expires_at(self, entry: Entry) -> float | None:
        """When the loaded ``entry`` will be unloaded for idleness if no request takes it
        (seconds since the epoch; for a busy model, counted from now), None: never."""
        if entry._idle is not None:
            return entry.deadline
        keep = self._idle_seconds(entry)
        return None if keep is None else time.time() + keep

    async def unload(self, name: str, reason: str = "asked") -> None:
        entry = self.entry(name)
        if entry.state in ("loaded", "failed"):
            await self._unload(entry, reason)

    async def aclose(self) -> None:
        for entry in self._entries.values():
            if entry.state == "loaded":
                await self._unload(entry, "shutdown")

    # -- loading --------------------------------------------------------------------------

    async def _ensure(self, entry: Entry, reason: str) -> Any:
        if entry.state == "unloading":          # let it go first, then load it afresh
            await self._unloaded(entry)
        if entry.state == "loaded":
            return entry.engine
        if entry._loading is None:
            entry._loading = asyncio.ensure_future(self._do_load(entry, reason))
        # every waiter shares the one load; one waiter leaving does not cancel it
        return await asyncio.shield(entry._loading)

    async def _unloaded(self, entry: Entry) -> None:
        """Wait for the unload under way to end (its running requests have up to ``grace``
        seconds), up to ``load_timeout``: then 503 ``model_unavailable``, not a wait as
        long as the grace period and the engine's close."""
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(
                    lambda: entry.state != "unloading"), self.load_timeout)
        except asyncio.TimeoutError:
            raise ModelUnavailable(
                f"The model '{entry.name}' is being unloaded (its running requests have up "
                f"to {self.grace:g} s to finish) and was not unloaded within the load "
                f"timeout ({self.load_timeout:g} s); send the request again to load it "
                f"anew") from None

    async def _do_load(self, entry: Entry, reason: str) -> Any:
        try:
            try:
                if not entry.config.estimate and self._estimate is not None:
                    entry.config.estimate = await self._estimate(entry.config)
                async with self._deciding:      # one load makes its room at a time, in turn
                    await self._make_room(entry)
                    entry.state, entry.error = "loading", None
                started = time.monotonic()
                reporting = LOAD_PROGRESS.set(lambda done: setattr(entry, "progress", done))
                try:
                    engine = await self._load(entry.config)
                finally:
                    LOAD_PROGRESS.reset(reporting)
            except ModelUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - said to every waiter, and kept
                cause = getattr(exc, "message", None) or str(exc)
                entry.state, entry.error = "failed", f"{type(exc).__name__}: {cause}"
                log.error("model %s: load failed (%s): %s", entry.name, reason, entry.error)
                raise ModelLoadFailed(f"The model '{entry.name}' could not be loaded: "
                                      f"{entry.error}") from exc
            entry.engine, entry.state = engine, "loaded"
            entry.loads += 1
            entry.load_seconds += time.monotonic() - started
            entry.last_used = time.monotonic()
            log.info("model %s: loaded (%s) in %.2f s", entry.name, reason,
                     time.monotonic() - started)
            if entry.active == 0 and entry.waiters == 0:
                self._went_idle(entry)
            return engine
        finally:
            entry._loading, entry.progress = None, None

    def _loaded(self) -> list[Entry]:
        return [e for e in self._entries.values() if e.state in ("loaded", "loading")]

    def _fits(self, entry: Entry) -> bool:
        others = [e for e in self._loaded() if e is not entry]
        if self.max_loaded and len(others) + 1 > self.max_loaded:
            return False
        used = sum(e.config.estimate for e in others)
        return not self.budget or used + entry.config.estimate <= self.budget

    async def _make_room(self, entry: Entry) -> None:
        """Unload idle models, least recently used first, until ``entry`` fits; wait (up to
        ``load_timeout``) for busy ones to go idle; 503 if it still does not fit."""
        deadline = time.monotonic() + self.load_timeout
        while not self._fits(entry):
            idle = sorted((e for e in self._loaded() if e is not entry and e.active == 0
                           and e.waiters == 0 and e.state == "loaded"
                           and not e.config.pinned),
                          key=lambda e: e.last_used)
            if idle:
                await self._unload(idle[0], f"room for {entry.name}")
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                busy = ", ".join(e.name for e in self._loaded() if e is not entry)
                raise ModelUnavailable(
                    f"The model '{entry.name}' cannot be loaded now: the models loaded "
                    f"({busy}) are busy and there is no room for another (max loaded "
                    f"models {self.max_loaded or 'unlimited'}, memory budget "
                    f"{_mb(self.budget) if self.budget else 'unlimited'} MB)")
            self._waiting += 1
            try:
                async with self._changed:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), left)
            finally:
                self._waiting -= 1

    # -- unloading ------------------------------------------------------------------------

    def _idle_seconds(self, entry: Entry) -> float | None:
        """How long the model stays loaded once idle (None: no idle unload)."""
        keep = entry.keep
        if keep is None:
            keep = None if entry.config.pinned else entry.config.keep_alive
        return None if keep is None or math.isinf(keep) else keep

    def _went_idle(self, entry: Entry) -> None:
        if self._waiting:               # a load waits for room: tell it (a task, as this
            asyncio.ensure_future(self._notify())   # is a plain call)
        keep = self._idle_seconds(entry)
        if keep is None or entry.state != "loaded":
            return
        loop = asyncio.get_running_loop()
        reason = "keep-alive 0" if keep == 0 else "idle"
        # a handle even for 0 (call_soon): acquire's fast path skips a model that has one
        entry._idle = (loop.call_soon(self._idle_unload, entry, reason) if keep == 0
                       else loop.call_later(keep, self._idle_unload, entry, reason))
        entry.deadline = time.time() + keep

    def _stop_idle(self, entry: Entry) -> None:
        if entry._idle is not None:
            entry._idle.cancel()
            entry._idle = None
        entry.deadline = None

    def _idle_unload(self, entry: Entry, reason: str = "idle") -> None:
        entry._idle = None
        if entry.active == 0 and entry.state == "loaded":
            asyncio.ensure_future(self._unload_idle(entry, reason))

    async def _unload_idle(self, entry: Entry, reason: str = "idle") -> None:
        # asked again when the task runs: a request may have taken the model since
        if (entry.active == 0 and entry.waiters == 0 and entry.state == "loaded"
                and entry._idle is None):
            await self._unload(entry, reason)

    async def _unload(self, entry: Entry, reason: str) -> None:
        self._stop_idle(entry)
        entry.keep = None               # the next load starts from the model's own
        engine, entry.engine = entry.engine, None
        entry.state = "unloading"
        try:
            deadline = time.monotonic() + self.grace
            while entry.active and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if engine is not None:
                await engine.aclose()
        except Exception:  # noqa: BLE001 - one model's failed close is its own: logged
            log.exception("model %s: its engine failed to close (%s)", entry.name, reason)
        finally:
            entry.state, entry.error = "unloaded", None
            entry.unloads += 1
            log.info("model %s: unloaded (%s)", entry.name, reason)
            await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def _mb(size: int) -> int:
    return round(size / 2**20)
