"""The Kubernetes side against the sandbox: the sync hook's apply/delete, the RayCluster trigger, the service proxy.

Real HTTP throughout: the GKE cluster is created through the production resources, its API is the sandbox's, and a
RayCluster starts a real local Ray head (stopped by PID when it is deleted).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import ssl
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from sandbox.testing import SandboxProcess, pid_alive
from sandbox.tls import new_cluster_tls

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.kube.access import ClusterAccess, ClusterUnreachableError, EndpointNotAllowedError, dashboard_address
from nemo_rl_gke.kube.async_client import AsyncKubeHook
from nemo_rl_gke.kube.client import TLS_VERIFY_FAILED, KubeApiError, KubeHook, ObjectRef, is_kube_transient
from nemo_rl_gke.kube.objects import (
    InvalidManifestError,
    NotOwnedObjectError,
    apply_objects,
    delete_objects,
    group_objects,
    lustre_ip,
)
from nemo_rl_gke.kube.raycluster import diagnose, pods_not_ready, reports_conditions
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.triggers.raycluster import CLASSPATH, RayClusterTrigger
from tests.gcp.conftest import ensure_cluster_with_gpu_pool, first_event, last_seq, raycluster_trigger
from tests.owners import owner_of

pytestmark = pytest.mark.airflow


@pytest.fixture
def cluster_spec(spec: RunSpec, hook: GcpHook) -> RunSpec:
    """A running GKE cluster and a ready Lustre instance (with its network and peering) in the test's project."""
    ensure_cluster_with_gpu_pool(spec, hook)
    return spec


def _kube(spec: RunSpec, hook: GcpHook) -> KubeHook:
    return KubeHook(spec, hook)


def _raycluster_objects(spec: RunSpec, hook: GcpHook) -> list[dict[str, Any]]:
    """The run's RayCluster and the Lustre storage objects it mounts, as the run applies them."""
    storage = group_objects(spec, t.LUSTRE_STORAGE, owner_of(spec), lustre_address=lustre_ip(spec, hook))
    return [*storage, *group_objects(spec, t.RAYCLUSTER, owner_of(spec))]


def _loss(sandbox: SandboxProcess, loss_id: str) -> dict[str, Any]:
    return next(loss for loss in sandbox.node_losses() if loss["id"] == loss_id)


def _ray_heads(sandbox: SandboxProcess) -> list[dict[str, Any]]:
    return sandbox.full_inventory()["ray_heads"]


def test_cluster_access_comes_from_the_gke_cluster(
    cluster_spec: RunSpec, hook: GcpHook, sandbox: SandboxProcess
) -> None:
    access = _kube(cluster_spec, hook).access
    # As on GKE: https to the reported address, under the CA the cluster reports.
    assert access.host.startswith("https://127.0.0.1:") and "BEGIN CERTIFICATE" in access.ca_pem
    google = hook.endpoint("container")
    proxied = dashboard_address(cluster_spec, access, google_endpoint=google)
    assert proxied.url == access.host + cluster_spec.dashboard_proxy_path and proxied.ca_pem == access.ca_pem
    # The proxy is https whatever the Google endpoint is.
    assert dashboard_address(cluster_spec, access, google_endpoint=None) == proxied
    # A plain-http API server gets no token, not even on loopback next to a loopback Google endpoint.
    plain = {"status": "RUNNING", "endpoint": "http://127.0.0.1:1"}
    with pytest.raises(EndpointNotAllowedError, match="https only"):
        ClusterAccess.from_cluster(plain, "c")
    with pytest.raises(EndpointNotAllowedError, match="https only"):
        dashboard_address(cluster_spec, ClusterAccess("http://127.0.0.1:1"), google_endpoint=google)
    # Another dashboard comes from the deployment, never from the conf, and must be https.
    deployment = Deployment(ray_dashboard_url="https://ray.internal.example:8265/")
    direct = dashboard_address(cluster_spec, None, deployment, google_endpoint=google)
    assert direct.url == "https://ray.internal.example:8265" and not direct.needs_token
    # A real GKE endpoint is a bare IP with a CA: HTTPS, and the CA decoded for verification.
    real = ClusterAccess.from_cluster(
        {"status": "RUNNING", "endpoint": "34.1.2.3", "masterAuth": {"clusterCaCertificate": "UEVN"}}, "c"
    )
    assert real == ClusterAccess("https://34.1.2.3", "PEM")
    with pytest.raises(ClusterUnreachableError, match="PROVISIONING"):
        ClusterAccess.from_cluster({"status": "PROVISIONING", "endpoint": "34.1.2.3"}, "c")


