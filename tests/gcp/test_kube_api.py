"""The sandbox's Kubernetes API answers as GKE's API server does (issue #37, first part): ``/version``, the full
label-selector grammar, the field labels each kind supports, and ``dryRun=All``. Real HTTPS with the Google token,
through the package's own KubeHook, against a cluster created through the production resources."""

from __future__ import annotations

from typing import Any

import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.kube.client import KubeApiError, KubeHook, ObjectRef
from nemo_rl_gke.run.ownership import reader
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.topology import GKE_CLUSTER
from tests.gcp.conftest import ensure_cluster_with_gpu_pool

pytestmark = pytest.mark.airflow
PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
def kube(spec: RunSpec, hook: GcpHook) -> KubeHook:
    """The package's hook on a running GKE cluster of the test's project."""
    ensure_cluster_with_gpu_pool(spec, hook)
    return KubeHook(spec, hook)


def _pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": {"containers": []}}


def _names(kube: KubeHook, labels: str = "", fields: str = "") -> list[str]:
    return sorted(o["metadata"]["name"] for o in kube.list("v1", "Pod", "default", labels=labels, fields=fields))


def test_version_is_the_clusters_gke_version(kube: KubeHook, hook: GcpHook, spec: RunSpec) -> None:
    cluster = resources(spec, reader())[GKE_CLUSTER].get(hook)
    assert cluster is not None
    version = kube.request("GET", "/version")
    assert version["gitVersion"] == "v" + cluster["currentMasterVersion"]
    assert (version["major"], version["minor"]) == tuple(cluster["currentMasterVersion"].split(".")[:2])


def test_discovery_gives_the_short_names_kubectl_resolves(kube: KubeHook) -> None:
    core = {r["name"]: r.get("shortNames") for r in kube.request("GET", "/api/v1")["resources"]}
    assert (core["namespaces"], core["pods"], core["persistentvolumeclaims"], core["secrets"]) == (
        ["ns"], ["po"], ["pvc"], None,
    )  # fmt: skip
    apps = {r["name"]: r.get("shortNames") for r in kube.request("GET", "/apis/apps/v1")["resources"]}
    assert apps["daemonsets"] == ["ds"]


def test_label_selectors_take_the_full_grammar_and_refuse_what_the_api_server_refuses(kube: KubeHook) -> None:
    pods = {
        "head": {"ray.io/cluster": "rc", "ray.io/node-type": "head"},
        "worker-0": {"ray.io/cluster": "rc", "ray.io/node-type": "worker", "rank": "0"},
        "worker-1": {"ray.io/cluster": "rc", "ray.io/node-type": "worker", "rank": "7"},
        "other": {"ray.io/cluster": "other"},
    }
    for name, labels in pods.items():
        kube.request("POST", PODS, body=_pod(name, labels))
    # What the old parser split on the first '=' and answered with nothing, silently.
    assert _names(kube, "ray.io/cluster=rc,ray.io/node-type!=head") == ["worker-0", "worker-1"]
    assert _names(kube, "ray.io/cluster==rc") == ["head", "worker-0", "worker-1"]
    assert _names(kube, "ray.io/node-type in (head, worker),rank notin (7)") == ["head", "worker-0"]
    assert _names(kube, "rank") == ["worker-0", "worker-1"]
    assert _names(kube, "!rank,ray.io/cluster") == ["head", "other"]
    assert _names(kube, "rank>3") == ["worker-1"]
    for bad in ("ray.io/cluster=r c", "a=b=c", "in (x)", "rank>x", "key in (a"):
        with pytest.raises(KubeApiError) as refused:
            _names(kube, bad)
        assert refused.value.status == 400 and "unable to parse requirement" in str(refused.value), bad


def test_field_selectors_take_each_kinds_field_labels_only(kube: KubeHook) -> None:
    kube.request("POST", PODS, body=_pod("a", {}))
    kube.request("POST", PODS, body=_pod("b", {}))
    assert _names(kube, fields="metadata.name=a") == ["a"]
    assert _names(kube, fields="metadata.name!=a") == ["b"]
    with pytest.raises(KubeApiError) as refused:
        _names(kube, fields="spec.containers=x")
    assert refused.value.status == 400 and "field label not supported: spec.containers" in str(refused.value)
    # Events take involvedObject.name (the RayCluster trigger reads a pod's events by it).
    assert kube.list("v1", "Event", "default", fields="involvedObject.name=a") == []


