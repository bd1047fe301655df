"""The OpenAPI documents a GKE 1.32 API server serves, and the unknown-field checks it makes with them.

Served (:func:`response`), as kube-openapi's handlers at the commit Kubernetes 1.32 pins (k8s.io/kube-openapi
``32ad38e42d3f``):

- ``/openapi/v3``: the index, one ``serverRelativeURL`` with a ``hash`` (upper-case SHA-512 of the document) per
  groupVersion (pkg/handler3/handler.go:121-165);
- ``/openapi/v3/api/v1``, ``/openapi/v3/apis/{group}/{version}``: the groupVersion's paths, each operation with its
  ``x-kubernetes-group-version-kind`` and query parameters (``fieldValidation`` on PATCH is what kubectl's
  ``queryParamVerifierV3`` looks for, k8s.io/cli-runtime v0.32.4 pkg/resource/query_param_verifier_v3.go:108-144),
  and ``components.schemas`` (a ``$ref`` with siblings is wrapped in ``allOf``, as kube-openapi's v3 builder does);
  an Accept it cannot serve is 406 (pkg/handler3/handler.go:223-288), a stale ``hash`` is a 301 to the current one;
- ``/openapi/v2`` as JSON; kubectl 1.32 asks it only for protobuf (k8s.io/client-go v0.32.4
  discovery/discovery_client.go:671-682), which is not modelled: that Accept is answered 406, as the handler
  answers any Accept it cannot serve (pkg/handler/handler.go:129-177). kubectl falls back to v2 only when v3 fails.

Schemas. Built-in kinds: the Kubernetes 1.32.0 definitions shipped by ``kubernetes_validate`` (the package's own
validator reads the same files), turned back from JSON Schema into OpenAPI: the nullable types, the ``$defs`` refs and
the ``oneOf`` it gives Quantity and IntOrString are undone. Any built-in kind added to ``sandbox.kube.RESOURCES`` is
found by its ``x-kubernetes-group-version-kind``. CRDs: :data:`CRDS`, compact descriptions of the structural schemas
their projects generate; core types inside them (pod templates, env, resources...) are inlined from the same 1.32
definitions, with the embedded ObjectMeta controller-gen writes (``generateEmbeddedObjectMeta``).

Unknown fields (:func:`unknown_fields`, :func:`apply_schema_errors`, :func:`check_fields`) walk those schemas: objects,
arrays, maps (``additionalProperties``), ``x-kubernetes-preserve-unknown-fields`` and int-or-string.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiohttp import web

from sandbox.kube_errors import KubeError
from sandbox.kube_patch import patch_types

Schema = dict[str, Any]
Resources = Mapping[str, Iterable[tuple[str, str, bool]]]

# The Kubernetes minor the sandbox's GKE clusters run; the definitions are kubernetes_validate's for it.
SCHEMA_VERSION = "1.32.0"
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
V3_JSON = "application/json"
# kube-openapi's accepted media types (pkg/handler3/handler.go:240-248); the sandbox has no protobuf encoder.
PROTOBUF = ("com.github.proto-openapi.spec.v3@v1.0+protobuf", "com.github.proto-openapi.spec.v2@v1.0+protobuf")
# metav1.FieldValidation* (k8s.io/apimachinery v0.32.4 pkg/apis/meta/v1/validation/validation.go:242): "" is Warn.
DIRECTIVES = ("", "Ignore", "Strict", "Warn")
WARNINGS_KEY = "sandbox.kube_openapi.warnings"


# --- built-in kinds: the Kubernetes 1.32 definitions -------------------------------------------------------------
def _to_openapi(node: Any) -> Any:
    """One JSON-Schema node of kubernetes_validate back into the OpenAPI v3 shape the API server serves."""
    if isinstance(node, list):
        return [_to_openapi(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: Schema = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, list):
            kinds = [t for t in value if t != "null"]
            out[key] = kinds[0] if len(kinds) == 1 else kinds
        elif key == "$ref":
            out[key] = "#/components/schemas/" + str(value).rsplit("/", 1)[-1]
        else:
            out[key] = _to_openapi(value)
    if "$ref" in out and len(out) > 1:
        # kube-openapi's v3 builder: a reference with a description is an allOf of the one reference.
        out = {"allOf": [{"$ref": out.pop("$ref")}], **out}
    return out


@functools.cache
def definitions() -> dict[str, Schema]:
    """Every 1.32 definition by its OpenAPI name (``io.k8s.api.core.v1.Pod``), as the API server's components."""
    import kubernetes_validate  # lazy: the sandbox loads the 1.3 MB file only when a schema is first asked for

    path = os.path.join(
        os.path.dirname(kubernetes_validate.__file__),
        "kubernetes-json-schema",
        f"v{SCHEMA_VERSION}-local",
        "_definitions.json",
    )
    with open(path, encoding="utf-8") as handle:
        raw = json.load(handle)["$defs"]
    found = {name: _to_openapi(schema) for name, schema in raw.items()}
    # The API server's Quantity and IntOrString are strings with a format; kubernetes_validate made them oneOfs.
    found[QUANTITY] = {"description": raw[QUANTITY].get("description", ""), "type": "string"}
    found[INT_OR_STRING] = {"description": "", "format": "int-or-string", "type": "string"}
    for schema in found.values():
        # kubernetes_validate pins apiVersion and kind with an enum; the API server's schemas do not.
        for prop in ("apiVersion", "kind"):
            if isinstance(schema.get("properties", {}).get(prop), dict):
                schema["properties"][prop].pop("enum", None)
    return found