def test_apply_creates_then_reapply_changes_nothing_and_delete_treats_404_as_done(
    cluster_spec: RunSpec, hook: GcpHook, sandbox: SandboxProcess
) -> None:
    kube = _kube(cluster_spec, hook)
    address = lustre_ip(cluster_spec, hook)
    objects = [
        *group_objects(cluster_spec, t.NCCL_INSTALLER, owner_of(cluster_spec)),
        *group_objects(cluster_spec, t.NETWORK_MAPPING, owner_of(cluster_spec)),
        *group_objects(cluster_spec, t.LUSTRE_STORAGE, owner_of(cluster_spec), lustre_address=address),
    ]
    first = apply_objects(kube, objects, owner_of(cluster_spec), adopt=False)
    assert {r.action for r in first} == {"created"} and len(first) == len(objects) == 21
    pv = kube.get(ObjectRef("v1", "PersistentVolume", cluster_spec.lustre_pv))
    assert pv is not None and pv["spec"]["csi"]["volumeAttributes"]["ip"] == address
    assert pv["metadata"]["labels"]["managed-by"] == "airflow-nemo-rl-gke"
    pvc = kube.get(ObjectRef("v1", "PersistentVolumeClaim", cluster_spec.lustre_pvc, cluster_spec.namespace))
    assert pvc is not None and pvc["status"]["phase"] == "Bound"

    # The PV controller's binding wrote the PV's status after its create: what a reapply must leave is what is stored.
    stored = [(kube.get(ObjectRef.of(obj)) or {})["metadata"]["resourceVersion"] for obj in objects]
    second = apply_objects(kube, objects, owner_of(cluster_spec), adopt=False)
    assert {r.action for r in second} == {"unchanged"}
    assert [r.resource_version for r in second] == stored

    changed = copy.deepcopy(objects)
    changed[1]["spec"]["deviceMode"] = "RDMA"
    third = apply_objects(kube, changed, owner_of(cluster_spec), adopt=False)
    assert [r.action for r in third].count("configured") == 1

    deleted = delete_objects(kube, objects, owner_of(cluster_spec))
    assert {r.action for r in deleted} == {"deleted"}
    assert {r.action for r in delete_objects(kube, objects, owner_of(cluster_spec))} == {"absent"}
    assert sandbox.full_inventory()["kubernetes"] == []


def test_an_unowned_object_is_refused_adopted_on_request_and_never_deleted(
    cluster_spec: RunSpec, hook: GcpHook
) -> None:
    kube = _kube(cluster_spec, hook)
    ours = group_objects(cluster_spec, t.NETWORK_MAPPING, owner_of(cluster_spec))[:1]
    foreign = copy.deepcopy(ours[0])
    foreign["metadata"]["labels"] = {"team": "someone-else"}
    kube.apply(foreign)
    with pytest.raises(NotOwnedObjectError, match="adopt_existing=true"):
        apply_objects(kube, ours, owner_of(cluster_spec), adopt=False)
    assert [r.action for r in apply_objects(kube, ours, owner_of(cluster_spec), adopt=True)] == ["adopted"]
    assert [r.action for r in delete_objects(kube, ours, owner_of(cluster_spec))] == ["kept-unowned"]
    assert kube.get(ObjectRef.of(ours[0])) is not None


def test_manifests_are_validated_at_apply_time(cluster_spec: RunSpec, hook: GcpHook) -> None:
    bad = group_objects(cluster_spec, t.NETWORK_MAPPING, owner_of(cluster_spec))[:1]
    bad[0]["spec"]["deviceMode"] = 7
    with pytest.raises(InvalidManifestError, match="deviceMode"):
        apply_objects(_kube(cluster_spec, hook), bad, owner_of(cluster_spec), adopt=False)


def test_api_errors_are_kubernetes_status_errors(cluster_spec: RunSpec, hook: GcpHook) -> None:
    kube = _kube(cluster_spec, hook)
    with pytest.raises(KubeApiError) as refused:
        kube.request("POST", "/api/v1/namespaces/nowhere/serviceaccounts", body={"apiVersion": "v1"})
    assert refused.value.status == 404 and 'namespaces "nowhere" not found' in str(refused.value)
    with pytest.raises(KubeApiError, match="does not serve Widget"):
        kube.resource_info("v1", "Widget")