def test_a_server_side_dry_run_answers_as_the_real_call_and_stores_nothing(kube: KubeHook) -> None:
    ref = ObjectRef("v1", "ConfigMap", "dry", "default")
    path = "/api/v1/namespaces/default/configmaps"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dry"}, "data": {"k": "v"}}
    created = kube.request("POST", path, body=body, query={"dryRun": "All"})
    assert created["metadata"]["name"] == "dry" and created["metadata"]["uid"]
    assert kube.get(ref) is None
    applied = kube.request(
        "PATCH", f"{path}/dry", body=body, content_type="application/apply-patch+yaml",
        query={"fieldManager": "t", "dryRun": "All"},
    )  # fmt: skip
    assert applied["data"] == {"k": "v"} and kube.get(ref) is None
    kube.apply(body)
    before = kube.get(ref)
    assert before is not None
    kube.request("DELETE", f"{path}/dry", query={"dryRun": "All"})
    changed = kube.request(
        "PATCH", f"{path}/dry", body={**body, "data": {"k": "w"}}, content_type="application/apply-patch+yaml",
        query={"fieldManager": "t", "dryRun": "All", "force": "true"},
    )  # fmt: skip
    assert changed["data"] == {"k": "w"}
    assert kube.get(ref) == before  # neither the delete nor the change happened
    with pytest.raises(KubeApiError) as refused:
        kube.request("POST", path, body=body, query={"dryRun": "Some"})
    assert refused.value.status == 400 and 'supported values: "All"' in str(refused.value)


def _volume(name: str, claim: str | None, policy: str = "Retain") -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": "18000Gi"}, "accessModes": ["ReadWriteMany"],
                            "persistentVolumeReclaimPolicy": policy, "csi": {"driver": "lustre.csi.storage.gke.io",
                                                                             "volumeHandle": name}}  # fmt: skip
    if claim:
        spec["claimRef"] = {"namespace": "default", "name": claim}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


def _claim(name: str, volume: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteMany"], "volumeName": volume, "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip


def _phase(kube: KubeHook, kind: str, name: str) -> str:
    found = kube.get(ObjectRef("v1", kind, name, "default" if kind == "PersistentVolumeClaim" else None))
    return str(((found or {}).get("status") or {}).get("phase"))


def test_a_pre_bound_volume_and_its_claim_bind_whichever_comes_first_and_a_deleted_claim_releases_it(
    kube: KubeHook,
) -> None:
    # As the run applies them (the PV first, pre-bound to its claim), and the other way round.
    kube.apply(_volume("pv-a", "claim-a"))
    assert _phase(kube, "PersistentVolume", "pv-a") == "Available"
    kube.apply(_claim("claim-a", "pv-a"))
    kube.apply(_claim("claim-b", "pv-b"))
    assert _phase(kube, "PersistentVolumeClaim", "claim-b") == "Pending"
    kube.apply(_volume("pv-b", None))
    for volume, claim in (("pv-a", "claim-a"), ("pv-b", "claim-b")):
        assert (_phase(kube, "PersistentVolume", volume), _phase(kube, "PersistentVolumeClaim", claim)) == (
            "Bound",
            "Bound",
        )
        pv = kube.get(ObjectRef("v1", "PersistentVolume", volume, None)) or {}
        pvc = kube.get(ObjectRef("v1", "PersistentVolumeClaim", claim, "default")) or {}
        assert pv["spec"]["claimRef"]["uid"] == pvc["metadata"]["uid"]
    # A volume reserved for another claim is not taken.
    kube.apply(_volume("pv-c", "someone-else"))
    kube.apply(_claim("claim-c", "pv-c"))
    assert _phase(kube, "PersistentVolumeClaim", "claim-c") == "Pending"
    # Deleting a bound claim releases a Retain volume; deleting a bound volume loses its claim.
    kube.delete(ObjectRef("v1", "PersistentVolumeClaim", "claim-a", "default"))
    assert _phase(kube, "PersistentVolume", "pv-a") == "Released"
    kube.delete(ObjectRef("v1", "PersistentVolume", "pv-b", None))
    assert _phase(kube, "PersistentVolumeClaim", "claim-b") == "Lost"


def test_the_packages_apply_is_strict_so_a_field_gke_would_drop_fails_it(
    kube: KubeHook, sandbox: SandboxProcess
) -> None:
    # A KubeRay or GKE field this cluster's CRD lacks must fail the apply, not vanish from what runs.
    since = sandbox.calls()[-1]["seq"]
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "strict", "namespace": "default"}}
    kube.apply({**config, "data": {"a": "1"}})
    with pytest.raises(KubeApiError, match=r"\.dataa: field not declared in schema"):
        kube.apply({**config, "dataa": {"a": "1"}})
    applies = [c for c in sandbox.calls(since) if c["method"] == "PATCH" and c["path"].endswith("/configmaps/strict")]
    assert [c["status"] for c in applies] == [201, 500]
    assert all("fieldValidation=Strict" in c["query"] and "force=true" in c["query"] for c in applies), applies
