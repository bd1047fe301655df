"""What every operator of a run shares, by composition: its step in the topology, the validated spec, the run's
identity (deployment, group, run) and the lease that lets it act on the group, the GCP hook, the start time the run
report needs, the run's stop stage, the one way to hand a wait to the triggerer, and the one way to keep a resource.

Imported while the DAG file is parsed: the hooks and clients are imported on first use only.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator, Context

from nemo_rl_gke.airflow_compat import AirflowFailException, AirflowSkipException
from nemo_rl_gke.links import RunLink
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.topology import PENDING, RETURN, STARTED_AT, VALIDATE, Step

if TYPE_CHECKING:
    from airflow.triggers.base import BaseTrigger

    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.run.deployment import Deployment
    from nemo_rl_gke.run.ownership import Owner
    from nemo_rl_gke.run.spec import RunSpec

DEFAULT_GCP_CONN_ID = "google_cloud_default"
# The trigger enforces the wait's timeout and says what timed out; Airflow's own deferral timeout is only a backstop
# for a trigger that never fires at all, so it is set a little later than the trigger's deadline.
DEFERRAL_BACKSTOP_S = 600
# A step holds its group's lease until its longest wait would end, plus this much, so a live run never loses it to
# a takeover; a crashed run's lease expires that much after its last step would have ended.
LEASE_MARGIN_S = 600
# A renewal that writes pushes the expiry this much further, so the steps of the next minutes only read the lease:
# each write is a rate-limited project-metadata write and an operation to wait for. A crashed run's lease outlives
# its last step by at most this much more.
LEASE_RENEW_AHEAD_S = 300


def pull(context: Context, task_id: str, key: str = RETURN) -> Any:
    """An XCom of another step of this run, refused when the topology does not declare that the step produces it."""
    if key not in topology.step(task_id).produces:
        raise KeyError(f"{task_id} does not produce XCom {key!r} (topology: {topology.step(task_id).produces})")
    return context["ti"].xcom_pull(task_ids=task_id, key=key)


class StepOperator(BaseOperator):
    """Base of every operator of a run: one step of :mod:`nemo_rl_gke.run.topology`.

    :param step: the step's task id in the topology (the task is created inside its group under its name).
    :param gcp_conn_id: the Airflow connection with the Google credentials and endpoint overrides.
    """

    def __init__(self, *, step: str, gcp_conn_id: str = DEFAULT_GCP_CONN_ID, **kwargs: Any) -> None:
        kwargs.setdefault("task_id", topology.step(step).name)
        super().__init__(**kwargs)
        self.step_id = step
        self.gcp_conn_id = gcp_conn_id
        # Only this step's own links: Airflow writes one XCom per declared link at the end of every try and every
        # deferral, and a link of another step of the same operator would always write "" (about 300 writes a run).
        own = tuple(link for link in self.operator_extra_links if not isinstance(link, RunLink) or step in link.steps)
        if len(own) != len(self.operator_extra_links):
            self.operator_extra_links = own
        # The RunSpec of the try running now (one XCom read per try, however often a step asks for it).
        self._run_spec: tuple[str, RunSpec] | None = None

    @property
    def step(self) -> Step:
        """This task's declaration."""
        return topology.step(self.step_id)

    @cached_property
    def hook(self) -> GcpHook:
        """The sync GCP hook; built on first use, never at parse time."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.hooks import GcpHook

        return GcpHook(gcp_conn_id=self.gcp_conn_id)

    @cached_property
    def deployment(self) -> Deployment:
        """The deployment's settings (secret connections, dashboard, installer allowlist), read at run time."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.run.deployment import load_deployment

        return load_deployment()

    def run_spec(self, context: Context) -> RunSpec:
        """The RunSpec the validate task accepted: the one source of names. From the training on, ``max_steps`` is
        the one the resume step set (resumed step + budget), when it set one; after the RayCluster's wait,
        ``capacity`` is the ladder's rung that served the run."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.run import capacity
        from nemo_rl_gke.run.spec import RunSpec

        # A try's id is new on every retry or clear, and what validate and the resume step pushed stays as it was
        # for as long as this try (its deferrals included) runs.
        try_id = str(getattr(context["ti"], "id", "") or "")
        if try_id and self._run_spec is not None and self._run_spec[0] == try_id:
            return self._run_spec[1]
        spec = RunSpec.from_conf(pull(context, VALIDATE))
        if self.step.stage in topology.RESUMED_STAGES and self.step_id != topology.RESUME:
            resumed = pull(context, topology.RESUME) or {}
            if resumed.get("max_steps") and resumed["max_steps"] != spec.max_steps:
                spec = dataclasses.replace(spec, max_steps=int(resumed["max_steps"]))
        if spec.capacity_ladder and topology.STAGES.index(self.step.stage) > topology.STAGES.index(topology.KUBE):
            served = capacity.served_capacity(pull(context, topology.RAYCLUSTER))
            if served is not None:
                spec = capacity.on_rung(spec, served)
        if try_id:
            self._run_spec = (try_id, spec)
        return spec

    def identity(self, context: Context, spec: RunSpec) -> Owner:
        """This run's identity: the deployment, the run group of the spec's names, and ``dag_id/run_id``."""
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.run.ownership import Owner

        return Owner(self.deployment.deployment_id, spec.group_id, f"{context['dag'].dag_id}/{context['run_id']}")

    def timeout_s(self, spec: RunSpec) -> float:
        """How long one wait of this step may take (the conf parameter its stage or the step names)."""
        param = self.step.wait_timeout_param
        if param is None:
            raise ValueError(f"{self.step_id} has no wait timeout in the topology")
        return float(getattr(spec, param))

    def pre_execute(self, context: Context) -> None:
        """Record when this try started (for the run report), skip a step past the conf's ``stop_after``, and make
        sure the run still holds its group's lease before a step that creates or deletes anything."""
        started = getattr(context["ti"], "start_date", None)
        if started is not None:
            context["ti"].xcom_push(key=STARTED_AT, value=started.astimezone(UTC).isoformat(timespec="milliseconds"))
        provisioning = self.step in topology.provisioning()
        if provisioning:
            stop = self.run_spec(context).stop_after
            if self.step in tuple(topology.after(stop)):
                raise AirflowSkipException(f"stop_after={stop}: the run stops before the {self.step.stage} stage")
        if self.step.holds_lease:
            self.hold_lease(context)
        self.persist_links(context)

    def persist_links(self, context: Context) -> None:
        """Push this step's extra links (:mod:`nemo_rl_gke.links`) that the RunSpec already determines, so they show
        while the task runs or is deferred. A link is a convenience: failing to build one never fails the task."""
        links = [link for link in self.operator_extra_links if isinstance(link, RunLink) and self.step_id in link.steps]
        if not links or self.step_id == VALIDATE:
            return
        try:
            spec = self.run_spec(context)
            for link in links:
                url = link.early(spec, context)
                if url:
                    context["ti"].xcom_push(key=link.xcom_key, value=url)
        except Exception:
            self.log.warning("Could not build the extra links of %s", self.step_id, exc_info=True)

    def hold_lease(self, context: Context) -> None:
        """Push the lease's expiry past this step's longest wait; a run that lost it acts on nothing more."""
        # lazy: execution-only (the cloud clients among them), kept out of DAG parsing
        from nemo_rl_gke.gcp.lease import LeaseLostError, renew
        from nemo_rl_gke.run.outcomes import KEPT_LEASE_LOST

        spec = self.run_spec(context)
        timeout = self.timeout_s(spec) if self.step.wait_timeout_param else 0.0
        until = time.time() + timeout + DEFERRAL_BACKSTOP_S + LEASE_MARGIN_S
        try:
            renew(self.hook, spec.project, self.identity(context, spec), until, ahead_s=LEASE_RENEW_AHEAD_S)
        except LeaseLostError as exc:
            if self.step.is_teardown:
                self.keep(context, {"action": KEPT_LEASE_LOST}, f"nothing deleted: {exc}")
            raise AirflowFailException(str(exc)) from exc

    def keep(self, context: Context, result: dict[str, Any], reason: str) -> NoReturn:
        """End a teardown step that keeps what it would delete: its result and why in XCom, the task skipped, so the
        grid shows it apart from a deletion (the run's state is not affected)."""
        context["ti"].xcom_push(key=RETURN, value={**result, "reason": reason})
        self.log.warning("Kept (%s): %s", result.get("action"), reason)
        raise AirflowSkipException(f"{result.get('action')}: {reason}")

    def defer_until(
        self,
        context: Context,
        spec: RunSpec,
        trigger_class: type[BaseTrigger],
        *,
        what: str,
        pending: Any = None,
        timeout_s: float | None = None,
        method_name: str = "execute_complete",
        **trigger_kwargs: Any,
    ) -> NoReturn:
        """Hand a wait to the triggerer with the spec's poll interval and this step's timeout (or ``timeout_s``);
        resume in ``method_name``. ``pending`` (the result so far) waits in XCom: ``airflow dags test`` drops
        deferral kwargs when it runs a trigger in line."""
        timeout_s = self.timeout_s(spec) if timeout_s is None else timeout_s
        if pending is not None:
            context["ti"].xcom_push(key=PENDING, value=pending)
        self.log.info(
            "%s: waiting (poll every %ss, timeout %ss), no worker slot held meanwhile",
            what,
            spec.poll_interval_s,
            timeout_s,
        )
        # Fixed here, once: the trigger serializes it, so a triggerer restart keeps the same deadline.
        trigger_kwargs.setdefault("started_at", time.time())
        trigger = trigger_class(
            gcp_conn_id=self.gcp_conn_id, poll_interval=spec.poll_interval_s, timeout=timeout_s, **trigger_kwargs
        )
        self.defer(trigger=trigger, method_name=method_name, timeout=timedelta(seconds=timeout_s + DEFERRAL_BACKSTOP_S))

    def pending(self, context: Context) -> Any:
        """The result this step stored before it deferred."""
        return context["ti"].xcom_pull(task_ids=self.step_id, key=PENDING)