@functools.cache
def _builtin_names() -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for name, schema in definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            gv = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            out.setdefault((gv, gvk["kind"]), name)
    return out


# --- CRDs: compact structural schemas ---------------------------------------------------------------------------
STR: Schema = {"type": "string"}
BOOL: Schema = {"type": "boolean"}
NUM: Schema = {"type": "number"}
I32: Schema = {"type": "integer", "format": "int32"}
I64: Schema = {"type": "integer", "format": "int64"}
TIME: Schema = {"type": "string", "format": "date-time"}
# controller-gen's resource.Quantity: int-or-string with the quantity pattern (left out here: not validated).
QTY: Schema = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}


def obj(properties: dict[str, Schema], *required: str, **extra: Any) -> Schema:
    """An object schema with its properties (and required names)."""
    out: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        out["required"] = list(required)
    return out


def arr(items: Schema, **extra: Any) -> Schema:
    """An array schema."""
    return {"type": "array", "items": items, **extra}


def dmap(values: Schema = STR) -> Schema:
    """A map (``additionalProperties``) schema."""
    return {"type": "object", "additionalProperties": values}


def core(name: str) -> Schema:
    """A core/meta 1.32 type by its short name (``core.v1.PodTemplateSpec``, ``meta.v1.Condition``), inlined when the
    CRD's schema is built, as controller-gen inlines the Go types."""
    prefix = "io.k8s.apimachinery.pkg.apis." if name.startswith("meta.") else "io.k8s.api."
    return {"$core": prefix + name}


def enum(*values: str) -> Schema:
    """A string enum."""
    return {"type": "string", "enum": list(values)}


