"""What ``kubectl get`` / ``logs`` / ``auth can-i`` read from a sandbox cluster (issue #37): the server-side Table
(``sandbox/kube_table.py``), the Node objects of the node pools (``sandbox/kube_nodes.py``), pods made from their
template with a log subresource (``sandbox/kuberay.py``, ``sandbox/kube_podlog.py``) and SelfSubjectAccessReview
(``sandbox/kube_authz.py``). Unit tests of the builders; ``tests/gcp/test_kubectl.py`` reads the same views of a
running RayCluster with the real kubectl."""

from __future__ import annotations

import time
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from sandbox.kube_cluster import KubeCluster
from sandbox.kube_errors import KubeError
from sandbox.kuberay import desired_resources, format_quantity, parse_quantity
from sandbox.store import Resource

from sandbox import kube_authz, kube_nodes, kube_podlog, kube_table, kube_volumes

KUBECTL_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
NOW = 1_800_000_000.0


def _at(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - seconds_ago))


def _pod(containers: list[str], status: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "creationTimestamp": _at(75), "labels": {"a": "b"}},
        "spec": {"containers": [{"name": name} for name in containers], **fields},
        "status": status,
    }


# --- Table: pods ----------------------------------------------------------------------------------------------------
def test_a_running_pod_with_a_sidecar_prints_as_kubectl_prints_it() -> None:
    running = {"ready": True, "restartCount": 0, "state": {"running": {}}}
    pod = _pod(
        ["ray-head", "fluent-bit"],
        {
            "phase": "Running",
            "podIPs": [{"ip": "10.0.0.7"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "ray-head", **running}, {"name": "fluent-bit", **running}],
        },
        nodeName="gke-c-pool-1",
    )
    assert kube_table.pod_row(pod, NOW) == [
        "p", "2/2", "Running", "0", "75s", "10.0.0.7", "gke-c-pool-1", "<none>", "<none>",
    ]  # fmt: skip


def test_pending_crashing_and_terminating_pods_get_printpods_status() -> None:
    unschedulable = _pod(["ray"], {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]})
    assert kube_table.pod_row(unschedulable, NOW)[1:4] == ["0/1", "Pending", "0"]
    creating = _pod(["ray"], {"phase": "Pending", "containerStatuses": [
        {"name": "ray", "ready": False, "state": {"waiting": {"reason": "ContainerCreating"}}}]})  # fmt: skip
    assert kube_table.pod_row(creating, NOW)[1:3] == ["0/1", "ContainerCreating"]
    crash = {
        "name": "ray",
        "ready": False,
        "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "finishedAt": _at(130)}},
    }
    crashing = _pod(["ray"], {"phase": "Running", "containerStatuses": [crash]})
    assert kube_table.pod_row(crashing, NOW)[1:4] == ["0/1", "CrashLoopBackOff", "3 (2m10s ago)"]
    terminating = _pod(["ray"], {"phase": "Running"})
    terminating["metadata"]["deletionTimestamp"] = _at(1)
    assert kube_table.pod_row(terminating, NOW)[2] == "Terminating"
    assert kube_table.pod_row(_pod([], {}), NOW)[5:7] == ["<none>", "<none>"]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(-5, "<invalid>"), (-1, "0s"), (45, "45s"), (150, "2m30s"), (600, "10m"), (3 * 3600 + 300, "3h5m"),
     (30 * 3600, "30h"), (50 * 3600, "2d2h"), (400 * 86400, "400d"), ((3 * 365 + 10) * 86400, "3y10d")],
)  # fmt: skip
def test_ages_are_apimachinerys_human_durations(seconds: float, shown: str) -> None:
    assert kube_table.human_duration(seconds) == shown


# --- Table: nodes, CRDs, the default convertor, includeObject, Accept ------------------------------------------
def test_a_node_prints_status_roles_and_version_and_a_cordoned_one_says_so() -> None:
    node = {
        "metadata": {"name": "n1", "creationTimestamp": _at(3600), "labels": {"node-role.kubernetes.io/gpu": ""}},
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [{"type": "Ready", "status": "False"}],
            "nodeInfo": {"kubeletVersion": "v1.33.5-gke.1201000", "osImage": "COS"},
            "addresses": [{"type": "InternalIP", "address": "10.1.0.2"}],
        },
    }
    row = kube_table.node_row(node, NOW)
    assert row == [
        "n1", "NotReady,SchedulingDisabled", "gpu", "60m", "v1.33.5-gke.1201000",
        "10.1.0.2", "<none>", "COS", "<unknown>", "<unknown>",
    ]  # fmt: skip
    assert [c["name"] for c in kube_table.columns_for("v1", "nodes") if c["priority"] == 0] == [
        "Name", "Status", "Roles", "Age", "Version",
    ]  # fmt: skip


