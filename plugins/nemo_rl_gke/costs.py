"""What a run's cloud resources cost per hour, and which of them are still up: the training view's banner.

The banner shows each resource that costs (or whose price is unknown) on its own row, and folds the free ones (networks,
subnets, firewall rules, ...: most of a run's resources) into one line that still says what state they are in, so a
kept network never reads like a deleted one (:func:`banner`).

Rough on-demand list-price estimates (USD, us-central1), for a ballpark while a run is going, not a bill: GPU nodes
use the run report's per-GPU prices (or the conf's ``gpu_hour_price_usd``), the rest the tables below. Networks,
subnets, firewall rules, the reserved peering range and the peering itself cost nothing while idle; the RayCluster
costs what its nodes cost, which the pools already count.

A resource counts as still up from the moment its ensure step started until its teardown step reports it gone
(:data:`nemo_rl_gke.outcomes.GONE`); a teardown that kept it says why. Pure and stdlib-only: the API server imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke import outcomes, topology
from nemo_rl_gke.report import DEFAULT_GPU_HOUR_PRICES_USD

if TYPE_CHECKING:
    from nemo_rl_gke.spec import RunSpec

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

# Ensure-step states in which the resource may exist (a failed create can leave one behind, e.g. in ERROR).
_UP = {
    "success": "up",
    "running": "being created",
    "deferred": "being created",
    "queued": "being created",
    "restarting": "being created",
    "up_for_retry": "create failed, retrying",
    "failed": "create failed: may exist",
}
_DELETING = {"running", "deferred", "queued", "up_for_retry", "restarting"}
# What each ensure/apply step makes, for people: the kind, and the RunSpec attribute holding its name.
_KINDS: dict[str, tuple[str, str]] = {
    topology.NET: ("VPC network", "network"),
    topology.GVNIC_NET: ("VPC network", "gvnic_network"),
    topology.GVNIC_SUB: ("subnet", "gvnic_subnet"),
    topology.GVNIC_FW: ("firewall rule", "gvnic_firewall"),
    topology.RDMA_NET: ("VPC network (RDMA)", "rdma_network"),
    **{sub: ("subnet (RDMA)", "") for sub in topology.RDMA_SUBS},
    topology.PEERING_RANGE: ("peering range", "peering_range"),
    topology.LUSTRE_FW: ("firewall rule", "lustre_firewall"),
    topology.PEERING: ("Service Networking peering", "network"),
    topology.LUSTRE: ("Managed Lustre instance", "lustre_name"),
    topology.GKE_CLUSTER: ("GKE cluster", "cluster_name"),
    topology.NODE_POOL: ("GPU node pool", "node_pool_name"),
    topology.RAYCLUSTER: ("RayCluster", "raycluster_name"),
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


def gpu_price(spec: RunSpec) -> float | None:
    """USD per GPU-hour: the conf's price, else the package's estimate for the GPU type."""
    if spec.gpu_hour_price_usd > 0:
        return float(spec.gpu_hour_price_usd)
    return DEFAULT_GPU_HOUR_PRICES_USD.get(spec.gpu_type)


def hourly_cost(task_id: str, spec: RunSpec) -> tuple[float | None, str]:
    """The estimated USD per hour of what ``task_id`` makes, and how it was estimated."""
    if task_id == topology.NODE_POOL:
        price = gpu_price(spec)
        gpus = spec.worker_replicas * spec.gpus_per_node
        basis = f"{spec.worker_replicas} x {spec.gpu.machine_type} ({gpus} x {spec.gpu_type}) at the pool's full size"
        return (None if price is None else price * gpus), basis
    if task_id == topology.GKE_CLUSTER:
        nodes = spec.system_initial_nodes * ZONES_PER_REGION
        node_price = MACHINE_HOUR_PRICES_USD.get(spec.system_machine_type)
        basis = f"management fee + {nodes} x {spec.system_machine_type} (default pool)"
        if node_price is None:
            return None, basis + ": no price for that machine type"
        return GKE_CLUSTER_HOUR_USD + nodes * node_price, basis
    if task_id == topology.LUSTRE:
        per_gib = LUSTRE_GIB_HOUR_USD.get(spec.lustre_throughput)
        basis = f"{spec.lustre_capacity_gib:,} GiB at {spec.lustre_throughput} MB/s/TiB"
        return (None if per_gib is None else per_gib * spec.lustre_capacity_gib), basis
    if task_id == topology.RAYCLUSTER:
        return 0.0, "runs on the pools' nodes"
    return 0.0, "no charge while idle"


def _made_by() -> tuple[str, ...]:
    """Every step that makes a cloud resource or the RayCluster, in creation order."""
    return (*(s.task_id for s in topology.gcp_resources()), topology.RAYCLUSTER)


def _deleted_by(task_id: str) -> str | None:
    """The teardown step that deletes what ``task_id`` makes (the node pool goes with its cluster)."""
    counterpart = topology.teardown_of(task_id) or topology.teardown_of(topology.GKE_CLUSTER)
    return None if counterpart is None else counterpart.task_id


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
    for task_id in _made_by():
        state = _UP.get(states.get(task_id, "none"))
        if state is None:
            continue
        made = results.get(task_id) or {}
        if made.get("action") == outcomes.ADOPTED:
            continue  # someone else's: it was up before this run and stays after it; not this run's cost
        teardown = _deleted_by(task_id)
        action = str((results.get(teardown) or {}).get("action") or "") if teardown else ""
        if action in outcomes.GONE:
            continue
        if action in outcomes.KEPT:
            state = f"kept ({action})"
        elif teardown and states.get(teardown) in _DELETING:
            state = "being deleted"
        kind, attr = _KINDS.get(task_id, (task_id, ""))
        name = str(made.get("name") or _spec_name(spec, task_id, attr))
        price, basis = hourly_cost(task_id, spec)
        if task_id == topology.NODE_POOL and (results.get(topology.SCALE_POOL) or {}).get("action") == (
            outcomes.SCALED_TO_ZERO
        ):
            # A warm cluster's pool at 0 nodes: it bills nothing until the next run's pods ask for GPUs.
            state, price, basis = "kept warm at 0 nodes", 0.0, "scaled to 0 nodes by teardown"
        found.append(RunningResource(task_id, kind, name, state, price, basis))
    # What costs most first: the banner is read top down.
    return sorted(found, key=lambda r: -(r.usd_per_hour or 0.0))


def _spec_name(spec: RunSpec, task_id: str, attr: str) -> str:
    """The resource's name as the RunSpec derives it (when its step has not reported one)."""
    if task_id in topology.RDMA_SUBS:
        return spec.rdma_subnets[topology.RDMA_SUBS.index(task_id)]
    return str(getattr(spec, attr)) if attr else task_id


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
