"""The sweeper's one task: sweep a project of what no run will tear down any more, deferring on every delete.

Thin glue: the sweep is :class:`nemo_rl_gke.sweeper.Sweep`; each wave of deletions is waited on by deferring to
:class:`~nemo_rl_gke.triggers.operations.OperationTrigger`, one operation after another, so no worker slot is held
while Google deletes a cluster or a Lustre instance (DESIGN rule 3). The sweep's state waits in XCom meanwhile.
Imported while the DAG file is parsed: the hooks, clients and the sweep itself are imported inside methods only.
"""

from __future__ import annotations

import time
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context

from nemo_rl_gke.airflow_compat import AirflowException, AirflowFailException
from nemo_rl_gke.dag_params import WARM_TTL_MAX_HOURS
from nemo_rl_gke.operators.base import DEFAULT_GCP_CONN_ID, DEFERRAL_BACKSTOP_S, LEASE_MARGIN_S
from nemo_rl_gke.run.deployment import load_deployment

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.gcp.operations import OperationRef
    from nemo_rl_gke.run.deployment import Deployment
    from nemo_rl_gke.sweeper import RunState, Sweep

# The sweeper DAG's params (:func:`nemo_rl_gke.dag_params.sweeper_params`), the only keys its conf may hold.
SWEEP_PARAMS = ("project", "dry_run", "warm_ttl_hours")
# The state of a sweep between deferrals, and its report text.
STATE_KEY = "sweep_state"
TEXT_KEY = "text"
# One wave of deletions (Lustre and the cluster take tens of minutes) is bounded like a run's teardown step
# (RunSpec.teardown_timeout_s), and polled like a run's waits (RunSpec.poll_interval_s).
WAIT_TIMEOUT_S = 3600.0
POLL_INTERVAL_S = 15.0


