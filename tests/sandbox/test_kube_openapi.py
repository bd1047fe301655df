"""The sandbox's OpenAPI documents and field validation (issue #37): the unknown-field walk over the 1.32 schemas and
the CRDs' structural schemas, and, through a real cluster API and the package's KubeHook, ``fieldValidation`` on
create and server-side apply and the ``/openapi/v3`` documents kubectl reads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sandbox.kube import RESOURCES
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.kube.client import KubeApiError, KubeHook, ObjectRef
from nemo_rl_gke.run.spec import RunSpec
from sandbox import kube_openapi as ko
from tests.gcp.conftest import FAST_RETRY, ZONE, ensure_cluster_with_gpu_pool

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def _pod(**extra: Any) -> dict[str, Any]:
    container = {"name": "c", "image": "busybox", "ports": [{"containerPort": 80}], **extra.pop("container", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"any/label": "x"}},
        "spec": {"containers": [container], **extra},
    }


def _raycluster(**spec: Any) -> dict[str, Any]:
    template = {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "head", "image": "ray"}]}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc"},
        "spec": {"headGroupSpec": {"rayStartParams": {}, "template": template}, **spec},
    }


# --- the schema walk ----------------------------------------------------------------------------------------------
def test_a_valid_pod_has_no_unknown_fields_and_maps_take_any_key() -> None:
    pod = _pod(container={"resources": {"limits": {"nvidia.com/gpu": 8}}}, nodeSelector={"k": "v"})
    assert ko.unknown_fields("v1", "Pod", pod) == []


def test_unknown_fields_are_named_as_strict_decoding_names_them_in_document_order() -> None:
    pod = _pod(foo=1, container={"bar": True, "ports": [{"containerPort": 80, "baz": 1}]})
    pod["metadata"]["zzz"] = "x"
    assert ko.unknown_fields("v1", "Pod", pod) == [
        "metadata.zzz",
        "spec.containers[0].ports[0].baz",  # ports come before bar in the container as sent
        "spec.containers[0].bar",
        "spec.foo",
    ]


def test_int_or_string_and_free_form_fields_are_not_walked() -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s"},
        "spec": {"ports": [{"port": 80, "targetPort": "http"}]},
    }
    assert ko.unknown_fields("v1", "Service", service) == []
    meta = {"name": "x", "managedFields": [{"manager": "m", "fieldsV1": {"f:data": {"f:anything": {}}}}]}
    assert ko.unknown_fields("v1", "ConfigMap", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}) == []


def test_crd_unknown_fields_are_sorted_and_reach_into_the_inlined_pod_template() -> None:
    rc = _raycluster(zzz=1, workerGroupSpecs=[{"groupName": "g", "minReplicas": 0, "maxReplicas": 1, "x": 1,
                                               "template": {"spec": {"containers": []}}}])  # fmt: skip
    rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["bad"] = 1
    # controller-gen's embedded ObjectMeta keeps labels, annotations, name, namespace, finalizers only.
    rc["spec"]["headGroupSpec"]["template"]["metadata"]["generateName"] = "x-"
    assert ko.unknown_fields("ray.io/v1", "RayCluster", rc) == [
        "spec.headGroupSpec.template.metadata.generateName",
        "spec.headGroupSpec.template.spec.containers[0].bad",
        "spec.workerGroupSpecs[0].x",
        "spec.zzz",
    ]


def test_pruned_drops_exactly_the_unknown_fields() -> None:
    pod = _pod(foo=1, container={"bar": True})
    kept = ko.pruned("v1", "Pod", pod)
    assert "foo" not in kept["spec"] and "bar" not in kept["spec"]["containers"][0]
    assert kept["spec"]["containers"][0]["ports"] == [{"containerPort": 80}]
    assert kept["metadata"]["labels"] == {"any/label": "x"}
    assert pod["spec"]["foo"] == 1  # the caller's object is untouched


def test_apply_errors_name_list_elements_by_their_keys_and_stop_at_a_maps_first_unknown_field() -> None:
    pod = _pod(container={"ports": [{"containerPort": 80, "baz": 1}], "bar": True, "zzz": 1}, foo=1, bar=2)
    assert ko.apply_schema_errors("v1", "Pod", pod) == [
        '.spec.containers[name="c"].ports[containerPort=80].baz: field not declared in schema',
        '.spec.containers[name="c"].bar: field not declared in schema',  # not zzz: the container map stopped
        ".spec.foo: field not declared in schema",  # not bar: so did spec
    ]
    ref = {"group": "g", "kind": "k", "name": "n", "extra": 1}
    net = {"apiVersion": "networking.gke.io/v1", "kind": "Network", "metadata": {"name": "n"},
           "spec": {"type": "Device", "parametersRef": ref}}  # fmt: skip
    assert ko.apply_schema_errors("networking.gke.io/v1", "Network", net) == [
        ".spec.parametersRef.extra: field not declared in schema"
    ]


def test_every_served_kind_has_a_schema_and_an_unknown_kind_is_not_checked() -> None:
    for gv, kinds in RESOURCES.items():
        for _, kind, _ in kinds:
            assert ko.schema_name(gv, kind), (gv, kind)
    assert ko.unknown_fields("example.com/v1", "Thing", {"spec": {"x": 1}}) == []


def test_an_unsupported_directive_is_invalid_on_the_options() -> None:
    with pytest.raises(Exception) as refused:
        ko.directive({"fieldValidation": "strict"}, "CreateOptions")
    status = refused.value.status()  # type: ignore[attr-defined]
    assert status["code"] == 422 and status["reason"] == "Invalid"
    assert status["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "strict": '
        'supported values: "", "Ignore", "Strict", "Warn"'
    )
    assert ko.directive({}, "PatchOptions") == "Warn"


def test_the_patch_operation_documents_field_validation_for_its_gvk() -> None:
    doc = json.loads(ko.document("ray.io/v1", RESOURCES))
    patch = doc["paths"]["/apis/ray.io/v1/namespaces/{namespace}/rayclusters/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "ray.io", "kind": "RayCluster", "version": "v1"}
    assert {"fieldValidation", "fieldManager", "force"} <= {p["name"] for p in patch["parameters"]}
    schema = doc["components"]["schemas"]["io.ray.v1.RayCluster"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": "ray.io", "kind": "RayCluster", "version": "v1"}]
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in doc["components"]["schemas"]
    assert ko.warning_header('unknown field "spec.foo"') == '299 - "unknown field \\"spec.foo\\""'


# --- through a real cluster API -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kube(sandbox_process: SandboxProcess) -> Iterator[KubeHook]:
    """The package's hook on one running cluster for the module (made once: the walk is what is tested)."""
    spec = RunSpec.from_conf({"project": "openapi-fields", "region": "us-central1", "zone": ZONE})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", sandbox_process.connection_json(spec.project))
        hook = GcpHook(retry_policy=FAST_RETRY)
        ensure_cluster_with_gpu_pool(spec, hook)
        yield KubeHook(spec, hook)


