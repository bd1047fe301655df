"""The Ray Jobs API's errors: the TLS error both hooks raise, and the async hook's API errors.

Apart from :mod:`nemo_rl_gke.ray.hooks` so that the trigger side imports neither Ray's job client nor the sync
Kubernetes and Google clients: the triggerer imports a trigger's module on its event loop.
"""

from __future__ import annotations

from typing import Any


class RayTlsError(RuntimeError):
    """The Ray Jobs API's TLS certificate does not verify against the CA it must be signed by (not retried)."""


def tls_error(address: str, against: str, cause: object) -> RayTlsError:
    """The error for a certificate at ``address`` that does not verify against ``against`` (both hooks raise it)."""
    return RayTlsError(
        f"the Ray Jobs API at {address} has a TLS certificate that does not verify against {against}: {cause}. "
        "Fix: for the run's own head service the CA is the GKE cluster's (masterAuth.clusterCaCertificate), read "
        "again from the cluster; for the deployment's ray_dashboard_url, a certificate the system trusts"
    )


class RayJobsApiError(RuntimeError):
    """The Ray Jobs API answered with an error a retry cannot fix, or with a body that is not a JSON object."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {str(body)[:300]}")
        self.status = status
        self.body = body


class RayJobsTransientError(RuntimeError):
    """A failure worth retrying: 408, 429, any 5xx, a connection error or a timeout."""