def test_rayclusters_print_kuberays_printer_columns_and_other_kinds_the_default_ones() -> None:
    raycluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc", "creationTimestamp": _at(30), "resourceVersion": "9"},
        "status": {
            "desiredWorkerReplicas": 2, "availableWorkerReplicas": 1, "desiredCPU": "18", "desiredMemory": "136Gi",
            "desiredGPU": "16", "desiredTPU": "0", "head": {"serviceIP": "10.0.0.1"},
        },
    }  # fmt: skip
    columns = kube_table.columns_for("ray.io/v1", "rayclusters")
    assert [(c["name"], c["priority"]) for c in columns][:8] == [
        ("Name", 0), ("desired workers", 0), ("available workers", 0), ("cpus", 0), ("memory", 0), ("gpus", 0),
        ("tpus", 1), ("status", 0),
    ]  # fmt: skip
    cells = kube_table.row_cells("ray.io/v1", "rayclusters", raycluster, NOW)
    # No state yet (omitempty) and no head pod IP: null cells, which kubectl shows as <none>.
    assert cells == ["rc", 2, 1, "18", "136Gi", "16", "0", None, "30s", None, "10.0.0.1"]
    # A built-in kind without a printer of its own (a review) gets the default convertor's columns.
    review = {"metadata": {"name": "r", "creationTimestamp": "2026-01-02T03:04:05Z"}}
    reviews = ("authorization.k8s.io/v1", "selfsubjectaccessreviews")
    assert [c["name"] for c in kube_table.columns_for(*reviews)] == ["Name", "Created At"]
    assert kube_table.row_cells(*reviews, review) == ["r", "2026-01-02T03:04:05Z"]
    # A CRD without printer columns gets apiextensions' default Age column.
    assert [c["name"] for c in kube_table.columns_for("networking.gke.io/v1", "networks")] == ["Name", "Age"]


def test_include_object_decides_what_each_row_carries() -> None:
    pods = {"kind": "PodList", "metadata": {"resourceVersion": "42"}, "items": [_pod(["ray"], {"phase": "Running"})]}
    table = kube_table.to_table("v1", "pods", pods, {})
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert table["metadata"] == {"resourceVersion": "42"}
    assert table["rows"][0]["object"] == {
        "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": pods["items"][0]["metadata"],
    }  # fmt: skip
    assert kube_table.to_table("v1", "pods", pods, {"includeObject": "Object"})["rows"][0]["object"]["spec"]
    assert kube_table.to_table("v1", "pods", pods, {"includeObject": "None"})["rows"][0]["object"] is None
    one = kube_table.to_table("v1", "pods", pods["items"][0], {}, "v1beta1")
    assert one["apiVersion"] == "meta.k8s.io/v1beta1" and len(one["rows"]) == 1
    with pytest.raises(KubeError, match='unrecognized includeObject value: "All"'):
        kube_table.to_table("v1", "pods", pods, {"includeObject": "All"})


def test_the_accept_header_is_negotiated_in_order() -> None:
    assert kube_table.wanted_table(KUBECTL_ACCEPT) == "v1"
    assert kube_table.wanted_table("application/json;as=Table;v=v1beta1;g=meta.k8s.io") == "v1beta1"
    assert kube_table.wanted_table("application/json") is None
    assert kube_table.wanted_table("") is None
    assert kube_table.wanted_table("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io, */*") is None
    with pytest.raises(KubeError) as refused:
        kube_table.wanted_table("application/json;as=Table;v=v2;g=meta.k8s.io")
    assert refused.value.code == 406


