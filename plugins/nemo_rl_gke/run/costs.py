"""Prices, and what of a run is still up and what it costs: the one home the run report, the alerts and the
training view's banner read.

The banner shows each resource that costs (or whose price is unknown) on its own row, and folds the free ones (networks,
subnets, firewall rules, ...: most of a run's resources) into one line that still says what state they are in, so a
kept network never reads like a deleted one (:func:`banner`).

Rough on-demand list-price estimates (USD, us-central1), for a ballpark while a run is going, not a bill: GPU nodes
at a per-GPU-hour price (the conf's ``gpu_hour_price_usd``, else :data:`DEFAULT_GPU_HOUR_PRICES_USD`), the rest the
tables below, each resource by its step's cost kind (:class:`nemo_rl_gke.run.topology.Cost`). Networks, subnets,
firewall rules, the reserved peering range and the peering itself cost nothing while idle; the RayCluster costs what
its nodes cost, which the pools already count.

A resource counts as still up from the moment its ensure step started until its teardown step reports it gone
(:data:`nemo_rl_gke.run.outcomes.GONE`); a teardown that kept it says why, one that failed says it may still exist;
the GPU pool goes with its cluster, or stays at 0 nodes when teardown scaled it down (:func:`pool_after_teardown`).

:func:`still_up` is the one answer to "what of this run is up, and what does it cost": the training view's banner,
the failure alert, the deadline alert and the run report all read it, so they list the same resources at the same
prices. Adopted resources follow :data:`ADOPTED_RULE`. Pure: the API server imports it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run import capacity, outcomes, topology
from nemo_rl_gke.run import task_states as ts
from nemo_rl_gke.run.topology import Cost

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec

# Rough on-demand list prices per GPU-hour (USD) of a4-highgpu-8g (B200) and a3-ultragpu-8g (H200) divided by 8.
# Estimates for a ballpark figure, not quotes: set gpu_hour_price_usd in the run conf for your contracted price.
DEFAULT_GPU_HOUR_PRICES_USD: dict[str, float] = {"b200": 11.0, "h200": 10.6}
# The share of that list price each capacity pays, with where it comes from (as published, seen 2026-12; estimates,
# not quotes: Spot prices move, a reservation may carry a committed-use discount, set gpu_hour_price_usd for yours).
CAPACITY_PRICE_SHARES: dict[str, tuple[float, str]] = {
    "reservation": (1.0, "on-demand rates for reserved VMs (cloud.google.com/compute/docs/instances/reservations)"),
    "on_demand": (1.0, "on-demand list price (cloud.google.com/compute/gpus-pricing)"),
    "flex_start": (
        0.47,
        "Dynamic Workload Scheduler flex-start, up to 53% off (cloud.google.com/products/dws/pricing)",
    ),
    "queued": (
        0.47,
        "Dynamic Workload Scheduler flex-start with queued provisioning, priced as flex-start "
        "(cloud.google.com/products/dws/pricing)",
    ),
    "spot": (0.40, "Spot VM GPUs, about 60% off, varies (cloud.google.com/spot-vms/pricing)"),
}
# Compute Engine machine types of the CPU pool, USD per node-hour.
MACHINE_HOUR_PRICES_USD: dict[str, float] = {
    "n2-highmem-80": 4.79,
    "n2-highmem-32": 1.92,
    "n2-standard-8": 0.39,
}
# GKE's cluster management fee, per cluster-hour.
GKE_CLUSTER_HOUR_USD = 0.10
# Managed Lustre, USD per GiB-hour by throughput tier (MB/s per TiB).
LUSTRE_GIB_HOUR_USD: dict[int, float] = {125: 0.000_10, 250: 0.000_14, 500: 0.000_21, 1000: 0.000_34}
# A regional cluster's default pool runs its per-zone node count in each of the region's zones.
ZONES_PER_REGION = 3

# What teardown left of the GPU pool (:func:`pool_after_teardown`).
POOL_GONE = "gone"
POOL_SCALED_TO_ZERO = outcomes.SCALED_TO_ZERO
POOL_UP = "up"

# A resource whose teardown step failed, or never ran because an earlier deletion failed.
DELETION_FAILED = "deletion failed: may still exist"
NOT_DELETED = "not deleted: an earlier deletion failed"

# The one rule for resources a run adopted (an ensure step's action ``adopted``), stated once for every surface.
ADOPTED_RULE = (
    "an adopted resource is someone else's: it was up before this run and stays after it, billed to whoever made it, "
    "so it is never listed as this run's nor counted in its USD per hour"
)

# Ensure-step states in which the resource may exist (a failed create can leave one behind, e.g. in ERROR).
_UP = {
    ts.SUCCESS: "up",
    **dict.fromkeys(sorted(ts.AT_WORK - {ts.UP_FOR_RETRY}), "being created"),
    ts.UP_FOR_RETRY: "create failed, retrying",
    ts.FAILED: "create failed: may exist",
}


@dataclass(frozen=True)
class RunningResource:
    """A resource of the run that is (or may be) up, with its estimated hourly cost (None: no price known)."""

    task_id: str
    kind: str
    name: str
    state: str
    usd_per_hour: float | None
    basis: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the price rounded to a cent's hundredth: it is an estimate)."""
        data = asdict(self)
        if self.usd_per_hour is not None:
            data["usd_per_hour"] = round(self.usd_per_hour, 4)
        return data


