"""Where a GPU worker's node comes from: the cluster's GPU node pool and the capacity its nodes are made of.

GKE's cluster autoscaler adds a node to the pool for each Pending pod that asks for GPUs, and the node comes only if
the pool's capacity has one (GKE docs: cluster autoscaler, reservations, flex-start, Spot VMs). The sandbox decides
that per worker pod of a RayCluster (:mod:`sandbox.kuberay` asks before it starts the pod's Ray node):

- ``reservation`` (a SPECIFIC_RESERVATION pool): a node while the reservation has a machine free
  (``count - in_use_count``, less the nodes the sandbox already made on it); else the pod stays Pending with the
  autoscaler's ``FailedScaleUp`` (GCE out of resources) and the pool shows a ``GCE_STOCKOUT`` condition.
- ``flex_start``: the Dynamic Workload Scheduler provides the pool's nodes together, ``flex_start_delay_s`` after the
  first pod asked (null: not while the sandbox runs). A node ends ``maxRunDuration`` after it started.
- ``queued`` (``queuedProvisioning.enabled``, flex-start with queued provisioning): a node only for a pod that
  consumes a ProvisioningRequest of class ``queued-provisioning.gke.io`` (the pod's
  ``autoscaling.x-k8s.io/consume-provisioning-request`` annotation) and tolerates the nodes'
  ``cloud.google.com/gke-queued`` taint. The request is Provisioned ``flex_start_delay_s`` after it was created
  (null: never), for its podSet's ``count`` nodes; each ends ``maxRunDurationSeconds`` (the request's parameter,
  else 7 days) after it started, and a lost one is not provided again (GKE takes a new request for that).
- ``spot`` and ``on_demand``: a node unless ``spot_stockout`` / ``on_demand_stockout`` is set.

The settings are the seed's ``capacity`` record (:mod:`sandbox.config`), changed at run time through
``POST /sandbox/seed``: the fault hooks of capacity. Spot preemptions are node losses (``mode: preempted``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.store import Resource, Store

# The pod condition message the scheduler gives while no node has a free GPU, and what the autoscaler adds.
NO_NODE = "0/{n} nodes are available: {n} Insufficient nvidia.com/gpu."
STOCKOUT = (
    "Node scale up in zones {zone} associated with this pod failed: GCE out of resources ({detail}). Pod is at risk "
    "of not being scheduled."
)
# Flex-start's longest run, and a flex-start or queued node's end when its pool or request sets none (GKE docs).
MAX_RUN_S = 7 * 24 * 3600.0
QUEUED_CLASS = "queued-provisioning.gke.io"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
QUEUED_TAINT = "cloud.google.com/gke-queued"
FLEX_WAITING = (
    "pod triggered scale-up of {pool}: flex-start capacity requested from the Dynamic Workload Scheduler; the nodes "
    "come when it has capacity"
)


@dataclass(frozen=True)
class Claim:
    """What a worker pod brings to a queued pool: the ProvisioningRequest it consumes (None: not found), its name,
    and whether the pod tolerates the queued nodes' taint."""

    request_name: str
    request: dict[str, Any] | None
    tolerates_taint: bool


@dataclass(frozen=True)
class Answer:
    """Whether a node was had for a pod, and when not, the reason and message its Pending status shows."""

    granted: bool
    reason: str = ""
    message: str = ""
    pool: str = ""
    # For a queued pool: whether the pod's ProvisioningRequest is Provisioned now (None: not a queued pool).
    provisioned: bool | None = None


def pool_capacity(pool: dict[str, Any]) -> str:
    """The capacity option a pool body was created with."""
    config = pool.get("config") or {}
    if (pool.get("queuedProvisioning") or {}).get("enabled"):
        return "queued"
    if config.get("flexStart"):
        return "flex_start"
    if config.get("spot"):
        return "spot"
    affinity = (config.get("reservationAffinity") or {}).get("consumeReservationType")
    return "reservation" if affinity == "SPECIFIC_RESERVATION" else "on_demand"


def _max_run_s(pool: dict[str, Any]) -> float | None:
    found = re.fullmatch(r"(\d+(?:\.\d+)?)s", str((pool.get("config") or {}).get("maxRunDuration", "")))
    return float(found.group(1)) if found else None


