"""The ``Node`` objects of a sandbox GKE cluster: one per node its node pools have, as the sandbox models them.

A pool's nodes are its static ones (``initialNodeCount`` in each of its zones, or its last ``setSize``: the count
the container API reports, :func:`sandbox.apis.container._node_count`) and, for the GPU pool, one node for each
worker pod the capacity model gave a node (:class:`sandbox.capacity.CapacityModel`, ``nodes``): the cluster autoscaler's
scale-up. Each Node carries what GKE's kubelet registers (GKE docs and kubernetes.io well-known labels):

- labels ``cloud.google.com/gke-nodepool``, ``node.kubernetes.io/instance-type``, ``topology.kubernetes.io/zone`` and
  ``region``, ``kubernetes.io/hostname``, ``kubernetes.io/os``/``arch``, ``cloud.google.com/machine-family``,
  ``cloud.google.com/gke-os-distribution``, ``cloud.google.com/gke-boot-disk``; on a GPU pool
  ``cloud.google.com/gke-accelerator`` (GPU docs), on Spot ``cloud.google.com/gke-spot`` (Spot VMs docs), on
  flex-start ``cloud.google.com/gke-flex-start`` (flex-start docs), on queued provisioning
  ``cloud.google.com/gke-queued`` with its ``NoSchedule`` taint;
- ``capacity`` / ``allocatable`` (cpu, memory, pods, ``nvidia.com/gpu``), allocatable less GKE's documented reservation
  (GKE docs, Standard cluster architecture: "Node allocatable resources");
- a ``Ready`` condition and ``nodeInfo.kubeletVersion`` from the pool's version.

The API serves them read-only: :func:`sync` writes them into the cluster's objects before each request, so get, list,
selectors and the Table view treat them as any other object.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import TYPE_CHECKING, Any

from sandbox import capacity, formats
from sandbox.apis.container import _node_count

if TYPE_CHECKING:
    from sandbox.capacity import CapacityModel
    from sandbox.kube_cluster import KubeCluster
    from sandbox.store import Resource, Store

NODE_GV, NODES = "v1", "nodes"
# GKE nodes register with a node address of their VM; the sandbox's "nodes" are this machine, as its pods are.
NODE_IP = "127.0.0.1"
# The pods a GKE node takes by default (maxPodsPerNode 110).
MAX_PODS = 110
GIB = 1024**3
# vCPUs and memory (GiB) of the predefined machine types the sandbox's pools use (Compute Engine machine families
# docs: accelerator-optimized A4 / A3 Ultra, general-purpose N2 / E2). Shared-core E2 types are listed by name.
MACHINES: dict[str, tuple[int, float]] = {
    "a4-highgpu-8g": (224, 3968.0),
    "a3-ultragpu-8g": (224, 2952.0),
    "e2-micro": (2, 1.0),
    "e2-small": (2, 2.0),
    "e2-medium": (2, 4.0),
}
# GiB per vCPU of the standard / highmem / highcpu N2 and E2 shapes (n2-highmem-80: 80 vCPUs, 640 GiB).
MEMORY_PER_CPU = {"standard": 4.0, "highmem": 8.0, "highcpu": 1.0}
# What the GKE node's boot image reports (imageType COS_CONTAINERD).
OS_IMAGE = "Container-Optimized OS from Google"


def machine_shape(machine_type: str) -> tuple[int, float] | None:
    """(vCPUs, memory GiB) of a machine type, or None when the sandbox does not know its shape."""
    if machine_type in MACHINES:
        return MACHINES[machine_type]
    parts = machine_type.split("-")
    if len(parts) == 3 and parts[1] in MEMORY_PER_CPU and parts[2].isdigit():
        cpus = int(parts[2])
        return cpus, cpus * MEMORY_PER_CPU[parts[1]]
    if len(parts) == 4 and parts[1] == "custom" and parts[2].isdigit() and parts[3].isdigit():
        return int(parts[2]), int(parts[3]) / 1024
    return None


def reserved_memory_bytes(total: float) -> float:
    """GKE's memory reservation on a node of ``total`` bytes, plus the kubelet's 100 MiB eviction threshold: 255 MiB
    below 1 GiB, else 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112, 2% above 128
    (GKE docs, Standard cluster architecture: memory and CPU reservations)."""
    eviction = 100 * 1024**2
    if total < GIB:
        return 255 * 1024**2 + eviction
    reserved = 0.0
    for low, high, share in ((0, 4, 0.25), (4, 8, 0.20), (8, 16, 0.10), (16, 128, 0.06), (128, float("inf"), 0.02)):
        reserved += max(0.0, min(total, high * GIB) - low * GIB) * share
    return reserved + eviction


def reserved_cpu_millis(cpus: int) -> float:
    """GKE's CPU reservation in millicores: 6% of the first core, 1% of the next, 0.5% of the next 2, 0.25% above 4."""
    reserved = 0.0
    for low, high, share in ((0, 1, 0.06), (1, 2, 0.01), (2, 4, 0.005), (4, float("inf"), 0.0025)):
        reserved += max(0.0, min(cpus, high) - low) * share * 1000
    return reserved