def _configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}, "foo": 1}


def _create(kube: KubeHook, body: dict[str, Any], mode: str | None) -> tuple[int, dict[str, str], dict[str, Any]]:
    """POST through the hook's client, keeping the response headers (the hook's request() keeps only the body)."""
    query = [("fieldValidation", mode)] if mode else []
    data, status, headers = kube.api_client.call_api(
        CONFIGMAPS, "POST", query_params=query, body=body, auth_settings=["BearerToken"],
        header_params={"Content-Type": "application/json"}, response_types_map={201: "object"},
        _return_http_data_only=False, _preload_content=True,
    )  # fmt: skip
    return status, dict(headers), data


@pytest.mark.airflow
def test_create_strict_refuses_warn_warns_and_ignore_drops_unknown_fields(kube: KubeHook) -> None:
    with pytest.raises(KubeApiError) as refused:
        kube.request("POST", CONFIGMAPS, body=_configmap("strict"), query={"fieldValidation": "Strict"})
    assert refused.value.status == 400 and refused.value.reason == "BadRequest"
    assert 'ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error: unknown field "foo"' in (
        str(refused.value)
    )
    assert kube.get(ObjectRef("v1", "ConfigMap", "strict", "default")) is None
    for mode, warned in (("Warn", True), (None, True), ("Ignore", False)):
        name = f"cm-{(mode or 'default').lower()}"
        status, headers, created = _create(kube, _configmap(name), mode)
        assert status == 201 and "foo" not in created and created["data"] == {"k": "v"}
        assert (headers.get("Warning") == '299 - "unknown field \\"foo\\""') is warned, (mode, headers)
        stored = kube.get(ObjectRef("v1", "ConfigMap", name, "default"))
        assert stored is not None and "foo" not in stored
    with pytest.raises(KubeApiError) as invalid:
        kube.request("POST", CONFIGMAPS, body=_configmap("bad"), query={"fieldValidation": "Loud"})
    assert invalid.value.status == 422 and "fieldValidation: Unsupported value" in str(invalid.value)


