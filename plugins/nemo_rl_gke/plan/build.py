"""The plan of a run: every GCP request, every manifest, the Ray job and the teardown, in order, creating nothing.

The plan is built from the same request builders, templates and recipe the apply tasks use (the GCP requests from
:mod:`nemo_rl_gke.plan.provision`, which the resources send; the Lustre transfers and the validation job from
:mod:`nemo_rl_gke.plan.transfers` and :mod:`nemo_rl_gke.plan.validation`, which the checkpoint steps send), so what a
reviewer reads is what would be sent. Secrets appear only as references to the Airflow connections that hold them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.plan.manifests import TEMPLATES, render_manifests
from nemo_rl_gke.plan.model_out import conversion_job, evaluation_job
from nemo_rl_gke.plan.provision import provision_requests
from nemo_rl_gke.plan.ray_job import RUN_ID_PLACEHOLDER, JobRequest, job_request
from nemo_rl_gke.plan.transfers import lustre_export_request, lustre_import_request
from nemo_rl_gke.plan.validation import planned_validation_job
from nemo_rl_gke.run import capacity, costs, topology
from nemo_rl_gke.run.budget import run_budget
from nemo_rl_gke.run.conf_schema import EVAL_OFF
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.ownership import PLANNED_RUN, Owner, lease_key
from nemo_rl_gke.run.recipes import load_recipe
from nemo_rl_gke.run.steps import final_step, step_budget

if TYPE_CHECKING:
    from nemo_rl_gke.plan.api import ApiRequest
    from nemo_rl_gke.plan.manifests import Manifest
    from nemo_rl_gke.run.spec import RunSpec

DEFAULT_DAG_ID = "nemo_rl_grpo_gke"
# With resume=latest the step the run continues from is known only once the resume step read the lineage.
LINEAGE_STEP = "<lineage step>"


# When a shared object's create and delete are PATCHes instead (the VPC's connection, another run group's).
SHARED_WHEN = "instead, when the VPC's connection exists (another run group's): our range added to it"
SHARED_DELETE_WHEN = "instead, while other run groups' ranges stay on the connection: only ours taken out"


@dataclass(frozen=True)
class PlannedRequest:
    """A GCP request with the provisioning stage it belongs to, and when it is sent ('' always; else instead of the
    request before it, when that holds)."""

    stage: str
    request: ApiRequest
    when: str = ""


@dataclass(frozen=True)
class TeardownStep:
    """One deletion, the teardown task that performs it, and whether the run's teardown policy performs it."""

    task_id: str
    action: str
    target: str
    performed: bool
    note: str = ""
    body: dict[str, Any] | None = None  # what the request carries, when it carries anything


