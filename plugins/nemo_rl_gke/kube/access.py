"""How the DAG reaches the created cluster's Kubernetes API and the Ray dashboard: resolved here, in one place.

The GKE cluster tells where its API is (``endpoint``, an address served over HTTPS; the sandbox's is
``127.0.0.1:PORT``) and which CA signs it (``masterAuth.clusterCaCertificate``); requests carry the Google bearer token
of the Airflow connection. The Ray job, with the HF and W&B tokens in its environment, goes to the run's own head
service through that API server's service proxy (FACTS §6), or to a dashboard URL the *deployment* configures; never
to one a conf names. The API server is always https, verified against the cluster's CA; the deployment's dashboard is
https verified against the system's CAs, or plain http to loopback while the Google connection itself points at
loopback (a local Ray next to the sandbox).
No clients, no tokens (the hooks add the token when they send a request); the one thing written is the CA bundle
file the clients read (:func:`ca_bundle`). Airflow's task runner runs the exit handlers registered in its forked
task process, so that file goes with the task.
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run.deployment import Deployment, EndpointNotAllowedError, check_endpoint, check_https

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec

RUNNING_STATES = frozenset({"RUNNING", "RECONCILING"})

__all__ = [
    "ClusterAccess",
    "ClusterUnreachableError",
    "DashboardAddress",
    "EndpointNotAllowedError",
    "ca_bundle",
    "dashboard_address",
]
# Per process: the directory of its CA bundle files (a forked child makes its own, and never removes its parent's).
_ca_dirs: dict[int, Path] = {}
_ca_lock = threading.Lock()


class ClusterUnreachableError(RuntimeError):
    """The GKE cluster is missing, not running, or reports no endpoint."""


def ca_bundle(ca_pem: str) -> str:
    """The path of a file holding ``ca_pem``, for clients that take a CA bundle path (the kubernetes clients'
    ``ssl_ca_cert``, requests' ``verify``).

    urllib3 and requests read the file again for every new connection, so it must outlive the client: there is one
    file per distinct CA, in a private directory of this process that is removed when the process exits.
    """
    with _ca_lock:
        pid = os.getpid()
        directory = _ca_dirs.get(pid)
        if directory is None:
            directory = Path(tempfile.mkdtemp(prefix="nemo-rl-gke-ca-"))
            _ca_dirs[pid] = directory
            atexit.register(_remove_ca_dir, pid, directory)
        path = directory / f"{hashlib.sha256(ca_pem.encode()).hexdigest()[:32]}.crt"
        if not path.exists():
            partial = path.with_suffix(".partial")
            partial.write_text(ca_pem, encoding="ascii")
            partial.replace(path)
        return str(path)


def _remove_ca_dir(pid: int, directory: Path) -> None:
    if os.getpid() == pid:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class ClusterAccess:
    """The API server's https base URL and the PEM of the CA that signs it (empty: the system's CAs)."""

    host: str
    ca_pem: str = ""

    @classmethod
    def from_cluster(cls, cluster: Mapping[str, Any] | None, label: str) -> ClusterAccess:
        """Read the access from a GKE cluster resource (as the container API returns it).

        GKE reports the endpoint as a bare address served over HTTPS, so ``https://`` is put in front. The bearer
        token goes to this host: an endpoint that names another scheme is refused, whatever host it names.
        """
        if cluster is None:
            raise ClusterUnreachableError(f"{label} does not exist")
        status = str(cluster.get("status", ""))
        endpoint = str(cluster.get("endpoint") or "")
        if status not in RUNNING_STATES or not endpoint:
            raise ClusterUnreachableError(f"{label} is {status or 'in no state'}, with no API endpoint to use yet")
        host = (endpoint if "://" in endpoint else f"https://{endpoint}").rstrip("/")
        check_https(host, f"the API of {label}")
        ca = str((cluster.get("masterAuth") or {}).get("clusterCaCertificate") or "")
        return cls(host, base64.b64decode(ca).decode() if ca else "")

    def ca_file(self) -> str | None:
        """The CA bundle path for the kubernetes clients' ``ssl_ca_cert`` (None: the system's CAs)."""
        return ca_bundle(self.ca_pem) if self.ca_pem else None


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
        a CA bundle file holding the cluster's CA (see :func:`ca_bundle`), or True for the system's CAs. Never
        False."""
        return ca_bundle(self.ca_pem) if self.ca_pem else True


def dashboard_address(
    spec: RunSpec,
    access: ClusterAccess | None,
    deployment: Deployment | None = None,
    google_endpoint: str | None = None,
) -> DashboardAddress:
    """The Ray dashboard of the run's RayCluster: the deployment's ``ray_dashboard_url`` if set, else the
    service-proxy path of the run's head service on the cluster's API server.

    ``google_endpoint`` is the Google connection's container endpoint (None: Google's own), which decides whether
    a plain-http ``ray_dashboard_url`` to loopback is allowed. The API server's proxy is https only. Raises
    :class:`EndpointNotAllowedError` for any other plain-http endpoint.
    """
    deployment = deployment or Deployment()
    if deployment.ray_dashboard_url:
        url = deployment.ray_dashboard_url.rstrip("/")
        check_endpoint(url, google_endpoint, "the deployment's ray_dashboard_url")
        return DashboardAddress(url, needs_token=False)
    if access is None:
        raise ClusterUnreachableError("the Ray dashboard goes through the cluster's API, which is not known")
    check_https(access.host, "the cluster's API server")
    return DashboardAddress(access.host + spec.dashboard_proxy_path, needs_token=True, ca_pem=access.ca_pem)
