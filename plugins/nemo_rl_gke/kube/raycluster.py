"""When a RayCluster is ready, and, when it is not, what exactly is stuck: pure reading of API objects.

Ready means the conditions ``HeadPodReady`` and ``RayClusterProvisioned`` are both True. KubeRay sets them by default
from 1.3; 1.2 only behind its ``RayClusterStatusConditions`` feature gate, and without it reports no
``status.conditions`` at all. Then readiness falls back on what those conditions stand for: the head pod and every
worker the spec asks for exist and are Running and Ready (pods by ``ray.io/cluster=NAME``). Failing instead would
strand users of GKE's managed Ray add-on, whose KubeRay version they do not choose. ``status.state`` is
deprecated and can read ``ready`` while pods are still Pending (kuberay #2188), so it is never used. When the wait
times out, the message names each condition that is not True (with its reason) and what the pods say: their phase,
an unschedulable reason, container waiting reasons such as ImagePullBackOff, and their Warning events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

REQUIRED_CONDITIONS = ("HeadPodReady", "RayClusterProvisioned")
RAYCLUSTER_API = "ray.io/v1"
CLUSTER_LABEL = "ray.io/cluster"
MAX_EVENTS_PER_POD = 3


def raycluster_path(namespace: str, name: str) -> str:
    """The REST path of a RayCluster."""
    return f"/apis/{RAYCLUSTER_API}/namespaces/{namespace}/rayclusters/{name}"


def pods_path(namespace: str) -> str:
    """The REST path of the pods of a namespace."""
    return f"/api/v1/namespaces/{namespace}/pods"


def events_path(namespace: str) -> str:
    """The REST path of the events of a namespace."""
    return f"/api/v1/namespaces/{namespace}/events"


def missing_conditions(raycluster: Mapping[str, Any]) -> list[str]:
    """Each required condition that is not True, as ``Name (status, reason: message)``."""
    found = {c.get("type"): c for c in (raycluster.get("status") or {}).get("conditions") or []}
    missing = []
    for name in REQUIRED_CONDITIONS:
        condition = found.get(name)
        if condition is None:
            missing.append(f"{name} (not reported yet)")
        elif condition.get("status") != "True":
            detail = ": ".join(str(p) for p in (condition.get("reason"), condition.get("message")) if p)
            missing.append(f"{name} ({condition.get('status')}{', ' + detail if detail else ''})")
    return missing


def is_ready(raycluster: Mapping[str, Any]) -> bool:
    """Both required conditions are True."""
    return not missing_conditions(raycluster)


def reports_conditions(raycluster: Mapping[str, Any]) -> bool:
    """Whether KubeRay writes ``status.conditions`` for this RayCluster (1.3+, or 1.2 with the feature gate)."""
    return bool((raycluster.get("status") or {}).get("conditions"))


def desired_workers(raycluster: Mapping[str, Any]) -> int:
    """The worker pods the spec asks for: the sum of its worker groups' replicas."""
    groups = (raycluster.get("spec") or {}).get("workerGroupSpecs") or []
    return sum(int(group.get("replicas") or 0) for group in groups)


def ready_workers(raycluster: Mapping[str, Any]) -> int:
    """The worker pods KubeRay counts ready now (``status.readyWorkerReplicas``)."""
    try:
        return int((raycluster.get("status") or {}).get("readyWorkerReplicas") or 0)
    except (TypeError, ValueError):
        return 0


def pods_not_ready(raycluster: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Without conditions: what keeps the cluster's pods from standing for HeadPodReady and RayClusterProvisioned."""
    roles = [((p.get("metadata") or {}).get("labels") or {}).get("ray.io/node-type") for p in pods]
    problems = []
    if "head" not in roles:
        problems.append("no head pod yet")
    workers, wanted = roles.count("worker"), desired_workers(raycluster)
    if workers < wanted:
        problems.append(f"{workers} of {wanted} worker pods created")
    for pod in pods:
        problem = pod_problem(pod)
        if problem is not None:
            problems.append(f"pod {(pod.get('metadata') or {}).get('name', '?')} {problem}")
    return problems


def pod_problem(pod: Mapping[str, Any]) -> str | None:
    """What keeps one pod from being ready, or None when it is Running and Ready."""
    status = pod.get("status") or {}
    phase = status.get("phase", "Unknown")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    reasons = []
    scheduled = conditions.get("PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        reasons.append(f"{scheduled.get('reason', 'NotScheduled')}: {scheduled.get('message', '')}".rstrip(": "))
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            text = f"container {container.get('name')} {waiting.get('reason', 'Waiting')}"
            reasons.append(f"{text}: {waiting['message']}" if waiting.get("message") else text)
    ready = conditions.get("Ready", {}).get("status") == "True"
    if phase == "Running" and ready and not reasons:
        return None
    return f"{phase}" + (f" ({'; '.join(reasons)})" if reasons else "")


def diagnose(
    name: str,
    raycluster: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
) -> str:
    """One message saying what is stuck: the missing conditions, then each pod's problem and its Warning events."""
    if raycluster is None:
        return f"RayCluster {name} does not exist"
    if reports_conditions(raycluster):
        parts = [f"RayCluster {name} is not ready: missing " + ", ".join(missing_conditions(raycluster))]
    else:
        parts = [
            f"RayCluster {name} is not ready: KubeRay reports no status.conditions (KubeRay before 1.3 without the "
            "RayClusterStatusConditions feature gate), so its pods were checked: "
            + ("; ".join(pods_not_ready(raycluster, pods)) or "all ready")
        ]
    if not pods:
        parts.append("no pods were created for it (is the KubeRay operator running?)")
    for pod in pods:
        pod_name = pod.get("metadata", {}).get("name", "?")
        problem = pod_problem(pod)
        if problem is None:
            continue
        line = f"pod {pod_name}: {problem}"
        warnings = [
            f"{e.get('reason')}: {e.get('message')}"
            for e in events
            if (e.get("involvedObject") or {}).get("name") == pod_name and e.get("type") == "Warning"
        ]
        # The newest events say the most; repeats of one reason add nothing.
        unique = list(dict.fromkeys(reversed(warnings)))[:MAX_EVENTS_PER_POD]
        if unique:
            line += "; events: " + " | ".join(unique)
        parts.append(line)
    return ". ".join(parts)
