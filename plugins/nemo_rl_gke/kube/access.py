"""How the DAG reaches the created cluster's Kubernetes API and the Ray dashboard: resolved here, in one place.

The GKE cluster tells where its API is (``endpoint``, an IP served over HTTPS, or a URL for the sandbox) and which CA
signs it (``masterAuth.clusterCaCertificate``); requests carry the Google bearer token of the Airflow connection.
The Ray dashboard is reached through the API server's service proxy by default (FACTS §6), or at a URL from the conf.
Pure: no clients, no tokens (the hooks add the token when they send a request).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_rl_gke.spec import RunSpec

RUNNING_STATES = frozenset({"RUNNING", "RECONCILING"})


class ClusterUnreachableError(RuntimeError):
    """The GKE cluster is missing, not running, or reports no endpoint."""


@dataclass(frozen=True)
class ClusterAccess:
    """The API server's base URL and the PEM of the CA that signs it (empty for a plain-HTTP sandbox endpoint)."""

    host: str
    ca_pem: str = ""

    @classmethod
    def from_cluster(cls, cluster: Mapping[str, Any] | None, label: str) -> ClusterAccess:
        """Read the access from a GKE cluster resource (as the container API returns it)."""
        if cluster is None:
            raise ClusterUnreachableError(f"{label} does not exist")
        status = str(cluster.get("status", ""))
        endpoint = str(cluster.get("endpoint") or "")
        if status not in RUNNING_STATES or not endpoint:
            raise ClusterUnreachableError(f"{label} is {status or 'in no state'}, with no API endpoint to use yet")
        host = endpoint if "://" in endpoint else f"https://{endpoint}"
        ca = str((cluster.get("masterAuth") or {}).get("clusterCaCertificate") or "")
        return cls(host.rstrip("/"), base64.b64decode(ca).decode() if ca else "")


@dataclass(frozen=True)
class DashboardAddress:
    """Where the Ray Jobs API is, and whether requests need the Google token (only through the API server)."""

    url: str
    needs_token: bool

    @property
    def via(self) -> str:
        """How it is reached, for logs and messages."""
        return "the Kubernetes API service proxy" if self.needs_token else "the conf's ray_dashboard_url"


def dashboard_address(spec: RunSpec, access: ClusterAccess | None) -> DashboardAddress:
    """The Ray dashboard of the run's RayCluster: ``ray_dashboard_url`` if set, else the service-proxy path."""
    if spec.ray_dashboard_url:
        return DashboardAddress(spec.ray_dashboard_url.rstrip("/"), needs_token=False)
    if access is None:
        raise ClusterUnreachableError("the Ray dashboard goes through the cluster's API, which is not known")
    return DashboardAddress(access.host + spec.dashboard_proxy_path, needs_token=True)
