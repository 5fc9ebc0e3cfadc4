"""The reading side every threaded engine shares (``podium.engine.jobs``): outputs in order up
to the finish reason, the worker's errors mapped once, and the end told to the engine once,
early or not. The engines themselves are held to the same in ``test_contract.py``."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from podium.engine.base import EngineOutput, EngineRequest, SamplingParams
from podium.engine.jobs import Job, JobOutputs
from podium.errors import EngineError, InvalidRequestError


class Outputs(JobOutputs[Job]):
    def __init__(self, job: Job, ends: list[bool]):
        super().__init__(job)
        self.ends = ends

    def _over(self, early: bool) -> None:
        self.ends.append(early)


def job() -> Job:
    return Job(EngineRequest("r", [1, 2], SamplingParams()), asyncio.get_running_loop(),
               asyncio.Queue())


def test_outputs_come_in_order_from_another_thread_and_end_on_the_finish_reason():
    async def scenario():
        ends: list[bool] = []
        j = job()
        outputs = Outputs(j, ends)

        def worker():
            for t in range(3):
                j.emit(EngineOutput([t]))
            j.emit(EngineOutput([3], finish_reason="stop"))
            j.emit(EngineOutput([4]))                       # after the last: never read

        threading.Thread(target=worker).start()
        seen = [out async for out in outputs]
        return seen, ends

    seen, ends = asyncio.run(scenario())
    assert [o.token_ids for o in seen] == [[0], [1], [2], [3]]
    assert seen[-1].finish_reason == "stop"
    assert ends == [False]                                  # ended once, not early


@pytest.mark.parametrize("error", [InvalidRequestError("bad grammar", param="grammar"),
                                   RuntimeError("llama_decode returned 1")])
def test_an_error_ends_the_outputs_raised_as_itself_or_as_an_engine_error(error):
    async def scenario():
        ends: list[bool] = []
        j = job()
        outputs = Outputs(j, ends)
        j.emit(EngineOutput([7]))
        j.emit(error)
        first = await outputs.__anext__()
        with pytest.raises(Exception) as raised:
            await outputs.__anext__()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(outputs.__anext__(), 5)
        await outputs.aclose()
        return first, raised.value, ends

    first, raised, ends = asyncio.run(scenario())
    assert first.token_ids == [7]
    if isinstance(error, InvalidRequestError):
        assert raised is error
    else:
        assert type(raised) is EngineError and raised.__cause__ is error
        assert str(raised) == "The engine failed: llama_decode returned 1"
    assert ends == [False]


def test_closing_early_ends_the_job_early_once():
    async def scenario():
        ends: list[bool] = []
        j = job()
        outputs = Outputs(j, ends)
        j.emit(EngineOutput([1]))
        await outputs.__anext__()
        await outputs.aclose()
        await outputs.aclose()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(outputs.__anext__(), 5)
        return ends

    assert asyncio.run(scenario()) == [True]


def test_a_cancelled_reader_ends_the_job_early():
    async def scenario():
        ends: list[bool] = []
        outputs = Outputs(job(), ends)
        reader = asyncio.ensure_future(outputs.__anext__())
        await asyncio.sleep(0)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        return list(ends)               # before ``outputs`` is dropped with this frame

    assert asyncio.run(scenario()) == [True]


def test_outputs_dropped_unread_end_the_job_early_and_after_the_end_do_nothing():
    async def scenario():
        dropped: list[bool] = []
        outputs = Outputs(job(), dropped)
        del outputs
        gc.collect()
        finished: list[bool] = []
        j = job()
        read = Outputs(j, finished)
        j.emit(EngineOutput([1], finish_reason="length"))
        assert [o.token_ids async for o in read] == [[1]]
        del read
        gc.collect()
        return dropped, finished

    assert asyncio.run(scenario()) == ([True], [False])


def test_an_output_for_a_closed_loop_ends_the_job_not_the_worker():
    """A caller's loop closed while its request was in a step (a script's asyncio.run ending
    after an abort): the worker's emit must not raise in the worker's thread, which would
    end it and every other request with it."""
    loop = asyncio.new_event_loop()
    gone = Job(EngineRequest("r", [1, 2], SamplingParams()), loop, asyncio.Queue())
    loop.close()
    caught: list[BaseException] = []
    worker = threading.Thread(target=lambda: _emit(gone, caught))
    worker.start()
    worker.join()
    assert caught == [] and gone.aborted


def _emit(job: Job, caught: list[BaseException]) -> None:
    try:
        job.emit(EngineOutput([7]))
    except BaseException as exc:  # noqa: BLE001 - what the test looks for
        caught.append(exc)
