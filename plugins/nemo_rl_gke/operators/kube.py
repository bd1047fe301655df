"""Operators that apply and delete the run's Kubernetes objects, deferring every wait on the RayCluster.

Thin glue: the objects and the apply/delete rules live in :mod:`nemo_rl_gke.kube.objects`, the API access in
:mod:`nemo_rl_gke.kube.client`, and waits go to :class:`~nemo_rl_gke.triggers.raycluster.RayClusterTrigger`.
Imported while the DAG is parsed, so the Kubernetes and Google clients are imported inside methods only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import Context

from nemo_rl_gke.airflow_compat import AirflowException, AirflowFailException
from nemo_rl_gke.links import DELETE_KUBE_LINKS
from nemo_rl_gke.operators.base import StepOperator
from nemo_rl_gke.operators.capacity import CapacityLadder
from nemo_rl_gke.run import outcomes, topology

if TYPE_CHECKING:
    from nemo_rl_gke.kube.client import KubeHook
    from nemo_rl_gke.run.deployment import Deployment
    from nemo_rl_gke.run.ownership import Owner
    from nemo_rl_gke.run.spec import RunSpec


class _KubeStep(StepOperator):
    """A step on the run's cluster: the Kubernetes hook and the deferred wait for the RayCluster."""

    def kube(self, spec: RunSpec) -> KubeHook:
        """The Kubernetes hook of the run's cluster (endpoint, CA and token from the GCP connection)."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.kube.client import KubeHook

        return KubeHook(spec, self.hook)

    def wait_for_raycluster(self, context: Context, spec: RunSpec, wait_for: str, result: dict[str, Any]) -> None:
        """Defer until the RayCluster is ``ready`` or ``deleted``; ``execute_complete`` returns ``result``."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.triggers.raycluster import RayClusterTrigger

        self.defer_until(
            context,
            spec,
            RayClusterTrigger,
            what=f"RayCluster {spec.namespace}/{spec.raycluster_name} to be {wait_for}",
            pending=result,
            cluster_path=spec.cluster_path,
            namespace=spec.namespace,
            name=spec.raycluster_name,
            wait_for=wait_for,
        )


class ApplyKubeObjectsOperator(CapacityLadder, _KubeStep):
    """Applies the step's group of Kubernetes objects server-side; for the RayCluster, waits until it is ready,
    falling down the run's capacity ladder while its GPU nodes do not come (:mod:`nemo_rl_gke.operators.capacity`).

    Groups: the NCCL RDMA installer, the network mapping, the Lustre PV/PVC (with the Lustre instance's IP) and the
    RayCluster. Re-applying an unchanged object leaves it (and its resourceVersion) as it is. Returns
    ``{"group", "objects": [{"object", "action", "resourceVersion"}]}``, and for the RayCluster ``capacity``: every
    rung tried (capacity, wait, start, end, outcome, message).
    """

    ui_color = "#e6f2e6"

    def execute(self, context: Context) -> dict[str, Any]:
        """Validate and apply the group; defer on the RayCluster's readiness."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.kube.client import KubeApiError
        from nemo_rl_gke.kube.objects import (
            InvalidManifestError,
            NotOwnedObjectError,
            apply_objects,
            group_objects,
            lustre_ip,
        )

        spec = self.run_spec(context)
        owner = self.identity(context, spec)
        # The PV names the Lustre instance by its IP, which exists only once Lustre does (it needs Lustre).
        address = lustre_ip(spec, self.hook) if topology.LUSTRE in self.step.needs else None
        where = {"lustre_address": address} if address else {}
        objects = group_objects(spec, self.step_id, owner, deployment=self.deployment, **where)
        try:
            results = apply_objects(self.kube(spec), objects, owner, adopt=spec.adopt_existing)
        except (InvalidManifestError, NotOwnedObjectError) as exc:
            raise AirflowFailException(str(exc)) from exc
        except KubeApiError as exc:
            if exc.status is not None and 400 <= exc.status < 500 and exc.status not in (408, 429):
                raise AirflowFailException(f"the cluster refused {self.step_id}: {exc}") from exc
            raise
        result = {"group": self.step_id, "objects": [r.to_dict() for r in results]}
        if self.step_id == topology.RAYCLUSTER:
            self.wait_on_rung(context, spec, result, self.current_rung(context, spec))
        return result

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the readiness wait: the result, or a failure naming the missing condition and the pods."""
        if self.step_id == topology.RAYCLUSTER:
            return self.rung_ended(context, self.run_spec(context), event)
        if event.get("status") == "success":
            self.log.info("%s", event.get("message"))
            return self.pending(context)
        # The message already says what is stuck (Pending, Unschedulable, image pulls): a retry would wait again.
        raise AirflowFailException(f"{event.get('status', 'error')}: {event.get('message', 'no message')}")


