"""Operator extra links: from a task to the thing it made, in the Google Cloud console, the Ray dashboard or W&B.

Modelled on the google provider's ``KubernetesEngineClusterLink`` (FACTS §10): the operator persists what the link
needs to XCom, and ``get_link`` returns it. Here the whole URL is persisted, under the link's own ``xcom_key``, by
:meth:`~nemo_rl_gke.operators.base.StepOperator.persist_links` when a try starts (built from the RunSpec, so it
shows while the task runs or is deferred). Links that depend on what the task found (the W&B run, the exported
URI, the dashboard the job was submitted to) are finished in ``get_link``, which the worker runs after the task
succeeds, fails or defers, and which reads the task's own XCom. The API server only reads these XComs back: it
never imports this module, and no plugin registration is needed.

A link class sits on an operator class, which runs many steps (one ensure operator makes every network, Lustre,
the cluster...); each link names the steps it belongs to and is empty (hidden by the UI) on the others.

The URL builders are pure functions of the RunSpec and XCom values, tested without Airflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote, urlencode

from airflow.sdk import BaseOperatorLink

from nemo_rl_gke.run import topology

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator

    from nemo_rl_gke.airflow_compat import TaskInstanceKey
    from nemo_rl_gke.run.spec import RunSpec

CONSOLE = "https://console.cloud.google.com"
# `kubectl proxy` listens here by default; it forwards to the cluster's API server with the user's own credentials.
KUBECTL_PROXY = "http://127.0.0.1:8001"


def _project(spec: RunSpec) -> str:
    return urlencode({"project": spec.project})


def gke_cluster_url(spec: RunSpec) -> str:
    """The cluster's page in the GKE console (the provider's KUBERNETES_CLUSTER_LINK format)."""
    return f"{CONSOLE}/kubernetes/clusters/details/{spec.region}/{spec.cluster_name}/details?{_project(spec)}"


def node_pool_url(spec: RunSpec) -> str:
    """The GPU node pool's page in the GKE console."""
    return f"{CONSOLE}/kubernetes/nodepool/{spec.region}/{spec.cluster_name}/{spec.node_pool_name}?{_project(spec)}"


def lustre_url(spec: RunSpec) -> str:
    """The Managed Lustre instance's page in the console."""
    return f"{CONSOLE}/managed-lustre/locations/{spec.zone}/instances/{spec.lustre_name}/details?{_project(spec)}"


def job_logs_url(spec: RunSpec) -> str:
    """Cloud Logging, filtered to the containers of the run's RayCluster (the job's driver runs on its head)."""
    query = "\n".join(
        (
            'resource.type="k8s_container"',
            f'resource.labels.project_id="{spec.project}"',
            f'resource.labels.location="{spec.region}"',
            f'resource.labels.cluster_name="{spec.cluster_name}"',
            f'resource.labels.namespace_name="{spec.namespace}"',
            f'labels."k8s-pod/ray_io/cluster"="{spec.raycluster_name}"',
        )
    )
    return f"{CONSOLE}/logs/query;query={quote(query, safe='')}?{_project(spec)}"


def ray_dashboard_url(spec: RunSpec, submitted: Mapping[str, Any] | None) -> str:
    """The Ray dashboard the job was submitted to.

    Through the GKE API server's service proxy (FACTS §6) a browser needs a Google bearer token, which a link cannot
    carry; ``kubectl proxy`` (after ``gcloud container clusters get-credentials``) adds the user's own, on
    127.0.0.1:8001, at the same path. A dashboard the deployment configured instead (``ray_dashboard_url``) is
    linked as it is.
    """
    address = str((submitted or {}).get("dashboard") or "")
    if address.startswith("https://") and spec.dashboard_proxy_path not in address:
        return address.rstrip("/") + "/"
    return f"{KUBECTL_PROXY}{spec.dashboard_proxy_path}/"


def gcs_url(uri: str) -> str:
    """A ``gs://bucket/path/`` URI as its Cloud Storage browser page ('' for anything else)."""
    # lazy: the builder the alerts and the Training view share (run/console.py), kept out of DAG parsing
    from nemo_rl_gke.run.console import gcs_url as browser_url

    return browser_url(uri)


def wandb_url(summary: Mapping[str, Any] | None) -> str:
    """The W&B run the job printed (parsed from its log), if it is an https URL."""
    url = str((summary or {}).get("wandb_url") or "")
    return url if url.startswith("https://") else ""


class RunLink(BaseOperatorLink):
    """A link of one or more steps of the run: ``steps`` says which; ``early`` builds it when a try starts."""

    name: ClassVar[str] = ""
    steps: ClassVar[frozenset[str]] = frozenset()

    def early(self, spec: RunSpec, context: Mapping[str, Any]) -> str:
        """The URL known from the RunSpec and earlier steps when the try starts ('' if not yet known)."""
        return ""

    def late(self, stored: str, ti_key: TaskInstanceKey) -> str:
        """The URL once the task has run, from its own XCom; the early one by default."""
        return stored

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        """Run by the worker after the try (success, failure or deferral); the result goes to ``xcom_key``."""
        if getattr(operator, "step_id", None) not in self.steps:
            return ""
        from airflow.sdk.execution_time.xcom import XCom

        stored = XCom.get_value(ti_key=ti_key, key=self.xcom_key)
        return self.late(stored if isinstance(stored, str) else "", ti_key)