@dataclass(frozen=True)
class CheckpointRequests:
    """What the resume and checkpoint steps send: the import of the lineage's checkpoint into a new Lustre (only with
    ``resume=latest``), the validation job and the export of the validated step."""

    resume_import: ApiRequest | None
    validation_job: JobRequest
    export: ApiRequest
    # The Hugging Face export, and (eval_benchmark not off) the evaluations of the base model and of the run's model.
    conversion_job: JobRequest | None = None
    evaluation_jobs: tuple[JobRequest, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form for the plan."""
        return {
            "resume_import": self.resume_import.to_dict() if self.resume_import else None,
            "validation_job": self.validation_job.to_dict(),
            "conversion_job": self.conversion_job.to_dict() if self.conversion_job else None,
            "evaluation_jobs": [job.to_dict() for job in self.evaluation_jobs],
            "export": self.export.to_dict(),
        }


@dataclass(frozen=True)
class Plan:
    """Everything a run would do. Build it with :func:`build_plan`."""

    spec: RunSpec
    dag_id: str
    owner: Owner
    requests: tuple[PlannedRequest, ...]
    manifests: tuple[Manifest, ...]
    installer_source: str
    job: JobRequest
    teardown: tuple[TeardownStep, ...]
    checkpoint: CheckpointRequests
    bounds: dict[str, Any] = dataclasses.field(default_factory=dict)

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
            "identity": {
                "deployment": self.owner.deployment,
                "group": self.owner.group,
                "labels": self.owner.labels,
                "description": self.owner.description,
                "lease": {"metadata_key": lease_key(self.owner.group), "on_held": self.spec.lease_held},
            },
            "bounds": self.bounds,
            "training": _training(self.spec),
            "gcp_requests": [
                {"stage": p.stage, **p.request.to_dict(), **({"when": p.when} if p.when else {})} for p in self.requests
            ],
            "manifests": [{"source": m.template, "object": m.obj} for m in self.manifests],
            "nccl_installer_source": self.installer_source,
            "ray_job": self.job.to_dict(),
            "secrets": [{"env": s.name, "connection": s.conn_id} for s in self.job.secrets],
            "teardown": {
                "policy": self.spec.teardown_policy,
                "steps": [dataclasses.asdict(t) for t in self.teardown],
            },
            "checkpoint": self.checkpoint.to_dict(),
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
            f"0. Identity: deployment {self.owner.deployment}, run group {self.owner.group}",
            f"   lease: taken before anything is created, as project metadata item {lease_key(self.owner.group)};"
            f" if another run holds it: {spec.lease_held}",
            f"   labels (where the API has them): {json.dumps(self.owner.labels)}",
            f"   description record (elsewhere): {self.owner.description}",
            "   teardown deletes only what carries this deployment and group and this run used or created",
            *_bounds_text(self.bounds),
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
            if planned.when:
                out.append(f"       ({planned.when})")
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
            f"   training: {_training_text(spec)}",
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
            if step.body is not None:
                out += ["         " + line for line in json.dumps(step.body, indent=2).splitlines()]
        return "\n".join([*out, "", *self._checkpoint_text()]) + "\n"

    def _checkpoint_text(self) -> list[str]:
        """Section 6: the requests of the resume and checkpoint steps (listed after teardown, which they precede)."""
        checkpoint = self.checkpoint
        out = [
            "6. Resume and checkpoint steps: Lustre transfers (Lustre v1), the validation, Hugging Face export and "
            "evaluation Ray jobs"
        ]
        if checkpoint.resume_import is not None:
            out += [
                "   [train.resume, before the job is submitted; only when this run created Lustre and the lineage "
                "has a checkpoint]",
                *_request_text(checkpoint.resume_import),
            ]
        out += [
            "   [checkpoint.validate, after the job: a Ray job on the same cluster, no secrets]",
            *_job_text(checkpoint.validation_job),
        ]
        if checkpoint.conversion_job is not None:
            out += [
                "   [checkpoint.convert, once the checkpoint is valid: the Hugging Face export into step_N/hf, a Ray "
                "job on the head, no GPU]",
                *_job_text(checkpoint.conversion_job),
            ]
        for evaluation in checkpoint.evaluation_jobs:
            base = evaluation.submission_id.endswith("-eval-base")
            what = "the base model, once per release, model, benchmark and settings" if base else "the run's model"
            out += [f"   [checkpoint.evaluate: {what}, on the GPU workers]", *_job_text(evaluation)]
        out += [
            "   [checkpoint.export, once the checkpoint is valid, whatever the conversion did]",
            *_request_text(checkpoint.export),
        ]
        return out


def _job_text(request: JobRequest) -> list[str]:
    """One Ray job as section 6 lists it: id, entrypoint, runtime env (secrets redacted), metadata."""
    job = request.to_dict()
    return [
        f"   submission_id: {job['submission_id']}",
        "   entrypoint:",
        *["     " + line for line in request.entrypoint.splitlines()],
        "   runtime_env: " + json.dumps(job["runtime_env"]),
        "   metadata: " + json.dumps(job["metadata"]),
    ]


def _request_text(req: ApiRequest) -> list[str]:
    """One request as section 1 lists it: the call, then its body."""
    lines = [f"   {req.http_method} {req.path}  ({req.service} {req.method}: {req.resource})"]
    if req.body is not None:
        lines += ["     " + line for line in json.dumps(req.body, indent=2).splitlines()]
    return lines


def gcp_requests(spec: RunSpec, owner: Owner) -> list[PlannedRequest]:
    """Provisioning requests in the topology's creation order, each tagged with its stage."""
    planned = []
    for s in provision_requests(spec, owner).values():
        planned += [PlannedRequest(s.stage, request) for request in s.planned]
        if s.shared is not None:
            planned.append(PlannedRequest(s.stage, s.shared[0], SHARED_WHEN))
    return planned


def checkpoint_requests(
    spec: RunSpec, dag_id: str, run_id: str, job: JobRequest, deployment: Deployment | None = None
) -> CheckpointRequests:
    """The requests of the resume and checkpoint steps of the run whose training job is ``job``.

    With ``resume=latest`` the lineage decides the import's source and step, and ``steps_per_run`` the final step:
    they are shown as placeholders. A run that converges stops at an earlier save, which is then the one validated
    and exported.
    """
    resume_import = None
    step: int | str = final_step(spec, load_recipe(spec.recipe))
    if spec.resumes:
        source = f"gs://{spec.export_bucket_name}/{dag_id}/<the lineage's run>/"
        resume_import = lustre_import_request(spec, dag_id, run_id, source, LINEAGE_STEP)
        if spec.steps_per_run:
            step = f"<lineage step + {spec.steps_per_run}>"
    return CheckpointRequests(
        resume_import=resume_import,
        validation_job=planned_validation_job(spec, dag_id, run_id, job.submission_id, step),
        conversion_job=conversion_job(spec, dag_id, run_id, job.submission_id, step=step, deployment=deployment),
        evaluation_jobs=tuple(
            evaluation_job(spec, dag_id, run_id, job.submission_id, step=at, deployment=deployment)
            for at in ((None, step) if spec.eval_benchmark != EVAL_OFF else ())
        ),
        export=lustre_export_request(spec, dag_id, run_id, step),
    )


def _training(spec: RunSpec) -> dict[str, Any]:
    """The step budget: what max_steps asks, what the recipe dataset's epochs allow, and the steps the job runs."""
    budget = step_budget(spec, load_recipe(spec.recipe))
    if budget is None:
        return {"max_steps": spec.max_steps, "epoch_cap": None, "steps": spec.max_steps}
    return {"max_steps": spec.max_steps, "epoch_cap": budget.epoch_cap, "steps": budget.effective}


def _training_text(spec: RunSpec) -> str:
    """The step budget in a line."""
    budget = step_budget(spec, load_recipe(spec.recipe))
    return budget.explain() if budget else f"max_steps={spec.max_steps} (the dataset's size is unknown)"


def teardown_steps(spec: RunSpec, manifests: list[Manifest], owner: Owner) -> list[TeardownStep]:
    """Deletions in the topology's teardown order (FACTS §4): the RayCluster, the other Kubernetes objects (each
    group in reverse apply order), Lustre, peering, range, cluster, firewall, subnets, networks. Lustre goes only
    after the checkpoint export succeeded, unless loss is accepted."""
    found = provision_requests(spec, owner)
    lustre_note = (
        "even if the export failed: accept_checkpoint_loss is true"
        if spec.accept_checkpoint_loss
        else f"only after the checkpoint export to gs://{spec.export_bucket_name} succeeded, else kept"
    )
    steps: list[TeardownStep] = []
    for teardown in topology.teardown_steps():
        for target in teardown.deletes:
            performed = topology.deletes_under(target, spec.teardown_policy)
            if target in TEMPLATES:
                for m in reversed([m for m in manifests if m.template == TEMPLATES[target]]):
                    where = f"{m.namespace}/" if m.namespace else ""
                    steps.append(TeardownStep(teardown.task_id, "DELETE", f"{m.kind} {where}{m.name}", performed))
                continue
            req = found[target].delete
            note = lustre_note if target == topology.LUSTRE else ""
            target_text = f"{req.path} ({req.resource})"
            steps.append(TeardownStep(teardown.task_id, req.http_method, target_text, performed, note, req.body))
            shared = found[target].shared
            if shared is not None:
                leave = shared[1]
                text = f"{leave.path} ({leave.resource})"
                steps.append(
                    TeardownStep(teardown.task_id, leave.http_method, text, performed, SHARED_DELETE_WHEN, leave.body)
                )
    return steps


def build_plan(
    spec: RunSpec,
    dag_id: str = DEFAULT_DAG_ID,
    run_id: str = RUN_ID_PLACEHOLDER,
    deployment: Deployment | None = None,
) -> Plan:
    """The plan of a validated spec for one DAG run (the run id fixes the Ray submission id).

    ``deployment`` resolves which connections the job's secrets come from and whose resources the run owns (None:
    the defaults).
    """
    deployment = deployment or Deployment()
    run = PLANNED_RUN if run_id == RUN_ID_PLACEHOLDER else f"{dag_id}/{run_id}"
    owner = Owner(deployment.deployment_id, spec.group_id, run)
    recipe = load_recipe(spec.recipe)
    manifests = render_manifests(spec, recipe.image_for(spec), owner)
    # With resume=latest the step the job checks for is known only once the resume step read the lineage.
    job = job_request(spec, recipe, dag_id, run_id, deployment, resumed_step=LINEAGE_STEP if spec.resumes else None)
    return Plan(
        spec=spec,
        dag_id=dag_id,
        owner=owner,
        requests=tuple(gcp_requests(spec, owner)),
        manifests=tuple(manifests),
        installer_source=spec.nccl_installer_source,
        job=job,
        teardown=tuple(teardown_steps(spec, manifests, owner)),
        checkpoint=checkpoint_requests(spec, dag_id, run_id, job, deployment),
        bounds=plan_bounds(spec, deployment),
    )


def plan_bounds(spec: RunSpec, deployment: Deployment) -> dict[str, Any]:
    """The deployment's bounds this run was judged against ([nemo_rl_gke]; the conf cannot change them), and the
    run's budget under them (the conf's lower limits applied; None: no limit)."""
    budget = run_budget(spec, deployment)
    return {
        "allowed_projects": list(deployment.projects),
        "allowed_regions": list(deployment.allowed_regions),
        "allowed_export_buckets": list(deployment.export_buckets(spec.project)),
        "gpu_nodes": spec.gpu_nodes,
        "max_gpu_nodes_per_run": deployment.max_gpu_nodes_per_run,
        "max_gpu_nodes_total": deployment.max_gpu_nodes_total,
        "allowed_recipes": list(deployment.allowed_recipes) or ["(every shipped recipe)"],
        "budget_hours": None if budget.hours is None else round(budget.hours, 4),
        "budget_usd": None if budget.usd is None else round(budget.usd, 2),
        "setup_reserve_s": load_recipe(spec.recipe).setup_s,
        "budget_overrun_minutes": deployment.budget_overrun_minutes,
        "allowed_capacity": list(deployment.allowed_capacity),
        "max_gpu_hour_usd": deployment.max_gpu_hour_usd or None,
        "capacity": spec.capacity,
        "capacity_usd_per_hour": costs.hourly_cost(topology.NODE_POOL, spec)[0],
        "capacity_price_basis": costs.capacity_price_basis(spec.capacity),
        "capacity_ladder": [
            {
                "capacity": rung.capacity,
                "wait_s": rung.wait_s,
                "usd_per_hour": costs.hourly_cost(topology.NODE_POOL, capacity.on_rung(spec, rung.capacity))[0],
            }
            for rung in capacity.ladder(spec)
        ],
    }


def _bounds_text(bounds: dict[str, Any]) -> list[str]:
    price = bounds["max_gpu_hour_usd"]
    ceiling = "any price" if price is None else f"at most {price:g} USD"
    return [
        f"   bounds ([nemo_rl_gke], set by the deployment): projects {', '.join(bounds['allowed_projects'])}; "
        f"regions {', '.join(bounds['allowed_regions'])}; export buckets {', '.join(bounds['allowed_export_buckets'])}",
        f"   GPU nodes: this run {bounds['gpu_nodes']} of max_gpu_nodes_per_run {bounds['max_gpu_nodes_per_run']}; "
        f"with this deployment's other live runs in the project at most {bounds['max_gpu_nodes_total']} "
        "(max_gpu_nodes_total, checked when the lease is taken); recipes "
        f"{', '.join(bounds['allowed_recipes'])}; capacity options {', '.join(bounds['allowed_capacity'])}, "
        f"{ceiling} per GPU-hour",
        f"   budget: {_limit_text(bounds['budget_hours'], 'h')}, {_limit_text(bounds['budget_usd'], 'USD')} "
        "(max_run_hours from the run's start, max_run_usd from the GPU pool's, flex-start's max run hours, the job "
        "timeout: one deadline): training gets checkpoint_must_save_by from the time left less "
        f"{bounds['setup_reserve_s']:g} s for NeMo RL's setup (the recipe's setup_s, until earlier runs measure it) "
        f"and stops at a save; {_overrun_text(bounds['budget_overrun_minutes'])}",
        f"   capacity: {bounds['capacity']}, the GPU pool at "
        f"{_limit_text(bounds['capacity_usd_per_hour'], 'USD/h').replace('no limit', 'an unknown price')} "
        f"({bounds['capacity_price_basis']}, unless gpu_hour_price_usd raises it)",
        *_ladder_text(bounds["capacity_ladder"]),
    ]


def _ladder_text(rungs: list[dict[str, Any]]) -> list[str]:
    """The ladder's rungs, when there is more than one: each one's wait for its nodes and its pool's price."""
    if len(rungs) < 2:
        return []
    tried = "; ".join(
        f"{n}. {r['capacity']} (nodes within {r['wait_s']:g} s, "
        f"{_limit_text(r['usd_per_hour'], 'USD/h').replace('no limit', 'an unknown price')})"
        for n, r in enumerate(rungs, 1)
    )
    return [
        f"   capacity ladder: {tried}. A rung that gives no nodes in time, or stocks out, has its pool replaced "
        "by the next rung's; the networks, Lustre and the cluster stay"
    ]


def _overrun_text(minutes: float) -> str:
    """What the deployment lets a late deadline save do."""
    if not minutes:
        return "no overrun to finish a late save (budget_overrun_minutes 0)"
    return f"up to {minutes:g} min past a budget or the job timeout to finish a late save (budget_overrun_minutes)"


def _limit_text(value: float | None, unit: str) -> str:
    return "no limit" if value is None else f"{value:g} {unit}"
