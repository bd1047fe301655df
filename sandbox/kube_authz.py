"""``SelfSubjectAccessReview``: "may I?", answered for the caller as the sandbox's API server decides it.

``kubectl auth can-i VERB RESOURCE`` posts one to ``/apis/authorization.k8s.io/v1/selfsubjectaccessreviews`` and
prints ``yes`` or ``no`` from ``status.allowed``. On GKE the answer is the union of Kubernetes RBAC and GKE's IAM
authorizer for the Google identity behind the token. The sandbox's Kubernetes API serves every request that carries a
valid token it issued (there is one identity, its service account, and no RBAC or IAM check on Kubernetes objects:
``docs/fidelity.md``), so the review says what that server does: allowed, for resource and non-resource requests
alike. A token that is not valid never gets here (401 first, as on GKE).

kubectl posts the review as protobuf (read by :mod:`sandbox.kube_protobuf`); the answer is JSON, which kubectl's
``Accept`` (``application/vnd.kubernetes.protobuf,application/json``) takes.

The request is validated as the API server validates it (``pkg/apis/authorization/validation/validation.go``
``ValidateSelfSubjectAccessReviewSpec``): exactly one of ``resourceAttributes`` / ``nonResourceAttributes``.
"""

from __future__ import annotations

import copy
from typing import Any

from sandbox.kube_errors import KubeError

GROUP_VERSION = "authorization.k8s.io/v1"
KIND = "SelfSubjectAccessReview"


def review(body: Any) -> dict[str, Any]:
    """The created review (the spec back, with ``status``), or :class:`KubeError` for a body the server refuses."""
    if not isinstance(body, dict) or body.get("apiVersion") != GROUP_VERSION or body.get("kind") != KIND:
        got = f"{body.get('apiVersion')}/{body.get('kind')}" if isinstance(body, dict) else type(body).__name__
        raise KubeError(400, "BadRequest", f"the body is {got}, the path is {GROUP_VERSION}/{KIND}")
    spec = body.get("spec") or {}
    resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    invalid = f'{KIND}.authorization.k8s.io "" is invalid: '
    if resource is not None and non_resource is not None:
        raise KubeError(
            422,
            "Invalid",
            invalid + "spec.nonResourceAttributes: Invalid value: cannot be specified in combination with "
            "resourceAttributes",
        )
    if resource is None and non_resource is None:
        raise KubeError(
            422,
            "Invalid",
            invalid + 'spec.resourceAttributes: Invalid value: "null": exactly one of nonResourceAttributes or '
            "resourceAttributes must be specified",
        )
    metadata = {k: v for k, v in (body.get("metadata") or {}).items() if k in ("name", "labels", "annotations")}
    # Nothing is stored: the answer has no uid or resourceVersion, and a null creationTimestamp.
    return {
        "kind": KIND,
        "apiVersion": GROUP_VERSION,
        "metadata": {**metadata, "creationTimestamp": None},
        "spec": copy.deepcopy(spec),
        "status": {"allowed": True},
    }
