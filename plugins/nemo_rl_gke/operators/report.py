"""The run report, the DAG's last task: stage durations, critical path, GPU node-hours and cost, training, checkpoint,
teardown; a table in the task log and JSON in XCom. When the run failed it also sends the run's failure alert
(:mod:`nemo_rl_gke.alerts`).

Airflow 3 tasks have no database access, so the report is built from what the execution API gives a task: every
finished task's state and duration (``get_task_breadcrumbs``), plus the start time each step records in XCom when it
starts (:class:`~nemo_rl_gke.operators.base.StepOperator`). The arithmetic lives in :mod:`nemo_rl_gke.observe.report`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import Context

from nemo_rl_gke.airflow_compat import AirflowFailException
from nemo_rl_gke.alerts import send
from nemo_rl_gke.operators.base import StepOperator, pull
from nemo_rl_gke.run import task_states as ts
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.times import epoch_of
from nemo_rl_gke.run.topology import (
    ERROR,
    EXPORT,
    JOB_BUDGET,
    JOB_RECOVERIES,
    JOB_STALLED,
    JOB_SUMMARY,
    REPORT_TEXT,
    RESUME,
    STARTED_AT,
    VALIDATE,
    WAIT,
)

if TYPE_CHECKING:
    from nemo_rl_gke.observe.report import RunReport


def _training(context: Context) -> dict[str, Any] | None:
    """The job's summary, with where it converged and the step its checkpoint is from (None: no job ran)."""
    summary = pull(context, WAIT, JOB_SUMMARY)
    if summary is None:
        return None
    waited = pull(context, WAIT) or {}
    outcome = ("converged_at", "final_step", "stopped_at_budget", "max_steps")
    stalled = pull(context, WAIT, JOB_STALLED) or {}
    recoveries = pull(context, WAIT, JOB_RECOVERIES) or []
    if recoveries:
        summary = {**summary, "recovery_log": recoveries}
    stop = (pull(context, WAIT, JOB_BUDGET) or {}).get("stop")
    if stop:
        # Which limit stopped the job, the USD at that moment, and what the stop lost (also for a failed wait).
        summary = {**summary, "deadline_stop": stop}
    if stalled:
        return {**summary, "final_step": stalled.get("final_step"), "stalled": stalled.get("message")}
    return {**summary, **{k: waited[k] for k in outcome if waited.get(k) is not None}}


def _next_run_at(dag: Any) -> float | None:
    """When the DAG's schedule next fires after now (epoch seconds); None for a DAG run only by hand."""
    from airflow.sdk import timezone
    from airflow.timetables.base import TimeRestriction

    # A schedule file's DAG has Airflow's cron timetable; a manual DAG's SDK NullTimetable has no next run to ask for.
    next_info = getattr(getattr(dag, "timetable", None), "next_dagrun_info", None)
    if next_info is None:
        return None
    restriction = TimeRestriction(earliest=timezone.utcnow(), latest=None, catchup=False)
    info = next_info(last_automated_data_interval=None, restriction=restriction)
    return None if info is None else info.run_after.timestamp()