# --- Nodes ----------------------------------------------------------------------------------------------------------
def _pool(name: str, config: dict[str, Any], count: int, **body: Any) -> Resource:
    key = f"projects/p/locations/us-central1/clusters/c/nodePools/{name}"
    pool_body = {"name": name, "config": config, "initialNodeCount": count, "locations": ["us-central1-b"], **body}
    made = {"system": 1.0, "gpu": 2.0}.get(name, 0.0)
    return Resource("container.nodePool", key, {**pool_body, "version": "1.33.5-gke.1201000"}, "ready", created=made)


def test_gke_allocatable_takes_the_documented_reservations() -> None:
    # GKE docs: a 4 GiB machine keeps 25% of 4 GiB plus the 100 MiB eviction threshold; 2 vCPUs keep 6% + 1%.
    capacity, allocatable = kube_nodes._resources({"config": {"machineType": "e2-medium"}})
    assert (capacity["cpu"], capacity["memory"]) == ("2", f"{4 * 1024 * 1024}Ki")
    assert allocatable["cpu"] == "1930m"
    assert allocatable["memory"] == f"{(3 * 1024 - 100) * 1024}Ki"
    assert allocatable["pods"] == "110" and "nvidia.com/gpu" not in capacity


def test_nodes_are_the_pools_static_nodes_and_the_gpu_nodes_capacity_made() -> None:
    system = _pool("system", {"machineType": "n2-highmem-80"}, 1)
    gpu_config = {
        "machineType": "a4-highgpu-8g",
        "spot": True,
        "accelerators": [{"acceleratorType": "nvidia-b200", "acceleratorCount": 8}],
    }
    gpu = _pool("gpu", gpu_config, 0)
    store = SimpleNamespace(of_kind=lambda kind, prefix="": [system, gpu])
    model = SimpleNamespace(nodes={gpu.key: {"rc-workers-worker-0": NOW - 60}})
    nodes = kube_nodes.nodes_of(store, model, "projects/p/locations/us-central1/clusters/c")  # type: ignore[arg-type]
    assert [n["metadata"]["labels"]["cloud.google.com/gke-nodepool"] for n in nodes] == ["system", "gpu"]
    static, made = nodes
    assert static["status"]["capacity"]["cpu"] == "80" and static["status"]["capacity"]["memory"] == "671088640Ki"
    labels = made["metadata"]["labels"]
    assert labels["cloud.google.com/gke-accelerator"] == "nvidia-b200"
    assert labels["cloud.google.com/gke-spot"] == "true"
    assert "cloud.google.com/gke-spot" not in static["metadata"]["labels"]
    assert labels["node.kubernetes.io/instance-type"] == "a4-highgpu-8g"
    assert labels["topology.kubernetes.io/zone"] == "us-central1-b"
    assert labels["kubernetes.io/hostname"] == made["metadata"]["name"]
    assert made["metadata"]["name"].startswith("gke-c-gpu-")
    assert made["status"]["capacity"]["nvidia.com/gpu"] == made["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert made["status"]["nodeInfo"]["kubeletVersion"] == "v1.33.5-gke.1201000"
    assert kube_table.node_row(made, NOW)[1:5] == ["Ready", "<none>", "60s", "v1.33.5-gke.1201000"]
    assert (
        kube_nodes.pod_node(store, model, "projects/p/locations/us-central1/clusters/c", "rc-workers-worker-0")
        == (made["metadata"]["name"])
    )  # type: ignore[arg-type]
    # The head (no GPU asked) lands on the system pool's node.
    assert (
        kube_nodes.pod_node(store, model, "projects/p/locations/us-central1/clusters/c", "rc-head")
        == (static["metadata"]["name"])
    )  # type: ignore[arg-type]


def test_flex_start_and_queued_nodes_carry_their_labels_and_the_queued_taint() -> None:
    flex = {"machineType": "a4-highgpu-8g", "flexStart": True}
    assert kube_nodes._labels(_pool("f", flex, 1), "us-central1-b", "n")["cloud.google.com/gke-flex-start"] == "true"
    queued = _pool("q", {"machineType": "a4-highgpu-8g", "flexStart": True}, 1, queuedProvisioning={"enabled": True})
    node = kube_nodes.node_object(queued, "us-central1-b", "0", NOW)
    assert node["metadata"]["labels"]["cloud.google.com/gke-queued"] == "true"
    assert {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]


# --- KubeRay's desired resources, the log's checks, the access review -------------------------------------------
def test_desired_resources_add_up_as_kuberay_and_resource_quantity_do() -> None:
    def container(**resources: Any) -> dict[str, Any]:
        return {"name": "ray", "resources": resources}

    raycluster = {
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": [
                container(requests={"cpu": "500m", "memory": "8Gi"}), container(limits={"cpu": "1"})]}}},
            "workerGroupSpecs": [
                {"replicas": 2, "template": {"spec": {"containers": [
                    container(requests={"cpu": "8"}, limits={"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 8})]}}},
                {"replicas": 5, "suspend": True, "template": {"spec": {"containers": [container(limits={"cpu": 9})]}}},
            ],
        }
    }  # fmt: skip
    # Requests win over limits; the suspended group counts for nothing; GPUs are every *gpu resource.
    assert desired_resources(raycluster) == {"cpu": "17500m", "memory": "136Gi", "nvidia.com/gpu": "16", "gpu": "16"}
    assert format_quantity(*parse_quantity("1536Mi")) == "1536Mi"
    assert format_quantity(Decimal(1536 * 1024**2), "binary") == "1536Mi"
    assert format_quantity(Decimal(512), "binary") == "512"
    assert format_quantity(Decimal("0.5"), "decimal") == "500m"
    with pytest.raises(ValueError, match="regular expression"):
        parse_quantity("lots")


def test_the_log_names_the_container_as_the_api_server_does() -> None:
    pod = _pod(["ray-head", "fluent-bit"], {})
    assert kube_podlog.container_for(pod, "fluent-bit") == "fluent-bit"
    with pytest.raises(KubeError, match=r"choose one of: \[ray-head fluent-bit\]") as refused:
        kube_podlog.container_for(pod, "")
    assert refused.value.code == 400
    with pytest.raises(KubeError, match="container nope is not valid for pod p"):
        kube_podlog.container_for(pod, "nope")
    assert kube_podlog.container_for(_pod(["only"], {}), "") == "only"
    assert kube_podlog.tail(b"a\nb\nc\n", 2, None) == b"b\nc\n"
    assert kube_podlog.tail(b"a\nb\nc\n", 0, None) == b""
    assert kube_podlog.tail(b"a\nb\nc\n", None, 3) == b"a\nb"


def test_an_access_review_needs_exactly_one_kind_of_attributes() -> None:
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview"}
    asked = {"resourceAttributes": {"verb": "create", "group": "ray.io", "resource": "rayclusters"}}
    answer = kube_authz.review({**body, "spec": asked})
    assert answer["status"] == {"allowed": True} and answer["spec"] == asked
    for attributes in ({}, {**asked, "nonResourceAttributes": {"path": "/api", "verb": "get"}}):
        with pytest.raises(KubeError) as refused:
            kube_authz.review({**body, "spec": attributes})
        assert refused.value.code == 422


# --- Table: the other built-in kinds' printers (printers.go v1.32) --------------------------------------------------
def _meta(name: str, namespace: str | None = "default", **fields: Any) -> dict[str, Any]:
    meta = {"name": name, "creationTimestamp": _at(75), **fields}
    return {**meta, "namespace": namespace} if namespace else meta


def _shown(group_version: str, plural: str) -> list[str]:
    """The columns kubectl shows without ``-o wide`` (priority 0)."""
    return [c["name"] for c in kube_table.columns_for(group_version, plural) if c["priority"] == 0]


def test_namespaces_accounts_config_maps_and_secrets_print_status_and_counts() -> None:
    assert _shown("v1", "namespaces") == ["Name", "Status", "Age"]
    namespace = {"metadata": _meta("team", None), "status": {"phase": "Terminating"}}
    assert kube_table.row_cells("v1", "namespaces", namespace, NOW) == ["team", "Terminating", "75s"]
    # A namespace is Active from its creation (SetDefaults_NamespaceStatus), status or not.
    assert kube_table.row_cells("v1", "namespaces", {"metadata": _meta("new", None)}, NOW)[1] == "Active"
    assert _shown("v1", "serviceaccounts") == ["Name", "Secrets", "Age"]
    account = {"metadata": _meta("generic-ksa"), "secrets": [{"name": "a"}, {"name": "b"}]}
    assert kube_table.row_cells("v1", "serviceaccounts", account, NOW) == ["generic-ksa", 2, "75s"]
    assert kube_table.row_cells("v1", "serviceaccounts", {"metadata": _meta("bare")}, NOW)[1] == 0
    assert _shown("v1", "configmaps") == ["Name", "Data", "Age"]
    config = {"metadata": _meta("fluentbit"), "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}
    assert kube_table.row_cells("v1", "configmaps", config, NOW) == ["fluentbit", 3, "75s"]
    assert _shown("v1", "secrets") == ["Name", "Type", "Data", "Age"]
    token = {"metadata": _meta("rc"), "type": "kubernetes.io/basic-auth", "data": {"username": "dQ=="}}
    assert kube_table.row_cells("v1", "secrets", token, NOW) == ["rc", "kubernetes.io/basic-auth", 1, "75s"]
    # stringData is merged into data on write, and the type defaults to Opaque.
    sent = {"metadata": _meta("s"), "data": {"a": "YQ=="}, "stringData": {"a": "x", "b": "y"}}
    assert kube_table.row_cells("v1", "secrets", sent, NOW) == ["s", "Opaque", 2, "75s"]


def test_a_claim_bound_to_its_volume_prints_bound_the_volume_capacity_and_rwx() -> None:
    cluster = KubeCluster("1", "projects/p/locations/us-central1/clusters/c")
    volume_spec = {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "lustre",
        "persistentVolumeReclaimPolicy": "Retain",
    }
    volume = cluster.new_object(
        "v1", "PersistentVolume", "pv", None, {"spec": {**volume_spec, "capacity": {"storage": "18000Gi"}}}
    )
    volume["metadata"]["creationTimestamp"] = _at(75)
    kube_volumes.volume_created(cluster, cluster.put("v1", "persistentvolumes", volume))
    claim_spec = {**volume_spec, "volumeName": "pv", "resources": {"requests": {"storage": "18000Gi"}}}
    claim = cluster.new_object("v1", "PersistentVolumeClaim", "pvc", "default", {"spec": claim_spec})
    claim["metadata"]["creationTimestamp"] = _at(75)
    kube_volumes.claim_created(cluster, claim)
    assert _shown("v1", "persistentvolumeclaims") == [
        "Name", "Status", "Volume", "Capacity", "Access Modes", "StorageClass", "VolumeAttributesClass", "Age",
    ]  # fmt: skip
    bound = cluster.get("v1", "persistentvolumeclaims", "default", "pvc")
    assert kube_table.row_cells("v1", "persistentvolumeclaims", bound, NOW) == [
        "pvc", "Bound", "pv", "18000Gi", "RWX", "lustre", "<unset>", "75s", "Filesystem",
    ]  # fmt: skip
    assert _shown("v1", "persistentvolumes") == [
        "Name", "Capacity", "Access Modes", "Reclaim Policy", "Status", "Claim", "StorageClass",
        "VolumeAttributesClass", "Reason", "Age",
    ]  # fmt: skip
    assert kube_table.row_cells("v1", "persistentvolumes", cluster.get("v1", "persistentvolumes", None, "pv"), NOW) == [
        "pv", "18000Gi", "RWX", "Retain", "Bound", "default/pvc", "lustre", "<unset>", "", "75s", "Filesystem",
    ]  # fmt: skip
    # A claim that names no volume shows neither capacity nor modes, whatever it requests.
    pending = {"metadata": _meta("wait"), "spec": {"resources": {"requests": {"storage": "1Gi"}}}}
    assert kube_table.row_cells("v1", "persistentvolumeclaims", pending, NOW)[1:6] == ["Pending", "", "", "", ""]


def test_volume_cells_follow_the_helpers_order_canonical_quantities_and_the_beta_class_annotation() -> None:
    volume = {
        "metadata": _meta("pv", None, annotations={"volume.beta.kubernetes.io/storage-class": "beta"},
                          deletionTimestamp=_at(1)),
        "spec": {"capacity": {"storage": "1024Gi"}, "storageClassName": "ignored", "volumeMode": "Block",
                 "accessModes": ["ReadWriteOncePod", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOnce"],
                 "volumeAttributesClassName": "gold"},
        "status": {"phase": "Failed", "reason": "Recycling"},
    }  # fmt: skip
    assert kube_table.row_cells("v1", "persistentvolumes", volume, NOW) == [
        "pv", "1Ti", "RWO,RWX,RWOP", "Retain", "Terminating", "", "beta", "gold", "Recycling", "75s", "Block",
    ]  # fmt: skip
    # Go's zero Quantity prints "0": a bound claim whose status has no capacity yet.
    claim = {"metadata": _meta("c"), "spec": {"volumeName": "pv"}, "status": {"phase": "Bound"}}
    assert kube_table.row_cells("v1", "persistentvolumeclaims", claim, NOW)[3:5] == ["0", ""]


def test_a_service_prints_its_type_cluster_ip_and_ports() -> None:
    assert _shown("v1", "services") == ["Name", "Type", "Cluster-IP", "External-IP", "Port(s)", "Age"]
    # KubeRay's head service as the sandbox stores it (no type, no protocols), with an allocated cluster IP.
    head = {
        "metadata": _meta("rc-head-svc"),
        "spec": {
            "clusterIP": "10.0.0.9",
            "selector": {"ray.io/node-type": "head", "ray.io/cluster": "rc"},
            "ports": [{"name": "dashboard", "port": 8265}, {"name": "gcs-server", "port": 6379},
                      {"name": "client", "port": 10001}],
        },
    }  # fmt: skip
    assert kube_table.row_cells("v1", "services", head, NOW) == [
        "rc-head-svc", "ClusterIP", "10.0.0.9", "<none>", "8265/TCP,6379/TCP,10001/TCP", "75s",
        "ray.io/cluster=rc,ray.io/node-type=head",
    ]  # fmt: skip
    node_port = {"metadata": _meta("np"), "spec": {
        "type": "NodePort", "clusterIPs": ["10.0.0.3", "fd00::3"], "externalIPs": ["1.2.3.4"],
        "ports": [{"port": 80, "nodePort": 30080, "protocol": "UDP"}]}}  # fmt: skip
    assert kube_table.row_cells("v1", "services", node_port, NOW)[1:5] == [
        "NodePort",
        "10.0.0.3",
        "1.2.3.4",
        "80:30080/UDP",
    ]
    balancer = {"metadata": _meta("lb"), "spec": {"type": "LoadBalancer", "clusterIP": "None"}}
    assert kube_table.row_cells("v1", "services", balancer, NOW)[1:5] == ["LoadBalancer", "None", "<pending>", "<none>"]
    balancer["status"] = {
        "loadBalancer": {"ingress": [{"ip": "34.1.1.2"}, {"hostname": "lb.example"}, {"ip": "34.1.1.2"}]}
    }
    assert kube_table.row_cells("v1", "services", balancer, NOW)[3] == "34.1.1.2,lb.example"
    external = {"metadata": _meta("ext"), "spec": {"type": "ExternalName", "externalName": "db.example.com"}}
    assert kube_table.row_cells("v1", "services", external, NOW)[1:4] == ["ExternalName", "<none>", "db.example.com"]
    assert kube_table.row_cells("v1", "services", external, NOW)[6] == "<none>"


def test_events_print_last_seen_the_object_and_the_message_and_the_rest_wide() -> None:
    assert _shown("v1", "events") == ["Last Seen", "Type", "Reason", "Object", "Message"]
    names = [c["name"] for c in kube_table.columns_for("v1", "events")]
    assert names[4:] == ["Subobject", "Source", "Message", "First Seen", "Count", "Name"]
    # As the sandbox's KubeRay writes them: a lastTimestamp, no firstTimestamp and no eventTime.
    scheduling = {
        "metadata": _meta("rc-head.1a2b"), "type": "Warning", "reason": "FailedScheduling", "count": 1,
        "involvedObject": {"kind": "Pod", "name": "rc-head", "namespace": "default"},
        "message": "0/1 nodes are available \n", "lastTimestamp": _at(75),
    }  # fmt: skip
    assert kube_table.row_cells("v1", "events", scheduling, NOW) == [
        "75s", "Warning", "FailedScheduling", "pod/rc-head", "", "", "0/1 nodes are available", "<unknown>", 1,
        "rc-head.1a2b",
    ]  # fmt: skip
    # An events.k8s.io-shaped one: eventTime for first seen, the series for last seen and count, the reporting fields.
    series = {
        "metadata": _meta("n.1"), "type": "Normal", "reason": "Pulled", "eventTime": "2027-01-15T07:58:00.000000Z",
        "involvedObject": {"kind": "Node", "fieldPath": "spec.containers{ray}"},
        "series": {"count": 4, "lastObservedTime": _at(30)}, "reportingComponent": "kubelet",
        "reportingInstance": "gke-n1", "source": {},
    }  # fmt: skip
    cells = kube_table.row_cells("v1", "events", series, NOW)
    assert cells[0] == "30s" and cells[3:6] == ["node", "spec.containers{ray}", "kubelet, gke-n1"]
    assert cells[8] == 4
    assert kube_table.row_cells("v1", "events", {**scheduling, "count": 0, "firstTimestamp": _at(150)}, NOW)[7:9] == [
        "2m30s", 1,
    ]  # fmt: skip


def test_daemon_sets_and_pod_templates_print_their_containers_and_selectors() -> None:
    assert _shown("apps/v1", "daemonsets") == [
        "Name", "Desired", "Current", "Ready", "Up-to-date", "Available", "Node Selector", "Age",
    ]  # fmt: skip
    installer = {
        "metadata": _meta("nccl-rdma-installer", "kube-system"),
        "spec": {
            "selector": {"matchLabels": {"k8s-app": "nccl"},
                         "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["b", "a"]},
                                              {"key": "z", "operator": "DoesNotExist"},
                                              {"key": "a", "operator": "Exists"}]},
            "template": {"spec": {
                "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-b200"},
                "containers": [{"name": "pause", "image": "pause:3.8"}, {"name": "log", "image": "bb"}]}},
        },
        "status": {"desiredNumberScheduled": 2, "currentNumberScheduled": 2, "numberReady": 1,
                   "updatedNumberScheduled": 2, "numberAvailable": 1},
    }  # fmt: skip
    assert kube_table.row_cells("apps/v1", "daemonsets", installer, NOW) == [
        "nccl-rdma-installer", 2, 2, 1, 2, 1, "cloud.google.com/gke-accelerator=nvidia-b200", "75s", "pause,log",
        "pause:3.8,bb", "a,k8s-app=nccl,tier notin (a,b),!z",
    ]  # fmt: skip
    fresh = {"metadata": _meta("new"), "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    assert kube_table.row_cells("apps/v1", "daemonsets", fresh, NOW)[1:7] == [0, 0, 0, 0, 0, "<none>"]
    assert kube_table.format_label_selector({"matchLabels": {}}) == "<none>"
    assert kube_table.format_label_selector({"matchExpressions": [{"key": "k", "operator": "Gt"}]}) == "<error>"
    assert _shown("v1", "podtemplates") == ["Name", "Containers", "Images", "Pod Labels"]
    template = {
        "metadata": _meta("t"),
        "template": {"metadata": {"labels": {"b": "2", "a": "1"}},
                     "spec": {"containers": [{"name": "x", "image": "ix"}, {"name": "y", "image": "iy"}]}},
    }  # fmt: skip
    assert kube_table.row_cells("v1", "podtemplates", template, NOW) == ["t", "x,y", "ix,iy", "a=1,b=2"]


def test_a_list_of_claims_turns_into_a_table_of_the_claim_printer() -> None:
    claims = {
        "kind": "PersistentVolumeClaimList",
        "metadata": {"resourceVersion": "7"},
        "items": [{"metadata": _meta("c"), "spec": {"volumeName": "v"},
                   "status": {"phase": "Bound", "accessModes": ["ReadWriteMany"], "capacity": {"storage": "1Gi"}}}],
    }  # fmt: skip
    table = kube_table.to_table("v1", "persistentvolumeclaims", claims, {})
    assert [c["name"] for c in table["columnDefinitions"]][:5] == [
        "Name",
        "Status",
        "Volume",
        "Capacity",
        "Access Modes",
    ]
    assert table["rows"][0]["cells"][:5] == ["c", "Bound", "v", "1Gi", "RWX"]
    assert all(set(c) == {"name", "type", "format", "description", "priority"} for c in table["columnDefinitions"])