class DeleteKubeObjectsOperator(_KubeStep):
    """Deletes the groups of Kubernetes objects the step deletes (in the topology's order), if the policy lets them go.

    A cluster that no longer exists took its objects with it. Before deleting the RayCluster the task copies its Ray
    session logs to the export bucket (bounded, never failing the task: :mod:`nemo_rl_gke.ray.log_archive`); after,
    it waits, deferred, until KubeRay has removed it. 404 is done. Returns ``{"groups", "action", "objects"}``, and
    for the RayCluster ``ray_logs``: the copy's summary (:func:`nemo_rl_gke.run.ray_logs.summarize`).
    """

    ui_color = "#fbe9e3"
    operator_extra_links = DELETE_KUBE_LINKS

    def execute(self, context: Context) -> dict[str, Any]:
        """Delete each group's objects in reverse apply order."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.kube.access import ClusterUnreachableError
        from nemo_rl_gke.kube.objects import delete_objects, group_objects
        from nemo_rl_gke.run.ray_logs import RESULT_KEY as RAY_LOGS
        from nemo_rl_gke.run.ray_logs import not_copied

        spec = self.run_spec(context)
        owner = self.identity(context, spec)
        groups = [g for g in self.step.deletes if topology.deletes_under(g, spec.teardown_policy)]
        if not groups:
            result = {"groups": list(self.step.deletes), "action": outcomes.KEPT_BY_POLICY, "objects": []}
            self.keep(context, result, f"teardown_policy={spec.teardown_policy}")
        kube = self.kube(spec)
        try:
            kube.access  # noqa: B018 - resolves the cluster first, so a missing one is told apart from API errors
        except ClusterUnreachableError as exc:
            # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
            from nemo_rl_gke.gcp.resources import resources

            cluster = resources(spec, owner)[topology.GKE_CLUSTER]
            actual = cluster.get(self.hook)
            # A cluster that is gone took its objects along; one in ERROR has no API to reach them, and the
            # cluster's own teardown step takes them along. Anything else (still provisioning) may come back.
            if actual is None or cluster.failed(actual):
                self.log.info("The objects go with the cluster: %s", exc)
                result = {"groups": groups, "action": outcomes.ABSENT, "objects": []}
                if topology.RAYCLUSTER in groups:
                    result[RAY_LOGS] = not_copied(self.ray_logs_uri(context, spec), f"no cluster to copy from: {exc}")
                return result
            raise AirflowException(f"cannot delete the {', '.join(groups)} objects yet: {exc}") from exc
        # Before the RayCluster goes, its Ray logs go to Cloud Storage: a copy that fails is recorded, never raised.
        logs = self.save_ray_logs(context, spec, owner, kube) if topology.RAYCLUSTER in groups else None
        results = [
            r
            for group in groups
            for r in delete_objects(kube, group_objects(spec, group, owner, deployment=self.deployment), owner)
        ]
        result = {"groups": groups, "action": outcomes.DELETED, "objects": [r.to_dict() for r in results]}
        if logs is not None:
            result[RAY_LOGS] = logs
        if any(r.action == outcomes.DELETED and r.ref.kind == "RayCluster" for r in results):
            self.wait_for_raycluster(context, spec, "deleted", result)
        return result

    def ray_logs_uri(self, context: Context, spec: RunSpec) -> str:
        """Where this run's Ray logs go (:meth:`RunSpec.ray_logs_uri`)."""
        return spec.ray_logs_uri(context["dag"].dag_id, context["run_id"])

    def save_ray_logs(self, context: Context, spec: RunSpec, owner: Owner, kube: KubeHook) -> dict[str, Any]:
        """Copy the RayCluster's Ray logs to the export bucket (:mod:`nemo_rl_gke.ray.log_archive`); the summary, for
        the alert and the Training view. The job's tokens are read (and masked) only to be blanked in the copy."""
        # lazy: the cloud clients (gcp/, kube.client, ray/) stay out of DAG parsing
        from nemo_rl_gke.ray.log_archive import archive_before_delete
        from nemo_rl_gke.run.ray_logs import not_copied

        uri = self.ray_logs_uri(context, spec)
        try:
            secrets = job_secret_values_lenient(spec, self.deployment)
        except Exception:
            self.log.warning("Ray logs: the job's secrets could not be read to blank them: not copied", exc_info=True)
            return not_copied(uri, "the job's secrets could not be read, so they could not be blanked")
        return archive_before_delete(spec, self.hook, kube, owner, self.deployment, uri=uri, secrets=secrets)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the deletion wait."""
        if event.get("status") == "success":
            self.log.info("%s", event.get("message"))
            return self.pending(context)
        raise AirflowException(f"{event.get('status', 'error')}: {event.get('message', 'no message')}")


def job_secret_values_lenient(spec: RunSpec, deployment: Deployment) -> list[str]:
    """The job's secret values that exist (HF token, W&B key), masked in every log: what the Ray log copy blanks. A
    missing one is no error here: the job then never had it either."""
    # lazy: execution-only (connections, the plan), kept out of DAG parsing
    from airflow.sdk import BaseHook
    from airflow.sdk.log import mask_secret

    # lazy: the plan's job (and its recipes) is read by the tasks that need it only
    from nemo_rl_gke.plan.ray_job import job_secrets

    values = []
    for secret in job_secrets(spec, deployment):
        try:
            password = BaseHook.get_connection(secret.conn_id).password
        except Exception:
            continue  # absent: nothing to blank
        if password:
            mask_secret(password)
            values.append(password)
    return values
