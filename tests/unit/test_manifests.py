"""The Kubernetes manifests: rendered from the RunSpec only, valid, and equivalent in substance to the tutorial's."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from nemo_rl_gke.kube.validation import KUBERNETES_SCHEMA_VERSION, available_schema_versions, validate_manifest
from nemo_rl_gke.plan import manifests as manifests_module
from nemo_rl_gke.plan.manifests import (
    LUSTRE_IP_PLACEHOLDER,
    Manifest,
    ManifestSourceError,
    load_nccl_installer,
    render_manifests,
    render_template,
)
from nemo_rl_gke.run import paths as paths_module
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.ownership import MANAGED_BY, MANAGED_BY_KEY, Owner
from nemo_rl_gke.run.spec import RunSpec

IMAGE = "nvcr.io/nvidia/nemo-rl:v0.5.0"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-rdma-installer.yaml"
TUTORIAL = RunSpec()  # the tutorial's run: B200, two GPU workers
H200 = RunSpec.from_conf(
    {
        "gpu_type": "h200",
        "worker_replicas": 4,
        "gpu_pool_max_nodes": 4,
        "namespace": "nemo-rl",
        "ksa_name": "nemo-ksa",
        "raycluster_name": "rc-h200",
        "lustre_name": "lustre-h200",
        "lustre_capacity_gib": 36000,
        "lustre_throughput": 250,
        "gvnic_prefix": "h-gvnic",
        "rdma_prefix": "h-rdma",
    }
)
SPECS = {"tutorial-b200": TUTORIAL, "h200-4-workers": H200}
NCCL_ENV_COMMON = {
    "NCCL_NET": "gIB",
    "NCCL_IB_GID_INDEX": "3",
    "NCCL_CROSS_NIC": "0",
    "NCCL_SOCKET_IFNAME": "eth0",
    "GLOO_SOCKET_IFNAME": "eth0",
    "TP_SOCKET_IFNAME": "eth0",
    "NCCL_NET_GDR_LEVEL": "PIX",
    "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64",
}
TUNER = {
    "b200": "/usr/local/gib/configs/tuner_config_a4.txtpb",
    "h200": "/usr/local/gib/configs/tuner_config_a3u.txtpb",
}
ACCELERATOR = {"b200": "nvidia-b200", "h200": "nvidia-h200-141gb"}


def owner_of(spec: RunSpec) -> Owner:
    """The identity a run of ``spec`` stamps on its objects."""
    return Owner("dep-a", spec.group_id, "nemo_rl_grpo_gke/manual__test")


OWNER = owner_of(RunSpec())


def _objects(spec: RunSpec, **kwargs: Any) -> list[dict[str, Any]]:
    return [m.obj for m in render_manifests(spec, IMAGE, owner_of(spec), **kwargs)]


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _raycluster(spec: RunSpec) -> dict[str, Any]:
    return _one(_objects(spec), "RayCluster")


def _head_pod(spec: RunSpec) -> dict[str, Any]:
    return _raycluster(spec)["spec"]["headGroupSpec"]["template"]


def _worker_group(spec: RunSpec) -> dict[str, Any]:
    groups = _raycluster(spec)["spec"]["workerGroupSpecs"]
    assert len(groups) == 1
    return groups[0]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _ray_container(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's Ray container: the first, then the fluent-bit sidecar and nothing else (KubeRay takes the first as
    the Ray container)."""
    containers = pod["spec"]["containers"]
    assert [c["name"] for c in containers[1:]] == ["fluent-bit"]
    return containers[0]


def _mount_sources(pod: dict[str, Any], container: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """mountPath -> the volume behind it, for ``container`` (default: the pod's Ray container)."""
    container = container or _ray_container(pod)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}


# --- order and validity ------------------------------------------------------------------------------------------
def test_apply_order_with_the_bundled_installer() -> None:
    kinds = [m.kind for m in render_manifests(TUTORIAL, IMAGE, owner_of(TUTORIAL))]
    assert kinds == [
        "DaemonSet",
        *["GKENetworkParamSet", "Network"] * 9,
        "PersistentVolume",
        "PersistentVolumeClaim",
        "ServiceAccount",
        "ConfigMap",
        "RayCluster",
    ]