CONDITIONS = arr(core("meta.v1.Condition"), **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
DELETION_POLICY = enum("DeleteCluster", "DeleteWorkers", "DeleteSelf", "DeleteNone")
# KubeRay v1.5.1 ray-operator/apis/ray/v1/raycluster_types.go:13-49 (RayClusterSpec), :92-163 (head/worker groups),
# :173-215 (AutoscalerOptions), :240-310 (RayClusterStatus); checked against config/crd/bases/ray.io_rayclusters.yaml.
_RAY_CREDENTIAL = obj({"value": STR, "valueFrom": core("core.v1.EnvVarSource")})
RAY_CLUSTER_SPEC = obj(
    {
        "authOptions": obj({"mode": enum("disabled", "token")}),
        "autoscalerOptions": obj(
            {
                "env": arr(core("core.v1.EnvVar")),
                "envFrom": arr(core("core.v1.EnvFromSource")),
                "idleTimeoutSeconds": I32,
                "image": STR,
                "imagePullPolicy": STR,
                "resources": core("core.v1.ResourceRequirements"),
                "securityContext": core("core.v1.SecurityContext"),
                "upscalingMode": enum("Default", "Aggressive", "Conservative"),
                "version": enum("v1", "v2"),
                "volumeMounts": arr(core("core.v1.VolumeMount")),
            }
        ),
        "enableInTreeAutoscaling": BOOL,
        "gcsFaultToleranceOptions": obj(
            {
                "externalStorageNamespace": STR,
                "redisAddress": STR,
                "redisPassword": _RAY_CREDENTIAL,
                "redisUsername": _RAY_CREDENTIAL,
            },
            "redisAddress",
        ),
        "headGroupSpec": obj(
            {
                "enableIngress": BOOL,
                "headService": core("core.v1.Service"),
                "labels": dmap(),
                "rayStartParams": dmap(),
                "resources": dmap(),
                "serviceType": STR,
                "template": core("core.v1.PodTemplateSpec"),
            },
            "template",
        ),
        "headServiceAnnotations": dmap(),
        "managedBy": STR,
        "rayVersion": STR,
        "suspend": BOOL,
        "workerGroupSpecs": arr(
            obj(
                {
                    "groupName": STR,
                    "idleTimeoutSeconds": I32,
                    "labels": dmap(),
                    "maxReplicas": {**I32, "default": 2147483647},
                    "minReplicas": {**I32, "default": 0},
                    "numOfHosts": {**I32, "default": 1},
                    "rayStartParams": dmap(),
                    "replicas": {**I32, "default": 0},
                    "resources": dmap(),
                    "scaleStrategy": obj({"workersToDelete": arr(STR)}),
                    "suspend": BOOL,
                    "template": core("core.v1.PodTemplateSpec"),
                },
                "groupName",
                "maxReplicas",
                "minReplicas",
                "template",
            )
        ),
    },
    "headGroupSpec",
)
RAY_CLUSTER_STATUS = obj(
    {
        "availableWorkerReplicas": I32,
        "conditions": CONDITIONS,
        "desiredCPU": QTY,
        "desiredGPU": QTY,
        "desiredMemory": QTY,
        "desiredTPU": QTY,
        "desiredWorkerReplicas": I32,
        "endpoints": dmap(),
        "head": obj({"podIP": STR, "podName": STR, "serviceIP": STR, "serviceName": STR}),
        "lastUpdateTime": {**TIME, "nullable": True},
        "maxWorkerReplicas": I32,
        "minWorkerReplicas": I32,
        "observedGeneration": I64,
        "readyWorkerReplicas": I32,
        "reason": STR,
        "state": STR,
        "stateTransitionTimes": dmap(TIME),
    }
)
# KubeRay v1.5.1 ray-operator/apis/ray/v1/rayjob_types.go:109-130 (DeletionStrategy), :178-187 (SubmitterConfig),
# :195-281 (RayJobSpec), :283-330 (RayJobStatus); checked against config/crd/bases/ray.io_rayjobs.yaml.
RAY_JOB_SPEC = obj(
    {
        "activeDeadlineSeconds": I32,
        "backoffLimit": {**I32, "default": 0},
        "clusterSelector": dmap(),
        "deletionStrategy": obj(
            {
                "deletionRules": arr(
                    obj(
                        {
                            "condition": obj(
                                {"jobStatus": enum("SUCCEEDED", "FAILED"), "ttlSeconds": {**I32, "default": 0}},
                                "jobStatus",
                            ),
                            "policy": DELETION_POLICY,
                        },
                        "condition",
                        "policy",
                    ),
                    **{"x-kubernetes-list-type": "atomic"},
                ),
                "onFailure": obj({"policy": DELETION_POLICY}),
                "onSuccess": obj({"policy": DELETION_POLICY}),
            }
        ),
        "entrypoint": STR,
        "entrypointNumCpus": NUM,
        "entrypointNumGpus": NUM,
        "entrypointResources": STR,
        "jobId": STR,
        "managedBy": STR,
        "metadata": dmap(),
        "rayClusterSpec": RAY_CLUSTER_SPEC,
        "runtimeEnvYAML": STR,
        "shutdownAfterJobFinishes": BOOL,
        "submissionMode": {**STR, "default": "K8sJobMode"},
        "submitterConfig": obj({"backoffLimit": I32}),
        "submitterPodTemplate": core("core.v1.PodTemplateSpec"),
        "suspend": BOOL,
        "ttlSecondsAfterFinished": {**I32, "default": 0},
    }
)
RAY_JOB_STATUS = obj(
    {
        "dashboardURL": STR,
        "endTime": TIME,
        "failed": {**I32, "default": 0},
        "jobDeploymentStatus": STR,
        "jobId": STR,
        "jobStatus": STR,
        "message": STR,
        "observedGeneration": I64,
        "rayClusterName": STR,
        "rayClusterStatus": RAY_CLUSTER_STATUS,
        "rayJobInfo": obj({"endTime": TIME, "startTime": TIME}),
        "reason": STR,
        "startTime": TIME,
        "succeeded": {**I32, "default": 0},
    }
)
# GoogleCloudPlatform/gke-networking-api apis/network/v1/gkenetworkparamset_types.go:51-180 (the public types of GKE's
# multi-network CRDs).
GNP_SPEC = obj(
    {
        "deviceMode": enum("DPDK-VFIO", "NetDevice", "RDMA"),
        "networkAttachment": STR,
        "podIPv4Ranges": obj({"rangeNames": arr(STR)}, "rangeNames"),
        "vpc": STR,
        "vpcSubnet": STR,
    }
)
GNP_STATUS = obj(
    {"conditions": CONDITIONS, "networkName": STR, "podCIDRs": obj({"cidrBlocks": arr(STR)}, "cidrBlocks")}
)
# gke-networking-api apis/network/v1/network_types.go:97-265.
NETWORK_SPEC = obj(
    {
        "IPAMMode": enum("Internal", "External"),
        "IPAMMode6": enum("Internal", "External"),
        "dnsConfig": obj({"nameservers": arr(STR), "searches": arr(STR)}, "nameservers"),
        "externalDHCP4": BOOL,
        "gateway4": STR,
        "l2NetworkConfig": obj({"prefixLength4": I32, "vlanID": I32}),
        "networkLifecycle": enum("AnthosManaged", "UserManaged"),
        "nodeInterfaceMatcher": obj({"interfaceName": STR}),
        "parametersRef": obj({"group": STR, "kind": STR, "name": STR, "namespace": STR}, "group", "kind", "name"),
        "provider": enum("GKE"),
        "routes": arr(obj({"to": STR}, "to")),
        "type": enum("L2", "L3", "Device"),
    },
    "type",
)
# kubernetes/autoscaler cluster-autoscaler-1.32.6 cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1/
# types.go:77-174.
PROVREQ_SPEC = obj(
    {
        "parameters": dmap({"type": "string", "maxLength": 255}),
        "podSets": arr(obj({"count": I32, "podTemplateRef": obj({"name": STR})}, "count", "podTemplateRef")),
        "provisioningClassName": STR,
    },
    "podSets",
    "provisioningClassName",
)
PROVREQ_STATUS = obj(
    {"conditions": CONDITIONS, "provisioningClassDetails": dmap({"type": "string", "maxLength": 32768})}
)
# (groupVersion, kind) -> (spec, status): the CRDs a GKE cluster with KubeRay, multi-networking and queued
# provisioning serves. A new CRD kind in sandbox.kube.RESOURCES gets its schema by one row here.
CRDS: dict[tuple[str, str], tuple[Schema, Schema]] = {
    ("ray.io/v1", "RayCluster"): (RAY_CLUSTER_SPEC, RAY_CLUSTER_STATUS),
    ("ray.io/v1", "RayJob"): (RAY_JOB_SPEC, RAY_JOB_STATUS),
    ("networking.gke.io/v1", "GKENetworkParamSet"): (GNP_SPEC, GNP_STATUS),
    ("networking.gke.io/v1", "Network"): (NETWORK_SPEC, obj({"conditions": CONDITIONS})),
    ("autoscaling.x-k8s.io/v1", "ProvisioningRequest"): (PROVREQ_SPEC, PROVREQ_STATUS),
}
# controller-gen's generateEmbeddedObjectMeta: an ObjectMeta inside a CRD keeps only these fields.
EMBEDDED_META = obj({"annotations": dmap(), "finalizers": arr(STR), "labels": dmap(), "name": STR, "namespace": STR})


def _inline(node: Any) -> Any:
    """A CRD schema node with its core types inlined, without descriptions (KubeRay's ``crd:maxDescLen=0``), as
    controller-gen generates them: ObjectMeta embedded, Quantity and IntOrString int-or-string."""
    if isinstance(node, list):
        return [_inline(item) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$core") or node.get("$ref", "").rsplit("/", 1)[-1] or None
    if not ref and len(node.get("allOf", [])) == 1:
        ref = node["allOf"][0]["$ref"].rsplit("/", 1)[-1]
    if ref == META + "ObjectMeta":
        return copy.deepcopy(EMBEDDED_META)
    if ref in (QUANTITY, INT_OR_STRING):
        return copy.deepcopy(QTY)
    if ref:
        return _inline(definitions()[ref])
    return {k: _inline(v) for k, v in node.items() if k not in ("description", "x-kubernetes-group-version-kind")}


def crd_name(group_version: str, kind: str) -> str:
    """A CRD kind's component name as the API server builds it: the group reversed, ``io.ray.v1.RayCluster``."""
    group, _, version = group_version.rpartition("/")
    return ".".join([*reversed(group.split(".")), version, kind])


@functools.cache
def _crd_schema(group_version: str, kind: str) -> Schema:
    spec, status = CRDS[(group_version, kind)]
    group, _, version = group_version.rpartition("/")
    return {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"allOf": [{"$ref": f"#/components/schemas/{META}ObjectMeta"}]},
            "spec": _inline(spec),
            "status": _inline(status),
        },
        "x-kubernetes-group-version-kind": [{"group": group, "kind": kind, "version": version}],
    }


