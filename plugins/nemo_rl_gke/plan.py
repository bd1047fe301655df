"""The plan of a run: every GCP request, every manifest, the Ray job and the teardown, in order, creating nothing.

The plan is built from the same request builders, templates and recipe the apply tasks use, so what a reviewer
reads is what would be sent. Secrets appear only as references to the Airflow connections that hold them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.rayjobs import RUN_ID_PLACEHOLDER, JobRequest, job_request
from nemo_rl_gke.recipes import load_recipe

if TYPE_CHECKING:
    from nemo_rl_gke.deployment import Deployment
    from nemo_rl_gke.gcp.api import ApiRequest
    from nemo_rl_gke.kube.manifests import Manifest
    from nemo_rl_gke.spec import RunSpec

DEFAULT_DAG_ID = "nemo_rl_grpo_gke"
# What each teardown policy deletes; everything else is kept (and adopted by the next run).
POLICY_DELETES = {
    "delete_all": {"raycluster", "kube", "lustre", "peering", "cluster", "network"},
    "keep_cluster_and_storage": {"raycluster"},
    "keep_all": set(),
}


@dataclass(frozen=True)
class PlannedRequest:
    """A GCP request with the provisioning stage it belongs to."""

    stage: str
    request: ApiRequest


@dataclass(frozen=True)
class TeardownStep:
    """One deletion, the group it belongs to, and whether the run's teardown policy performs it."""

    group: str
    action: str
    target: str
    performed: bool
    note: str = ""