def test_external_installer_is_not_rendered_nor_fetched_at_plan_time(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*_: Any, **__: Any) -> None:
        raise AssertionError("render_manifests must not fetch anything")

    monkeypatch.setattr(manifests_module.urllib.request, "urlopen", no_network)
    monkeypatch.setattr(manifests_module.urllib.request, "build_opener", no_network)
    spec = RunSpec.from_conf({"nccl_installer_source": "https://example.com/nccl-rdma-installer.yaml"})
    kinds = [m.kind for m in render_manifests(spec, IMAGE, owner_of(spec))]
    assert "DaemonSet" not in kinds
    assert kinds[0] == "GKENetworkParamSet"
    assert kinds[-1] == "RayCluster"


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_every_rendered_object_validates(spec: RunSpec) -> None:
    for manifest in render_manifests(spec, IMAGE, owner_of(spec), lustre_ip="10.90.0.5"):
        assert validate_manifest(manifest.obj) == [], manifest.name


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_every_object_carries_the_ownership_labels(spec: RunSpec) -> None:
    for obj in _objects(spec):
        labels = obj["metadata"]["labels"]
        assert labels[MANAGED_BY_KEY] == MANAGED_BY
        assert owner_of(spec).labels.items() <= labels.items()


def test_manifest_accessors() -> None:
    manifests = render_manifests(TUTORIAL, IMAGE, owner_of(TUTORIAL))
    pvc = next(m for m in manifests if m.kind == "PersistentVolumeClaim")
    assert (pvc.template, pvc.api_version, pvc.name, pvc.namespace) == (
        "lustre-storage.yaml.j2",
        "v1",
        "nemo-rl-lustre-pvc",
        "default",
    )
    pv = next(m for m in manifests if m.kind == "PersistentVolume")
    assert pv.namespace is None
    assert isinstance(pv, Manifest)


def test_schema_version_is_one_kubernetes_validate_ships() -> None:
    assert KUBERNETES_SCHEMA_VERSION in available_schema_versions()


# --- network mapping ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_network_mapping_matches_the_tutorial(spec: RunSpec) -> None:
    objects = _objects(spec)
    param_sets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "GKENetworkParamSet"}
    networks = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Network"}
    expected = {"gvnic-1": (spec.gvnic_network, spec.gvnic_subnet, "NetDevice")}
    expected |= {f"rdma-{n}": (spec.rdma_network, spec.rdma_subnets[n], "RDMA") for n in range(8)}
    assert len(param_sets) == 9
    assert len(networks) == 9
    assert {
        name: (p["spec"]["vpc"], p["spec"]["vpcSubnet"], p["spec"]["deviceMode"]) for name, p in param_sets.items()
    } == expected
    for name, network in networks.items():
        assert network["apiVersion"] == "networking.gke.io/v1"
        assert network["spec"] == {
            "type": "Device",
            "parametersRef": {"group": "networking.gke.io", "kind": "GKENetworkParamSet", "name": name},
        }
    for obj in [*param_sets.values(), *networks.values()]:
        assert "namespace" not in obj["metadata"], "network mapping objects are cluster-scoped"


def test_network_mapping_uses_the_tutorial_names_for_the_default_run() -> None:
    param_sets = {o["metadata"]["name"]: o["spec"] for o in _objects(TUTORIAL) if o["kind"] == "GKENetworkParamSet"}
    assert param_sets["gvnic-1"] == {
        "vpc": "nemo-rl-gvnic-net",
        "vpcSubnet": "nemo-rl-gvnic-sub",
        "deviceMode": "NetDevice",
    }
    assert param_sets["rdma-5"] == {"vpc": "nemo-rl-rdma-net", "vpcSubnet": "nemo-rl-rdma-sub-5", "deviceMode": "RDMA"}