def gpu_hour_price(gpu_type: str, conf_price_usd: float = 0.0, capacity: str = "") -> tuple[float | None, str]:
    """USD per GPU-hour and where it comes from: the estimate for the GPU type (its list price, times the capacity's
    share of it when one is given: "default"), or the conf's price where it is higher ("conf"; with no estimate for
    the GPU, the conf's price whatever it is), else ``(None, "unknown")``.

    The one price every figure of a run uses: the budget's deadline, the stop message, the report and the view. The
    conf may raise it, never lower it: the conf is untrusted, and a tiny price would stretch a USD budget."""
    estimate = None
    if gpu_type in DEFAULT_GPU_HOUR_PRICES_USD:
        share, _ = CAPACITY_PRICE_SHARES.get(capacity, (1.0, ""))
        estimate = DEFAULT_GPU_HOUR_PRICES_USD[gpu_type] * share
    if conf_price_usd > 0 and (estimate is None or conf_price_usd > estimate):
        return float(conf_price_usd), "conf"
    if estimate is not None:
        return estimate, "default"
    return None, "unknown"


def capacity_price_basis(capacity: str) -> str:
    """How the default price of a capacity is made ("0.40 x list: Spot VM GPUs, ...")."""
    share, source = CAPACITY_PRICE_SHARES.get(capacity, (1.0, "list price"))
    return f"{share:.2f} x list: {source}"


def pool_usd_per_hour(price_per_gpu_hour: float | None, gpus_per_node: int, nodes: int) -> float | None:
    """USD per hour of a GPU pool of ``nodes`` nodes at a per-GPU-hour price (None: no price known)."""
    return None if price_per_gpu_hour is None else price_per_gpu_hour * (gpus_per_node * nodes)


def hourly_cost(task_id: str, spec: RunSpec) -> tuple[float | None, str]:
    """The estimated USD per hour of what ``task_id`` makes, and how it was estimated (by its step's cost kind)."""
    cost = topology.step(task_id).cost
    if cost is Cost.GPU_NODES:
        price, source = gpu_hour_price(spec.gpu_type, spec.gpu_hour_price_usd, spec.capacity)
        gpus = spec.worker_replicas * spec.gpus_per_node
        basis = (
            f"{spec.worker_replicas} x {spec.gpu.machine_type} ({gpus} x {spec.gpu_type}) at the pool's full size, "
            f"{spec.capacity}"
        )
        if source == "default" and spec.capacity != "reservation":
            basis += f" ({capacity_price_basis(spec.capacity)})"
        return pool_usd_per_hour(price, spec.gpus_per_node, spec.worker_replicas), basis
    if cost is Cost.CLUSTER:
        nodes = spec.system_initial_nodes * ZONES_PER_REGION
        node_price = MACHINE_HOUR_PRICES_USD.get(spec.system_machine_type)
        basis = f"management fee + {nodes} x {spec.system_machine_type} (default pool)"
        if node_price is None:
            return None, basis + ": no price for that machine type"
        return GKE_CLUSTER_HOUR_USD + nodes * node_price, basis
    if cost is Cost.LUSTRE:
        per_gib = LUSTRE_GIB_HOUR_USD.get(spec.lustre_throughput)
        basis = f"{spec.lustre_capacity_gib:,} GiB at {spec.lustre_throughput} MB/s/TiB"
        return (None if per_gib is None else per_gib * spec.lustre_capacity_gib), basis
    if cost is Cost.ON_NODES:
        return 0.0, "runs on the pools' nodes"
    return 0.0, "no charge while idle"


