"""The step store's reads and writes from the triggerer (:mod:`nemo_rl_gke.observe.step_store` says what it holds).

It lives in the deferred task's own XCom, as the log position does (:mod:`~nemo_rl_gke.triggers.log_position`):
Airflow keeps a task's XComs across its deferrals, a new try clears them, and the triggerer serves a trigger's
``GetXCom`` / ``SetXCom``. The calls are blocking Task SDK calls made from the worker thread that parsed the lines.
Best effort by design: a store that cannot be read costs a restarted trigger one whole parse of the log, and one
that cannot be written leaves the view a step or more behind, never a wrong number.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from nemo_rl_gke.observe import step_store
from nemo_rl_gke.observe.metrics import RunMetrics
from nemo_rl_gke.triggers.log_position import TASK_KEYS

log = logging.getLogger(__name__)


class MetricsStore:
    """One task's step store: :meth:`load` what a trigger before this one saved, :meth:`save` a snapshot."""

    def __init__(self, task: Mapping[str, Any]) -> None:
        missing = [k for k in TASK_KEYS if k not in task]
        if missing:
            raise ValueError(f"a task key needs {', '.join(TASK_KEYS)}; missing {', '.join(missing)}")
        self.task = {k: task[k] for k in TASK_KEYS}

    def load(self, submission_id: str) -> tuple[dict[str, Any], RunMetrics] | None:
        """This job's head and the metrics it commits; None when there is none (or it is another job's, or
        unreadable)."""
        from airflow.sdk.execution_time.xcom import XCom

        key = step_store.head_key(step_store.attempt_of(submission_id))
        try:
            head = XCom.get_one(key=key, **self.task)
            if not step_store.valid_head(head) or head["submission_id"] != submission_id:
                return None
            chunks = [XCom.get_one(key=k, **self.task) for k in step_store.chunk_keys(head)]
        except Exception as exc:
            log.warning("Could not read the step store (%s): the job's log is parsed again from its start", exc)
            return None
        metrics = step_store.restore(head, chunks)
        return None if metrics is None else (dict(head), metrics)

    def save(self, head: Mapping[str, Any], chunks: Mapping[str, Any]) -> bool:
        """Write the chunks, then the head that commits them; whether all of it was written."""
        from airflow.sdk.execution_time.xcom import XCom

        try:
            for key, rows in chunks.items():
                XCom.set(key, rows, **self.task)
            XCom.set(step_store.head_key(int(head["attempt"])), dict(head), **self.task)
        except Exception as exc:
            log.warning("Could not save the step store (%s): the Training view lags until the next save", exc)
            return False
        return True
