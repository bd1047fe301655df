"""What blocks an event loop: every asyncio callback of the main thread timed by the CPU it took.

``dag.test`` runs each trigger in line with ``asyncio.run`` in the main thread, as the triggerer runs them all on the
one loop every deferred task of the deployment shares. asyncio's own debug check (``loop.slow_callback_duration``)
times callbacks by the wall clock, which on a shared 2-core machine grows with whatever else runs; the CPU time a
callback spent in its thread is what it took from the loop itself. Less the garbage collector's passes in that
thread: a full collection of a whole ``dag.test`` process (Airflow, Ray, FastAPI in one heap) can take a second, in
whichever callback happens to allocate when it is due, and says nothing about that callback's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
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
    gc_s: float = 0.0  # the collector's CPU in the callback, not counted in cpu_s


def _describe(handle: asyncio.Handle) -> str:
    callback: Any = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        frame = getattr(coro, "cr_frame", None)
        where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        # dag.test's task runs one trigger (its closure's ``trigger``); the innermost awaited frame is where it waits.
        trigger = frame.f_locals.get("trigger") if frame is not None else None
        inner, awaited = None, coro
        while awaited is not None:
            inner = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None) or inner
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
        if trigger is not None:
            where += f" (trigger {type(trigger).__name__}"
            where += f", waiting at {inner.f_code.co_filename}:{inner.f_lineno})" if inner is not None else ")"
        return f"task {task.get_name()}: {getattr(coro, '__qualname__', coro)}{where}"
    return repr(handle)


@contextlib.contextmanager
def slow_callbacks(bound_s: float) -> Iterator[list[SlowCallback]]:
    """Within the block, collect every main-thread asyncio callback that took more than ``bound_s`` of CPU."""
    slow: list[SlowCallback] = []
    original = asyncio.events.Handle._run
    main = threading.main_thread()
    collected = [0.0, 0.0]  # the main thread's GC CPU so far, and when its current pass started

    def on_gc(phase: str, _: dict[str, Any]) -> None:
        if threading.current_thread() is not main:
            return
        if phase == "start":
            collected[1] = time.thread_time()
        else:
            collected[0] += time.thread_time() - collected[1]

    def timed(handle: asyncio.Handle) -> None:
        if threading.current_thread() is not main:
            original(handle)
            return
        cpu, wall, gc_before = time.thread_time(), time.perf_counter(), collected[0]
        try:
            original(handle)
        finally:
            in_gc = collected[0] - gc_before
            spent = time.thread_time() - cpu - in_gc
            if spent > bound_s:
                # Described after it ran: a task's coroutine is then where it suspended, next to what was slow.
                wall_s = round(time.perf_counter() - wall, 3)
                slow.append(SlowCallback(round(spent, 3), wall_s, _describe(handle), round(in_gc, 3)))

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    try:
        yield slow
    finally:
        gc.callbacks.remove(on_gc)
        asyncio.events.Handle._run = original  # type: ignore[method-assign]