# --- Lustre ------------------------------------------------------------------------------------------------------
def test_lustre_pv_and_pvc_match_the_tutorial() -> None:
    objects = _objects(TUTORIAL, lustre_ip="10.90.0.5")
    pv, pvc = _one(objects, "PersistentVolume"), _one(objects, "PersistentVolumeClaim")
    assert pv["metadata"]["name"] == TUTORIAL.lustre_pv
    assert pv["spec"] == {
        "storageClassName": "lustre-rwx-500mbps-per-tib",
        "capacity": {"storage": "18000Gi"},
        "accessModes": ["ReadWriteMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        "volumeMode": "Filesystem",
        "claimRef": {"namespace": "default", "name": TUTORIAL.lustre_pvc},
        "csi": {
            "driver": "lustre.csi.storage.gke.io",
            "volumeHandle": "nemo-rl-demo/us-central1-b/nemo-rl-lustre",
            "volumeAttributes": {"ip": "10.90.0.5", "filesystem": "lustrefs"},
        },
    }
    assert pvc["metadata"]["name"] == TUTORIAL.lustre_pvc
    assert pvc["metadata"]["namespace"] == "default"
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "lustre-rwx-500mbps-per-tib",
        "volumeName": TUTORIAL.lustre_pv,
        "resources": {"requests": {"storage": "18000Gi"}},
    }


def test_lustre_objects_follow_the_spec() -> None:
    objects = _objects(H200)
    pv, pvc = _one(objects, "PersistentVolume"), _one(objects, "PersistentVolumeClaim")
    assert pv["spec"]["capacity"]["storage"] == "36000Gi"
    assert pv["spec"]["storageClassName"] == pvc["spec"]["storageClassName"] == H200.lustre_storage_class
    assert pv["spec"]["claimRef"] == {"namespace": "nemo-rl", "name": H200.lustre_pvc}
    assert pv["spec"]["csi"]["volumeHandle"] == H200.lustre_volume_handle
    assert pvc["metadata"]["namespace"] == "nemo-rl"


def test_plan_mode_leaves_the_lustre_ip_placeholder() -> None:
    pv = _one(_objects(TUTORIAL), "PersistentVolume")
    assert (
        pv["spec"]["csi"]["volumeAttributes"]["ip"]
        == LUSTRE_IP_PLACEHOLDER
        == "<LUSTRE_IP from the instance's mountPoint>"
    )


# --- RayCluster --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_raycluster_identity_and_service_account(spec: RunSpec) -> None:
    objects = _objects(spec)
    rc, sa = _one(objects, "RayCluster"), _one(objects, "ServiceAccount")
    assert rc["apiVersion"] == "ray.io/v1"
    assert (rc["metadata"]["name"], rc["metadata"]["namespace"]) == (spec.raycluster_name, spec.namespace)
    assert (sa["metadata"]["name"], sa["metadata"]["namespace"]) == (spec.ksa_name, spec.namespace)
    assert objects.index(sa) < objects.index(rc), "the pods' service account must exist before the RayCluster"
    for pod in (_head_pod(spec), _worker_group(spec)["template"]):
        assert pod["spec"]["serviceAccountName"] == spec.ksa_name


