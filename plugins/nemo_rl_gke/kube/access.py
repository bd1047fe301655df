"""How the DAG reaches the created cluster's Kubernetes API and the Ray dashboard: resolved here, in one place.

The GKE cluster tells where its API is (``endpoint``, an IP served over HTTPS, or a URL for the sandbox) and which CA
signs it (``masterAuth.clusterCaCertificate``); requests carry the Google bearer token of the Airflow connection.
The Ray job, with the HF and W&B tokens in its environment, goes to the run's own head service through that API
server's service proxy (FACTS §6), or to a dashboard URL the *deployment* configures; never to one a conf names.
Either endpoint must be https (verified against the cluster's CA or the system's), or plain http to loopback while
the Google connection itself points at loopback: the local sandbox.
Pure: no clients, no tokens (the hooks add the token when they send a request).
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.deployment import Deployment, EndpointNotAllowedError, check_endpoint

if TYPE_CHECKING:
    from nemo_rl_gke.spec import RunSpec

RUNNING_STATES = frozenset({"RUNNING", "RECONCILING"})

__all__ = [
    "ClusterAccess",
    "ClusterUnreachableError",
    "DashboardAddress",
    "EndpointNotAllowedError",
    "dashboard_address",
]


class ClusterUnreachableError(RuntimeError):
    """The GKE cluster is missing, not running, or reports no endpoint."""


@dataclass(frozen=True)
class ClusterAccess:
    """The API server's base URL and the PEM of the CA that signs it (empty for a plain-HTTP sandbox endpoint)."""

    host: str
    ca_pem: str = ""

    @classmethod
    def from_cluster(
        cls, cluster: Mapping[str, Any] | None, label: str, google_endpoint: str | None = None
    ) -> ClusterAccess:
        """Read the access from a GKE cluster resource (as the container API returns it).

        The bearer token goes to this host, so it must be https, or plain http to loopback (the sandbox); with
        ``google_endpoint`` (the Google connection's container endpoint) given, that must be loopback too.
        """
        if cluster is None:
            raise ClusterUnreachableError(f"{label} does not exist")
        status = str(cluster.get("status", ""))
        endpoint = str(cluster.get("endpoint") or "")
        if status not in RUNNING_STATES or not endpoint:
            raise ClusterUnreachableError(f"{label} is {status or 'in no state'}, with no API endpoint to use yet")
        host = (endpoint if "://" in endpoint else f"https://{endpoint}").rstrip("/")
        if not host.startswith("https://"):
            check_endpoint(host, google_endpoint if google_endpoint is not None else host, f"the API of {label}")
        ca = str((cluster.get("masterAuth") or {}).get("clusterCaCertificate") or "")
        return cls(host, base64.b64decode(ca).decode() if ca else "")


@dataclass(frozen=True)
class DashboardAddress:
    """Where the Ray Jobs API is, whether requests need the Google token (only through the API server), and the CA
    that signs it (empty: the system's CAs)."""

    url: str
    needs_token: bool
    ca_pem: str = ""

    @property
    def via(self) -> str:
        """How it is reached, for logs and messages."""
        return "the Kubernetes API service proxy" if self.needs_token else "the deployment's ray_dashboard_url"

    def verify(self) -> bool | str:
        """What a ``requests``-based client (Ray's JobSubmissionClient ``verify=``) checks the certificate against:
        a CA bundle file holding the cluster's CA, or True for the system's CAs."""
        if not self.ca_pem:
            return True
        with tempfile.NamedTemporaryFile("w", suffix=".crt", delete=False) as ca_file:
            ca_file.write(self.ca_pem)
        return ca_file.name


def dashboard_address(
    spec: RunSpec,
    access: ClusterAccess | None,
    deployment: Deployment | None = None,
    google_endpoint: str | None = None,
) -> DashboardAddress:
    """The Ray dashboard of the run's RayCluster: the deployment's ``ray_dashboard_url`` if set, else the
    service-proxy path of the run's head service on the cluster's API server.

    ``google_endpoint`` is the Google connection's container endpoint (None: Google's own), which decides whether
    plain http to loopback is allowed. Raises :class:`EndpointNotAllowedError` for any other plain-http endpoint.
    """
    deployment = deployment or Deployment()
    if deployment.ray_dashboard_url:
        url = deployment.ray_dashboard_url.rstrip("/")
        check_endpoint(url, google_endpoint, "the deployment's ray_dashboard_url")
        return DashboardAddress(url, needs_token=False)
    if access is None:
        raise ClusterUnreachableError("the Ray dashboard goes through the cluster's API, which is not known")
    check_endpoint(access.host, google_endpoint, "the cluster's API server")
    return DashboardAddress(access.host + spec.dashboard_proxy_path, needs_token=True, ca_pem=access.ca_pem)
