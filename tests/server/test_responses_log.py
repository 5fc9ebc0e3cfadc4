"""The Responses service's last writes: tracked until done, drained at shutdown."""

from __future__ import annotations

import asyncio
import gc

from podium.api.responses.log import Finalizers
from podium.errors import StoreUnavailable


def test_finalizers_are_kept_until_done_and_drained():
    async def main():
        finalizers = Finalizers()
        done = []

        async def write(n, delay):
            await asyncio.sleep(delay)
            done.append(n)
            if n == 1:      # a last write may start another one; drain waits for it too
                finalizers.spawn(write(3, 0.05))

        finalizers.spawn(write(1, 0.05))
        finalizers.spawn(write(2, 0.1))
        gc.collect()        # nobody else holds the tasks: they must not be lost
        assert len(finalizers) == 2
        await finalizers.drain()
        assert sorted(done) == [1, 2, 3] and len(finalizers) == 0
    asyncio.run(main())


def test_a_store_failure_in_a_last_write_is_logged_not_raised(caplog):
    async def main():
        finalizers = Finalizers()

        async def write():
            raise StoreUnavailable("disk full")

        finalizers.spawn(write())
        await finalizers.drain()
    asyncio.run(main())
    assert "could not be finished: disk full" in caplog.text


def test_a_cancel_heard_again_does_not_cut_the_last_writes_short():
    """A cancel request stays on the stored row until the response ends, and each lease
    renewal hears it again (``_cancel_here``): the second must not cancel the background
    task again while it writes its end, or the response is never stored as cancelled (its
    lease lapses and another pass fails it)."""
    import asyncio

    from podium.api.responses.service import ResponsesService

    async def main():
        service = ResponsesService.__new__(ResponsesService)
        wrote = asyncio.Event()
        release = asyncio.Event()

        async def background():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                await release.wait()        # the last writes, under way
                wrote.set()
                raise

        task = asyncio.ensure_future(background())
        service._running = {"resp_1": task}
        await asyncio.sleep(0)
        service._cancel_here("resp_1")
        await asyncio.sleep(0.01)
        service._cancel_here("resp_1")      # heard again at the next renewal
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(task, return_exceptions=True)
        return wrote.is_set()

    assert asyncio.run(main())
