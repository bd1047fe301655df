"""Offline rules for the deployment's bounds: where a run may act (projects, regions, export buckets), which recipes
it may run, how many GPU nodes it may hold, which GPU capacity it may use and at what price, and how long and how
much it may run (:mod:`nemo_rl_gke.run.deployment`).

Whoever can trigger a run writes its conf, so the conf never widens these: each finding names the setting, the
value, the bound and who can change it (the deployment's operator, never the conf). The total across runs is also
enforced when a run takes its group's lease (:mod:`nemo_rl_gke.gcp.lease`), since only then are the others known.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from nemo_rl_gke.preflight.registry import Violation, rule
from nemo_rl_gke.run import capacity, costs
from nemo_rl_gke.run.deployment import ENV_PREFIX, SECTION, WHO_CHANGES
from nemo_rl_gke.run.findings import shown

if TYPE_CHECKING:
    from nemo_rl_gke.run.deployment import Deployment
    from nemo_rl_gke.run.recipes import Recipe
    from nemo_rl_gke.run.spec import RunSpec

BOUNDS = "deployment"
# Every bound rule's id starts so.
BOUND_RULES = "deployment."


def _setting(name: str) -> str:
    return f"[{SECTION}] {name} ({ENV_PREFIX}{name.upper()})"


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(values) if values else "nothing"


@rule(
    "deployment.project",
    BOUNDS,
    "The project is one the deployment allows",
    example={"project": "someone-elses-proj"},
    counter_example={"project": "nemo-rl-demo"},
    uses_deployment=True,
)
def project_allowed(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """A run acts only in the Google connection's project or one listed in allowed_projects."""
    allowed = deployment.projects
    if spec.project not in allowed:
        connection = (
            f"the Google connection's project {deployment.gcp_project}"
            if deployment.gcp_project
            else "no project from the Google connection (its 'project' extra is unset)"
        )
        yield Violation(
            ("project",),
            spec.project,
            f"project {shown(spec.project)} is outside the deployment's bound {_setting('allowed_projects')}: it "
            f"allows {_listed(allowed)} ({connection}, plus allowed_projects)",
            (
                f"use one of {_listed(allowed)}; only {WHO_CHANGES} can allow another project"
                if allowed
                else f"no project is allowed yet: {WHO_CHANGES} sets the project extra of the Google connection "
                "(AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT for the CLI) or allowed_projects"
            ),
        )