def pool_after_teardown(actions: Mapping[str, str], ended: Collection[str] | None = None) -> str:
    """What the teardown steps' actions (task id -> action) left of the GPU pool: :data:`POOL_GONE` (the deletion
    it goes with took it), :data:`POOL_SCALED_TO_ZERO` (kept, scaled to 0 nodes) or :data:`POOL_UP`. With
    ``ended``, only the actions of those task ids count (the report counts the pool's hours until such an end)."""

    def did(task_id: str) -> str | None:
        return actions.get(task_id) if ended is None or task_id in ended else None

    deletion = topology.deleted_by(topology.NODE_POOL)
    if deletion is not None and did(deletion.task_id) in outcomes.GONE:
        return POOL_GONE
    if did(topology.SCALE_POOL) == outcomes.SCALED_TO_ZERO:
        return POOL_SCALED_TO_ZERO
    return POOL_UP


def _made_by() -> tuple[str, ...]:
    """Every step whose resource the banner lists (it has a cost kind), in creation order."""
    return tuple(s.task_id for s in topology.STEPS.values() if s.cost is not None)


def still_running(
    spec: RunSpec,
    states: Mapping[str, str],
    results: Mapping[str, Mapping[str, Any] | None],
) -> list[RunningResource]:
    """The run's resources that are (or may be) up, from its task states and the tasks' return values.

    ``states`` maps task id to task-instance state; ``results`` maps task id to its return XCom (an ensure step's
    ``{"name", "action"}``, a teardown step's ``{"action"}``). A resource whose teardown reported it gone is left out;
    one a teardown kept stays, labelled with why.
    """
    found = []
    actions = {t: str((r or {}).get("action") or "") for t, r in results.items()}
    for task_id in _made_by():
        state = _UP.get(states.get(task_id, ts.NONE))
        if state is None:
            continue
        made = results.get(task_id) or {}
        if made.get("action") == outcomes.ADOPTED:
            continue  # ADOPTED_RULE
        teardown = topology.deleted_by(task_id)
        action = actions.get(teardown.task_id, "") if teardown else ""
        if action in outcomes.GONE:
            continue
        ended = states.get(teardown.task_id) if teardown else None
        if action in outcomes.KEPT:
            state = f"kept ({action})"
        elif ended in ts.AT_WORK:
            state = "being deleted"
        elif ended == ts.FAILED:
            state = DELETION_FAILED
        elif ended == ts.UPSTREAM_FAILED:
            state = NOT_DELETED
        step = topology.step(task_id)
        name = str(made.get("name") or _spec_name(spec, step))
        price, basis = hourly_cost(task_id, spec)
        if task_id == topology.NODE_POOL and pool_after_teardown(actions) == POOL_SCALED_TO_ZERO:
            # A warm cluster's pool at 0 nodes: it bills nothing until the next run's pods ask for GPUs.
            state, price, basis = "kept warm at 0 nodes", 0.0, "scaled to 0 nodes by teardown"
        found.append(RunningResource(task_id, step.makes or task_id, name, state, price, basis))
    # What costs most first: the banner is read top down.
    return sorted(found, key=lambda r: -(r.usd_per_hour or 0.0))


