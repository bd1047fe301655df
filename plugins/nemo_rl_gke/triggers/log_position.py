"""Where a job's driver-log lines stopped in the task log, kept in the deferred task's own XCom.

A trigger that a restarted triggerer runs again reads the job's log from its start (the metrics and the guards need
every line), but writes into the task log only what the trigger before it had not. XCom is the store the two share:
Airflow keeps a task's XComs across its deferrals (only a new try clears them, and a new try has a log file of its
own), and the triggerer serves a trigger's XCom calls. The position is read and written from worker threads, where a
Task SDK call is a plain blocking call that never holds the event loop.

The position is saved after each step's lines are logged (RayJobTrigger), never before: a trigger killed between
the two repeats that one step's lines, never loses one. No order of two writes to two stores can do better.
Best effort by design: a position that cannot be read or written costs lines shown twice, never a line lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

XCOM_KEY = "log_position"
TASK_KEYS = ("dag_id", "run_id", "task_id", "map_index")


def task_key(ti: Any) -> dict[str, Any]:
    """The task instance a trigger's position belongs to, as plain trigger kwargs (ids only)."""
    return {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "map_index": ti.map_index}


class LogPositions:
    """The task log's position in one task's XCom: ``{"submission_id", "offset", "step", "lines"}``, ``offset`` the
    characters of the driver log the task log has read through (every complete line before it was written there),
    ``step`` the newest step header among them and ``lines`` how many driver-log lines the task log has of the job
    (what a person, or a test, compares with the task log)."""

    def __init__(self, task: Mapping[str, Any]) -> None:
        missing = [k for k in TASK_KEYS if k not in task]
        if missing:
            raise ValueError(f"a task key needs {', '.join(TASK_KEYS)}; missing {', '.join(missing)}")
        self.task = {k: task[k] for k in TASK_KEYS}

    def load(self, submission_id: str) -> int:
        """Where the task log stopped for this job (0: nothing logged yet, or the position is another job's)."""
        from airflow.sdk.execution_time.xcom import XCom

        try:
            saved = XCom.get_one(key=XCOM_KEY, **self.task)
        except Exception as exc:
            log.warning("Could not read where the task log stopped (%s): the job's lines are logged again", exc)
            return 0
        if not isinstance(saved, Mapping) or saved.get("submission_id") != submission_id:
            return 0
        offset = saved.get("offset")
        return offset if isinstance(offset, int) and not isinstance(offset, bool) and offset > 0 else 0

    def save(self, submission_id: str, offset: int, step: int, lines: int) -> None:
        """Record that the task log has the job's ``lines`` lines up to ``offset``, through step ``step``'s header."""
        from airflow.sdk.execution_time.xcom import XCom

        value = {"submission_id": submission_id, "offset": offset, "step": step, "lines": lines}
        try:
            XCom.set(XCOM_KEY, value, **self.task)
        except Exception as exc:
            log.warning("Could not record where the task log stopped (%s): a restarted trigger may repeat lines", exc)