def test_a_kubernetes_client_with_another_ca_fails_at_once_naming_the_cluster_ca(
    cluster_spec: RunSpec, hook: GcpHook, sandbox: SandboxProcess
) -> None:
    impostor = new_cluster_tls("impostor").ca_pem  # what a stale or wrong CA looks like: any other CA
    kube = _kube(cluster_spec, hook)
    assert kube.request("GET", "/api")["kind"] == "APIVersions"  # control: the cluster's own CA verifies
    wrong = _kube(cluster_spec, hook)
    wrong.access = ClusterAccess(kube.access.host, impostor)
    with pytest.raises(KubeApiError, match=r"not verify against the cluster's CA .*certificate verify failed") as bad:
        wrong.request("GET", "/api")
    assert not is_kube_transient(bad.value)  # never retried: another try cannot fix a CA

    async def async_get(access: ClusterAccess | None) -> dict[str, Any] | None:
        async with AsyncKubeHook("google_cloud_default", cluster_spec.cluster_path, access=access) as client:
            return await client.get("/api")

    assert (asyncio.run(async_get(None)) or {})["kind"] == "APIVersions"  # control: the CA the cluster reports
    with pytest.raises(KubeApiError) as refused:
        asyncio.run(async_get(ClusterAccess(kube.access.host, impostor)))
    assert refused.value.reason == TLS_VERIFY_FAILED and "certificate verify failed" in str(refused.value)


def test_a_raycluster_runs_a_real_ray_reachable_through_the_service_proxy_and_stops_by_pid(
    cluster_spec: RunSpec, hook: GcpHook, sandbox: SandboxProcess
) -> None:
    kube = _kube(cluster_spec, hook)
    objects = _raycluster_objects(cluster_spec, hook)
    apply_objects(kube, objects, owner_of(cluster_spec), adopt=False)
    try:
        # Still waiting: the head takes seconds to start, and a short run of the trigger yields nothing.
        with pytest.raises(TimeoutError):
            asyncio.run(first_event(raycluster_trigger(cluster_spec), timeout=0.5))
        since = last_seq(sandbox)
        event = asyncio.run(first_event(raycluster_trigger(cluster_spec)))
        assert event["status"] == "success", event
        # Between two reads the wait watches the RayCluster from the version read: one read per change of the object
        # (and one to start), not one per 0.2 s poll however long Ray takes to start.
        path = f"/namespaces/{cluster_spec.namespace}/rayclusters"
        calls = [c for c in sandbox.calls(since) if path in c["path"] and c["method"] == "GET"]
        watches = [c for c in calls if "watch=true" in c["query"]]
        reads = [c for c in calls if c["path"].endswith(f"{path}/{cluster_spec.raycluster_name}")]
        assert watches and all(c["status"] == 200 for c in calls), calls
        assert len(reads) == len(watches) + 1, calls
        heads = _ray_heads(sandbox)
        assert len(heads) == 1 and pid_alive(heads[0]["pid"])
        # /data is the Lustre instance's directory, and Ray learns it from SANDBOX_DATA_DIR.
        lustre = next(r for r in sandbox.inventory() if r["path"] == cluster_spec.lustre_path)
        assert heads[0]["data_dir"] == lustre["data_dir"]
        # Each Ray pod has a /tmp of its own (TMPDIR), which goes with the pod: the head's dashboard keeps its
        # forkserver's socket dir there, not in the host's shared one, where every delete used to leave it behind.
        # Ray starts that forkserver before its dashboard serves HTTP (docs/fidelity.md, RayCluster deletion).
        head_tmp = Path(heads[0]["driver_logs"]).parents[1] / "tmp"
        assert psutil.Process(heads[0]["pid"]).environ()["TMPDIR"] == str(head_tmp)
        assert list(head_tmp.glob("pymp-*")), sorted(p.name for p in head_tmp.parent.iterdir())
        worker_tmps = {psutil.Process(w["pid"]).environ()["TMPDIR"] for w in heads[0]["workers"]}
        assert len(worker_tmps) == cluster_spec.worker_replicas and str(head_tmp) not in worker_tmps
        assert all(Path(tmp).name == "tmp" and Path(tmp).parent.name.startswith("sbrw-") for tmp in worker_tmps)

        address = kube.dashboard()
        request = urllib.request.Request(address.url + "/api/version", headers=kube.dashboard_headers(address))
        context = ssl.create_default_context(cadata=address.ca_pem)
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            assert json.loads(response.read())["ray_version"] == "2.60.0"

        # Every worker pod is a real Ray node of its own: a lost one is replaced, and only the workers wait sees it.
        workers = heads[0]["workers"]
        assert len(workers) == cluster_spec.worker_replicas and all(w["ready"] and pid_alive(w["pid"]) for w in workers)
        loss = sandbox.lose_node(cluster_spec.raycluster_name, mode="killed", replace_after_s=2.0)
        deadline = time.monotonic() + 30
        while _loss(sandbox, loss["id"])["state"] == "armed" and time.monotonic() < deadline:
            time.sleep(0.05)
        lost = _loss(sandbox, loss["id"])
        assert lost["state"] == "lost", lost
        status = kube.get(ObjectRef("ray.io/v1", "RayCluster", cluster_spec.raycluster_name, cluster_spec.namespace))
        assert status is not None and status["status"]["readyWorkerReplicas"] == cluster_spec.worker_replicas - 1
        gone = next(w for w in workers if w["pod"] == lost["worker_pod"])
        assert not pid_alive(gone["pid"])
        event = asyncio.run(first_event(raycluster_trigger(cluster_spec, "workers")))
        assert event["status"] == "success" and _loss(sandbox, loss["id"])["state"] == "replaced", event
        now = {w["pod"]: w for w in _ray_heads(sandbox)[0]["workers"]}
        assert lost["worker_pod"] not in now and now[lost["replacement_pod"]]["ready"]
    finally:
        results = delete_objects(kube, objects, owner_of(cluster_spec))
    assert any(r.action == "deleted" and r.ref.kind == "RayCluster" for r in results)
    assert asyncio.run(first_event(raycluster_trigger(cluster_spec, "deleted")))["status"] == "success"
    assert _ray_heads(sandbox) == [] and not pid_alive(heads[0]["pid"])
    assert not head_tmp.exists() and not any(Path(tmp).exists() for tmp in worker_tmps)


