"""Taking a run group's lease before anything is created, and freeing it after teardown.

Thin glue: the lease itself lives in :mod:`nemo_rl_gke.gcp.lease`; a wait for another run to let go is a deferral to
:class:`~nemo_rl_gke.triggers.lease.LeaseTrigger`.
"""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import Context

from nemo_rl_gke.airflow_compat import AirflowFailException, AirflowSkipException
from nemo_rl_gke.operators.base import DEFERRAL_BACKSTOP_S, LEASE_MARGIN_S, StepOperator, pull
from nemo_rl_gke.run import outcomes, topology

# The first hold covers the network stage; every later step pushes the expiry past its own longest wait.
FIRST_HOLD_PARAM = "network_timeout_s"


class TakeLeaseOperator(StepOperator):
    """Takes the run group's lease, recording the run's GPU nodes; when another run holds it, or this deployment's
    other live runs in the project hold too many GPU nodes for this one (``max_gpu_nodes_total``), fails naming them
    (``lease_held=fail``), skips the run (``skip``), or waits deferred up to ``lease_wait_s`` (``wait``). Returns the
    lease taken."""

    ui_color = "#e8f4ea"

    def execute(self, context: Context) -> dict[str, Any]:
        """Take the lease, or decide what to do about its holder."""
        return self._take(context, started_at=time.time())

    def _take(self, context: Context, started_at: float) -> dict[str, Any]:
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.lease import GpuNodesBoundError, LeaseHeldError, acquire
        from nemo_rl_gke.triggers.lease import LeaseTrigger

        spec = self.run_spec(context)
        owner = self.identity(context, spec)
        bound = self.deployment.max_gpu_nodes_total
        ttl = float(getattr(spec, FIRST_HOLD_PARAM)) + DEFERRAL_BACKSTOP_S + LEASE_MARGIN_S
        try:
            outcome, _ = acquire(
                self.hook,
                spec.project,
                owner,
                ttl,
                names=spec.group_names,
                gpu_nodes=spec.gpu_nodes,
                max_gpu_nodes_total=bound,
            )
        except (LeaseHeldError, GpuNodesBoundError) as exc:
            message = f"{exc}. Nothing was touched."
            if spec.lease_held == "skip":
                raise AirflowSkipException(f"lease_held=skip: {message}") from exc
            if spec.lease_held == "wait":
                self.defer_until(
                    context,
                    spec,
                    LeaseTrigger,
                    what=f"the lease of group {owner.group} ({exc})",
                    pending={"started_at": started_at},
                    project=spec.project,
                    group=owner.group,
                    started_at=started_at,
                    deployment=owner.deployment,
                    gpu_nodes=spec.gpu_nodes,
                    max_gpu_nodes_total=bound,
                )
            if isinstance(exc, GpuNodesBoundError):
                raise AirflowFailException(
                    f"{message} Fix: wait for those runs to end, trigger with lease_held=wait (up to lease_wait_s) or "
                    "lease_held=skip, or lower worker_replicas and gpu_pool_max_nodes; only the deployment's operator "
                    "can raise [nemo_rl_gke] max_gpu_nodes_total (AIRFLOW__NEMO_RL_GKE__MAX_GPU_NODES_TOTAL)."
                ) from exc
            raise AirflowFailException(
                f"{message} Fix: wait for that run to end, or trigger with lease_held=wait (up to lease_wait_s) or "
                "lease_held=skip; if that run is gone for good its lease expires by itself and is then taken over."
            ) from exc
        self.log.info(
            "Lease of group %s %s for run %s (%s), %d GPU nodes of the deployment's %d",
            owner.group,
            outcome,
            owner.run,
            owner,
            spec.gpu_nodes,
            bound,
        )
        return {
            "group": owner.group,
            "deployment": owner.deployment,
            "run": owner.run,
            "outcome": outcome,
            "gpu_nodes": spec.gpu_nodes,
        }

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The holder let go (take it now, or wait again if another run was quicker), or the wait ran out."""
        if event.get("status") != "success":
            raise AirflowFailException(f"{event.get('message')}. Nothing was touched.")
        return self._take(context, started_at=float(self.pending(context)["started_at"]))


class ReleaseLeaseOperator(StepOperator):
    """Frees the run group's lease after teardown, recording whether the group's resources were kept (warm)."""

    ui_color = "#fbe9e3"

    def execute(self, context: Context) -> dict[str, Any]:
        """Release the lease this run holds (a run that lost it releases nothing)."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.lease import release

        spec = self.run_spec(context)
        owner = self.identity(context, spec)
        kept = [
            s.task_id
            for s in topology.teardown_steps()
            if s.task_id != self.step_id and (pull(context, s.task_id) or {}).get("action") in outcomes.KEPT
        ]
        # Every resource of the group deleted (or never there): its lease record goes too, so the project's
        # metadata does not keep one record per group ever made (docs/request-budget.md).
        deletes = [s.task_id for s in topology.teardown_steps() if s.op is topology.Op.DELETE_GCP]
        gone = not kept and all((pull(context, d) or {}).get("action") in outcomes.GONE for d in deletes)
        freed = release(self.hook, spec.project, owner, warm=bool(kept), gone=gone)
        if freed is None:
            self.log.warning("Run %s did not hold the lease of group %s: nothing released", owner.run, owner.group)
            return {"group": owner.group, "action": "not-held"}
        if gone:
            self.log.info("Lease record of group %s removed: nothing of the group is left", owner.group)
            return {"group": owner.group, "action": "removed", "warm": False}
        self.log.info("Lease of group %s released%s", owner.group, f"; kept: {', '.join(kept)}" if kept else "")
        return {"group": owner.group, "action": "released", "warm": bool(kept)}