@pytest.mark.airflow
def test_apply_refuses_unknown_fields_whatever_the_directive_as_the_api_server_does(kube: KubeHook) -> None:
    rc = _raycluster(zzz=1)
    for mode in ("Strict", "Warn", "Ignore"):
        with pytest.raises(KubeApiError) as refused:
            kube.request(
                "PATCH", "/apis/ray.io/v1/namespaces/default/rayclusters/rc", body=rc,
                content_type="application/apply-patch+yaml",
                query={"fieldManager": "t", "fieldValidation": mode, "dryRun": "All"},
            )  # fmt: skip
        # The namespace is the applied body's (none here), as objectGVKNN reads it from the patch object.
        assert refused.value.status == 500, mode
        assert "failed to create typed patch object (/rc; ray.io/v1, Kind=RayCluster): " in str(refused.value)
        assert ".spec.zzz: field not declared in schema" in str(refused.value)
    applied = kube.request(
        "PATCH", "/apis/ray.io/v1/namespaces/default/rayclusters/rc", body=_raycluster(),
        content_type="application/apply-patch+yaml", query={"fieldManager": "t", "dryRun": "All"},
    )  # fmt: skip
    assert applied["spec"]["headGroupSpec"]["template"]["metadata"] == {"labels": {"a": "b"}}


@pytest.mark.airflow
def test_openapi_v3_index_points_at_each_group_versions_document_by_its_hash(kube: KubeHook) -> None:
    paths = kube.request("GET", "/openapi/v3")["paths"]
    assert set(paths) == {"api/v1"} | {f"apis/{gv}" for gv in RESOURCES if "/" in gv}
    url = paths["api/v1"]["serverRelativeURL"]
    doc = kube.request("GET", url.split("?")[0], query={"hash": url.split("hash=")[1]})
    assert doc["components"]["schemas"]["io.k8s.api.core.v1.Pod"]["x-kubernetes-group-version-kind"] == [
        {"group": "", "kind": "Pod", "version": "v1"}
    ]
    # A stale hash is redirected to the current one; protobuf, which the sandbox cannot encode, is not acceptable.
    pool = kube.api_client.rest_client.pool_manager
    auth = {"Authorization": f"Bearer {kube.token()}"}
    stale = pool.request("GET", f"{kube.access.host}/openapi/v3/api/v1?hash=0", headers=auth, redirect=False)
    assert stale.status == 301 and stale.headers["Location"] == url
    proto = {**auth, "Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"}
    assert pool.request("GET", f"{kube.access.host}/openapi/v2", headers=proto).status == 406
