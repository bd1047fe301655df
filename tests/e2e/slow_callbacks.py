"""What blocks an event loop: every asyncio callback of the main thread timed by the CPU it took.

``dag.test`` runs each trigger in line with ``asyncio.run`` in the main thread, as the triggerer runs them all on the
one loop every deferred task of the deployment shares. asyncio's own debug check (``loop.slow_callback_duration``)
times callbacks by the wall clock, which on a shared 2-core machine grows with whatever else runs; the CPU time a
callback spent in its thread is what it took from the loop itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SlowCallback:
    """One callback over the bound: the CPU and the wall time it ran, and what it was (a task: its coroutine)."""

    cpu_s: float
    wall_s: float
    callback: str


def _describe(handle: asyncio.Handle) -> str:
    callback: Any = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        frame = getattr(coro, "cr_frame", None)
        where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        return f"task {task.get_name()}: {getattr(coro, '__qualname__', coro)}{where}"
    return repr(handle)


@contextlib.contextmanager
def slow_callbacks(bound_s: float) -> Iterator[list[SlowCallback]]:
    """Within the block, collect every main-thread asyncio callback that took more than ``bound_s`` of CPU."""
    slow: list[SlowCallback] = []
    original = asyncio.events.Handle._run
    main = threading.main_thread()

    def timed(handle: asyncio.Handle) -> None:
        if threading.current_thread() is not main:
            original(handle)
            return
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            original(handle)
        finally:
            spent = time.thread_time() - cpu
            if spent > bound_s:
                # Described after it ran: a task's coroutine is then where it suspended, next to what was slow.
                slow.append(SlowCallback(round(spent, 3), round(time.perf_counter() - wall, 3), _describe(handle)))

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    try:
        yield slow
    finally:
        asyncio.events.Handle._run = original  # type: ignore[method-assign]