def schema_name(group_version: str, kind: str) -> str | None:
    """The component name of a kind's schema, or None when the sandbox has none for it."""
    if (group_version, kind) in CRDS:
        return crd_name(group_version, kind)
    return _builtin_names().get((group_version, kind))


def component(name: str) -> Schema:
    """A component schema by name (built-in or CRD)."""
    for (gv, kind), _ in CRDS.items():
        if crd_name(gv, kind) == name:
            return _crd_schema(gv, kind)
    return definitions()[name]


# --- the unknown-field walk -------------------------------------------------------------------------------------
def _resolve(schema: Schema | None) -> Schema | None:
    """Follow ``$ref`` and a one-element ``allOf`` to the schema that describes the value."""
    while schema is not None:
        if "$ref" in schema:
            schema = component(schema["$ref"].rsplit("/", 1)[-1])
        elif len(schema.get("allOf", [])) == 1 and "properties" not in schema:
            schema = schema["allOf"][0]
        else:
            return schema
    return None


def _opaque(schema: Schema) -> bool:
    """Whether nothing below this schema is checked: preserved unknown fields, int-or-string, a free-form object."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-int-or-string"):
        return True
    return schema.get("type") == "object" and "properties" not in schema and "additionalProperties" not in schema


Visit = Callable[[str, dict[str, Any], str], bool]


def _walk(value: Any, schema: Schema | None, path: str, found: Visit, *, ssa: bool = False) -> None:
    """Call ``found(path, mapping, key)`` for each field the schema does not declare; ``found`` says whether to go
    on with that map's other keys (structured-merge-diff stops at a map's first unknown field)."""
    schema = _resolve(schema)
    if schema is None or _opaque(schema):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key in list(value):
            sub = props.get(key) if props is not None else None
            if sub is None and isinstance(extra, dict):
                sub = extra
            child = f"{path}.{key}" if path else key
            if sub is None:
                if props is None and extra is None:
                    continue
                if not found(child, value, key):
                    return
                continue
            _walk(value[key], sub, child, found, ssa=ssa)
    elif isinstance(value, list):
        items = schema.get("items")
        keys = schema.get("x-kubernetes-list-map-keys") if ssa else None
        for index, item in enumerate(value):
            _walk(item, items, f"{path}{_element(index, item, keys)}", found, ssa=ssa)


def _element(index: int, item: Any, keys: list[str] | None) -> str:
    """A list element in a path: ``[0]``, or as structured-merge-diff names an associative list's element,
    ``[name="head"]`` (sigs.k8s.io/structured-merge-diff v4.4.2 fieldpath/element.go:139-157)."""
    if not keys or not isinstance(item, dict):
        return f"[{index}]"
    parts = [f"{k}={json.dumps(item[k])}" for k in keys if k in item]
    return "[" + ",".join(parts) + "]"


def _root(group_version: str, kind: str) -> Schema | None:
    name = schema_name(group_version, kind)
    return None if name is None else {"$ref": f"#/components/schemas/{name}"}


def unknown_fields(group_version: str, kind: str, obj_: Mapping[str, Any]) -> list[str]:
    """The fields of ``obj_`` its kind's schema does not declare, as the API server's strict decoding names them
    (``spec.containers[0].foo``): in document order for built-in kinds (sigs.k8s.io/json's strict errors), sorted for
    CRDs (apiextensions-apiserver v0.32.4 pkg/apiserver/schema/pruning/algorithm.go:40). Empty for an unknown kind."""
    out: list[str] = []
    _walk(dict(obj_), _root(group_version, kind), "", lambda path, _m, _k: out.append(path) is None)
    return sorted(out) if (group_version, kind) in CRDS else out


def pruned(group_version: str, kind: str, obj_: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``obj_`` without the fields its schema does not declare: what the API server stores, as decoding into
    the Go type drops them for built-in kinds and pruning drops them for CRDs with structural schemas."""
    out = copy.deepcopy(dict(obj_))

    def drop(_path: str, mapping: dict[str, Any], key: str) -> bool:
        del mapping[key]
        return True

    _walk(out, _root(group_version, kind), "", drop)
    return out


def apply_schema_errors(group_version: str, kind: str, obj_: Mapping[str, Any]) -> list[str]:
    """What server-side apply refuses in an applied object, as structured-merge-diff words it
    (``.spec.foo: field not declared in schema``; v4.4.2 typed/validate.go:173-181): the first undeclared field of
    each map."""
    out: list[str] = []

    def record(path: str, _mapping: dict[str, Any], _key: str) -> bool:
        out.append("." + path.replace(".[", "[") + ": field not declared in schema")
        return False

    _walk(dict(obj_), _root(group_version, kind), "", record, ssa=True)
    return out


# --- fieldValidation on writes ----------------------------------------------------------------------------------
def directive(query: Mapping[str, str], options_kind: str) -> str:
    """The request's ``fieldValidation``, defaulted to Warn (k8s.io/apiserver v0.32.4
    pkg/endpoints/handlers/rest.go:405-415); any other value is 422 Invalid on the call's options, as
    ``ValidateCreateOptions``/``ValidatePatchOptions`` answer (create.go:102-112, patch.go:118-128)."""
    value = query.get("fieldValidation", "")
    if value not in DIRECTIVES:
        supported = ", ".join(json.dumps(v) for v in DIRECTIVES)
        body = f'Unsupported value: "{value}": supported values: {supported}'
        raise KubeError(
            422,
            "Invalid",
            f'{options_kind}.meta.k8s.io "" is invalid: fieldValidation: {body}',
            {
                "group": "meta.k8s.io",
                "kind": options_kind,
                "causes": [{"reason": "FieldValueNotSupported", "message": body, "field": "fieldValidation"}],
            },
        )
    return value or "Warn"


def warning_header(text: str) -> str:
    """A ``Warning`` header value as the API server writes it (k8s.io/apimachinery v0.32.4 pkg/util/net/http.go:655):
    code 299, agent ``-``, the text quoted."""
    return '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_fields(
    request: web.Request, group_version: str, kind: str, body: dict[str, Any], *, apply: bool = False
) -> dict[str, Any]:
    """The body a create or an apply stores, by the request's ``fieldValidation``.

    Create (k8s.io/apiserver v0.32.4 pkg/endpoints/handlers/create.go:119-141): Strict refuses unknown fields, 400
    ``Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "spec.foo"``
    (rest.go:246-257); Warn adds one ``Warning`` per field; both Warn and Ignore store the object without them.
    Apply: server-side apply refuses unknown fields whatever the directive, 500 with no reason, because the typed
    patch's error is not a Status (k8s.io/apimachinery v0.32.4 pkg/util/managedfields/internal/structuredmerge.go:
    144-148; kubernetes/kubernetes#122480)."""
    mode = directive(request.query, "PatchOptions" if apply else "CreateOptions")
    if apply:
        errors = apply_schema_errors(group_version, kind, body)
        if errors:
            meta = body.get("metadata") or {}
            gvk = f"{group_version if '/' in group_version else '/' + group_version}, Kind={kind}"
            detail = errors[0] if len(errors) == 1 else "\n".join(["errors:", *("  " + e for e in errors)])
            where = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}; {gvk}"
            raise KubeError(500, "", f"failed to create typed patch object ({where}): {detail}")
        return body
    unknown = unknown_fields(group_version, kind, body)
    if not unknown:
        return body
    if mode == "Strict":
        fields = ", ".join(f"unknown field {json.dumps(path)}" for path in unknown)
        version = group_version.rpartition("/")[2]
        raise KubeError(
            400,
            "BadRequest",
            f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: {fields}',
        )
    if mode == "Warn":
        request.setdefault(WARNINGS_KEY, []).extend(f"unknown field {json.dumps(path)}" for path in unknown)
    return pruned(group_version, kind, body)


