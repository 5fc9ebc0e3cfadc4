"""The server process: quiet while idle, memory given back after traffic, stops from any
thread."""

import asyncio
import email.utils
import gc
import socket
import threading
import time

import httpx
import pytest
import uvicorn

import podium.server.lifecycle as lifecycle
from podium.server.app import create_app
from podium.server.memory import FreeListReserve
from podium.settings import Settings
from tests.conftest import SERVED


class CountingServer(lifecycle.Server):
    """Podium's server, counting uvicorn's ticks."""

    ticks = 0

    async def on_tick(self, counter: int) -> bool:
        self.ticks += 1
        return await super().on_tick(counter)


def wait_for(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def served(scripted, tmp_path, monkeypatch):
    """Podium's Server in a thread on a scripted engine (a reply paced over ~0.6 s), with
    every return of memory counted."""
    returns = []
    real = lifecycle.give_back_memory

    async def counted(*args):
        await real(*args)
        returns.append(time.monotonic())

    monkeypatch.setattr(lifecycle, "give_back_memory", counted)
    app = create_app(Settings(store_url=f"sqlite:///{tmp_path / 'life.db'}"),
                     scripted(["one two three four five six seven eight nine ten eleven "
                               "twelve"], delay=0.05))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = CountingServer(uvicorn.Config(app, port=port, log_level="warning"),
                            app.state.drain, grace=1, settle=0.2)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_for(lambda: server.started)
    yield server, f"http://127.0.0.1:{port}", returns, thread
    server.should_exit = True
    thread.join(10)


def fetch(url: str, path: str) -> httpx.Response:
    with httpx.Client(base_url=url) as client:          # the connection closes after
        return client.get(path)


def test_idle_server_sleeps_until_a_connection_and_gives_memory_back(served):
    server, url, returns, _ = served
    assert fetch(url, "/health").status_code == 200
    assert wait_for(lambda: len(returns) == 1)          # once, `settle` after the traffic
    ticks = server.ticks
    time.sleep(2.5)
    assert server.ticks == ticks                        # uvicorn alone ticks 10 times a second
    assert len(returns) == 1                            # and nothing more to give back

    # the first connection after an idle spell is answered with a fresh Date header
    r = fetch(url, "/health")
    date = email.utils.parsedate_to_datetime(r.headers["date"]).timestamp()
    assert abs(date - time.time()) <= 1.5
    assert wait_for(lambda: len(returns) == 2)


def test_ticks_while_a_connection_is_open(served):
    server, url, returns, _ = served
    ticks = server.ticks
    with httpx.Client(base_url=url) as client:
        r = client.post("/v1/chat/completions", json={
            "model": SERVED, "stream": True, "messages": [{"role": "user", "content": "go"}]})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    closed = time.monotonic()
    assert server.ticks - ticks >= 4                    # the stream took about 0.6 s
    assert wait_for(lambda: returns)
    assert returns[0] - closed >= 0.15                  # only `settle` (0.2 s) after it closed


def test_stop_from_another_thread_wakes_an_idle_server(served):
    server, url, returns, thread = served
    fetch(url, "/health")
    assert wait_for(lambda: len(returns) == 1)
    started = time.monotonic()
    server.should_exit = True
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - started < 3


def _burst(loop) -> None:
    """Leave every free list full of objects freed at the end of a burst."""
    handles = [loop.call_soon(int) for _ in range(2000)]
    timers = [loop.call_later(100, int) for _ in range(2000)]
    futures = [loop.create_future() for _ in range(2000)]
    iterators = [f.__await__() for f in futures]
    for timer in timers:
        timer.cancel()
    del handles, timers, futures, iterators


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_free_list_reserve_swaps_start_up_objects_in(loop_name):
    """After a burst, the reserve ends up holding the very objects it made at start-up (the
    burst's kept objects were let go), and swapping leaks nothing."""

    def handles() -> int:
        gc.collect()
        return sum(type(o).__name__ in ("Handle", "TimerHandle") for o in gc.get_objects())

    async def scenario():
        loop = asyncio.get_running_loop()
        reserve = FreeListReserve()
        start_up = [set(map(id, held)) for held in reserve._held]
        counts = []
        for _ in range(3):
            _burst(loop)
            await asyncio.sleep(0.05)
            await reserve.swap()
            counts.append(handles())
        kept = [len(set(map(id, held)) & ids) for held, ids in zip(reserve._held, start_up)]
        fired = loop.create_future()
        loop.call_later(0.01, fired.set_result, True)   # the loop still runs timers
        assert await fired
        return [len(ids) for ids in start_up], kept, counts, len(asyncio.all_tasks())

    if loop_name == "uvloop":
        import uvloop
        sizes, kept, counts, tasks = uvloop.run(scenario())
        assert sizes == [255, 250, 250]    # future iterators, handles, timer handles
    else:
        sizes, kept, counts, tasks = asyncio.run(scenario())
        assert sizes == [255]              # asyncio's own handles keep no free list
    # the loop may borrow a handle or two while the reserve is in the free list
    assert all(k >= size - 2 for k, size in zip(kept, sizes)), kept
    assert counts[-1] <= counts[0] and tasks == 1
