"""Kubernetes API errors and which of them are worth another try.

Apart from :mod:`nemo_rl_gke.kube.client` so that the triggers can use them without importing the sync clients:
the triggerer imports a trigger's module on its event loop, and the sync hooks pull in the Google and Kubernetes
client libraries (seconds of imports that would block every deferred task of the deployment).
"""

from __future__ import annotations

import urllib3

OBJECT_RESPONSES = {200: "object", 201: "object", 202: "object"}
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
# The reason of a KubeApiError whose server failed TLS verification: never transient, never retried.
TLS_VERIFY_FAILED = "TLSVerificationFailed"
# kube-apiserver answers a server-side apply whose object does not fit the kind's schema with a 500 (kubernetes#122480,
# apimachinery managedfields/internal/structuredmerge.go): the request is wrong, and another try gets the same answer.
SCHEMA_REFUSAL = "failed to create typed patch object"


class KubeApiError(RuntimeError):
    """A Kubernetes API call failed: ``status`` is the HTTP status (None without a response), ``reason`` the
    Status reason."""

    def __init__(self, message: str, *, status: int | None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def is_kube_transient(exc: BaseException) -> bool:
    """429, 5xx, a dropped connection or a timeout: worth another try (not a server-side apply the schema refused)."""
    if isinstance(exc, KubeApiError):
        if exc.reason == TLS_VERIFY_FAILED or SCHEMA_REFUSAL in str(exc):
            return False
        return exc.status is None or exc.status in TRANSIENT_STATUSES
    return isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


def tls_error(what: str, host: str, detail: object) -> KubeApiError:
    """The API server's certificate does not verify against the cluster's CA: a wrong or stale CA, or a server that
    is not the cluster's. Retrying cannot help."""
    return KubeApiError(
        f"{what}: the TLS certificate of {host} does not verify against the cluster's CA "
        f"(masterAuth.clusterCaCertificate): {detail}. Fix: read the cluster again (a recreated cluster has a new CA), "
        "and check that the endpoint is the cluster's own",
        status=None,
        reason=TLS_VERIFY_FAILED,
    )