def add_warnings(request: web.Request, response: web.StreamResponse) -> None:
    """Put the request's warnings on its response, one ``Warning`` header each."""
    for text in request.get(WARNINGS_KEY, ()):
        response.headers.add("Warning", warning_header(text))


# --- the documents ----------------------------------------------------------------------------------------------
def _closure(names: Iterable[str]) -> dict[str, Schema]:
    """The named components and every component they reference."""
    out: dict[str, Schema] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out[name] = component(name)
        todo.extend(_refs(out[name]))
    return dict(sorted(out.items()))


def _refs(node: Any) -> list[str]:
    if isinstance(node, list):
        return [r for item in node for r in _refs(item)]
    if not isinstance(node, dict):
        return []
    own = [node["$ref"].rsplit("/", 1)[-1]] if isinstance(node.get("$ref"), str) else []
    return own + [r for v in node.values() for r in _refs(v)]


def _param(name: str, where: str, description: str, schema: Schema | None = None) -> Schema:
    out = {"name": name, "in": where, "description": description, "schema": schema or {"type": "string"}}
    if where == "path":
        out["required"] = True
    return {**out, "uniqueItems": True}


DRY_RUN = _param("dryRun", "query", "When present, indicates that modifications should not be persisted.")
FIELD_MANAGER = _param("fieldManager", "query", "fieldManager is a name associated with the actor or entity.")
FIELD_VALIDATION = _param(
    "fieldValidation",
    "query",
    "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing "
    "unknown or duplicate fields. Valid values are: - Ignore - Warn (default) - Strict",
)
FORCE = _param("force", "query", 'Force is going to "force" Apply requests.', {"type": "boolean"})


