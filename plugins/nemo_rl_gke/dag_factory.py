"""Build a run's DAG from the topology: one task per step, in its group, with its needs, retries and teardown role.

The manual DAG and every scheduled DAG come from :func:`build_dag`, so they cannot drift apart. Nothing here does
I/O or imports a cloud client: it runs while Airflow parses DAG files.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, BaseOperator, TaskGroup, TriggerRule

from nemo_rl_gke.airflow_compat import task_group
from nemo_rl_gke.alerts import RunAlertNotifier, dag_deadline, record_failure
from nemo_rl_gke.dag_params import build_params
from nemo_rl_gke.docs import GROUP_DOCS, scheduled_dag_doc
from nemo_rl_gke.operators.checkpoint import ExportCheckpointOperator, ResumeOperator, ValidateCheckpointOperator
from nemo_rl_gke.operators.gcp import DeleteGcpResourceOperator, EnsureGcpResourceOperator, ScaleGpuPoolOperator
from nemo_rl_gke.operators.kube import ApplyKubeObjectsOperator, DeleteKubeObjectsOperator
from nemo_rl_gke.operators.lease import ReleaseLeaseOperator, TakeLeaseOperator
from nemo_rl_gke.operators.model_out import ConvertCheckpointOperator, EvaluateModelOperator, PublishModelOperator
from nemo_rl_gke.operators.preflight import (
    ApplyGateOperator,
    PlanOperator,
    PreflightLiveOperator,
    ValidateConfOperator,
)
from nemo_rl_gke.operators.rayjob import RayJobSensor, SubmitRayJobOperator
from nemo_rl_gke.operators.report import RunReportOperator
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.airflow_settings import max_active_runs
from nemo_rl_gke.run.alert_settings import AlertSettings
from nemo_rl_gke.run.topology import Op

OPERATORS: dict[Op, type[BaseOperator]] = {
    Op.VALIDATE_CONF: ValidateConfOperator,
    Op.PLAN: PlanOperator,
    Op.APPLY_GATE: ApplyGateOperator,
    Op.TAKE_LEASE: TakeLeaseOperator,
    Op.PREFLIGHT_LIVE: PreflightLiveOperator,
    Op.ENSURE_GCP: EnsureGcpResourceOperator,
    Op.APPLY_KUBE: ApplyKubeObjectsOperator,
    Op.RESUME: ResumeOperator,
    Op.SUBMIT_JOB: SubmitRayJobOperator,
    Op.FOLLOW_JOB: RayJobSensor,
    Op.VALIDATE_CHECKPOINT: ValidateCheckpointOperator,
    Op.CONVERT_CHECKPOINT: ConvertCheckpointOperator,
    Op.EVALUATE_MODEL: EvaluateModelOperator,
    Op.EXPORT_CHECKPOINT: ExportCheckpointOperator,
    Op.PUBLISH_MODEL: PublishModelOperator,
    Op.DELETE_KUBE: DeleteKubeObjectsOperator,
    Op.DELETE_GCP: DeleteGcpResourceOperator,
    Op.SCALE_POOL: ScaleGpuPoolOperator,
    Op.RELEASE_LEASE: ReleaseLeaseOperator,
    Op.REPORT: RunReportOperator,
}
# Every task records the first line of its final error for the run's failure alert.
DEFAULT_ARGS: dict[str, Any] = {
    "owner": "ml-platform",
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "on_failure_callback": record_failure,
}
TAGS = ["nemo-rl", "grpo", "gke", "gpu"]


def _step_kwargs(step: topology.Step, dag_id: str, alerts: AlertSettings) -> dict[str, Any]:
    """What the topology says about a task beyond its operator: retries, delay, docs, assets, alerts."""
    kwargs: dict[str, Any] = {"step": step.task_id, "doc_md": step.doc}
    if step.op is Op.VALIDATE_CONF:
        # A refused conf is the one failure the report does not follow: this task alerts for it itself.
        kwargs["on_failure_callback"] = [record_failure, RunAlertNotifier(alerts.connections)]
    if step.op is Op.REPORT:
        kwargs["alert_connections"] = alerts.connections
    if step.retries is not None:
        kwargs["retries"] = step.retries
    if step.retry_delay_s is not None:
        kwargs["retry_delay"] = timedelta(seconds=step.retry_delay_s)
        # A failed deletion is retried soon, then less often: a dependent still going away usually clears quickly.
        kwargs["retry_exponential_backoff"] = step.op is Op.DELETE_GCP
    if step.outlets:
        kwargs["outlets"] = [Asset(name=name.format(dag_id=dag_id)) for name in step.outlets]
    if step.inlets:
        kwargs["inlets"] = [Asset(name=name.format(dag_id=dag_id)) for name in step.inlets]
    if step.op is Op.VALIDATE_CHECKPOINT:
        # Also after a failed train.wait: a stalled job's newest save is still validated and exported (the operator
        # skips when there is none). A failed setup upstream (validate, the lease, a resource) still makes it
        # upstream_failed: Airflow checks a task's indirect setups before its trigger rule.
        kwargs["trigger_rule"] = TriggerRule.ALL_DONE
    if step.op is Op.EXPORT_CHECKPOINT:
        # Whatever the Hugging Face export did: every run exports the checkpoint it validated (the step skips itself
        # when the checkpoint did not validate).
        kwargs["trigger_rule"] = TriggerRule.ALL_DONE
    if step in topology.provisioning() and len(step.needs) > 1:
        # As all_success, but a step whose upstreams mix skipped (past stop_after) and failed ones is upstream_failed,
        # never skipped: a skip must not hide a failure from the run's state. (One upstream: the same as all_success.)
        kwargs["trigger_rule"] = TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS
    return kwargs


def _group(name: str) -> TaskGroup:
    """A task group with its tooltip and docs (what it does, what to do when it fails)."""
    tooltip, doc = GROUP_DOCS[name]
    return task_group(name, tooltip=tooltip, doc_md=doc)


def build_dag(
    dag_id: str,
    *,
    description: str,
    doc_md: str,
    schedule: Any = None,
    start_date: datetime | None = None,
    tags: list[str] | None = None,
    param_defaults: dict[str, Any] | None = None,
    alerts: AlertSettings | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """The run's DAG: every step of the topology wired by its needs; teardown after any failure; the report last.

    ``param_defaults`` overrides the trigger form's defaults (a schedule's partial conf); ``alerts`` picks the alert
    connections and a deadline (default: every connection the deployment allows, resolved when an alert is sent, and
    no deadline); ``dag_kwargs`` go to DAG.
    """
    alerts = alerts or AlertSettings()
    deadline = dag_deadline(alerts)
    if deadline is not None:
        dag_kwargs["deadline"] = deadline
    # Runs of one run group queue on its lease (on the cloud side, so across Airflows too); runs of different
    # groups go side by side, up to this many at once per DAG.
    # How many runs at once: the deployment's setting (each holds a lease on its own run group, and its GPUs).
    dag_kwargs.setdefault("max_active_runs", max_active_runs())
    with DAG(
        dag_id=dag_id,
        description=description,
        schedule=schedule,
        start_date=start_date or datetime(2026, 1, 1),
        catchup=False,
        tags=tags or TAGS,
        doc_md=doc_md,
        default_args=DEFAULT_ARGS,
        **dag_kwargs,
    ) as dag:
        groups: dict[str, TaskGroup] = {}
        tasks: dict[str, BaseOperator] = {}
        for step in topology.STEPS.values():
            group = None
            if step.group is not None:
                group = groups.get(step.group) or groups.setdefault(step.group, _group(step.group))
            tasks[step.task_id] = OPERATORS[step.op](task_group=group, **_step_kwargs(step, dag_id, alerts))
        # Every edge as the topology derives it: teardown after every provisioning step, the report after teardown.
        for step in topology.STEPS.values():
            tasks[step.task_id].set_upstream([tasks[up] for up in topology.upstream(step.task_id)])
        for step in topology.teardown_steps():
            tasks[step.task_id].as_teardown(
                setups=tasks[topology.setup_of(step.task_id)], on_failure_fail_dagrun=step.counts_for_run_state
            )
        report = next(s for s in topology.STEPS.values() if s.op is Op.REPORT)
        # It runs whenever the conf was valid, after teardown. It decides the run's state in one case: a train.wait
        # that did not succeed is no leaf (checkpoint.validate runs after it whatever its end, for a stalled job's
        # newest save), so the report fails the run for it.
        tasks[report.task_id].as_teardown(setups=tasks[topology.setup_of(report.task_id)], on_failure_fail_dagrun=True)
    # Set after the tasks: Airflow deep-copies the DAG's params into every task created while they are set, and
    # merges them back at run time anyway (process_params), so this keeps 50 copies of every Param out of each parse.
    dag.params = build_params(param_defaults)
    return dag


def build_scheduled_dags(directory: Path | None = None) -> dict[str, DAG]:
    """One DAG per schedule file (``include/schedules/*.yaml``): the run's DAG on the schedule's cron, its conf as the
    form's defaults, paused when Airflow first sees it, never catching up. A bad file raises
    :class:`~nemo_rl_gke.run.schedules.ScheduleError` (the DAG file's import error names the file, field and fix)."""
    from airflow.timetables.trigger import CronTriggerTimetable

    # lazy: read at call time, so tests and deployments can re-point the paths
    from nemo_rl_gke.run.paths import SCHEDULES_DIR

    # lazy: only the schedules' DAG file builds them; the manual one does not load the schedule checks
    from nemo_rl_gke.run.schedules import load_schedules

    dags = {}
    for schedule in load_schedules(directory or SCHEDULES_DIR):
        dags[schedule.dag_id] = build_dag(
            schedule.dag_id,
            description=schedule.description,
            doc_md=scheduled_dag_doc(schedule),
            schedule=CronTriggerTimetable(schedule.cron, timezone=schedule.timezone),
            tags=[*TAGS, "scheduled"],
            param_defaults=schedule.run_conf,
            alerts=schedule.alerts,
            is_paused_upon_creation=True,
            # Nights of one schedule are one run group: they queue on its lease, so one active run at a time.
            max_active_runs=1,
        )
    return dags