def _own(ti_key: TaskInstanceKey, key: str) -> Any:
    from airflow.sdk.execution_time.xcom import XCom

    return XCom.get_value(ti_key=ti_key, key=key)


class GkeClusterLink(RunLink):
    """The GKE cluster, on the step that creates it."""

    name = "GKE cluster"
    steps = frozenset({topology.GKE_CLUSTER})

    def early(self, spec: RunSpec, context: Mapping[str, Any]) -> str:
        return gke_cluster_url(spec)


class GkeNodePoolLink(RunLink):
    """The GPU node pool, on the step that creates it."""

    name = "GPU node pool"
    steps = frozenset({topology.NODE_POOL})

    def early(self, spec: RunSpec, context: Mapping[str, Any]) -> str:
        return node_pool_url(spec)


class LustreInstanceLink(RunLink):
    """The Managed Lustre instance, on the step that creates it."""

    name = "Lustre instance"
    steps = frozenset({topology.LUSTRE})

    def early(self, spec: RunSpec, context: Mapping[str, Any]) -> str:
        return lustre_url(spec)


class JobLogsLink(RunLink):
    """The job's containers in Cloud Logging, on the steps that submit and follow it."""

    name = "Job logs (Cloud Logging)"
    steps = frozenset({topology.SUBMIT, topology.WAIT})

    def early(self, spec: RunSpec, context: Mapping[str, Any]) -> str:
        return job_logs_url(spec)


class RayDashboardLink(RunLink):
    """The RayCluster's dashboard, on the steps that submit and follow the job."""

    name = "Ray dashboard"
    steps = frozenset({topology.SUBMIT, topology.WAIT})

    def early(self, spec: RunSpec, context: Mapping[str, Any]) -> str:
        submitted = context["ti"].xcom_pull(task_ids=topology.SUBMIT) if context.get("ti") else None
        return ray_dashboard_url(spec, submitted if isinstance(submitted, Mapping) else None)


class WandbRunLink(RunLink):
    """The W&B run, once the job printed it (train.wait's summary XCom, set when the job ended)."""

    name = "W&B run"
    steps = frozenset({topology.WAIT})

    def late(self, stored: str, ti_key: TaskInstanceKey) -> str:
        summary = _own(ti_key, topology.JOB_SUMMARY)
        return wandb_url(summary if isinstance(summary, Mapping) else None) or stored


class ExportedCheckpointLink(RunLink):
    """The exported checkpoint in Cloud Storage: where the export goes, then where it went."""

    name = "Checkpoint in Cloud Storage"
    steps = frozenset({topology.EXPORT})

    def early(self, spec: RunSpec, context: Mapping[str, Any]) -> str:
        # lazy: the recipes load when the link is drawn, not at DAG parsing
        from nemo_rl_gke.run.recipes import load_recipe
        from nemo_rl_gke.run.steps import final_step

        step = final_step(spec, load_recipe(spec.recipe))
        return gcs_url(spec.export_uri(context["dag"].dag_id, context["run_id"], step))

    def late(self, stored: str, ti_key: TaskInstanceKey) -> str:
        result = _own(ti_key, topology.RETURN)
        uri = result.get("uri") if isinstance(result, Mapping) else None
        return gcs_url(str(uri)) if uri else stored


class RayLogsLink(RunLink):
    """The run's Ray logs in Cloud Storage, on the step that copies them before it deletes the RayCluster: where
    they go, then where they went (none when nothing was copied)."""

    name = "Ray logs in Cloud Storage"
    steps = frozenset({topology.DELETE_RAYCLUSTER})

    def early(self, spec: RunSpec, context: Mapping[str, Any]) -> str:
        return gcs_url(spec.ray_logs_uri(context["dag"].dag_id, context["run_id"]))

    def late(self, stored: str, ti_key: TaskInstanceKey) -> str:
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.run.ray_logs import summary_of

        summary = summary_of(_own(ti_key, topology.RETURN))
        if summary is None:
            return stored
        return gcs_url(str(summary.get("uri") or "")) if summary.get("files") else ""


# Which operator classes carry which links (the operators' operator_extra_links).
GCP_RESOURCE_LINKS = (GkeClusterLink(), GkeNodePoolLink(), LustreInstanceLink())
JOB_LINKS = (RayDashboardLink(), JobLogsLink())
WAIT_LINKS = (*JOB_LINKS, WandbRunLink())
EXPORT_LINKS = (ExportedCheckpointLink(),)
DELETE_KUBE_LINKS = (RayLogsLink(),)