def _operation(action: str, kind: str, gvk: dict[str, str], ref: str, *, params: list[Schema], what: str) -> Schema:
    body = {"content": {V3_JSON: {"schema": {"$ref": ref}}}, "required": True}
    op: Schema = {
        "description": f"{what} {kind}",
        "operationId": f"{action}{kind}",
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": {V3_JSON: {"schema": {"$ref": ref}}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
    }
    if action == "post":
        op["requestBody"] = body
        op["responses"]["201"] = op["responses"]["200"]
    if action == "patch":
        # kubectl reads these to pick its patch: a custom resource lists no strategic merge, as the real document.
        types = patch_types(gvk["group"] + "/" + gvk["version"] if gvk["group"] else gvk["version"])
        op["requestBody"] = {"content": {t: {"schema": {"type": "object"}} for t in types}, "required": True}
        op["responses"]["201"] = op["responses"]["200"]
    return op


def _paths(group_version: str, plural: str, kind: str, namespaced: bool) -> dict[str, Schema]:
    """The paths of one kind, with the operations and parameters the API server documents for them."""
    group, _, version = group_version.rpartition("/")
    gvk = {"group": group, "kind": kind, "version": version}
    name = schema_name(group_version, kind)
    ref = f"#/components/schemas/{name}"
    base = "/api/v1" if not group else f"/apis/{group_version}"
    scope = f"{base}/namespaces/{{namespace}}" if namespaced else base
    ns_param = [_param("namespace", "path", "object name and auth scope, such as for teams and projects")]
    path_params = (ns_param if namespaced else []) + [_param("pretty", "query", "If 'true', the output is pretty.")]
    writes = [DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION]
    collection = {
        "get": _operation("list", kind, gvk, ref, params=[], what="list or watch objects of kind"),
        "post": _operation("post", kind, gvk, ref, params=writes, what="create a"),
        "parameters": path_params,
    }
    item = {
        "get": _operation("get", kind, gvk, ref, params=[], what="read the specified"),
        "patch": _operation("patch", kind, gvk, ref, params=[*writes, FORCE], what="partially update the specified"),
        "delete": _operation("delete", kind, gvk, ref, params=[DRY_RUN], what="delete a"),
        "parameters": [_param("name", "path", f"name of the {kind}"), *path_params],
    }
    return {f"{scope}/{plural}": collection, f"{scope}/{plural}/{{name}}": item}


