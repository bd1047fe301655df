"""Operators that apply and delete the run's Kubernetes objects, deferring every wait on the RayCluster.

Thin glue: the objects and the apply/delete rules live in :mod:`nemo_rl_gke.kube.objects`, the API access in
:mod:`nemo_rl_gke.kube.client`, and waits go to :class:`~nemo_rl_gke.triggers.raycluster.RayClusterTrigger`.
Imported while the DAG is parsed, so the Kubernetes and Google clients are imported inside ``execute`` only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from nemo_rl_gke.operators.gcp import DEFERRAL_BACKSTOP_S, KEPT_BY_POLICY, _GcpResourceOperator

if TYPE_CHECKING:
    from nemo_rl_gke.kube.client import KubeHook
    from nemo_rl_gke.spec import RunSpec

RAYCLUSTER_GROUP = "raycluster"
PENDING_RESULT_KEY = "pending_result"


class _KubeOperator(_GcpResourceOperator):
    """Shared plumbing: the object groups, the Kubernetes hook of the run's cluster, the RayCluster deferral."""

    def __init__(self, *, groups: Sequence[str], **kwargs: Any) -> None:
        # The objects live in the run's GKE cluster: the shared plumbing (spec, GCP hook) is keyed to that resource.
        super().__init__(resource_key="cluster", **kwargs)
        self.groups = list(groups)

    def kube(self, spec: RunSpec) -> KubeHook:
        """The Kubernetes hook of the run's cluster (endpoint, CA and token from the GCP connection)."""
        from nemo_rl_gke.kube.client import KubeHook

        return KubeHook(spec, self.hook)

    def defer_on_raycluster(
        self, context: Context, spec: RunSpec, wait_for: str, result: dict[str, Any], timeout_s: int
    ) -> None:
        """Hand the wait for the RayCluster (ready or deleted) to the triggerer.

        The result so far waits in XCom, not in the deferral's kwargs: ``airflow dags test`` drops those kwargs when
        it runs the trigger in line (it passes only the event).
        """
        from nemo_rl_gke.triggers.raycluster import RayClusterTrigger

        context["ti"].xcom_push(key=PENDING_RESULT_KEY, value=result)
        self.log.info(
            "Waiting for RayCluster %s/%s to be %s (poll every %ss, timeout %ss), no worker slot held meanwhile",
            spec.namespace,
            spec.raycluster_name,
            wait_for,
            spec.poll_interval_s,
            timeout_s,
        )
        self.defer(
            trigger=RayClusterTrigger(
                cluster_path=spec.cluster_path,
                namespace=spec.namespace,
                name=spec.raycluster_name,
                wait_for=wait_for,
                gcp_conn_id=self.gcp_conn_id,
                poll_interval=spec.poll_interval_s,
                timeout=timeout_s,
                started_at=time.time(),
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=timeout_s + DEFERRAL_BACKSTOP_S),
        )