def _resources(pool: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of one node of ``pool``."""
    config = pool.get("config") or {}
    capacity_: dict[str, str] = {"pods": str(MAX_PODS)}
    allocatable: dict[str, str] = {"pods": str(MAX_PODS)}
    shape = machine_shape(str(config.get("machineType", "")))
    if shape is not None:
        cpus, memory_gib = shape
        memory = memory_gib * GIB
        capacity_["cpu"] = str(cpus)
        allocatable["cpu"] = f"{round(cpus * 1000 - reserved_cpu_millis(cpus))}m"
        capacity_["memory"] = f"{int(memory // 1024)}Ki"
        allocatable["memory"] = f"{int((memory - reserved_memory_bytes(memory)) // 1024)}Ki"
    gpus = sum(int(a.get("acceleratorCount") or 0) for a in config.get("accelerators") or [])
    if gpus:
        capacity_["nvidia.com/gpu"] = allocatable["nvidia.com/gpu"] = str(gpus)
    return capacity_, allocatable


def _digest(*parts: str, size: int = 8) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:size]


def node_name(pool: Resource, zone: str, member: str) -> str:
    """A node's name as GKE forms it, ``gke-{cluster}-{pool}-{instance group id}-{instance suffix}`` (the instance
    name of its VM): the group id per pool and zone, the suffix per node (``member``: its index, or the pod it was
    made for)."""
    cluster = pool.key.partition("/clusters/")[2].partition("/")[0]
    stem = f"gke-{cluster}-{pool.name}"[:40].rstrip("-")
    return f"{stem}-{_digest(pool.key, zone)}-{_digest(pool.key, zone, member, size=4)}"


def _zones(pool: Resource) -> list[str]:
    return list(pool.body.get("locations") or []) or [""]


def _labels(pool: Resource, zone: str, name: str) -> dict[str, str]:
    config = pool.body.get("config") or {}
    machine = str(config.get("machineType", ""))
    region = zone.rsplit("-", 1)[0]
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": machine,
        "beta.kubernetes.io/os": "linux",
        "cloud.google.com/gke-boot-disk": str(config.get("diskType", "pd-balanced")),
        "cloud.google.com/gke-container-runtime": "containerd",
        "cloud.google.com/gke-nodepool": pool.name,
        "cloud.google.com/gke-os-distribution": "cos",
        "cloud.google.com/machine-family": machine.partition("-")[0],
        "failure-domain.beta.kubernetes.io/region": region,
        "failure-domain.beta.kubernetes.io/zone": zone,
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": machine,
        "topology.gke.io/zone": zone,
        "topology.kubernetes.io/region": region,
        "topology.kubernetes.io/zone": zone,
    }
    accelerators = config.get("accelerators") or []
    if accelerators:
        labels["cloud.google.com/gke-accelerator"] = str(accelerators[0].get("acceleratorType", ""))
    kind = capacity.pool_capacity(pool.body)
    if kind == "spot":
        labels["cloud.google.com/gke-spot"] = "true"
    elif kind in ("flex_start", "queued"):
        labels["cloud.google.com/gke-flex-start"] = "true"
    if kind == "queued":
        labels["cloud.google.com/gke-queued"] = "true"
    # The pool's own Kubernetes labels (NodeConfig.labels) go on every node.
    labels.update({str(k): str(v) for k, v in (config.get("labels") or {}).items()})
    return labels


def _taints(pool: Resource) -> list[dict[str, str]]:
    config = pool.body.get("config") or {}
    taints = [
        {"key": str(t.get("key", "")), "value": str(t.get("value", "")), "effect": _effect(t.get("effect"))}
        for t in config.get("taints") or []
    ]
    if capacity.pool_capacity(pool.body) == "queued":
        taints.append({"key": capacity.QUEUED_TAINT, "value": "true", "effect": "NoSchedule"})
    return taints


def _effect(value: Any) -> str:
    """NodeConfig's taint effect (``NO_SCHEDULE``) as Kubernetes writes it (``NoSchedule``)."""
    return "".join(part.capitalize() for part in str(value or "NO_SCHEDULE").split("_"))