def test_a_worker_whose_ray_crashes_while_starting_is_restarted_by_the_kubelet_and_joins(
    cluster_spec: RunSpec, hook: GcpHook, sandbox: SandboxProcess
) -> None:
    # On a loaded host Ray's own startup can time out ("The current node timed out during startup"): the Ray
    # container exits, and on GKE the kubelet restarts it after its back-off. Here the first worker's `ray start` is
    # killed as soon as it exists, long before it can join.
    kube = _kube(cluster_spec, hook)
    objects = _raycluster_objects(cluster_spec, hook)
    apply_objects(kube, objects, owner_of(cluster_spec), adopt=False)
    try:
        deadline = time.monotonic() + 120
        starting: dict[str, Any] = {}
        while not starting and time.monotonic() < deadline:
            heads = _ray_heads(sandbox)
            starting = next((w for h in heads for w in h["workers"] if w["pid"] and not w["ready"]), {})
            time.sleep(0.02)
        assert starting, _ray_heads(sandbox)
        os.killpg(starting["pid"], signal.SIGKILL)
        event = asyncio.run(first_event(raycluster_trigger(cluster_spec)))
        assert event["status"] == "success", event
        pod = kube.get(ObjectRef("v1", "Pod", starting["pod"], cluster_spec.namespace))
        assert pod is not None and pod["status"]["phase"] == "Running", pod
        ray_status = pod["status"]["containerStatuses"][0]
        assert ray_status["restartCount"] == 1 and ray_status["ready"], ray_status
        events = kube.list("v1", "Event", cluster_spec.namespace)
        said = [e["message"] for e in events if e["involvedObject"]["name"] == starting["pod"]]
        assert any(m.startswith("Back-off 10s restarting failed container=") for m in said), said
        joined = {w["pod"]: w for w in _ray_heads(sandbox)[0]["workers"]}
        assert joined[starting["pod"]]["ready"] and joined[starting["pod"]]["pid"] != starting["pid"]
    finally:
        delete_objects(kube, objects, owner_of(cluster_spec))