@dataclass(frozen=True)
class Plan:
    """Everything a run would do. Build it with :func:`build_plan`."""

    spec: RunSpec
    dag_id: str
    requests: tuple[PlannedRequest, ...]
    manifests: tuple[Manifest, ...]
    installer_source: str
    job: JobRequest
    teardown: tuple[TeardownStep, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: for ``--format json`` and XCom."""
        recipe = load_recipe(self.spec.recipe)
        return {
            "dag_id": self.dag_id,
            "mode": self.spec.mode,
            "recipe": {
                "name": recipe.name,
                "nemo_rl_version": recipe.nemo_rl_version,
                "image": recipe.image_for(self.spec),
            },
            "conf": self.spec.to_conf(),
            "gcp_requests": [{"stage": p.stage, **p.request.to_dict()} for p in self.requests],
            "manifests": [{"source": m.template, "object": m.obj} for m in self.manifests],
            "nccl_installer_source": self.installer_source,
            "ray_job": self.job.to_dict(),
            "secrets": [{"env": s.name, "connection": s.conn_id} for s in self.job.secrets],
            "teardown": {
                "policy": self.spec.teardown_policy,
                "steps": [
                    {"group": t.group, "action": t.action, "target": t.target, "performed": t.performed, "note": t.note}
                    for t in self.teardown
                ],
            },
        }

    def to_text(self) -> str:
        """A reviewable, ordered listing (full manifests are in the JSON form)."""
        spec, recipe = self.spec, load_recipe(self.spec.recipe)
        out = [
            f"Plan for {self.dag_id}: mode={spec.mode}, recipe {recipe.name} (NeMo RL {recipe.nemo_rl_version}), "
            f"{spec.worker_replicas} x {spec.effective_machine_type} "
            f"({spec.gpus_per_node} x {spec.gpu.accelerator_type}) in {spec.zone}, project {spec.project}",
            "Nothing has been created yet. In apply mode the run makes these calls, in this order.",
            "",
            f"1. Google Cloud requests ({len(self.requests)}); storage and cluster run side by side once the main "
            "network exists",
        ]
        stage = ""
        for n, planned in enumerate(self.requests, 1):
            req = planned.request
            if planned.stage != stage:
                stage = planned.stage
                out.append(f"   [{stage}]")
            out.append(f"   {n:2}. {req.http_method} {req.path}  ({req.service} {req.method}: {req.resource})")
            if req.body is not None:
                out += ["         " + line for line in json.dumps(req.body, indent=2).splitlines()]
        out += ["", f"2. Kubernetes objects ({len(self.manifests)}), applied server-side in this order"]
        if spec.nccl_installer_source != "bundled":
            out.append(f"   - NCCL RDMA installer from {self.installer_source} (read at apply time)")
        for m in self.manifests:
            where = f"{m.namespace}/" if m.namespace else ""
            out.append(f"   - {m.api_version} {m.kind} {where}{m.name}  (from {m.template})")
        job = self.job.to_dict()
        out += [
            "",
            "3. Ray job (Jobs API, through the Kubernetes API service proxy to the head service)",
            f"   submission_id: {job['submission_id']}",
            f"   image: {recipe.image_for(spec)}",
            "   entrypoint:",
            *["     " + line for line in self.job.entrypoint.splitlines()],
            "   runtime_env:",
            *["     " + line for line in json.dumps(job["runtime_env"], indent=2).splitlines()],
            "   metadata: " + json.dumps(job["metadata"]),
            "",
            "4. Secrets the run reads at submit time (values never shown)",
            *[f"   - {s.name} <- password of Airflow connection '{s.conn_id}'" for s in self.job.secrets],
            "",
            f"5. Teardown (policy {spec.teardown_policy}); only resources this DAG created are deleted",
        ]
        for n, step in enumerate(self.teardown, 1):
            mark = "[delete]" if step.performed else "[keep]  "
            note = f"  ({step.note})" if step.note else ""
            out.append(f"   {n:2}. {mark} {step.action} {step.target}{note}")
        return "\n".join(out) + "\n"


def gcp_requests(spec: RunSpec) -> list[PlannedRequest]:
    """Provisioning requests in dependency order, each tagged with its stage."""
    from nemo_rl_gke.gcp.gke import gke_requests
    from nemo_rl_gke.gcp.lustre import lustre_create_request
    from nemo_rl_gke.gcp.networks import network_requests
    from nemo_rl_gke.gcp.peering import peering_requests

    planned = [PlannedRequest("network", r) for r in network_requests(spec)]
    planned += [PlannedRequest("storage", r) for r in [*peering_requests(spec), lustre_create_request(spec)]]
    planned += [PlannedRequest("cluster", r) for r in gke_requests(spec)]
    return planned


def teardown_steps(spec: RunSpec, manifests: list[Manifest]) -> list[TeardownStep]:
    """Deletions in the order that works (FACTS §4): RayCluster, Kubernetes objects, Lustre, peering, cluster,
    firewall, subnets, networks. Lustre goes only after the checkpoint export succeeded, unless loss is accepted."""
    from nemo_rl_gke.gcp.gke import gke_delete_requests
    from nemo_rl_gke.gcp.lustre import lustre_delete_request
    from nemo_rl_gke.gcp.networks import network_delete_requests
    from nemo_rl_gke.gcp.peering import peering_delete_requests

    deletes = POLICY_DELETES[spec.teardown_policy]
    steps: list[TeardownStep] = []
    for m in reversed(manifests):
        group = "raycluster" if m.kind == "RayCluster" else "kube"
        where = f"{m.namespace}/" if m.namespace else ""
        steps.append(TeardownStep(group, "DELETE", f"{m.kind} {where}{m.name}", group in deletes))
    steps.sort(key=lambda s: s.group != "raycluster")  # the RayCluster first: it holds the GPUs
    lustre_note = (
        "even if the export failed: accept_checkpoint_loss is true"
        if spec.accept_checkpoint_loss
        else f"only after the checkpoint export to gs://{spec.export_bucket_name} succeeded, else kept"
    )
    groups: list[tuple[str, list[ApiRequest], str]] = [
        ("lustre", [lustre_delete_request(spec)], lustre_note),
        ("peering", peering_delete_requests(spec), ""),
        ("cluster", gke_delete_requests(spec), ""),
        ("network", network_delete_requests(spec), ""),
    ]
    for group, requests, note in groups:
        for req in requests:
            steps.append(TeardownStep(group, req.http_method, f"{req.path} ({req.resource})", group in deletes, note))
    return steps


def build_plan(
    spec: RunSpec,
    dag_id: str = DEFAULT_DAG_ID,
    run_id: str = RUN_ID_PLACEHOLDER,
    deployment: Deployment | None = None,
) -> Plan:
    """The plan of a validated spec for one DAG run (the run id fixes the Ray submission id).

    ``deployment`` resolves which connections the job's secrets come from (None: the defaults).
    """
    from nemo_rl_gke.kube.manifests import render_manifests

    recipe = load_recipe(spec.recipe)
    manifests = render_manifests(spec, recipe.image_for(spec))
    return Plan(
        spec=spec,
        dag_id=dag_id,
        requests=tuple(gcp_requests(spec)),
        manifests=tuple(manifests),
        installer_source=spec.nccl_installer_source,
        job=job_request(spec, recipe, dag_id, run_id, deployment),
        teardown=tuple(teardown_steps(spec, manifests)),
    )