class CapacityModel:
    """The nodes the sandbox made for worker pods, per pool, and the rules that say whether another one comes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # pool key -> pod -> when its node started; pool key -> when a pod first asked (flex-start's queue).
        self.nodes: dict[str, dict[str, float]] = {}
        self.asked: dict[str, float] = {}
        # pool key -> the pods refused a node by a stock-out (until one is had, or the pool goes).
        self.refused: dict[str, set[str]] = {}
        # pod -> its node's run limit in seconds, from its ProvisioningRequest (queued pools); request uid -> the
        # nodes it provided. A lost node is not provided again: on GKE that takes a new request.
        self.max_run: dict[str, float] = {}
        self.provided: dict[str, int] = {}

    def gpu_pool(self, cluster_key: str) -> Resource | None:
        """The cluster's ready node pool with GPUs (the run's one GPU pool)."""
        for resource in self.store.of_kind("container.nodePool", cluster_key + "/nodePools/"):
            if resource.phase == "ready" and (resource.body.get("config") or {}).get("accelerators"):
                return resource
        return None

    def request(self, cluster_key: str, pod: str, now: float, claim: Claim | None = None) -> Answer:
        """A node for ``pod`` now, or why not (the pod stays Pending with that reason and message). ``claim``: the
        ProvisioningRequest the pod consumes, which only a queued pool looks at."""
        pool = self.gpu_pool(cluster_key)
        if pool is None:
            return Answer(False, "Unschedulable", NO_NODE.format(n=1) + " No node pool with GPUs can scale up.")
        held = self.nodes.setdefault(pool.key, {})
        if pod in held:
            return Answer(True, pool=pool.key)
        settings = self.store.config.capacity
        kind = pool_capacity(pool.body)
        zone = ",".join(pool.body.get("locations") or [])
        problem = ""
        if kind == "reservation":
            left = [key for key in self.reservations(pool) if self.free(key) > 0]
            if not left:
                problem = STOCKOUT.format(zone=zone, detail="the specific reservation has no free machine")
        elif kind == "queued":
            return self._queued(pool, pod, now, claim)
        elif kind == "flex_start":
            first = self.asked.setdefault(pool.key, now)
            delay = settings.get("flex_start_delay_s")
            if delay is None or now < first + float(delay):
                return Answer(False, "Unschedulable", f"{NO_NODE.format(n=1)} {FLEX_WAITING.format(pool=pool.name)}")
        elif settings.get(f"{kind}_stockout"):
            problem = STOCKOUT.format(zone=zone, detail=f"no {kind.replace('_', '-')} capacity in the zone")
        if problem:
            self.refused.setdefault(pool.key, set()).add(pod)
            return Answer(False, "Unschedulable", f"{NO_NODE.format(n=1)} {problem}", pool.key)
        held[pod] = now
        self.refused.get(pool.key, set()).discard(pod)
        return Answer(True, pool=pool.key)

    def _queued(self, pool: Resource, pod: str, now: float, claim: Claim | None) -> Answer:
        """A queued pool's node: only through a Provisioned request, at most its podSet's count of them."""
        pending = NO_NODE.format(n=1) + f" The node pool {pool.name} has queued provisioning: "
        if claim is None or not claim.request_name:
            why = f"its nodes come only through a ProvisioningRequest the pod consumes ({CONSUME_ANNOTATION})."
            return Answer(False, "Unschedulable", pending + why, provisioned=False)
        if not claim.tolerates_taint:
            why = f"its nodes carry the taint {{{QUEUED_TAINT}: true}}, which the pod does not tolerate."
            return Answer(False, "Unschedulable", pending + why, provisioned=False)
        request = claim.request
        if request is None or (request.get("spec") or {}).get("provisioningClassName") != QUEUED_CLASS:
            why = (
                f"the pod's ProvisioningRequest {claim.request_name} does not exist or is not of class {QUEUED_CLASS}."
            )
            return Answer(False, "Unschedulable", pending + why, provisioned=False)
        created = datetime.fromisoformat(request["metadata"]["creationTimestamp"]).timestamp()
        delay = self.store.config.capacity.get("flex_start_delay_s")
        if delay is None or now < created + float(delay):
            why = f"ProvisioningRequest {claim.request_name} is Accepted and waits for capacity (Provisioned=False)."
            return Answer(False, "Unschedulable", pending + why, provisioned=False)
        spec = request.get("spec") or {}
        count = int(((spec.get("podSets") or [{}])[0]).get("count") or 0)
        uid = str(request["metadata"].get("uid", claim.request_name))
        if self.provided.get(uid, 0) >= count:
            why = f"ProvisioningRequest {claim.request_name} provided its {count} node(s); more take a new request."
            return Answer(False, "Unschedulable", pending + why, provisioned=True)
        self.provided[uid] = self.provided.get(uid, 0) + 1
        self.nodes.setdefault(pool.key, {})[pod] = now
        seconds = (spec.get("parameters") or {}).get("maxRunDurationSeconds")
        self.max_run[pod] = float(seconds) if seconds else MAX_RUN_S
        return Answer(True, pool=pool.key, provisioned=True)

    def stocked_out(self, pool: Resource) -> list[str]:
        """The reservations the pool cannot grow on: others use every machine, or a pod of this pool was refused."""
        refused = bool(self.refused.get(pool.key))
        return [
            key
            for key in self.reservations(pool)
            if self.free(key) <= 0
            and (
                refused or self.store.config.reservations[key].in_use_count >= self.store.config.reservations[key].count
            )
        ]

    def release(self, pod: str, *, requeue: bool = False) -> None:
        """The pod's node is gone (its pod was deleted, or the node lost); ``requeue``: its flex-start pool's next
        node is a new request that waits in the queue again (a node that reached its maxRunDuration)."""
        for key, held in self.nodes.items():
            if held.pop(pod, None) is not None and requeue:
                self.asked.pop(key, None)

    def forget_pool(self, pool_key: str) -> None:
        """A deleted pool takes its nodes, and its flex-start request, with it."""
        for pod in self.nodes.pop(pool_key, {}):
            self.max_run.pop(pod, None)
        self.asked.pop(pool_key, None)
        self.refused.pop(pool_key, None)

    def ends_at(self, pod: str) -> float | None:
        """When the pod's flex-start node reaches its pool's maxRunDuration (None: it has no end)."""
        for key, held in self.nodes.items():
            if pod in held:
                pool = self.store.get(key)
                limit = None if pool is None else _max_run_s(pool.body)
                if pool is not None and pool_capacity(pool.body) == "flex_start":
                    return held[pod] + (limit if limit is not None else MAX_RUN_S)
                if pool is not None and pool_capacity(pool.body) == "queued":
                    return held[pod] + self.max_run.get(pod, MAX_RUN_S)
        return None

    def capacity_of(self, pod: str) -> str | None:
        """The capacity option of the pool the pod's node is in (None: it has no node)."""
        for key, held in self.nodes.items():
            if pod in held:
                pool = self.store.get(key)
                return None if pool is None else pool_capacity(pool.body)
        return None

    def reservations(self, pool: Resource) -> list[str]:
        """The keys of the specific reservations (in its zones) a pool takes its nodes from."""
        affinity = pool.body.get("config", {}).get("reservationAffinity") or {}
        if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
            return []
        project = pool.key.split("/")[1]
        found = []
        for value in affinity.get("values") or []:
            parts = value.split("/")
            owner, name = (parts[1], parts[3]) if len(parts) >= 4 and parts[0] == "projects" else (project, parts[0])
            for zone in pool.body.get("locations", []):
                key = f"projects/{owner}/zones/{zone}/reservations/{name}"
                if key in self.store.config.reservations:
                    found.append(key)
        return found

    def free(self, reservation_key: str) -> int:
        """Machines of the reservation no one uses: its count, less what others use and the sandbox's nodes on it."""
        reservation = self.store.config.reservations[reservation_key]
        used = sum(
            len(held)
            for key, held in self.nodes.items()
            if (pool := self.store.get(key)) is not None and reservation_key in self.reservations(pool)
        )
        return reservation.count - reservation.in_use_count - used

    def to_json(self) -> dict[str, Any]:
        """The settings and every node made, per pool (the admin API's ``/sandbox/capacity``)."""
        return {
            "settings": dict(self.store.config.capacity),
            "nodes": {key: sorted(held) for key, held in self.nodes.items() if held},
            "reservations_free": {key: self.free(key) for key in sorted(self.store.config.reservations)},
        }