def still_up(
    spec: RunSpec | None,
    states: Mapping[str, str],
    results: Mapping[str, Any],
) -> list[RunningResource]:
    """What of a run is (or may be) up and its price: :func:`still_running` for the RunSpec of validate's accepted
    conf, priced as the capacity that served the run (a ladder's served rung, read from ``kube.raycluster``'s
    result). Without an accepted conf (``spec`` None) nothing was created: the empty list. ``results`` maps task id
    to its return XCom (anything but a mapping counts as none)."""
    if spec is None:
        return []
    served = capacity.served_capacity(results.get(topology.RAYCLUSTER))
    if served is not None:
        spec = capacity.on_rung(spec, served)
    mappings = {k: v for k, v in results.items() if isinstance(v, Mapping)}
    return still_running(spec, states, mappings)


def results_read(states: Mapping[str, str]) -> list[str]:
    """The task ids whose return values :func:`still_up` reads for a run in these task states: each ensure step
    that may have made its resource, its teardown step and the pool's scale-down once they ran, and the RayCluster's
    (the served capacity). A reader fetches only these (an XCom that does not exist yet is an error in the SDK)."""
    wanted = []
    for task_id in _made_by():
        if states.get(task_id, ts.NONE) in _UP:
            wanted.append(task_id)
            teardown = topology.deleted_by(task_id)
            # A kept resource's teardown step records why, then ends skipped.
            if teardown is not None and states.get(teardown.task_id) in (ts.SUCCESS, ts.SKIPPED):
                wanted.append(teardown.task_id)
    for task_id in (topology.SCALE_POOL, topology.RAYCLUSTER):
        if states.get(task_id) in (ts.SUCCESS, ts.SKIPPED):
            wanted.append(task_id)
    return list(dict.fromkeys(wanted))


def _spec_name(spec: RunSpec, step: topology.Step) -> str:
    """The resource's name as the RunSpec derives it (when its step has not reported one)."""
    if step.task_id in topology.RDMA_SUBS:
        return spec.rdma_subnets[topology.RDMA_SUBS.index(step.task_id)]
    return str(getattr(spec, step.name_attr)) if step.name_attr else step.task_id


def total_per_hour(resources: list[RunningResource]) -> float:
    """The summed estimate (resources without a price count 0)."""
    return sum(r.usd_per_hour or 0.0 for r in resources)


def _plural(kind: str, count: int) -> str:
    return f"{count} {kind}" if count == 1 else f"{count} {kind}s"


def free_line(free: list[RunningResource]) -> str:
    """One line for the free resources: how many, of which kinds, and their states ("16 free resources: 3 VPC
    networks, 9 subnets, ... - all up"); a kept one says so (``kept (kept-for-lustre)``)."""
    kinds: dict[str, int] = {}
    states: dict[str, int] = {}
    for r in free:
        family = r.kind.split(" (")[0]  # "subnet (RDMA)" counts with "subnet"
        kinds[family] = kinds.get(family, 0) + 1
        states[r.state] = states.get(r.state, 0) + 1
    what = ", ".join(_plural(kind, n) for kind, n in kinds.items())
    if len(states) == 1:
        how = f"all {next(iter(states))}" if len(free) > 1 else next(iter(states))
    else:
        how = ", ".join(f"{n} {state}" for state, n in sorted(states.items(), key=lambda kv: -kv[1]))
    return f"{_plural('free resource', len(free))}: {what} - {how}, 0.00 USD/h"


def banner(resources: list[RunningResource]) -> dict[str, Any]:
    """The banner's layout: one row per resource that costs or has no known price (most expensive first), the free
    ones (0 USD/h) folded into one line, and the summed estimate."""
    costly = [r for r in resources if r.usd_per_hour != 0.0]
    free = [r for r in resources if r.usd_per_hour == 0.0]
    return {
        "count": len(resources),
        "usd_per_hour": round(total_per_hour(resources), 2),
        "costly": [r.to_dict() for r in costly],
        "free": [r.to_dict() for r in free],
        "free_line": free_line(free) if free else None,
    }