@rule(
    "deployment.region",
    BOUNDS,
    "The region is one the deployment allows",
    example={"region": "europe-west4", "zone": "europe-west4-b"},
    counter_example={"region": "us-central1", "zone": "us-central1-b"},
    uses_deployment=True,
)
def region_allowed(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """The region (and so the zone, which must lie in it) is on allowed_regions."""
    if spec.region not in deployment.allowed_regions:
        yield Violation(
            ("region", "zone"),
            spec.region,
            f"region {shown(spec.region)} is outside the deployment's bound {_setting('allowed_regions')}: it "
            f"allows {_listed(deployment.allowed_regions)}",
            f"use one of {_listed(deployment.allowed_regions)} (and a zone in it); only {WHO_CHANGES} can allow "
            "another region",
        )


@rule(
    "deployment.export-bucket",
    BOUNDS,
    "The export bucket is one the deployment allows",
    example={"export_bucket": "outsider-drop-box"},
    counter_example={"export_bucket": "nemo-rl-demo-nemo-rl-checkpoints"},
    uses_deployment=True,
)
def export_bucket_allowed(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """The Lustre service agent writes the trained weights to the export bucket: only allowed buckets receive them."""
    bucket = spec.export_bucket_name
    if not deployment.bucket_allowed(bucket, spec.project):
        allowed = deployment.export_buckets(spec.project)
        yield Violation(
            ("export_bucket", "project"),
            spec.export_bucket or bucket,
            f"bucket {shown(bucket)} is outside the deployment's bound {_setting('allowed_export_buckets')}: a "
            f"run in {spec.project} may export only to {_listed(allowed)} ('*' ends a prefix); the Lustre service "
            "agent would write the trained weights there",
            f"leave export_bucket empty for {spec.project}-nemo-rl-checkpoints if allowed, or use an allowed "
            f"bucket; only {WHO_CHANGES} can allow another bucket",
        )


@rule(
    "deployment.gpu-nodes",
    BOUNDS,
    "The run's GPU nodes fit the deployment's per-run and total bounds",
    example={"worker_replicas": 3, "gpu_pool_max_nodes": 3, "generation_nodes": 1},
    counter_example={"worker_replicas": 2, "gpu_pool_max_nodes": 2},
    uses_deployment=True,
)
def gpu_nodes_bounded(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """A run's GPU nodes are its pool's ceiling; they must fit max_gpu_nodes_per_run, and max_gpu_nodes_total
    (a run that alone passes the total could never take its lease)."""
    for name in ("max_gpu_nodes_per_run", "max_gpu_nodes_total"):
        bound = getattr(deployment, name)
        if spec.gpu_nodes > bound:
            yield Violation(
                ("gpu_pool_max_nodes", "worker_replicas"),
                spec.gpu_nodes,
                f"the run may hold {spec.gpu_nodes} GPU nodes (max of worker_replicas={spec.worker_replicas} and "
                f"gpu_pool_max_nodes={spec.gpu_pool_max_nodes}; generation nodes are part of worker_replicas), more "
                f"than the deployment's bound {_setting(name)} of {bound}",
                f"lower worker_replicas and gpu_pool_max_nodes to {bound} or less; only {WHO_CHANGES} can raise {name}",
            )
            return


@rule(
    "deployment.recoveries",
    BOUNDS,
    "The run's node-loss recoveries fit the deployment's bound",
    example={"max_recoveries": 6},
    counter_example={"max_recoveries": 2},
    uses_deployment=True,
)
def recoveries_bounded(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """Each recovery waits for a replacement node and trains again: the deployment caps how many a conf may ask for."""
    if spec.max_recoveries > deployment.max_recoveries:
        yield Violation(
            ("max_recoveries",),
            spec.max_recoveries,
            f"max_recoveries={spec.max_recoveries} is more than the deployment's bound "
            f"{_setting('max_recoveries')} of {deployment.max_recoveries}",
            f"set max_recoveries to {deployment.max_recoveries} or less; only {WHO_CHANGES} can raise it",
        )


@rule(
    "deployment.recipe",
    BOUNDS,
    "The recipe is one the deployment allows",
    example={"recipe": "qwen2.5-7b-gsm8k-v0.7.0"},
    counter_example={"recipe": "gemma3-27b-gsm8k-v0.5.0"},
    uses_deployment=True,
    example_deployment={"allowed_recipes": ("gemma3-27b-gsm8k-v0.5.0",)},
)
def recipe_allowed(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """With allowed_recipes set, only those recipes run (empty: every recipe shipped in include/recipes)."""
    if deployment.allowed_recipes and spec.recipe not in deployment.allowed_recipes:
        yield Violation(
            ("recipe",),
            spec.recipe,
            f"recipe {shown(spec.recipe)} is outside the deployment's bound {_setting('allowed_recipes')}: it "
            f"allows {_listed(deployment.allowed_recipes)}",
            f"use one of {_listed(deployment.allowed_recipes)}; only {WHO_CHANGES} can allow another recipe",
        )


@rule(
    "deployment.budget",
    BOUNDS,
    "The conf only lowers the deployment's max_run_hours and max_run_usd",
    example={"max_run_hours": 100},
    counter_example={"max_run_hours": 2},
    uses_deployment=True,
)
def budget_bounded(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """Whoever triggers a run may ask it to last or spend less than the deployment allows, never more (the
    budget itself is enforced while training: :mod:`nemo_rl_gke.run.budget`)."""
    for name in ("max_run_hours", "max_run_usd"):
        value, bound = getattr(spec, name), getattr(deployment, name)
        if value is not None and bound > 0 and value > bound:
            unit, verb = ("h", "last") if name == "max_run_hours" else ("USD", "spend")
            yield Violation(
                (name,),
                value,
                f"the run would {verb} up to {value:g} {unit}, more than the deployment's bound {_setting(name)} of "
                f"{bound:g} {unit}",
                f"set {name} to at most {bound:g}, or leave it empty for {bound:g}; only {WHO_CHANGES} can raise it",
            )


@rule(
    "deployment.publish",
    BOUNDS,
    "The publish policy is one the deployment allows",
    example={"publish": "always"},
    counter_example={"publish": "if_better"},
    uses_deployment=True,
    example_deployment={"allowed_publish": ("if_better", "never")},
)
def publish_allowed(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """A conf cannot publish every night's model where the deployment asks for a better score first."""
    if spec.publish not in deployment.allowed_publish:
        allowed = _listed(deployment.allowed_publish)
        yield Violation(
            ("publish",),
            spec.publish,
            f"publish={spec.publish} is outside the deployment's bound {_setting('allowed_publish')}: it allows "
            f"{allowed}",
            f"use {allowed}; only {WHO_CHANGES} can allow another policy",
        )


@rule(
    "deployment.capacity",
    BOUNDS,
    "Every GPU capacity option the run may use is one the deployment allows",
    example={"capacity": "spot"},
    counter_example={"capacity": "reservation"},
    uses_deployment=True,
    example_deployment={"allowed_capacity": ("reservation", "flex_start")},
)
def capacity_allowed(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """``capacity`` and each rung of ``capacity_ladder`` must be in allowed_capacity: a conf cannot fall back onto
    an option the deployment ruled out (Spot where a preemption is not acceptable, say)."""
    refused = [option for option in capacity.options(spec) if option not in deployment.allowed_capacity]
    if refused:
        params = ("capacity_ladder", "capacity") if spec.capacity_ladder else ("capacity",)
        allowed = _listed(deployment.allowed_capacity)
        yield Violation(
            params,
            list(capacity.options(spec)) if spec.capacity_ladder else spec.capacity,
            f"{' and '.join(refused)} {'is' if len(refused) == 1 else 'are'} outside the deployment's bound "
            f"{_setting('allowed_capacity')}: it allows {allowed}",
            f"use only {allowed} as capacity and on capacity_ladder; only {WHO_CHANGES} can allow another option",
        )


@rule(
    "deployment.gpu-price",
    BOUNDS,
    "Every GPU capacity option the run may use costs at most the deployment's max_gpu_hour_usd",
    example={"capacity": "on_demand"},
    counter_example={"capacity": "spot"},
    uses_deployment=True,
    example_deployment={"max_gpu_hour_usd": 6.0},
)
def gpu_hour_cost_bounded(spec: RunSpec, _: Recipe, deployment: Deployment) -> Iterator[Violation]:
    """Each option is priced at the price table's estimate for the GPU (a conf's gpu_hour_price_usd is the conf's
    word, so it cannot lower the price the bound sees); an option without a price cannot be judged and is refused."""
    ceiling = deployment.max_gpu_hour_usd
    if ceiling <= 0:
        return
    over = []
    for option in capacity.options(spec):
        price, _source = costs.gpu_hour_price(spec.gpu_type, 0.0, option)
        if price is None or price > ceiling:
            over.append(f"{option} ({'no price' if price is None else f'{price:g} USD'})")
    if over:
        params = ("capacity_ladder", "capacity", "gpu_type") if spec.capacity_ladder else ("capacity", "gpu_type")
        yield Violation(
            params,
            list(capacity.options(spec)) if spec.capacity_ladder else spec.capacity,
            f"a {spec.gpu_type} GPU-hour on {', '.join(over)} costs more than the deployment's bound "
            f"{_setting('max_gpu_hour_usd')} of {ceiling:g} USD (the price table's estimate, run/costs.py)",
            f"use a capacity (or ladder) whose {spec.gpu_type} GPU-hour costs {ceiling:g} USD or less; only "
            f"{WHO_CHANGES} can raise max_gpu_hour_usd",
        )