@functools.cache
def _document_bytes(group_version: str, kinds: tuple[tuple[str, str, bool], ...]) -> bytes:
    paths: dict[str, Schema] = {}
    names = []
    for plural, kind, namespaced in kinds:
        name = schema_name(group_version, kind)
        if name is None:
            continue  # no schema known: the kind is served, its OpenAPI is not (a CRD without a schema row)
        names.append(name)
        paths.update(_paths(group_version, plural, kind, namespaced))
    crd = any((group_version, kind) in CRDS for _, kind, _ in kinds)
    document = {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes CRD Swagger" if crd else "Kubernetes", "version": "v0.1.0" if crd else "v1.32"},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": _closure(names)},
    }
    return json.dumps(document, separators=(",", ":")).encode()


def document(group_version: str, resources: Resources) -> bytes:
    """``/openapi/v3/{api/v1 | apis/group/version}``: the groupVersion's document, as JSON bytes."""
    return _document_bytes(group_version, tuple(tuple(r) for r in resources[group_version]))  # type: ignore[misc]


def _gv_key(group_version: str) -> str:
    return "api/" + group_version if "/" not in group_version else "apis/" + group_version


def etag(data: bytes) -> str:
    """kube-openapi's ETag and ``hash``: the upper-case hex SHA-512 of the document (pkg/handler3/handler.go:121)."""
    return hashlib.sha512(data).hexdigest().upper()


