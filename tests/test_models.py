"""``podium.models.Models``: loads on demand, shared by waiters, LRU eviction within the
limits, never a busy model, failed loads reported and retried, idle unload. The engines are
stand-ins that count their loads and closes (what ``Models`` needs of an engine is that
``load`` makes it and ``aclose`` frees it); the real engines' load and unload are tested in
tests/engine."""

import asyncio
import time

import pytest

from podium.errors import InvalidRequestError, ModelNotFound
from podium.models import ModelConfig, ModelLoadFailed, Models, ModelUnavailable

MB = 2**20


class Engine:
    def __init__(self, name: str):
        self.name, self.closed = name, False

    async def aclose(self) -> None:
        self.closed = True


class Loader:
    """Loads take ``seconds``; ``fail`` names models whose next load raises."""

    def __init__(self, seconds: float = 0.05):
        self.seconds, self.fail = seconds, set[str]()
        self.loads: list[str] = []
        self.engines: list[Engine] = []

    async def __call__(self, config: ModelConfig) -> Engine:
        self.loads.append(config.name)
        await asyncio.sleep(self.seconds)
        if config.name in self.fail:
            self.fail.discard(config.name)
            raise OSError(f"cannot open {config.name}.gguf")
        engine = Engine(config.name)
        self.engines.append(engine)
        return engine


def models(loader, *configs, **limits):
    return Models(list(configs) or [ModelConfig("a"), ModelConfig("b"), ModelConfig("c")],
                  loader, **limits)


def run(coro):
    return asyncio.run(coro)


def test_a_model_loads_on_its_first_request_and_names_resolve():
    async def main():
        loader = Loader()
        m = models(loader, ModelConfig("chat", aliases=("gpt-4o",)))
        assert m.entry("chat").state == "unloaded"
        async with m.use("gpt-4o") as engine:
            assert engine.name == "chat" and m.entry("chat").state == "loaded"
        async with m.use("chat") as again:
            assert again is engine
        assert loader.loads == ["chat"]
        with pytest.raises(ModelNotFound) as e:
            async with m.use("other"):
                pass
        assert "'other'" in e.value.message and "chat" in e.value.message
    run(main())


def test_requests_arriving_during_a_load_share_it():
    async def main():
        loader = Loader(seconds=0.2)
        m = models(loader)

        async def ask():
            async with m.use("a") as engine:
                return engine
        engines = await asyncio.gather(*(ask() for _ in range(8)))
        assert loader.loads == ["a"] and all(e is engines[0] for e in engines)
    run(main())


def test_a_waiter_that_leaves_does_not_cancel_the_load():
    async def main():
        loader = Loader(seconds=0.2)
        m = models(loader)

        async def ask():
            async with m.use("a"):
                pass
        first = asyncio.ensure_future(ask())
        await asyncio.sleep(0.05)
        first.cancel()
        async with m.use("a"):
            pass
        assert loader.loads == ["a"]
    run(main())


def test_a_failed_load_tells_every_waiter_then_the_next_request_retries():
    async def main():
        loader = Loader(seconds=0.1)
        loader.fail.add("a")
        m = models(loader)

        async def ask():
            async with m.use("a"):
                return "ok"
        results = await asyncio.gather(*(ask() for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, ModelLoadFailed) for r in results)
        assert "'a'" in results[0].message and "cannot open a.gguf" in results[0].message
        assert results[0].status_code == 503
        entry = m.entry("a")
        assert entry.state == "failed" and "cannot open a.gguf" in entry.error
        assert await ask() == "ok"          # tried again
        assert loader.loads == ["a", "a"] and entry.state == "loaded" and entry.error is None
    run(main())


def test_least_recently_used_idle_model_is_evicted_for_room():
    async def main():
        loader = Loader(seconds=0.01)
        m = models(loader, max_loaded=2)
        for name in ("a", "b"):
            async with m.use(name):
                pass
        async with m.use("a"):              # a is now the most recent
            pass
        async with m.use("c"):
            pass
        states = {e.name: e.state for e in m.entries()}
        assert states == {"a": "loaded", "b": "unloaded", "c": "loaded"}
        assert loader.engines[1].name == "b" and loader.engines[1].closed
    run(main())


def test_a_busy_model_is_never_evicted_the_other_waits():
    async def main():
        loader = Loader(seconds=0.01)
        m = models(loader, max_loaded=1, load_timeout=5)
        order = []

        async def long_stream():
            async with m.use("a") as engine:
                order.append("a start")
                await asyncio.sleep(0.3)
                assert not engine.closed        # never closed under a running stream
                order.append("a end")

        async def other():
            await asyncio.sleep(0.05)
            async with m.use("b"):
                order.append("b")
        await asyncio.gather(long_stream(), other())
        assert order == ["a start", "a end", "b"]
        assert m.entry("a").state == "unloaded" and m.entry("b").state == "loaded"
    run(main())