def test_head_matches_the_tutorial() -> None:
    head_group = _raycluster(TUTORIAL)["spec"]["headGroupSpec"]
    assert head_group["rayStartParams"] == {"dashboard-host": "0.0.0.0"}
    pod = head_group["template"]
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "default-pool"}
    container = _ray_container(pod)
    assert container["name"] == "ray-head"
    assert container["image"] == IMAGE
    for side in ("limits", "requests"):
        assert container["resources"][side] == {"cpu": "64", "memory": "500G", "nvidia.com/gpu": 0}
    assert _env(container) == {"RAY_GROUP": "head"}
    script = container["command"][-1]
    assert container["command"][:2] == ["bash", "-c"]
    assert script.rstrip().endswith("exec ${KUBERAY_GEN_RAY_START_CMD}")
    assert "cd /opt/nemo-rl" in script
    assert "/usr/bin/python -m uv venv" in script
    assert "git " not in script
    assert _mount_sources(pod)["/data"] == {
        "name": "lustre-data",
        "persistentVolumeClaim": {"claimName": TUTORIAL.lustre_pvc},
    }


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_worker_group_matches_the_tutorial(spec: RunSpec) -> None:
    group = _worker_group(spec)
    assert group["groupName"] == spec.worker_group == "worker-grp-0"
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == spec.worker_replicas
    pod = group["template"]
    container = _ray_container(pod)
    assert container["name"] == "ray-worker"
    assert container["image"] == IMAGE
    assert container["securityContext"] == {"privileged": True}
    for side in ("limits", "requests"):
        assert container["resources"][side] == {"nvidia.com/gpu": 8, "cpu": "206", "memory": "2400Gi"}
    assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": ACCELERATOR[spec.gpu_type]}
    assert pod["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        {"key": "cloud.google.com/impending-node-termination", "operator": "Exists"},
        {"key": "user-workload", "operator": "Exists"},
    ]
    script = container["command"][-1]
    assert script.rstrip().endswith("exec ${KUBERAY_GEN_RAY_START_CMD}")
    assert "source /usr/local/gib/scripts/set_nccl_env.sh" in script
    assert "git " not in script


def test_worker_replicas_come_from_the_spec() -> None:
    assert _worker_group(TUTORIAL)["replicas"] == 2
    assert _worker_group(H200)["replicas"] == 4


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_worker_nccl_env_is_exact(spec: RunSpec) -> None:
    env = _env(_ray_container(_worker_group(spec)["template"]))
    assert env.pop("RAY_GROUP") == {"fieldRef": {"fieldPath": "metadata.labels['ray.io/group']"}}
    assert env == {**NCCL_ENV_COMMON, "NCCL_TUNER_CONFIG_PATH": TUNER[spec.gpu_type]}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_worker_multi_nic_annotations_are_exactly_eth0_to_eth9(spec: RunSpec) -> None:
    annotations = _worker_group(spec)["template"]["metadata"]["annotations"]
    assert annotations["networking.gke.io/default-interface"] == "eth0"
    assert json.loads(annotations["networking.gke.io/interfaces"]) == [
        {"interfaceName": "eth0", "network": "default"},
        {"interfaceName": "eth1", "network": "gvnic-1"},
        *({"interfaceName": f"eth{n + 2}", "network": f"rdma-{n}"} for n in range(8)),
    ]


