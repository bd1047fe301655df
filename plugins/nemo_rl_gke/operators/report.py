"""The run report, the DAG's last task: stage durations, critical path, GPU node-hours and cost, training, checkpoint,
teardown; a table in the task log and JSON in XCom.

Airflow 3 tasks have no database access, so the report is built from what the execution API gives a task: every
finished task's state and duration (``get_task_breadcrumbs``), plus the start time each step records in XCom when it
starts (:class:`~nemo_rl_gke.operators.base.StepOperator`). The arithmetic lives in :mod:`nemo_rl_gke.report`.
"""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import Context

from nemo_rl_gke import topology
from nemo_rl_gke.operators.base import StepOperator, epoch_of, pull
from nemo_rl_gke.topology import EXPORT, JOB_SUMMARY, REPORT_TEXT, RESUME, STARTED_AT, VALIDATE, WAIT


def _training(context: Context) -> dict[str, Any] | None:
    """The job's summary, with where it converged and the step its checkpoint is from (None: no job ran)."""
    summary = pull(context, WAIT, JOB_SUMMARY)
    if summary is None:
        return None
    waited = pull(context, WAIT) or {}
    return {**summary, **{k: waited[k] for k in ("converged_at", "final_step") if waited.get(k) is not None}}


class RunReportOperator(StepOperator):
    """Builds the run report from the run's tasks and their XComs; always runs, after teardown."""

    ui_color = "#eeeeee"

    def execute(self, context: Context) -> dict[str, Any]:
        """Collect timings and results, log the table, return the JSON."""
        from nemo_rl_gke.report import RunInputs, TaskTiming, build_report
        from nemo_rl_gke.spec import RunSpec

        ti = context["ti"]
        conf = pull(context, VALIDATE)
        if not conf:
            self.log.info("The conf was refused before anything ran: nothing to report")
            return {"report": None}
        spec = RunSpec.from_conf(conf)
        dag = context["dag"]
        crumbs = {c["task_id"]: c for c in ti.get_task_breadcrumbs(dag_id=dag.dag_id, run_id=context["run_id"])}
        task_ids = [t.task_id for t in dag.tasks if t.task_id != self.task_id]
        starts = dict(zip(task_ids, ti.xcom_pull(task_ids=task_ids, key=STARTED_AT) or [], strict=False))
        timings = []
        for task_id in task_ids:
            crumb = crumbs.get(task_id, {})
            start, duration = epoch_of(starts.get(task_id)), crumb.get("duration")
            end = start + float(duration) if start is not None and duration is not None else None
            timings.append(TaskTiming(task_id, str(crumb.get("state") or "none"), start, end))
        teardown = {}
        for step in topology.teardown_steps():
            if step.op is topology.Op.RELEASE_LEASE:
                continue  # the lease's release deletes nothing
            result = pull(context, step.task_id)
            if result:
                teardown[step.task_id] = str(result.get("action"))
        exported = pull(context, EXPORT) or {}
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
                training_summary=_training(context),
                checkpoint_uri=exported.get("uri"),
                teardown_actions=teardown,
                lineage=(pull(context, RESUME) or {}).get("lineage") or (),
            ),
        )
        text = report.to_text()
        self.log.info("Run report\n%s", text)
        ti.xcom_push(key=REPORT_TEXT, value=text)
        return report.to_dict()