def test_no_room_in_time_is_a_503_with_retry_after():
    async def main():
        loader = Loader(seconds=0.01)
        m = models(loader, max_loaded=1, load_timeout=0.2)
        async with m.use("a"):
            with pytest.raises(ModelUnavailable) as e:
                async with m.use("b"):
                    pass
        assert e.value.status_code == 503 and e.value.headers["retry-after"]
        assert "'b'" in e.value.message and "a" in e.value.message
        assert m.entry("b").state == "unloaded"
        async with m.use("b"):          # a is idle now: room is made
            pass
    run(main())


def test_a_model_over_the_whole_budget_is_a_400():
    async def main():
        m = models(Loader(), ModelConfig("small", estimate=100 * MB),
                   ModelConfig("huge", estimate=900 * MB), budget=500 * MB)
        with pytest.raises(InvalidRequestError) as e:
            async with m.use("huge"):
                pass
        assert e.value.param == "model" and "900 MB" in e.value.message
        async with m.use("small"):
            pass
    run(main())


def test_the_budget_counts_estimates():
    async def main():
        loader = Loader(seconds=0.01)
        m = models(loader, ModelConfig("a", estimate=300 * MB),
                   ModelConfig("b", estimate=150 * MB), ModelConfig("c", estimate=250 * MB),
                   budget=500 * MB)
        for name in ("a", "b"):
            async with m.use(name):
                pass
        async with m.use("c"):      # 300 + 150 + 250 > 500: a (least recent) goes
            pass
        assert {e.name for e in m.entries() if e.state == "loaded"} == {"b", "c"}
    run(main())


def test_a_pinned_model_loads_at_start_and_stays():
    async def main():
        loader = Loader(seconds=0.01)
        m = models(loader, ModelConfig("p", pinned=True), ModelConfig("b"), max_loaded=2,
                   load_timeout=0.1)
        await m.start()
        assert loader.loads == ["p"]
        async with m.use("b"):
            pass
        await m.unload("b")
        m.max_loaded = 1
        with pytest.raises(ModelUnavailable):   # p is idle, but never evicted for room
            async with m.use("b"):
                pass
        assert m.entry("p").state == "loaded"
    run(main())


def test_an_idle_model_is_unloaded_after_its_keep_alive_and_reloads():
    async def main():
        loader = Loader(seconds=0.01)
        m = models(loader, ModelConfig("a", keep_alive=0.1), ModelConfig("b"))
        async with m.use("a"):
            await asyncio.sleep(0.2)        # busy longer than keep_alive: not unloaded
            assert m.entry("a").state == "loaded"
        async with m.use("b"):
            pass
        await asyncio.sleep(0.3)
        assert m.entry("a").state == "unloaded" and loader.engines[0].closed
        assert m.entry("b").state == "loaded"       # no keep_alive: kept
        async with m.use("a"):
            pass
        assert loader.loads == ["a", "b", "a"] and m.entry("a").unloads == 1
    run(main())


def test_unload_waits_for_running_requests():
    async def main():
        loader = Loader(seconds=0.01)
        m = models(loader, grace=5)
        done = []

        async def stream():
            async with m.use("a") as engine:
                await asyncio.sleep(0.2)
                done.append(engine.closed)
        task = asyncio.ensure_future(stream())
        await asyncio.sleep(0.05)
        await m.unload("a")
        await task
        assert done == [False] and loader.engines[0].closed
        assert m.entry("a").state == "unloaded"
    run(main())


def test_names_must_be_unique_and_pinned_models_must_fit():
    with pytest.raises(ValueError, match="two models"):
        Models([ModelConfig("a"), ModelConfig("b", aliases=("a",))], Loader())
    with pytest.raises(ValueError, match="budget"):
        Models([ModelConfig("a", estimate=2 * MB, pinned=True)], Loader(), budget=MB)


def test_a_request_arriving_as_the_keep_alive_fires_keeps_its_model():
    async def main():
        loader = Loader(seconds=0)
        m = models(loader, ModelConfig("a", keep_alive=0.05))
        async with m.use("a"):
            pass
        entry = m.entry("a")
        assert entry._idle is not None
        entry._idle.cancel()
        m._idle_unload(entry)           # the timer fires: the unload is scheduled ...
        async with m.use("a") as engine:        # ... and a request comes before it runs
            await asyncio.sleep(0.1)
            assert entry.state == "loaded" and not engine.closed
        assert loader.loads == ["a"]
    run(main())