class ApplyKubeObjectsOperator(_KubeOperator):
    """Applies one group of the run's Kubernetes objects server-side; for the RayCluster, waits until it is ready.

    Groups: ``nccl-installer``, ``network-mapping``, ``lustre-storage`` (with the Lustre instance's IP) and
    ``raycluster``. Re-applying an unchanged object leaves it (and its resourceVersion) as it is. Returns
    ``{"group", "objects": [{"object", "action", "resourceVersion"}]}``.
    """

    ui_color = "#e6f2e6"

    def __init__(self, *, group: str, **kwargs: Any) -> None:
        super().__init__(groups=[group], **kwargs)
        self.group = group

    def execute(self, context: Context) -> dict[str, Any]:
        """Validate and apply the group; defer on the RayCluster's readiness."""
        from nemo_rl_gke.kube.client import KubeApiError
        from nemo_rl_gke.kube.objects import (
            InvalidManifestError,
            NotOwnedObjectError,
            apply_objects,
            group_objects,
            lustre_ip,
        )

        spec = self.run_spec(context)
        address = lustre_ip(spec, self.hook) if self.group == "lustre-storage" else None
        objects = group_objects(spec, self.group, **({"lustre_address": address} if address else {}))
        try:
            results = apply_objects(self.kube(spec), objects, adopt=spec.adopt_existing)
        except (InvalidManifestError, NotOwnedObjectError) as exc:
            raise AirflowFailException(str(exc)) from exc
        except KubeApiError as exc:
            if exc.status is not None and 400 <= exc.status < 500 and exc.status not in (408, 429):
                raise AirflowFailException(f"the cluster refused {self.group}: {exc}") from exc
            raise
        result = {"group": self.group, "objects": [r.to_dict() for r in results]}
        if self.group == RAYCLUSTER_GROUP:
            self.defer_on_raycluster(context, spec, "ready", result, spec.stage_timeout_s("kube"))
        return result

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the readiness wait: the result, or a failure naming the missing condition and the pods."""
        if event.get("status") == "success":
            self.log.info("%s", event.get("message"))
            return context["ti"].xcom_pull(task_ids=self.task_id, key=PENDING_RESULT_KEY)
        # The message already says what is stuck (Pending, Unschedulable, image pulls): a retry would wait again.
        raise AirflowFailException(f"{event.get('status', 'error')}: {event.get('message', 'no message')}")


class DeleteKubeObjectsOperator(_KubeOperator):
    """Deletes groups of the run's Kubernetes objects (in the order given), if the teardown policy lets them go.

    ``keep_cluster_and_storage`` deletes only the RayCluster (it holds the GPU nodes); ``keep_all`` deletes nothing.
    A cluster that no longer exists took its objects with it. After deleting the RayCluster the task waits, deferred,
    until KubeRay has removed it. 404 is done. Returns ``{"groups", "action", "objects"}``.
    """

    ui_color = "#fbe9e3"

    def execute(self, context: Context) -> dict[str, Any]:
        """Delete the group's objects in reverse apply order."""
        from nemo_rl_gke.kube.access import ClusterUnreachableError
        from nemo_rl_gke.kube.objects import delete_objects, group_objects
        from nemo_rl_gke.plan import POLICY_DELETES

        spec = self.run_spec(context)
        deletes = POLICY_DELETES[spec.teardown_policy]
        groups = [g for g in self.groups if (RAYCLUSTER_GROUP if g == RAYCLUSTER_GROUP else "kube") in deletes]
        if not groups:
            self.log.info("Kubernetes objects of %s kept by teardown policy %s", self.groups, spec.teardown_policy)
            return {"groups": self.groups, "action": KEPT_BY_POLICY, "objects": []}
        kube = self.kube(spec)
        try:
            kube.access  # noqa: B018 - resolves the cluster first, so a missing one is told apart from API errors
        except ClusterUnreachableError as exc:
            from nemo_rl_gke.gcp.resources import resources

            if resources(spec)["cluster"].get(self.hook) is None:
                self.log.info("The cluster is gone, and its Kubernetes objects with it (%s)", exc)
                return {"groups": groups, "action": "absent", "objects": []}
            raise AirflowException(f"cannot delete the {', '.join(groups)} objects yet: {exc}") from exc
        results = [r for group in groups for r in delete_objects(kube, group_objects(spec, group))]
        result = {"groups": groups, "action": "deleted", "objects": [r.to_dict() for r in results]}
        if any(r.action == "deleted" and r.ref.kind == "RayCluster" for r in results):
            self.defer_on_raycluster(context, spec, "deleted", result, spec.stage_timeout_s("teardown"))
        return result

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the deletion wait."""
        if event.get("status") == "success":
            self.log.info("%s", event.get("message"))
            return context["ti"].xcom_pull(task_ids=self.task_id, key=PENDING_RESULT_KEY)
        raise AirflowException(f"{event.get('status', 'error')}: {event.get('message', 'no message')}")