def index(resources: Resources) -> dict[str, Any]:
    """``/openapi/v3``: each groupVersion's server-relative URL with its hash."""
    return {
        "paths": {
            _gv_key(gv): {"serverRelativeURL": f"/openapi/v3/{_gv_key(gv)}?hash={etag(document(gv, resources))}"}
            for gv in sorted(resources)
        }
    }


def swagger_v2(resources: Resources) -> dict[str, Any]:
    """``/openapi/v2`` as JSON: every served kind's definitions with v2 references."""
    names = [n for gv, kinds in resources.items() for _, kind, _ in kinds if (n := schema_name(gv, kind))]
    text = json.dumps(_closure(names)).replace("#/components/schemas/", "#/definitions/")
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.32"},
        "paths": {},
        "definitions": json.loads(text),
    }


def _negotiate(accept: str, protobuf: str) -> str | None:
    """The media type kube-openapi serves for an Accept header (JSON or, not modelled, protobuf), or None (406)."""
    for clause in (accept or "*/*").split(","):
        media = clause.split(";")[0].strip().lower()
        kind, _, sub = media.partition("/")
        if kind not in ("application", "*"):
            continue
        if sub in ("json", "*"):
            return "json"
        if sub in (protobuf, "com.github.proto-openapi.spec.v2.v1.0+protobuf"):
            return None  # the real server serves protobuf here; the sandbox has no encoder, so as an Accept it cannot
    return None


def response(path: str, query: Mapping[str, str], accept: str, resources: Resources) -> web.Response | None:
    """The answer to an ``/openapi/...`` path, or None when the path is not an OpenAPI one."""
    if path == "/openapi/v3":
        data = json.dumps(index(resources)).encode()
        return web.Response(body=data, content_type=V3_JSON, headers={"Etag": json.dumps(etag(data))})
    if path == "/openapi/v2":
        if _negotiate(accept, PROTOBUF[1]) is None:
            return web.Response(status=406, headers={"Vary": "Accept"})
        data = json.dumps(swagger_v2(resources)).encode()
        return web.Response(body=data, content_type=V3_JSON, headers={"Etag": json.dumps(etag(data)), "Vary": "Accept"})
    if not path.startswith("/openapi/v3/"):
        return None
    key = path.removeprefix("/openapi/v3/")
    gv = key.removeprefix("api/") if key.startswith("api/") else key.removeprefix("apis/")
    if gv not in resources or _gv_key(gv) != key:
        # kube-openapi answers an unknown groupVersion with an empty 200 (handler3/handler.go:254-256).
        return web.Response(status=200, headers={"Vary": "Accept"})
    if _negotiate(accept, PROTOBUF[0]) is None:
        return web.Response(status=406, headers={"Vary": "Accept"})
    data = document(gv, resources)
    tag = etag(data)
    headers = {"Etag": json.dumps(tag), "Vary": "Accept"}
    wanted = query.get("hash")
    if wanted and wanted != tag:
        return web.Response(status=301, headers={**headers, "Location": f"/openapi/v3/{key}?hash={tag}"})
    if wanted:
        headers["Cache-Control"] = "public, immutable"
    return web.Response(body=data, content_type=V3_JSON, headers=headers)