def node_object(pool: Resource, zone: str, member: str, created: float) -> dict[str, Any]:
    """One Node of ``pool`` in ``zone`` (``member``: its index or the pod it was made for), made at ``created``."""
    name = node_name(pool, zone, member)
    capacity_, allocatable = _resources(pool.body)
    project = pool.key.split("/")[1]
    at = formats.kube_time(created)
    conditions = [
        (kind, "False", f"KubeletHas{reason}", message)
        for kind, reason, message in (
            ("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"),
        )
    ] + [("Ready", "True", "KubeletReady", "kubelet is posting ready status")]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{pool.key}/{zone}/{member}")),
            "creationTimestamp": at,
            "labels": _labels(pool, zone, name),
            "annotations": {"container.googleapis.com/instance_id": str(int(_digest(name, size=15), 16))},
        },
        "spec": {
            "providerID": f"gce://{project}/{zone}/{name}",
            **({"taints": taints} if (taints := _taints(pool)) else {}),
        },
        "status": {
            "capacity": capacity_,
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": kind,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": at,
                    "lastTransitionTime": at,
                }
                for kind, status, reason, message in conditions
            ],
            "addresses": [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "kubeletVersion": "v" + str(pool.body.get("version", "")),
                "kubeProxyVersion": "v" + str(pool.body.get("version", "")),
                "osImage": OS_IMAGE,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def pools_of(store: Store, cluster_key: str) -> list[Resource]:
    """The cluster's node pools whose nodes exist (ready, or being deleted), oldest first."""
    found = [
        r for r in store.of_kind("container.nodePool", cluster_key + "/nodePools/") if r.phase in ("ready", "deleting")
    ]
    return sorted(found, key=lambda r: (r.created, r.key))


def nodes_of(store: Store, model: CapacityModel, cluster_key: str) -> list[dict[str, Any]]:
    """Every Node of the cluster: each pool's static nodes, spread over its zones, and the nodes the capacity model
    made for worker pods (in the pool's first zone, as the sandbox's pools place them)."""
    nodes = []
    for pool in pools_of(store, cluster_key):
        zones = _zones(pool)
        for index in range(_node_count(pool)):
            nodes.append(node_object(pool, zones[index % len(zones)], str(index), pool.created))
        for pod, started in sorted((model.nodes.get(pool.key) or {}).items()):
            nodes.append(node_object(pool, zones[0], pod, started))
    return nodes


def pod_node(store: Store, model: CapacityModel, cluster_key: str, pod: str) -> str:
    """The node a RayCluster pod runs on: the node made for it (a worker), else the first static node of the first
    pool without GPUs (where a head without a GPU request lands), else ''."""
    for pool in pools_of(store, cluster_key):
        if pod in (model.nodes.get(pool.key) or {}):
            return node_name(pool, _zones(pool)[0], pod)
    for pool in pools_of(store, cluster_key):
        if not (pool.body.get("config") or {}).get("accelerators") and _node_count(pool) > 0:
            return node_name(pool, _zones(pool)[0], "0")
    return ""


def sync(cluster: KubeCluster, store: Store, model: CapacityModel) -> None:
    """Make the cluster's Node objects those of :func:`nodes_of`: new ones added, gone ones removed, unchanged ones
    left with their resourceVersion."""
    wanted = {node["metadata"]["name"]: node for node in nodes_of(store, model, cluster.cluster_key)}
    for existing in list(cluster.of(NODE_GV, NODES)):
        name = existing["metadata"]["name"]
        if name not in wanted:
            cluster.remove(NODE_GV, NODES, None, name)
    for name, node in wanted.items():
        existing = cluster.get(NODE_GV, NODES, None, name)
        if existing is not None:
            stored = {**existing, "metadata": {k: v for k, v in existing["metadata"].items() if k != "resourceVersion"}}
            if stored == node:
                continue
        cluster.put(NODE_GV, NODES, node)
