"""Offline validation of the manifests a run applies, so that a bad object fails ``validate``, not the apply step.

Core kinds (PersistentVolume, PersistentVolumeClaim, ServiceAccount, DaemonSet, ...) are checked against the
Kubernetes OpenAPI schemas shipped by the ``kubernetes_validate`` package, in strict mode (unknown fields fail).
The custom resources get small schemas of the fields FACTS §5 relies on: ``ray.io/v1`` RayCluster (its pod templates
again against the core PodTemplateSpec) and ``networking.gke.io/v1`` GKENetworkParamSet / Network. Every object must
also have valid names and carry the package's ownership label.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

from nemo_rl_gke.run.ownership import MANAGED_BY, MANAGED_BY_KEY

# Oldest Kubernetes minor this package expects GKE to run. Core v1 / apps/v1 fields are never removed, so an object
# valid against it is accepted by newer API servers too.
KUBERNETES_SCHEMA_VERSION = "1.33"

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?)$")
# GKE rejects Device-type Network objects with longer names (FACTS §4).
DEVICE_NETWORK_NAME_MAX = 41
RAY_HEAD_SERVICE_SUFFIX = "-head-svc"
CLUSTER_SCOPED_KINDS = frozenset(
    {
        "PersistentVolume",
        "Namespace",
        "StorageClass",
        "ClusterRole",
        "ClusterRoleBinding",
        "Network",
        "GKENetworkParamSet",
    }
)

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
        "generateName": {"type": "string"},
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer"},
        "creationTimestamp": {"type": ["string", "null"]},
        "deletionTimestamp": {"type": ["string", "null"]},
        "deletionGracePeriodSeconds": {"type": "integer"},
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {"type": "object"}},
        "managedFields": {"type": "array", "items": {"type": "object"}},
    },
    "additionalProperties": False,
}


def _custom_object(api_version: str, kind: str, spec_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec_schema,
            "status": {"type": "object"},
        },
        "additionalProperties": False,
    }


GKE_NETWORK_PARAM_SET_SCHEMA = _custom_object(
    "networking.gke.io/v1",
    "GKENetworkParamSet",
    {
        "type": "object",
        "required": ["vpc", "vpcSubnet", "deviceMode"],
        "properties": {
            "vpc": {"type": "string", "minLength": 1},
            "vpcSubnet": {"type": "string", "minLength": 1},
            "deviceMode": {"enum": ["NetDevice", "RDMA"]},
            "podIPv4Ranges": {"type": "object"},
        },
        "additionalProperties": False,
    },
)

GKE_NETWORK_SCHEMA = _custom_object(
    "networking.gke.io/v1",
    "Network",
    {
        "type": "object",
        "required": ["type", "parametersRef"],
        "properties": {
            # Only device networks are made here: the pod gets the NIC itself (gVNIC or an RDMA device).
            "type": {"const": "Device"},
            "parametersRef": {
                "type": "object",
                "required": ["group", "kind", "name"],
                "properties": {
                    "group": {"const": "networking.gke.io"},
                    "kind": {"const": "GKENetworkParamSet"},
                    "name": {"type": "string", "minLength": 1},
                },
                "additionalProperties": False,
            },
            "provider": {"type": "string"},
            "routes": {"type": "array"},
        },
        "additionalProperties": False,
    },
)

_RAY_START_PARAMS = _STRING_MAP
_POD_TEMPLATE = {"type": "object"}  # checked separately against the core PodTemplateSpec
_HEAD_GROUP = {
    "type": "object",
    "required": ["rayStartParams", "template"],
    "properties": {
        "rayStartParams": _RAY_START_PARAMS,
        "template": _POD_TEMPLATE,
        "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
        "headService": {"type": "object"},
        "enableIngress": {"type": "boolean"},
        "resources": _STRING_MAP,
        "labels": _STRING_MAP,
    },
    "additionalProperties": False,
}
_WORKER_GROUP = {
    "type": "object",
    "required": ["groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template"],
    "properties": {
        "groupName": {"type": "string", "minLength": 1},
        "replicas": {"type": "integer", "minimum": 0},
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
        "numOfHosts": {"type": "integer", "minimum": 1},
        "rayStartParams": _RAY_START_PARAMS,
        "template": _POD_TEMPLATE,
        "idleTimeoutSeconds": {"type": "integer"},
        "suspend": {"type": "boolean"},
        "scaleStrategy": {"type": "object"},
        "resources": _STRING_MAP,
        "labels": _STRING_MAP,
    },
    "additionalProperties": False,
}
RAYCLUSTER_SCHEMA = _custom_object(
    "ray.io/v1",
    "RayCluster",
    {
        "type": "object",
        "required": ["headGroupSpec"],
        "properties": {
            "headGroupSpec": _HEAD_GROUP,
            "workerGroupSpecs": {"type": "array", "items": _WORKER_GROUP},
            "rayVersion": {"type": "string"},
            "enableInTreeAutoscaling": {"type": "boolean"},
            "autoscalerOptions": {"type": "object"},
            "headServiceAnnotations": _STRING_MAP,
            "suspend": {"type": "boolean"},
            "managedBy": {"type": "string"},
            "gcsFaultToleranceOptions": {"type": "object"},
            # KubeRay 1.5.1 (ray-operator/apis/ray/v1 AuthOptions): token mode needs rayVersion >= 2.52.0.
            "authOptions": {
                "type": "object",
                "properties": {"mode": {"enum": ["disabled", "token"]}, "secretName": {"type": "string"}},
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    },
)

# kubernetes/autoscaler provisioningrequest/apis/autoscaling.x-k8s.io/v1 types.go: one PodSet per request on GKE
# (its "flex-start with queued provisioning" page), parameters are strings.
PROVISIONING_REQUEST_SCHEMA = _custom_object(
    "autoscaling.x-k8s.io/v1",
    "ProvisioningRequest",
    {
        "type": "object",
        "required": ["provisioningClassName", "podSets"],
        "properties": {
            "provisioningClassName": {"type": "string", "minLength": 1},
            "parameters": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 255}},
            "podSets": {
                "type": "array",
                "minItems": 1,
                "maxItems": 1,
                "items": {
                    "type": "object",
                    "required": ["count", "podTemplateRef"],
                    "properties": {
                        "count": {"type": "integer", "minimum": 1},
                        "podTemplateRef": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": {"type": "string", "minLength": 1}},
                            "additionalProperties": False,
                        },
                    },
                    "additionalProperties": False,
                },
            },
        },
        "additionalProperties": False,
    },
)

CUSTOM_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("autoscaling.x-k8s.io/v1", "ProvisioningRequest"): PROVISIONING_REQUEST_SCHEMA,
    ("networking.gke.io/v1", "GKENetworkParamSet"): GKE_NETWORK_PARAM_SET_SCHEMA,
    ("networking.gke.io/v1", "Network"): GKE_NETWORK_SCHEMA,
    ("ray.io/v1", "RayCluster"): RAYCLUSTER_SCHEMA,
}


def validate_manifest(obj: dict[str, Any]) -> list[str]:
    """Every problem with one Kubernetes object, as ``Kind/name: path: message`` strings; empty when it is valid.

    Checks the object's schema (core OpenAPI for built-in kinds, the package's own schemas for RayCluster and the
    GKE network objects), its names (DNS-1123 and the stricter rules of some kinds) and its ownership label.
    """
    if not isinstance(obj, dict):
        return [f"not a Kubernetes object: {type(obj).__name__}"]
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    where = f"{obj.get('kind', '?')}/{metadata.get('name', '?')}"
    problems = list(_schema_problems(obj)) + list(_name_problems(obj, metadata)) + list(_label_problems(metadata))
    return [f"{where}: {problem}" for problem in problems]


def _schema_problems(obj: dict[str, Any]) -> Iterator[str]:
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        yield "apiVersion and kind must be strings"
        return
    schema = CUSTOM_SCHEMAS.get((api_version, kind))
    if schema is not None:
        yield from _jsonschema_problems(schema, obj)
        if kind == "RayCluster":
            yield from _raycluster_problems(obj)
        return
    if "." in api_version.split("/")[0] and not api_version.split("/")[0].endswith(".k8s.io"):
        yield (
            f"no schema for {api_version} {kind}: this package validates only core kinds, RayCluster, "
            "ProvisioningRequest and GKE networks"
        )
        return
    yield from _core_problems(obj)


def _jsonschema_problems(schema: dict[str, Any], instance: Any) -> Iterator[str]:
    import jsonschema  # lazy: validation runs in tasks and tests, not at DAG parse time

    validator = jsonschema.Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        yield f"{_path(error.absolute_path)}: {error.message}"


def _core_problems(obj: dict[str, Any]) -> Iterator[str]:
    import kubernetes_validate  # lazy: it loads jsonschema, referencing and the schema files

    try:
        kubernetes_validate.validate(obj, KUBERNETES_SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        yield f"{_path(error.path)}: {error.message}"
    except kubernetes_validate.SchemaNotFoundError as error:
        yield error.message


def _raycluster_problems(obj: dict[str, Any]) -> Iterator[str]:
    spec = obj.get("spec") or {}
    head = spec.get("headGroupSpec") or {}
    if isinstance(head.get("template"), dict):
        yield from _pod_template_problems(head["template"], "spec.headGroupSpec.template")
    groups = spec.get("workerGroupSpecs") or []
    names = [g.get("groupName") for g in groups if isinstance(g, dict)]
    for duplicate in sorted({n for n in names if names.count(n) > 1 and isinstance(n, str)}):
        yield f"spec.workerGroupSpecs: groupName {duplicate!r} is used twice"
    for i, group in enumerate(groups):
        if not isinstance(group, dict):
            continue
        where = f"spec.workerGroupSpecs.{i}"
        if isinstance(group.get("template"), dict):
            yield from _pod_template_problems(group["template"], f"{where}.template")
        counts = [group.get(k) for k in ("minReplicas", "replicas", "maxReplicas")]
        if all(isinstance(c, int) for c in counts) and not counts[0] <= counts[1] <= counts[2]:
            yield f"{where}: minReplicas <= replicas <= maxReplicas does not hold ({', '.join(map(str, counts))})"
        name = group.get("groupName")
        if isinstance(name, str) and not DNS1123_LABEL.fullmatch(name):
            yield f"{where}.groupName: {name!r} is not a DNS-1123 label (it becomes part of the pod names)"


def _pod_template_problems(template: dict[str, Any], prefix: str) -> Iterator[str]:
    # kubernetes_validate has no entry point for a bare PodTemplateSpec; a PodTemplate object wraps exactly one.
    wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "template"}, "template": template}
    for problem in _core_problems(wrapper):
        yield problem.replace("template", prefix, 1) if problem.startswith("template") else f"{prefix}: {problem}"
    containers = (template.get("spec") or {}).get("containers") or []
    if not containers:
        yield f"{prefix}.spec.containers: KubeRay runs Ray in the first container; there is none"
    # The OpenAPI schema leaves image optional (for templates defaulted later); a pod without one never starts.
    for i, container in enumerate(containers):
        if isinstance(container, dict) and not container.get("image"):
            yield f"{prefix}.spec.containers.{i}.image: missing; every Ray container needs an image"


def _name_problems(obj: dict[str, Any], metadata: dict[str, Any]) -> Iterator[str]:
    kind, name, namespace = obj.get("kind"), metadata.get("name"), metadata.get("namespace")
    if not isinstance(name, str) or not name:
        yield "metadata.name: missing"
        return
    if not DNS1123_SUBDOMAIN.fullmatch(name):
        yield f"metadata.name: {name!r} is not a DNS-1123 subdomain (lowercase letters, digits, '-', '.')"
    if kind == "Network" and len(name) > DEVICE_NETWORK_NAME_MAX:
        yield f"metadata.name: {name!r} is longer than {DEVICE_NETWORK_NAME_MAX} characters, the limit for GKE Networks"
    if kind == "RayCluster" and not DNS1035_LABEL.fullmatch(name + RAY_HEAD_SERVICE_SUFFIX):
        yield f"metadata.name: {name!r} does not give a valid head service name ({name}{RAY_HEAD_SERVICE_SUFFIX})"
    if namespace is not None:
        if kind in CLUSTER_SCOPED_KINDS:
            yield f"metadata.namespace: {kind} is cluster-scoped and takes no namespace"
        elif not isinstance(namespace, str) or not DNS1123_LABEL.fullmatch(namespace):
            yield f"metadata.namespace: {namespace!r} is not a DNS-1123 label"


def _label_problems(metadata: dict[str, Any]) -> Iterator[str]:
    labels = metadata.get("labels")
    if not isinstance(labels, dict):
        labels = {}
    for key, value in labels.items():
        prefix, _, label_name = str(key).rpartition("/")
        if (prefix and not DNS1123_SUBDOMAIN.fullmatch(prefix)) or not LABEL_NAME.fullmatch(label_name):
            yield f"metadata.labels: {key!r} is not a valid label key"
        if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
            yield f"metadata.labels.{key}: {value!r} is not a valid label value"
    if labels.get(MANAGED_BY_KEY) != MANAGED_BY:
        yield (
            f"metadata.labels.{MANAGED_BY_KEY}: must be {MANAGED_BY!r}, the ownership marker teardown and "
            "adoption rely on"
        )


def _path(path: Any) -> str:
    return ".".join(str(p) for p in path) or "(root)"


@functools.cache
def available_schema_versions() -> tuple[str, ...]:
    """Kubernetes minor versions whose core schemas the installed kubernetes_validate ships, e.g. ``1.33``."""
    import kubernetes_validate.utils

    return tuple(
        dict.fromkeys(kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions())
    )