def _never_ready_event(cluster_spec: RunSpec, hook: GcpHook, sandbox: SandboxProcess) -> dict[str, Any]:
    """The RayCluster wait's event for a RayCluster whose pods never schedule (its apply's operation hangs)."""
    sandbox.add_fault(
        {"method": "PATCH", "path": "/rayclusters/"},
        operation="hang",
        message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    )
    kube = _kube(cluster_spec, hook)
    raycluster = group_objects(cluster_spec, t.RAYCLUSTER, owner_of(cluster_spec))
    try:
        apply_objects(kube, raycluster, owner_of(cluster_spec), adopt=False)
        return asyncio.run(first_event(raycluster_trigger(cluster_spec, timeout=1.5)))
    finally:
        sandbox.clear_faults()
        delete_objects(kube, raycluster, owner_of(cluster_spec))


def test_a_raycluster_that_never_gets_ready_times_out_naming_the_condition_and_the_pod_reason(
    cluster_spec: RunSpec, hook: GcpHook, sandbox: SandboxProcess
) -> None:
    event = _never_ready_event(cluster_spec, hook, sandbox)
    assert event["status"] == "timeout"
    message = event["message"]
    assert "missing HeadPodReady (False, HeadPodNotReady)" in message
    assert "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in message
    assert "events: FailedScheduling" in message
    assert _ray_heads(sandbox) == []


def test_trigger_errors_end_in_one_event(cluster_spec: RunSpec, hook: GcpHook, sandbox: SandboxProcess) -> None:
    # A non-transient API answer (403) is an error event at once, not a wait until the deadline.
    sandbox.add_fault({"method": "GET", "path": "/rayclusters/"}, status=403, message="forbidden by policy")
    try:
        event = asyncio.run(first_event(raycluster_trigger(cluster_spec, timeout=60)))
    finally:
        sandbox.clear_faults()
    assert event["status"] == "error" and "403" in event["message"] and "not retried" in event["message"]
    # A missing RayCluster while waiting for readiness is an error; while waiting for deletion it is success.
    assert asyncio.run(first_event(raycluster_trigger(cluster_spec)))["status"] == "error"
    assert asyncio.run(first_event(raycluster_trigger(cluster_spec, "deleted")))["status"] == "success"
    gone = RunSpec.from_conf({**cluster_spec.to_conf(), "cluster_name": "no-such-cluster"})
    assert asyncio.run(first_event(raycluster_trigger(gone)))["status"] == "error"


