"""tests/e2e/slow_callbacks.py catches a callback that holds the loop's CPU, and not one that only waits."""

from __future__ import annotations

import asyncio
import gc
import time

from tests.e2e.slow_callbacks import slow_callbacks


async def _burns(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def _waits(seconds: float) -> None:
    await asyncio.sleep(seconds)
    await asyncio.to_thread(time.sleep, seconds)  # a blocking call off the loop takes none of its CPU


def test_a_callback_that_burns_the_loop_is_caught_with_its_coroutine() -> None:
    with slow_callbacks(0.2) as slow:
        asyncio.run(_waits(0.3))
        asyncio.run(_burns(0.3))
    [caught] = slow
    assert caught.cpu_s >= 0.3 and caught.wall_s >= caught.cpu_s * 0.9
    assert "_burns" in caught.callback
    # Outside the block nothing is timed any more.
    asyncio.run(_burns(0.3))
    assert len(slow) == 1


async def _collects(seconds: float) -> None:
    # A full garbage collection over a big heap in the callback: the collector's CPU, not the callback's code.
    heap = [[i] for i in range(200_000)]
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        gc.collect()
    del heap


def test_the_collectors_passes_are_not_counted_to_the_callback_they_fell_in() -> None:
    with slow_callbacks(0.2) as slow:
        asyncio.run(_collects(0.5))
        asyncio.run(_burns(0.3))
    # Only the burner is caught; the collecting callback's 0.5 s went to the collector.
    assert ["_burns" in s.callback for s in slow] == [True], slow
