"""PATCH and managedFields in the sandbox's Kubernetes API (issue #37): JSON, merge and strategic merge patches
(``sandbox/kube_patch.py``) and structured-merge-diff owners and conflicts (``sandbox/kube_fields.py``). Pure unit
tests first, then one real cluster over HTTPS through the package's KubeHook."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.kube.client import KubeHook
from nemo_rl_gke.run.spec import RunSpec
from sandbox import kube_fields as kf
from sandbox import kube_patch as kp
from tests.gcp.conftest import ensure_cluster_with_gpu_pool, hook, project, spec  # noqa: F401 (fixtures)

POD = kf.Shape("v1", "Pod")
RAY = kf.Shape("ray.io/v1", "RayCluster")


def _pod(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "1"}}, "spec": fields}


def _rc(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"}, "spec": fields}


# --- JSON patch -----------------------------------------------------------------------------------------------------
def test_json_patch_runs_every_rfc6902_operation_in_order() -> None:
    doc = _pod(containers=[{"name": "a", "image": "x"}])
    out = kp.json_patch(doc, [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "move", "from": "/metadata/labels/a", "path": "/metadata/labels/b"},
        {"op": "copy", "from": "/spec/containers/0", "path": "/spec/containers/-"},
        {"op": "replace", "path": "/spec/containers/1/name", "value": "c"},
        {"op": "add", "path": "/spec/containers/0", "value": {"name": "first"}},
        {"op": "remove", "path": "/spec/containers/-1"},  # json-patch v4 takes negative indices
    ])  # fmt: skip
    assert out["metadata"]["labels"] == {"b": "1"}
    assert [c["name"] for c in out["spec"]["containers"]] == ["first", "a"]
    assert doc["metadata"]["labels"] == {"a": "1"}  # the stored object is not touched


@pytest.mark.parametrize(
    ("op", "detail"),
    [
        ({"op": "test", "path": "/metadata/labels/a", "value": "2"}, "testing value /metadata/labels/a failed"),
        ({"op": "remove", "path": "/metadata/labels/zz"}, "Unable to remove nonexistent key: zz"),
        ({"op": "add", "path": "/nope/deeper", "value": 1}, 'doc is missing path: "/nope/deeper"'),
        ({"op": "replace", "path": "/spec/containers/5", "value": 1}, "doc is missing key: /spec/containers/5"),
        ({"op": "frobnicate", "path": "/a"}, "Unexpected kind: frobnicate"),
    ],
)
def test_a_failing_json_patch_operation_is_422_with_the_generic_message(op: dict[str, Any], detail: str) -> None:
    with pytest.raises(kp.PatchError) as refused:
        kp.json_patch(_pod(containers=[]), [op])
    assert (refused.value.code, refused.value.reason) == (422, "Invalid")
    assert refused.value.message == "the server rejected our request due to an error in our request"
    assert detail in refused.value.detail


def test_a_json_patch_that_is_not_a_list_is_a_bad_request() -> None:
    with pytest.raises(kp.PatchError) as refused:
        kp.apply_patch(kp.JSON_PATCH, _pod(), '{"op": "add"}', "v1", "Pod")
    assert refused.value.code == 400 and "cannot unmarshal object" in refused.value.message


# --- merge patch ----------------------------------------------------------------------------------------------------
def test_merge_patch_merges_maps_deletes_nulls_and_replaces_lists() -> None:
    doc = _pod(containers=[{"name": "a"}, {"name": "b"}])
    out = kp.merge_patch(doc, {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"containers": [{"name": "z"}]}})
    assert out["metadata"] == {"name": "p", "labels": {"c": "3"}}
    assert out["spec"]["containers"] == [{"name": "z"}]
    with pytest.raises(kp.PatchError) as refused:
        kp.apply_patch(kp.MERGE_PATCH, doc, "null", "v1", "Pod")
    assert (refused.value.code, refused.value.message) == (400, "Invalid JSON Patch")


# --- strategic merge patch ----------------------------------------------------------------------------------------
def test_strategic_merge_merges_containers_env_and_ports_by_their_merge_keys() -> None:
    doc = _pod(
        containers=[
            {"name": "a", "image": "x", "env": [{"name": "E", "value": "1"}], "ports": [{"containerPort": 80}]},
            {"name": "b", "image": "y"},
        ],
        tolerations=[{"key": "t1"}],
    )
    patch = {
        "spec": {
            "containers": [{"name": "a", "env": [{"name": "F", "value": "2"}], "ports": [{"containerPort": 81}]}],
            "tolerations": [{"key": "t2"}],  # no patchStrategy: replaced
        }
    }
    out = kp.strategic_merge_patch(doc, patch, "v1", "Pod")
    first = out["spec"]["containers"][0]
    assert first["image"] == "x" and [e["name"] for e in first["env"]] == ["E", "F"]
    assert [p["containerPort"] for p in first["ports"]] == [80, 81]
    assert [c["name"] for c in out["spec"]["containers"]] == ["a", "b"]
    assert out["spec"]["tolerations"] == [{"key": "t2"}]


def test_strategic_merge_directives_delete_replace_order_and_retain_keys() -> None:
    doc = _pod(
        containers=[{"name": "a"}, {"name": "b"}, {"name": "c"}],
        volumes=[{"name": "v", "emptyDir": {}}],
    )
    deleted = kp.strategic_merge_patch(doc, {"spec": {"containers": [{"name": "b", "$patch": "delete"}]}}, "v1", "Pod")
    assert [c["name"] for c in deleted["spec"]["containers"]] == ["a", "c"]
    ordered = kp.strategic_merge_patch(
        doc, {"spec": {"$setElementOrder/containers": [{"name": "c"}, {"name": "a"}], "containers": [{"name": "c"}]}},
        "v1", "Pod",
    )  # fmt: skip
    # b is server-only: mergeSortedSlice puts it before c, which comes after it in the live list.
    assert [c["name"] for c in ordered["spec"]["containers"]] == ["b", "c", "a"]
    retained = kp.strategic_merge_patch(
        doc, {"spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/x"}}]}},
        "v1", "Pod",
    )  # fmt: skip
    assert retained["spec"]["volumes"] == [{"name": "v", "hostPath": {"path": "/x"}}]
    replaced = kp.strategic_merge_patch(doc, {"metadata": {"labels": {"$patch": "replace", "z": "9"}}}, "v1", "Pod")
    assert replaced["metadata"]["labels"] == {"z": "9"}


def test_strategic_merge_without_the_merge_key_is_a_bad_request() -> None:
    with pytest.raises(kp.PatchError) as refused:
        kp.strategic_merge_patch(
            _pod(containers=[{"name": "a"}]), {"spec": {"containers": [{"image": "x"}]}}, "v1", "Pod"
        )
    assert refused.value.code == 400 and refused.value.message.endswith("does not contain declared merge key: name")


def test_custom_resources_refuse_strategic_merge_as_the_crd_handler_does() -> None:
    with pytest.raises(kp.PatchError) as refused:
        kp.check_content_type("application/strategic-merge-patch+json", "ray.io/v1")
    assert (refused.value.code, refused.value.reason) == (415, "UnsupportedMediaType")
    assert refused.value.message == (
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    )
    assert (
        kp.check_content_type("application/strategic-merge-patch+json; charset=utf-8", "apps/v1") == kp.STRATEGIC_PATCH
    )


# --- field sets -----------------------------------------------------------------------------------------------------
def test_field_sets_key_associative_lists_by_their_keys_and_encode_as_fields_v1() -> None:
    pod = _pod(containers=[{"name": "a", "image": "x", "ports": [{"containerPort": 80}]}])
    pod["metadata"]["finalizers"] = ["f1"]
    fields = kf.field_set(pod, POD)
    port = ("f:spec", "f:containers", 'k:{"name":"a"}', "f:ports", 'k:{"containerPort":80,"protocol":"TCP"}')
    assert (*port, "f:containerPort") in fields  # protocol defaulted into the key, as the API server defaults it
    assert ("f:metadata", "f:finalizers", 'v:"f1"') in fields
    assert ("f:metadata", "f:name") not in fields and ("f:apiVersion",) not in fields  # stripped
    tree = kf.to_fields_v1(fields)
    assert tree["f:spec"]["f:containers"]['k:{"name":"a"}']["."] == {}
    assert kf.from_fields_v1(tree) == fields


def test_an_update_owns_what_it_changed_and_takes_it_from_other_managers() -> None:
    managed = kf.Managed()
    created = _rc(x=1, y=2)
    kf.record_update(None, created, managed, "creator", RAY)
    creator = kf.Owner("creator", kf.UPDATE, "ray.io/v1")
    # A custom resource's empty object has no spec: the create added it, so the set has spec itself (".").
    assert kf.to_fields_v1(managed.owners[creator].fields) == {"f:spec": {".": {}, "f:x": {}, "f:y": {}}}
    kf.record_update(created, _rc(x=5, y=2), managed, "editor", RAY)
    assert managed.owners[creator].fields == {("f:spec",), ("f:spec", "f:y")}
    assert managed.owners[kf.Owner("editor", kf.UPDATE, "ray.io/v1")].fields == {("f:spec", "f:x")}


def test_apply_conflicts_with_another_owner_and_force_takes_the_field() -> None:
    managed = kf.Managed()
    live = kf.apply(None, _rc(x=1, y=[1]), managed, "first", RAY, force=False)
    with pytest.raises(kf.ApplyConflict) as conflict:
        kf.apply(live, _rc(x=2), managed, "second", RAY, force=False)
    assert conflict.value.message() == 'Apply failed with 1 conflict: conflict with "first": .spec.x'
    assert conflict.value.causes() == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "first"', "field": ".spec.x"}
    ]
    forced = kf.apply(live, _rc(x=2), managed, "second", RAY, force=True)
    assert forced["spec"] == {"x": 2, "y": [1]}
    assert managed.owners[kf.Owner("first", kf.APPLY)].fields == {("f:spec", "f:y")}
    assert managed.owners[kf.Owner("second", kf.APPLY)].fields == {("f:spec", "f:x")}


def test_an_update_owner_is_named_with_its_api_version_and_conflicts_list_by_manager() -> None:
    managed = kf.Managed()
    live = _rc(x=1, y=1)
    kf.record_update(None, live, managed, "kubectl-edit", RAY)
    with pytest.raises(kf.ApplyConflict) as conflict:
        kf.apply(live, _rc(x=2, y=2), managed, "mine", RAY, force=False)
    assert conflict.value.message() == (
        'Apply failed with 2 conflicts: conflicts with "kubectl-edit" using ray.io/v1:\n- .spec.x\n- .spec.y'
    )


def test_applying_the_same_value_co_owns_and_a_dropped_field_goes_only_when_nobody_else_owns_it() -> None:
    managed = kf.Managed()
    live = kf.apply(None, _rc(x=1, y=1, z=1), managed, "a", RAY, force=False)
    live = kf.apply(live, _rc(x=1), managed, "b", RAY, force=False)  # same value: no conflict
    assert ("f:spec", "f:x") in managed.owners[kf.Owner("b", kf.APPLY)].fields
    live = kf.apply(live, _rc(y=1), managed, "a", RAY, force=False)
    assert live["spec"] == {"x": 1, "y": 1}  # z had no other owner; x is still b's


def test_apply_merges_containers_by_name_and_prunes_the_managers_own_dropped_item() -> None:
    managed = kf.Managed()
    two = _pod(containers=[{"name": "a", "image": "x"}, {"name": "b", "image": "y"}])
    live = kf.apply(None, two, managed, "m", POD, force=False)
    live = kf.record_update(live, two, managed, "other", POD) and live  # nothing changed: no owner
    assert kf.Owner("other", kf.UPDATE, "v1") not in managed.owners
    out = kf.apply(live, _pod(containers=[{"name": "b", "image": "z"}]), managed, "m", POD, force=False)
    assert out["spec"]["containers"] == [{"name": "b", "image": "z"}]


def test_the_manager_of_an_update_comes_from_the_user_agent_without_field_manager() -> None:
    assert kf.manager_for("", "kubectl/v1.32.3 (linux/amd64) kubernetes/abc") == "kubectl"
    assert kf.manager_for("mine", "kubectl/v1.32.3") == "mine"
    assert kf.manager_for("", "OpenAPI-Generator/31.0.0/python") == "OpenAPI-Generator"


# --- over HTTPS, through the package's hook ---------------------------------------------------------------------
@pytest.fixture
def kube(spec: RunSpec, hook: GcpHook) -> KubeHook:  # noqa: F811 (fixtures imported above)
    """The package's hook on a running GKE cluster of the test's project."""
    ensure_cluster_with_gpu_pool(spec, hook)
    return KubeHook(spec, hook)


def _raw(kube: KubeHook, path: str, body: Any, content_type: str, **query: str) -> tuple[int, dict[str, Any]]:
    """PATCH through the hook's API client; the status and the JSON body, an error's Status included."""
    try:
        response = kube.api_client.call_api(
            path, "PATCH", query_params=list(query.items()), body=body, auth_settings=["BearerToken"],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            _preload_content=False, _return_http_data_only=True,
        )  # fmt: skip
    except ApiException as exc:
        return exc.status, json.loads(exc.body)
    return response.status, json.loads(response.data)


# A custom resource no sandbox controller acts on (a RayCluster would start a Ray head).
NET_PATH = "/apis/networking.gke.io/v1/gkenetworkparamsets/net"
CM_PATH = "/api/v1/namespaces/default/configmaps/cm"


def test_server_side_apply_conflicts_over_https_and_force_takes_over(kube: KubeHook) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "default"}}
    status, _ = _raw(kube, CM_PATH, {**cm, "data": {"k": "1"}}, kp.APPLY_PATCH, fieldManager="alice")
    assert status == 201
    status, refused = _raw(kube, CM_PATH, {**cm, "data": {"k": "2"}}, kp.APPLY_PATCH, fieldManager="bob")
    assert status == 409 and refused["reason"] == "Conflict"
    assert refused["message"] == 'Apply failed with 1 conflict: conflict with "alice": .data.k'
    assert refused["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "alice"', "field": ".data.k"}
    ]
    status, missing = _raw(kube, CM_PATH, cm, kp.APPLY_PATCH)
    assert (status, missing["message"]) == (
        422, 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
    )  # fmt: skip
    status, forced = _raw(kube, CM_PATH, {**cm, "data": {"k": "2"}}, kp.APPLY_PATCH, fieldManager="bob", force="true")
    assert status == 200 and forced["data"] == {"k": "2"}
    assert [(e["manager"], e["operation"]) for e in forced["metadata"]["managedFields"]] == [("bob", "Apply")]
    # The package's own apply (fieldManager + force) still takes over a field another manager set.
    applied = kube.apply({**cm, "data": {"k": "3"}})
    assert applied["data"] == {"k": "3"}


def test_merge_json_and_strategic_patches_over_https(kube: KubeHook) -> None:
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "a", "image": "x"}]},
    }  # fmt: skip
    created = kube.request("POST", "/api/v1/namespaces/default/pods", body=pod, query={"fieldManager": "maker"})
    path = "/api/v1/namespaces/default/pods/p"
    status, merged = _raw(kube, path, {"metadata": {"labels": {"l": "1"}}}, kp.MERGE_PATCH, fieldManager="labeler")
    assert status == 200 and merged["metadata"]["labels"] == {"l": "1"}
    assert int(merged["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert {e["manager"] for e in merged["metadata"]["managedFields"]} == {"maker", "labeler"}
    status, same = _raw(kube, path, {"metadata": {"labels": {"l": "1"}}}, kp.MERGE_PATCH, fieldManager="labeler")
    assert same["metadata"]["resourceVersion"] == merged["metadata"]["resourceVersion"]  # a no-op keeps it
    status, strategic = _raw(
        kube, path, {"spec": {"containers": [{"name": "b", "image": "y"}]}}, kp.STRATEGIC_PATCH, fieldManager="s"
    )
    assert status == 200 and [c["name"] for c in strategic["spec"]["containers"]] == ["a", "b"]
    status, failed = _raw(kube, path, [{"op": "test", "path": "/metadata/name", "value": "q"}], kp.JSON_PATCH)
    assert (status, failed["reason"]) == (422, "Invalid")
    status, patched = _raw(kube, path, [{"op": "remove", "path": "/metadata/labels/l"}], kp.JSON_PATCH)
    assert status == 200 and not patched["metadata"].get("labels")
    status, forbidden = _raw(kube, path, {}, kp.MERGE_PATCH, force="true")
    assert status == 422 and forbidden["message"].endswith("force: Forbidden: may not be specified for non-apply patch")


def test_a_custom_resource_refuses_strategic_merge_but_takes_merge_patch(kube: KubeHook) -> None:
    net = {"apiVersion": "networking.gke.io/v1", "kind": "GKENetworkParamSet", "metadata": {"name": "net"}}
    kube.request("POST", "/apis/networking.gke.io/v1/gkenetworkparamsets", body={**net, "spec": {"vpc": "a"}})
    status, refused = _raw(kube, NET_PATH, {"spec": {"vpc": "b"}}, kp.STRATEGIC_PATCH)
    assert (status, refused["reason"]) == (415, "UnsupportedMediaType")
    assert "application/strategic-merge-patch+json" not in refused["message"]
    status, merged = _raw(kube, NET_PATH, {"spec": {"vpc": "b"}}, kp.MERGE_PATCH)
    assert status == 200 and merged["spec"]["vpc"] == "b" and merged["metadata"]["generation"] == 2