def test_every_interface_names_a_rendered_network() -> None:
    objects = _objects(H200)
    networks = {o["metadata"]["name"] for o in objects if o["kind"] == "Network"}
    interfaces = json.loads(_worker_group(H200)["template"]["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert {i["network"] for i in interfaces} - {"default"} == networks


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_worker_volumes_match_the_tutorial(spec: RunSpec) -> None:
    mounts = _mount_sources(_worker_group(spec)["template"])
    assert mounts["/dev/shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "240Gi"}
    assert mounts["/usr/local/nvidia"]["hostPath"] == {"path": "/home/kubernetes/bin/nvidia"}
    assert mounts["/usr/local/gib"]["hostPath"] == {"path": "/home/kubernetes/bin/gib"}
    assert mounts["/data"]["persistentVolumeClaim"] == {"claimName": spec.lustre_pvc}
    assert mounts["/tmp/ray"] == {"name": "log-volume", "emptyDir": {}}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_ray_logs_ship_as_the_tutorial_chart_ships_them(spec: RunSpec) -> None:
    # The tutorial's chart: a fluent-bit sidecar on head and workers, sharing the emptyDir log-volume on /tmp/ray with
    # the Ray container, its config from the ConfigMap on /fluent-bit/etc/ (the head's Ray container mounts it too:
    # the tutorial's head values forget it, so its head sidecar would tail nothing).
    objects = _objects(spec)
    config = _one(objects, "ConfigMap")
    assert config["metadata"]["name"] == spec.fluentbit_config_name == f"{spec.raycluster_name}-fluentbit-config"
    assert TUTORIAL.fluentbit_config_name == "ray-cluster-kuberay-fluentbit-config"  # the tutorial's release's name
    conf = config["data"]["fluent-bit.conf"]
    for path in ("logs/worker-*", "logs/raylet*", "logs/*"):
        assert f"Path              /tmp/ray/session_latest/{path}\n" in conf
    assert "Name              stackdriver" in conf and "resource          gce_instance" in conf
    kinds = [o["kind"] for o in objects]
    assert kinds.index("ConfigMap") < kinds.index("RayCluster")  # the pods mount it
    for pod, group in ((_head_pod(spec), {"value": "head"}), (_worker_group(spec)["template"], None)):
        sidecar = pod["spec"]["containers"][1]
        assert sidecar["image"] == "fluent/fluent-bit:latest"
        sidecar_mounts = _mount_sources(pod, sidecar)
        assert sidecar_mounts["/fluent-bit/etc/"] == {
            "name": "fluentbit-config-volume",
            "configMap": {"name": spec.fluentbit_config_name},
        }
        assert sidecar_mounts["/tmp/ray"] == _mount_sources(pod)["/tmp/ray"] == {"name": "log-volume", "emptyDir": {}}
        ray_group = sidecar["env"][0]
        assert ray_group["name"] == "RAY_GROUP"
        assert ray_group.get("value") == "head" if group else "valueFrom" in ray_group


def test_data_is_the_same_pvc_on_head_and_workers() -> None:
    objects = _objects(H200)
    pvc = _one(objects, "PersistentVolumeClaim")["metadata"]["name"]
    for pod in (_head_pod(H200), _worker_group(H200)["template"]):
        assert _mount_sources(pod)["/data"]["persistentVolumeClaim"]["claimName"] == pvc


# --- NCCL installer ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_bundled_installer_targets_the_gpu_nodes(spec: RunSpec) -> None:
    (daemonset,) = load_nccl_installer(spec, owner_of(spec))
    assert (daemonset["kind"], daemonset["metadata"]["name"], daemonset["metadata"]["namespace"]) == (
        "DaemonSet",
        "nccl-rdma-installer",
        "kube-system",
    )
    pod = daemonset["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (expression,) = term["matchExpressions"]
    assert expression["key"] == "cloud.google.com/gke-accelerator"
    assert spec.gpu.accelerator_type in expression["values"]
    assert pod["tolerations"] == [{"operator": "Exists"}]
    (installer,) = pod["initContainers"]
    assert installer["image"] == "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1"
    assert installer["securityContext"] == {"privileged": True}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert set(host_paths.values()) == {"/home/kubernetes/bin/nvidia/lib64", "/home/kubernetes/bin/gib"}
    assert validate_manifest(daemonset) == []


def test_bundled_installer_is_the_one_render_manifests_applies() -> None:
    assert load_nccl_installer(TUTORIAL, owner_of(TUTORIAL)) == [_objects(TUTORIAL)[0]]


@pytest.fixture
def include_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private include/ holding the fixture installer at manifests/nccl.yaml."""
    include = tmp_path / "include"
    (include / "manifests").mkdir(parents=True)
    (include / "manifests" / "nccl.yaml").write_bytes(FIXTURE.read_bytes())
    monkeypatch.setattr(paths_module, "INCLUDE_DIR", include)
    return include


@pytest.mark.parametrize("relative", [True, False], ids=["relative-to-include", "absolute-inside-include"])
def test_installer_from_a_file_inside_include(include_dir: Path, relative: bool) -> None:
    source = "manifests/nccl.yaml" if relative else str(include_dir / "manifests" / "nccl.yaml")
    spec = RunSpec.from_conf({"nccl_installer_source": source})
    (daemonset,) = load_nccl_installer(spec, owner_of(spec))
    assert daemonset["kind"] == "DaemonSet"
    assert daemonset["spec"]["template"]["spec"]["initContainers"][0]["command"][-1] == "echo fixture installer"
    labels = daemonset["metadata"]["labels"]
    assert labels["k8s-app"] == "nccl-rdma-installer", "the file's own labels are kept"
    assert owner_of(spec).labels.items() <= labels.items(), "and the run's ownership labels are added"
    assert validate_manifest(daemonset) == []


def test_installer_from_an_allowed_https_url_is_fetched_with_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, float]] = []

    class FakeOpener:
        def open(self, url: str, timeout: float) -> io.BytesIO:
            calls.append((url, timeout))
            return io.BytesIO(FIXTURE.read_bytes())

    monkeypatch.setattr(manifests_module.urllib.request, "build_opener", lambda *handlers: FakeOpener())
    url = "https://example.com/gpudirect-rdma/nccl-rdma-installer.yaml"
    deployment = Deployment(nccl_installer_allowlist=("https://example.com/gpudirect-rdma/",))
    (daemonset,) = load_nccl_installer(RunSpec.from_conf({"nccl_installer_source": url}), OWNER, deployment)
    assert daemonset["metadata"]["name"] == "nccl-rdma-installer"
    assert calls == [(url, manifests_module.NCCL_FETCH_TIMEOUT_S)]


@pytest.mark.parametrize(
    "source",
    [
        "http://example.com/installer.yaml",
        "https://example.com/installer.yaml",  # not on the default allowlist
        "installer.yaml",
        "./installer.yaml",
        "ftp://example.com/x.yaml",
        "file:///etc/passwd",
        "/etc/passwd",
        "manifests/../../../etc/passwd.yaml",
        "",
    ],
)
def test_bad_installer_source_raises(source: str) -> None:
    with pytest.raises(ManifestSourceError, match="nccl_installer_source"):
        load_nccl_installer(RunSpec.from_conf({"nccl_installer_source": source}), OWNER)


def test_missing_or_non_manifest_installer_file_raises_without_quoting_it(include_dir: Path) -> None:
    with pytest.raises(ManifestSourceError, match="no such file inside include/"):
        load_nccl_installer(RunSpec.from_conf({"nccl_installer_source": "absent.yaml"}), OWNER)
    (include_dir / "list.yaml").write_text("- just-a-secret-line\n- a list\n")
    with pytest.raises(ManifestSourceError, match="Kubernetes object") as not_objects:
        load_nccl_installer(RunSpec.from_conf({"nccl_installer_source": "list.yaml"}), OWNER)
    assert "just-a-secret-line" not in str(not_objects.value)
    (include_dir / "broken.yaml").write_text("root:x:0:0:root:/root:/bin/bash\n  : [\n")
    with pytest.raises(ManifestSourceError, match="not valid YAML at line") as broken:
        load_nccl_installer(RunSpec.from_conf({"nccl_installer_source": "broken.yaml"}), OWNER)
    assert "root:x" not in str(broken.value)
    (include_dir / "empty.yaml").write_text("# nothing\n")
    with pytest.raises(ManifestSourceError, match="no Kubernetes object"):
        load_nccl_installer(RunSpec.from_conf({"nccl_installer_source": "empty.yaml"}), OWNER)
    (include_dir / "bomb.yaml").write_text("a: &a [x, x]\nb: &b [*a, *a]\napiVersion: v1\nkind: ConfigMap\n")
    with pytest.raises(ManifestSourceError, match="aliases"):
        load_nccl_installer(RunSpec.from_conf({"nccl_installer_source": "bomb.yaml"}), OWNER)


def test_a_symlink_out_of_include_is_refused(include_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.yaml"
    outside.write_bytes(FIXTURE.read_bytes())
    (include_dir / "manifests" / "link.yaml").symlink_to(outside)
    with pytest.raises(ManifestSourceError, match="must be inside include/"):
        load_nccl_installer(RunSpec.from_conf({"nccl_installer_source": "manifests/link.yaml"}), OWNER)


# --- validation rejects what the API server would ----------------------------------------------------------------
def _rename(container: dict[str, Any], old: str, new: str) -> None:
    container[new] = container.pop(old)


def _first(kind: str, name: str | None = None) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    def pick(objects: list[dict[str, Any]]) -> dict[str, Any]:
        return next(o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"]))

    return pick


def _worker(rc: dict[str, Any]) -> dict[str, Any]:
    return rc["spec"]["workerGroupSpecs"][0]


BROKEN: dict[str, tuple[Callable[[list[dict[str, Any]]], dict[str, Any]], Callable[[dict[str, Any]], None], str]] = {
    "worker replica": (_first("RayCluster"), lambda o: _rename(_worker(o), "replicas", "replica"), "replica"),
    "head rayStartParam": (
        _first("RayCluster"),
        lambda o: _rename(o["spec"]["headGroupSpec"], "rayStartParams", "rayStartParam"),
        "rayStartParam",
    ),
    "worker container volumeMount": (
        _first("RayCluster"),
        lambda o: _rename(_worker(o)["template"]["spec"]["containers"][0], "volumeMounts", "volumeMount"),
        "spec.workerGroupSpecs.0.template.spec.containers.0",
    ),
    "head container without image": (
        _first("RayCluster"),
        lambda o: o["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].pop("image"),
        "spec.headGroupSpec.template",
    ),
    "replicas above max": (_first("RayCluster"), lambda o: _worker(o).update(replicas=9), "minReplicas <= replicas"),
    "deviceMod": (_first("GKENetworkParamSet"), lambda o: _rename(o["spec"], "deviceMode", "deviceMod"), "deviceMod"),
    "unknown deviceMode": (_first("GKENetworkParamSet"), lambda o: o["spec"].update(deviceMode="Rdma"), "deviceMode"),
    "L3 network": (_first("Network"), lambda o: o["spec"].update(type="L3"), "spec.type"),
    "parametersRef kind": (
        _first("Network"),
        lambda o: o["spec"]["parametersRef"].update(kind="GKENetworkParamSets"),
        "parametersRef.kind",
    ),
    "network name too long": (_first("Network"), lambda o: o["metadata"].update(name="n" * 42), "41"),
    "namespaced network": (_first("Network"), lambda o: o["metadata"].update(namespace="default"), "cluster-scoped"),
    "PV storageClass": (
        _first("PersistentVolume"),
        lambda o: _rename(o["spec"], "storageClassName", "storageClass"),
        "storageClass",
    ),
    "PVC volumName": (
        _first("PersistentVolumeClaim"),
        lambda o: _rename(o["spec"], "volumeName", "volumName"),
        "volumName",
    ),
    "DaemonSet selector": (_first("DaemonSet"), lambda o: o["spec"].pop("selector"), "selector"),
    "uppercase name": (_first("ServiceAccount"), lambda o: o["metadata"].update(name="Generic-KSA"), "DNS-1123"),
    "no ownership label": (
        _first("ServiceAccount"),
        lambda o: o["metadata"]["labels"].pop(MANAGED_BY_KEY),
        MANAGED_BY_KEY,
    ),
    "foreign owner": (
        _first("PersistentVolume"),
        lambda o: o["metadata"]["labels"].update({MANAGED_BY_KEY: "x"}),
        "ownership",
    ),
    "unknown custom kind": (_first("RayCluster"), lambda o: o.update(kind="RayJob"), "no schema"),
}


@pytest.mark.parametrize("case", BROKEN.values(), ids=BROKEN.keys())
def test_validation_rejects_a_broken_object(case: tuple[Any, Any, str]) -> None:
    pick, break_it, expected = case
    obj = copy.deepcopy(pick(_objects(TUTORIAL)))
    assert validate_manifest(obj) == []
    break_it(obj)
    problems = validate_manifest(obj)
    assert problems, "the broken object was accepted"
    assert any(expected in problem for problem in problems), problems


def test_validation_of_a_non_object() -> None:
    assert validate_manifest(["not", "a", "dict"]) != []  # type: ignore[arg-type]


# --- odd values cannot break the YAML ----------------------------------------------------------------------------
def test_odd_strings_stay_single_scalars() -> None:
    odd_namespace = "odd: \"ns'\n- {x}: [y] # z"
    odd_image = "registry/img:tag\n  evil: true"
    # validate refuses these (control characters, names), so the spec is built around it: the templates must still
    # keep each one a single scalar.
    spec = dataclasses.replace(TUTORIAL, namespace=odd_namespace, ksa_name="a: b", lustre_filesystem="x\ny: z")
    objects = [m.obj for m in render_manifests(spec, odd_image, owner_of(spec), lustre_ip='1.2.3.4"\nfoo: bar')]
    assert [o["kind"] for o in objects] == [o["kind"] for o in _objects(TUTORIAL)]
    assert _one(objects, "PersistentVolumeClaim")["metadata"]["namespace"] == odd_namespace
    assert _one(objects, "RayCluster")["metadata"]["namespace"] == odd_namespace
    assert _one(objects, "ServiceAccount")["metadata"] == {
        "name": "a: b",
        "namespace": odd_namespace,
        "labels": owner_of(spec).labels,
    }
    pv = _one(objects, "PersistentVolume")
    assert pv["spec"]["claimRef"]["namespace"] == odd_namespace
    assert pv["spec"]["csi"]["volumeAttributes"] == {"ip": '1.2.3.4"\nfoo: bar', "filesystem": "x\ny: z"}
    rc = _one(objects, "RayCluster")
    assert rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == odd_image
    assert "evil" not in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    # The values survive, and validation names them instead of the YAML breaking.
    problems = validate_manifest(_one(objects, "PersistentVolumeClaim"))
    assert any("metadata.namespace" in p and "DNS-1123" in p for p in problems), problems


# --- the template environment ------------------------------------------------------------------------------------
def test_a_missing_template_variable_fails_instead_of_rendering_empty() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render_template("raycluster.yaml.j2", spec=TUTORIAL, owner=OWNER)  # no image


def test_rendered_yaml_round_trips() -> None:
    for obj in _objects(H200):
        assert yaml.safe_load(yaml.safe_dump(obj)) == obj


def test_importing_the_modules_stays_light() -> None:
    code = (
        "import sys\n"
        "import nemo_rl_gke.plan.manifests, nemo_rl_gke.kube.validation\n"
        "heavy = {'jinja2', 'yaml', 'jsonschema', 'kubernetes_validate', 'kubernetes'} & set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    plugins = str(Path(__file__).resolve().parents[2] / "plugins")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONPATH": plugins}
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _raycluster_spec(recipe: str) -> dict[str, Any]:
    spec = RunSpec.from_conf({"recipe": recipe})
    (obj,) = [m.obj for m in render_manifests(spec, IMAGE, Owner("d", "g", "r")) if m.kind == "RayCluster"]
    assert validate_manifest(obj) == []
    return obj["spec"]


def test_a_ray_with_token_auth_gets_authoptions_token_and_its_ray_version() -> None:
    # KubeRay 1.5.1+ needs both: authOptions {mode: token} and spec.rayVersion >= 2.52.0.
    spec = _raycluster_spec("qwen2.5-7b-gsm8k-v0.7.0")
    assert spec["authOptions"] == {"mode": "token"}
    assert spec["rayVersion"] == "2.55.1"
    assert _raycluster_spec("local-cpu-gsm8k")["authOptions"] == {"mode": "token"}


def test_a_ray_older_than_token_auth_declares_its_version_and_no_authoptions() -> None:
    spec = _raycluster_spec("gemma3-27b-gsm8k-v0.5.0")
    assert spec["rayVersion"] == "2.49.2"
    assert "authOptions" not in spec


def test_authoptions_are_schema_checked() -> None:
    spec = RunSpec.from_conf({"recipe": "qwen2.5-7b-gsm8k-v0.7.0"})
    (obj,) = [m.obj for m in render_manifests(spec, IMAGE, Owner("d", "g", "r")) if m.kind == "RayCluster"]
    bad = copy.deepcopy(obj)
    bad["spec"]["authOptions"] = {"mode": "password"}
    assert validate_manifest(bad) != []