class RunReportOperator(StepOperator):
    """Builds the run report from the run's tasks and their XComs; always runs, after teardown. A failed run's alert
    goes from here: this task has every fact the message needs, and runs after teardown, so what it says is still
    running is what the run really left (see :mod:`nemo_rl_gke.alerts`). A run stopped at its budget succeeds, and
    its alert says so. checkpoint.validate runs after train.wait whatever its end (a stalled job's newest save is
    exported), so a failed train.wait is no leaf of the run: this task then fails the run (it counts for the run's
    state), "stalled at step N" after a stall.

    :param alert_connections: the DAG's alert connections (empty: every one the deployment allows).
    """

    ui_color = "#eeeeee"

    def __init__(self, *, alert_connections: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.alert_connections = tuple(alert_connections)

    def execute(self, context: Context) -> dict[str, Any]:
        """Collect timings and results, log the table, return the JSON; alert when the run failed."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.observe.alert_messages import run_failed
        from nemo_rl_gke.observe.report import TaskTiming
        from nemo_rl_gke.run.publish import NOT_PROMOTED

        ti = context["ti"]
        conf = pull(context, VALIDATE)
        if not conf:
            self.log.info("The conf was refused before anything ran: nothing to report")
            return {"report": None}
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
        states = {t.task_id: t.state for t in timings}
        waited = pull(context, WAIT) or {}
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.run.costs import results_read

        # What costs.still_up reads, read once: the report and the alert then say the same of what is still up.
        results = {task_id: pull(context, task_id) for task_id in results_read(states)}
        report = None
        try:
            report = self._report(context, conf, timings, results)
        finally:
            # Also when the report itself fails: the alert then goes out without costs rather than not at all.
            publish = pull(context, topology.PUBLISH) or {}
            if run_failed(states) or waited.get("stopped_at_budget") or publish.get("outcome") == NOT_PROMOTED:
                self._alert(context, states, report, conf, results)
        self._fail_with_training(context, states)
        return report.to_dict()

    def _fail_with_training(self, context: Context, states: dict[str, str]) -> None:
        """checkpoint.validate runs after train.wait whatever its end, so a failed (or upstream_failed) train.wait is
        no leaf of the run: this task fails the run for it, naming what failed (after a stall, once its newest save
        is exported)."""
        if states.get(WAIT) not in ts.FAILED_STATES:
            return
        stalled = pull(context, WAIT, JOB_STALLED) or {}
        if stalled:
            first = str(stalled.get("message") or "stalled").splitlines()[0].rstrip(".")
            step = stalled.get("final_step")
            raise AirflowFailException(f"the run fails: train.wait {first}; checkpoint step {step} was exported")
        failed = [task_id for task_id, state in states.items() if state == ts.FAILED and task_id != topology.RUN_REPORT]
        error = str(pull(context, WAIT, ERROR) or "").strip().splitlines()
        detail = f": {error[0]}" if states.get(WAIT) == ts.FAILED and error else ""
        raise AirflowFailException(f"the run fails: {', '.join(failed) or WAIT} failed{detail}")

    def _report(self, context: Context, conf: dict[str, Any], timings: list[Any], results: dict[str, Any]) -> RunReport:
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.observe.report import RunInputs, build_report
        from nemo_rl_gke.run import capacity
        from nemo_rl_gke.run.spec import RunSpec

        spec = RunSpec.from_conf(conf)
        rayclusters = pull(context, topology.RAYCLUSTER) or {}
        served = capacity.served_capacity(rayclusters)
        if served is not None:
            spec = capacity.on_rung(spec, served)  # priced as the capacity that served it
        dag = context["dag"]
        teardown = {}
        for step in topology.teardown_steps():
            if step.op is topology.Op.RELEASE_LEASE:
                continue  # the lease's release deletes nothing
            result = pull(context, step.task_id)
            if result:
                teardown[step.task_id] = str(result.get("action"))
        exported = pull(context, EXPORT) or {}
        pending = (pull(context, topology.DELETE_LUSTRE) or {}).get("pending") or ()
        report = build_report(
            timings,
            {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks},
            RunInputs(
                gpu_type=spec.gpu_type,
                gpus_per_node=spec.gpus_per_node,
                worker_replicas=spec.worker_replicas,
                now=time.time(),
                gpu_hour_price_usd=spec.gpu_hour_price_usd,
                capacity=spec.capacity,
                capacity_rungs=rayclusters.get("capacity") or () if spec.capacity_ladder else (),
                teardown_policy=spec.teardown_policy,
                training_summary=_training(context),
                checkpoint_uri=exported.get("uri"),
                teardown_actions=teardown,
                lineage=(pull(context, RESUME) or {}).get("lineage") or (),
                pending_checkpoints=pending,
                next_run_at=_next_run_at(dag),
                pool_ready_at=epoch_of((pull(context, topology.NODE_POOL) or {}).get("ready_at")),
                model_out={
                    "convert": pull(context, topology.CONVERT),
                    "evaluate": pull(context, topology.EVALUATE),
                    "publish": pull(context, topology.PUBLISH),
                },
                spec=spec,
                results=results,
            ),
        )
        text = report.to_text()
        self.log.info("Run report\n%s", text)
        context["ti"].xcom_push(key=REPORT_TEXT, value=text)
        return report

    def _alert(
        self,
        context: Context,
        states: dict[str, str],
        report: RunReport | None,
        conf: dict[str, Any],
        results: dict[str, Any],
    ) -> None:
        """Send the failed run's alert; a problem is logged, never raised (an alert never changes the run)."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.observe.alert_messages import failure_alert
        from nemo_rl_gke.run.ray_logs import summary_of

        try:
            errors = {}
            for task_id, state in states.items():
                if state == ts.FAILED and task_id in topology.STEPS:
                    errors[task_id] = str(pull(context, task_id, ERROR) or "")
            alert = failure_alert(
                context["dag"].dag_id,
                context["run_id"],
                states,
                errors=errors,
                training=_training(context),
                report=report,
                publish=pull(context, topology.PUBLISH),
                ray_logs=summary_of(pull(context, topology.DELETE_RAYCLUSTER)),
                conf=conf,
                results=results,
            )
            send(alert, self.alert_connections, context=context)
        except Exception:
            self.log.exception("The run's failure alert could not be built or sent")