class SweepOperator(BaseOperator):
    """Finds this deployment's run groups that no run will tear down (expired leases of ended runs, warm groups idle
    past their TTL) and deletes their resources in teardown order, keeping other deployments', foreign ones and a
    Lustre instance with a pending checkpoint. Logs the report and returns it as a dict; fails after reporting when
    a deletion failed (the next sweep tries again).

    Reads the DAG params ``project``, ``dry_run`` and ``warm_ttl_hours``; a scheduled run group idles for its
    schedule file's own ``warm_ttl_hours`` instead.

    :param gcp_conn_id: the Airflow connection with the Google credentials and endpoint overrides.
    :param wait_timeout_s: the longest wait for one wave of deletions.
    :param poll_interval_s: how often the triggerer polls a delete operation.
    """

    ui_color = "#fbe9e3"

    def __init__(
        self,
        *,
        gcp_conn_id: str = DEFAULT_GCP_CONN_ID,
        wait_timeout_s: float = WAIT_TIMEOUT_S,
        poll_interval_s: float = POLL_INTERVAL_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gcp_conn_id = gcp_conn_id
        self.wait_timeout_s = wait_timeout_s
        self.poll_interval_s = poll_interval_s

    @cached_property
    def hook(self) -> GcpHook:
        """The sync GCP hook; built on first use, never at parse time."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.hooks import GcpHook

        return GcpHook(gcp_conn_id=self.gcp_conn_id)

    @property
    def lease_ttl_s(self) -> float:
        """How long the sweep holds a group's lease past each pass: its longest wait, with the runs' margins."""
        return self.wait_timeout_s + DEFERRAL_BACKSTOP_S + LEASE_MARGIN_S

    def execute(self, context: Context) -> dict[str, Any]:
        """Judge every lease record of the project, look at the groups to sweep, and start deleting."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.sweeper import Sweep

        deployment = load_deployment(self.gcp_conn_id)
        project, dry_run, warm_ttl_hours = sweep_params(context["params"], deployment)
        sweep = Sweep.start(
            self.hook,
            project=project,
            deployment=deployment.deployment_id,
            run=f"{context['dag'].dag_id}/{context['run_id']}",
            now=time.time(),
            run_state=self.run_state(context),
            warm_ttl_hours=warm_ttl_hours,
            ttl_hours=self.schedule_ttls(),
            dry_run=dry_run,
        )
        return self.proceed(context, sweep)

    def schedule_ttls(self) -> dict[str, float]:
        """Each schedule's own ``warm_ttl_hours`` by run group; a bad schedule file leaves every group on the param's
        TTL (logged: a sweeper that stops sweeping would leak GPUs)."""
        # lazy: read at call time, so tests and deployments can re-point the paths
        from nemo_rl_gke.run.paths import SCHEDULES_DIR

        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.run.schedules import ScheduleError, warm_ttls

        try:
            return warm_ttls(SCHEDULES_DIR)
        except ScheduleError as exc:
            self.log.error("Schedules' warm TTLs not read (every group gets the param's): %s", exc)
            return {}

    def run_state(self, context: Context) -> RunState:
        """The state of another DAG run through the task instance; unknown (None) when it cannot be told, which
        leaves that run's group alone."""
        ti = context["ti"]

        def state(run: str) -> str | None:
            dag_id, slash, run_id = run.partition("/")
            if not slash:
                return None
            try:
                found = ti.get_dagrun_state(dag_id=dag_id, run_id=run_id)
            except Exception as exc:  # a run Airflow no longer knows, or the API is down: the safe side is to wait
                self.log.warning("The state of run %s cannot be told (%s): its group is left alone", run, exc)
                return None
            return str(getattr(found, "value", found))

        return state

    def proceed(self, context: Context, sweep: Sweep) -> dict[str, Any]:
        """One pass; defer on the first operation of the wave it started, or end with the report."""
        waiting = sweep.advance(self.hook, now=time.time(), lease_ttl_s=self.lease_ttl_s)
        if waiting:
            first, rest = waiting[0], waiting[1:]
            self.wait(context, sweep, first, rest, started_at=time.time())
        return self.finish(context, sweep)

    def wait(
        self, context: Context, sweep: Sweep, operation: OperationRef, rest: list[OperationRef], started_at: float
    ) -> None:
        """Defer on one operation of the wave; the rest of the wave and the sweep wait in XCom. Every operation of a
        wave shares the wave's deadline."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.triggers.operations import OperationTrigger

        state = {"sweep": sweep.to_dict(), "waiting": [op.to_dict() for op in rest], "started_at": started_at}
        context["ti"].xcom_push(key=STATE_KEY, value=state)
        self.log.info(
            "Waiting for %s (operation %s), no worker slot held meanwhile", operation.resource, operation.path
        )
        trigger = OperationTrigger(
            operation=operation.to_dict(),
            gcp_conn_id=self.gcp_conn_id,
            poll_interval=self.poll_interval_s,
            timeout=self.wait_timeout_s,
            started_at=started_at,
        )
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            timeout=timedelta(seconds=self.wait_timeout_s + DEFERRAL_BACKSTOP_S),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after one operation: wait for the next of the wave, or make the next pass."""
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.gcp.operations import OperationRef
        from nemo_rl_gke.sweeper import Sweep

        state = context["ti"].xcom_pull(task_ids=self.task_id, key=STATE_KEY)
        if not state:
            raise AirflowException("the sweep's state is missing from XCom; the next sweep starts over")
        sweep = Sweep.from_dict(state["sweep"])
        sweep.note_wait(event.get("operation") or {}, str(event.get("status")), str(event.get("message")))
        if event.get("status") != "success":
            self.log.warning("%s", event.get("message"))
        waiting = [OperationRef.from_dict(op) for op in state["waiting"]]
        if waiting:
            self.wait(context, sweep, waiting[0], waiting[1:], started_at=float(state["started_at"]))
        return self.proceed(context, sweep)

    def finish(self, context: Context, sweep: Sweep) -> dict[str, Any]:
        """Log the report, keep its text in XCom, return it; fail when a deletion failed, so it is seen."""
        report = sweep.report()
        text = report.to_text()
        self.log.info("%s", text)
        context["ti"].xcom_push(key=TEXT_KEY, value=text)
        if report.failed:
            context["ti"].xcom_push(key="return_value", value=report.to_dict())
            raise AirflowException("some deletions failed (the report above says which); the next sweep tries again")
        return report.to_dict()


def sweep_params(params: Any, deployment: Deployment | None = None) -> tuple[str, bool, float]:
    """The DAG params ``project``, ``dry_run`` and ``warm_ttl_hours``, checked (a bad one fails the task, not
    retried: the same params would fail again). The project must be one ``deployment`` allows (None: the
    defaults), as a run's must."""
    # lazy: execution-only, kept out of DAG parsing
    from nemo_rl_gke.preflight.offline import check_conf

    unknown = sorted(set(params) - set(SWEEP_PARAMS))
    if unknown:
        # A typo such as "dry-run" must not turn a dry run into a real sweep.
        raise AirflowFailException(
            f"unknown param(s) {', '.join(repr(k[:40]) for k in unknown[:5])}: the sweeper takes only "
            f"{', '.join(SWEEP_PARAMS)}. Fix: spell the param as listed"
        )
    project = params.get("project")
    # The run's own rules for a project id and its bound; the other findings are about defaults the sweep does not use.
    _, findings = check_conf({"project": project}, deployment)
    wrong = [str(f) for f in findings if set(f.params) <= {"project"}]
    if wrong:
        raise AirflowFailException("param project: " + "; ".join(wrong))
    dry_run = params.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise AirflowFailException(f"param dry_run must be true or false, not {dry_run!r}")
    ttl = params.get("warm_ttl_hours", 24)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= WARM_TTL_MAX_HOURS:
        raise AirflowFailException(
            f"param warm_ttl_hours must be a number of hours in (0, {WARM_TTL_MAX_HOURS}], not {ttl!r}"
        )
    return str(project), dry_run, float(ttl)