def test_trigger_serializes_exactly_and_round_trips() -> None:
    trigger = RayClusterTrigger(
        cluster_path="projects/p/locations/r/clusters/c",
        namespace="default",
        name="rc",
        wait_for="deleted",
        gcp_conn_id="gcp",
        poll_interval=2,
        timeout=60,
        started_at=1000.0,
        node_pool_path="/v1/projects/p/locations/r/clusters/c/nodePools/gpu",
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH
    assert kwargs == {
        "cluster_path": "projects/p/locations/r/clusters/c",
        "namespace": "default",
        "name": "rc",
        "wait_for": "deleted",
        "gcp_conn_id": "gcp",
        "poll_interval": 2.0,
        "timeout": 60.0,
        "started_at": 1000.0,
        "node_pool_path": "/v1/projects/p/locations/r/clusters/c/nodePools/gpu",
    }
    assert RayClusterTrigger(**kwargs).serialize() == (classpath, kwargs)
    with pytest.raises(ValueError, match="wait_for"):
        RayClusterTrigger(cluster_path="x", namespace="n", name="r", wait_for="soon")


def test_diagnose_reads_image_pull_errors_and_missing_pods() -> None:
    raycluster = {"status": {"conditions": [{"type": "HeadPodReady", "status": "False", "reason": "HeadPodNotReady"}]}}
    pods = [
        {
            "metadata": {"name": "rc-head-x"},
            "status": {
                "phase": "Pending",
                "containerStatuses": [
                    {"name": "ray-head", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}
                ],
            },
        }
    ]
    events = [
        {"involvedObject": {"name": "rc-head-x"}, "type": "Warning", "reason": "Failed", "message": "pull failed"}
    ]
    text = diagnose("rc", raycluster, pods, events)
    assert "HeadPodReady (False, HeadPodNotReady)" in text and "RayClusterProvisioned (not reported yet)" in text
    assert "container ray-head ImagePullBackOff: not found" in text and "events: Failed: pull failed" in text
    assert "no pods were created" in diagnose("rc", raycluster, [], [])
    assert diagnose("rc", None, [], []) == "RayCluster rc does not exist"


def test_deleting_the_gke_cluster_stops_its_ray(cluster_spec: RunSpec, hook: GcpHook, sandbox: SandboxProcess) -> None:
    kube = _kube(cluster_spec, hook)
    objects = _raycluster_objects(cluster_spec, hook)
    apply_objects(kube, objects, owner_of(cluster_spec), adopt=False)
    assert asyncio.run(first_event(raycluster_trigger(cluster_spec)))["status"] == "success"
    pid = _ray_heads(sandbox)[0]["pid"]
    from nemo_rl_gke.gcp.resources import delete_resource
    from tests.gcp.conftest import wait_for

    outcome = delete_resource(resources(cluster_spec, owner_of(cluster_spec))[t.GKE_CLUSTER], hook, used=True)
    assert outcome.operation is not None
    wait_for(hook, outcome.operation)
    deadline = time.monotonic() + 30
    while (_ray_heads(sandbox) or pid_alive(pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ray_heads(sandbox) == [] and not pid_alive(pid)


# --- KubeRay 1.2: no status.conditions ------------------------------------------------------------------------------
def _pod(name: str, role: str, ready: bool) -> dict[str, Any]:
    status = {"phase": "Running" if ready else "Pending", "conditions": [{"type": "Ready", "status": str(ready)}]}
    return {"metadata": {"name": name, "labels": {"ray.io/node-type": role}}, "status": status}


def test_without_conditions_readiness_is_every_pod_the_spec_asks_for_ready() -> None:
    raycluster = {"spec": {"workerGroupSpecs": [{"replicas": 2}]}, "status": {"state": "ready"}}
    head, w1, w2 = _pod("h", "head", True), _pod("w1", "worker", True), _pod("w2", "worker", True)
    assert not reports_conditions(raycluster)
    assert pods_not_ready(raycluster, [head, w1, w2]) == []
    # status.state says ready, but one worker is missing and another not ready: not ready.
    problems = pods_not_ready(raycluster, [head, _pod("w1", "worker", False)])
    assert problems == ["1 of 2 worker pods created", "pod w1 Pending"]
    assert pods_not_ready(raycluster, []) == ["no head pod yet", "0 of 2 worker pods created"]
    text = diagnose("rc", raycluster, [head], [])
    assert "KubeRay reports no status.conditions (KubeRay before 1.3 without the RayClusterStatusConditions" in text
    assert "0 of 2 worker pods created" in text


@pytest.fixture
def kuberay_1_2(sandbox: SandboxProcess) -> Any:
    """The sandbox's KubeRay behaves like 1.2 without its feature gate (no conditions) for one test."""
    sandbox.seed({"kuberay_conditions": False})
    yield sandbox
    sandbox.seed({"kuberay_conditions": True})


def test_a_raycluster_without_conditions_is_ready_when_its_pods_are(
    cluster_spec: RunSpec, hook: GcpHook, kuberay_1_2: SandboxProcess
) -> None:
    kube = _kube(cluster_spec, hook)
    objects = _raycluster_objects(cluster_spec, hook)
    apply_objects(kube, objects, owner_of(cluster_spec), adopt=False)
    try:
        event = asyncio.run(first_event(raycluster_trigger(cluster_spec)))
        found = kube.get(ObjectRef("ray.io/v1", "RayCluster", cluster_spec.raycluster_name, cluster_spec.namespace))
        assert found is not None and "conditions" not in found.get("status", {})
    finally:
        delete_objects(kube, objects, owner_of(cluster_spec))
    assert event["status"] == "success", event
    assert "Ready (KubeRay reports no conditions)" in event["message"]


def test_a_raycluster_without_conditions_times_out_naming_its_pods(
    cluster_spec: RunSpec, hook: GcpHook, kuberay_1_2: SandboxProcess
) -> None:
    event = _never_ready_event(cluster_spec, hook, kuberay_1_2)
    assert event["status"] == "timeout"
    assert "KubeRay reports no status.conditions" in event["message"]
    assert "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in event["message"]