def test_glob_aliases_match_whole_names_in_order():
    m = models(Loader(), ModelConfig("a", aliases=("claude-*", "gpt-4o")),
               ModelConfig("b", aliases=("claude-haiku-*",)))
    assert m.entry("claude-haiku-4-5").name == "a"          # the first glob in order
    assert m.entry("gpt-4o").name == "a"
    for name in ("Claude-x", "gpt-4o-mini", "my-claude-x"):
        with pytest.raises(ModelNotFound, match="serves 'a', 'b'"):
            m.entry(name)


def test_an_engine_that_fails_to_close_does_not_take_the_others_down():
    async def main():
        loader = Loader(seconds=0)
        m = models(loader)
        async with m.use("a") as a:
            async def broken() -> None:
                raise RuntimeError("double free")
            a.aclose = broken
        async with m.use("b"):
            pass
        await m.unload("a")                     # logged, not raised
        assert m.entry("a").state == "unloaded" and m.entry("b").state == "loaded"
        async with m.use("a") as again:         # and it loads again
            assert again is not a
    run(main())


def test_a_model_loaded_for_waiting_requests_is_not_evicted_before_they_take_it():
    # (found by a simulation: on Python 3.12 and 3.13 the waiters of a fresh load resumed
    # after a competing load had already evicted it as idle, both models by turns, and no
    # request was ever served; waiting requests make a model busy)
    async def main():
        loader = Loader(seconds=0.05)
        m = models(loader, ModelConfig("a", keep_alive=300), ModelConfig("b", keep_alive=300),
                   max_loaded=1)
        served: list[str] = []

        async def ask(name):
            async with m.use(name):
                served.append(name)
                await asyncio.sleep(0.05)

        first = await m.acquire("a")
        waiting = [asyncio.create_task(ask("b")) for _ in range(4)]
        await asyncio.sleep(0.01)
        m.release(first)
        await asyncio.sleep(0.02)
        waiting.append(asyncio.create_task(ask("a")))
        done, pending = await asyncio.wait(waiting, timeout=5)
        assert not pending and sorted(served) == ["a", "b", "b", "b", "b"]
        b = m.entry("b")
        b_engine = await m.acquire("b")             # and the rule itself: a load's waiter
        m.release(b_engine)                         # keeps it from being taken for room
        b.waiters += 1
        m.load_timeout = 0.1
        with pytest.raises(ModelUnavailable):
            await m.load("a")
        assert b.state == "loaded"
        b.waiters -= 1
    run(main())


def test_a_request_arriving_during_an_unload_waits_at_most_the_load_timeout():
    """An unload gives its running request the whole grace; a new request for the model
    does not wait that long: after ``load_timeout`` it is a 503 saying why."""
    async def main():
        loader = Loader(seconds=0.01)
        m = models(loader, grace=5, load_timeout=0.3)
        release = asyncio.Event()

        async def running():
            async with m.use("a"):
                await release.wait()
        task = asyncio.ensure_future(running())
        await asyncio.sleep(0.05)
        unload = asyncio.ensure_future(m.unload("a"))
        await asyncio.sleep(0.05)
        assert m.entry("a").state == "unloading"
        started = asyncio.get_running_loop().time()
        with pytest.raises(ModelUnavailable) as caught:
            await m.acquire("a")
        waited = asyncio.get_running_loop().time() - started
        assert 0.25 < waited < 2, waited
        assert caught.value.status_code == 503 and "being unloaded" in caught.value.message
        release.set()
        await asyncio.gather(task, unload)
        async with m.use("a") as engine:         # after the unload: loaded anew
            assert engine is loader.engines[1]
    run(main())


def test_a_tenants_keep_alive_never_shortens_the_models_own():
    """Keys share models: a tenant's 0 (or '1ms') leaves an idle model to its own keep-alive,
    a longer value keeps it longer; the operator's 0 unloads it."""
    async def main():
        loader = Loader(seconds=0.01)
        m = models(loader, ModelConfig("a", keep_alive=300))
        await m.load("a")
        entry = m.entry("a")
        m.keep_alive("a", 0, tenant=True)
        m.keep_alive("a", 0.001, tenant=True)
        await asyncio.sleep(0.1)
        assert entry.state == "loaded" and entry.keep == 300
        m.keep_alive("a", 3600, tenant=True)
        assert entry.keep == 3600 and m.expires_at(entry) > time.time() + 3000
        m.keep_alive("a", 0)                     # the operator's word
        await asyncio.sleep(0.1)
        assert entry.state == "unloaded" and loader.engines[0].closed
    run(main())
