"""The run report, the DAG's last task: stage durations, critical path, GPU node-hours and cost, training, checkpoint,
teardown; a table in the task log and JSON in XCom.

Airflow 3 tasks have no database access, so the report is built from what the execution API gives a task: every
finished task's state and duration (``get_task_breadcrumbs``), plus the start time each of this package's tasks
records in XCom when it starts (:class:`RecordsStart`). The arithmetic lives in :mod:`nemo_rl_gke.report`.
"""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import BaseOperator, Context

STARTED_AT_KEY = "started_at"
REPORT_TEXT_KEY = "text"


class RecordsStart(BaseOperator):
    """Base of the package's operators: pushes the task instance's start time, which the run report needs."""

    def pre_execute(self, context: Context) -> None:
        """Record when this try started (a resumed deferral pushes the same start again)."""
        started = getattr(context["ti"], "start_date", None)
        if started is not None:
            context["ti"].xcom_push(key=STARTED_AT_KEY, value=started.timestamp())


class RunReportOperator(RecordsStart):
    """Builds the run report from the run's tasks and their XComs; always runs, after teardown."""

    ui_color = "#eeeeee"

    def __init__(self, *, validate_task_id: str = "validate", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validate_task_id = validate_task_id

    def execute(self, context: Context) -> dict[str, Any]:
        """Collect timings and results, log the table, return the JSON."""
        from nemo_rl_gke.report import RunInputs, TaskTiming, build_report
        from nemo_rl_gke.spec import RunSpec

        ti = context["ti"]
        conf = ti.xcom_pull(task_ids=self.validate_task_id)
        if not conf:
            self.log.info("The conf was refused before anything ran: nothing to report")
            return {"report": None}
        spec = RunSpec.from_conf(conf)
        dag = context["dag"]
        crumbs = {c["task_id"]: c for c in ti.get_task_breadcrumbs(dag_id=dag.dag_id, run_id=context["run_id"])}
        task_ids = [t.task_id for t in dag.tasks if t.task_id != self.task_id]
        starts = dict(zip(task_ids, ti.xcom_pull(task_ids=task_ids, key=STARTED_AT_KEY) or [], strict=False))
        timings = []
        for task_id in task_ids:
            crumb = crumbs.get(task_id, {})
            start, duration = starts.get(task_id), crumb.get("duration")
            end = start + float(duration) if start is not None and duration is not None else None
            timings.append(TaskTiming(task_id, str(crumb.get("state") or "none"), start, end))
        results = {t: ti.xcom_pull(task_ids=t) for t in task_ids if t.startswith(("teardown.", "checkpoint."))}
        teardown = {t: str(r.get("action")) for t, r in results.items() if t.startswith("teardown.") and r}
        exported = results.get("checkpoint.export") or {}
        report = build_report(
            timings,
            {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks},
            RunInputs(
                gpu_type=spec.gpu_type,
                gpus_per_node=spec.gpus_per_node,
                worker_replicas=spec.worker_replicas,
                now=time.time(),
                gpu_hour_price_usd=spec.gpu_hour_price_usd,
                teardown_policy=spec.teardown_policy,
                training_summary=ti.xcom_pull(task_ids="train.wait", key="summary"),
                checkpoint_uri=exported.get("uri"),
                teardown_actions=teardown,
            ),
        )
        text = report.to_text()
        self.log.info("Run report\n%s", text)
        ti.xcom_push(key=REPORT_TEXT_KEY, value=text)
        return report.to_dict()
