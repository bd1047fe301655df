"""The sync Google Cloud hook of the package: credentials and project from ``google_cloud_default``, and every client.

The connection's extras (DESIGN rule 7: the same code locally and in the cloud):

- ``is_anonymous: true``: AnonymousCredentials (GoogleBaseHook's own extra), for the local sandbox;
- ``project``: the project GoogleBaseHook reports; for information only, since every resource path comes from the
  RunSpec (one source of names);
- ``api_endpoint``: one base URL for every service (``http://127.0.0.1:PORT`` for the sandbox); absent means Google's
  real endpoints;
- ``endpoints``: ``{service: url}`` per-service overrides that win over ``api_endpoint``. Services are named as in
  :class:`~nemo_rl_gke.gcp.operations.OperationRef`: compute, container, lustre, servicenetworking,
  cloudresourcemanager, serviceusage, storage.

Clients are built lazily and cached on the hook, with their own retries turned off: :meth:`GcpHook.call` and
:meth:`GcpHook.execute` apply one bounded retry policy to transient errors only, so a 400, a 403 or a 409 surfaces at
once and a fault is retried the same way whichever client library sent the request.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import requests
from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
from google.api_core import exceptions as api_exceptions
from google.cloud import compute_v1, container_v1, lustre_v1
from googleapiclient import discovery as gdiscovery
from googleapiclient.errors import HttpError
from googleapiclient.http import HttpRequest, build_http

log = logging.getLogger(__name__)

T = TypeVar("T")

# HTTP statuses worth another try: rate limiting and the server-side failures Google documents as retryable.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
_TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    api_exceptions.TooManyRequests,
    api_exceptions.InternalServerError,
    api_exceptions.BadGateway,
    api_exceptions.ServiceUnavailable,
    api_exceptions.GatewayTimeout,
    api_exceptions.DeadlineExceeded,
    # The connection itself: a reset or a timeout says nothing about the request. Trying again is safe for a read;
    # a retried create gets its first operation back (the requestId of compute and Lustre) or a 409 that ensure()
    # reads back as the resource it made.
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    ConnectionError,
    TimeoutError,
)
# The servicePath a discovery API's methods are relative to, where it is not empty: an endpoint override replaces the
# rootUrl and the servicePath both, so it is put back (Cloud Storage's is storage/v1/).
SERVICE_PATHS = {"storage": "storage/v1/"}
_GRPC_TRANSIENT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INTERNAL"})
COMPUTE_CLIENTS: dict[str, type] = {
    "networks": compute_v1.NetworksClient,
    "subnetworks": compute_v1.SubnetworksClient,
    "firewalls": compute_v1.FirewallsClient,
    "global_addresses": compute_v1.GlobalAddressesClient,
    "network_profiles": compute_v1.NetworkProfilesClient,
    "reservations": compute_v1.ReservationsClient,
    "regions": compute_v1.RegionsClient,
    "global_operations": compute_v1.GlobalOperationsClient,
    "region_operations": compute_v1.RegionOperationsClient,
    "projects": compute_v1.ProjectsClient,
}


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a google-cloud or googleapiclient error, or ``None`` for anything else."""
    if isinstance(exc, HttpError):
        return int(exc.resp.status)
    if isinstance(exc, api_exceptions.GoogleAPICallError) and isinstance(exc.code, int):
        return exc.code
    return None


def is_not_found(exc: BaseException) -> bool:
    """A 404 from either client family: the resource (or operation) does not exist."""
    return isinstance(exc, api_exceptions.NotFound) or http_status(exc) == 404


def is_conflict(exc: BaseException) -> bool:
    """A 409 from either client family: the resource already exists (or is being changed)."""
    return isinstance(exc, api_exceptions.Conflict) or http_status(exc) == 409


def is_transient(exc: BaseException) -> bool:
    """Whether an error is worth retrying: 429, 500, 502, 503, 504, UNAVAILABLE, DEADLINE_EXCEEDED, a dropped socket.

    400, 403, 404 and 409 are never transient: the same request would fail the same way.
    """
    if isinstance(exc, _TRANSIENT_EXCEPTIONS):
        return True
    status = http_status(exc)
    if status in TRANSIENT_STATUSES:
        return True
    grpc_status = getattr(exc, "grpc_status_code", None)
    return grpc_status is not None and getattr(grpc_status, "name", "") in _GRPC_TRANSIENT


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with full jitter for transient errors: at most ``attempts`` calls in all."""

    attempts: int = 6
    initial_s: float = 1.0
    maximum_s: float = 30.0
    multiplier: float = 2.0

    def delays(self) -> list[float]:
        """The sleep before each retry (full jitter: uniform in [0, cap]), ``attempts - 1`` of them."""
        caps = [min(self.initial_s * self.multiplier**n, self.maximum_s) for n in range(self.attempts - 1)]
        return [random.uniform(0.0, cap) for cap in caps]


def retry_transient(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy = RetryPolicy(),
    transient: Callable[[BaseException], bool] = is_transient,
) -> T:
    """Call ``fn``; on a transient error sleep and call it again, at most ``policy.attempts`` times in all.

    Anything that is not transient is raised at once, and the last transient error is raised when the attempts run out.
    ``transient`` tells them apart (Google's errors by default; the Kubernetes hook passes its own).
    """
    delays = policy.delays()
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:
            if not transient(exc) or attempt == policy.attempts - 1:
                raise
            delay = delays[attempt]
            log.warning(
                "%s: transient error (attempt %s of %s), retrying in %.2fs: %s",
                what,
                attempt + 1,
                policy.attempts,
                delay,
                exc,
            )
            time.sleep(delay)
    raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover


class GcpHook(GoogleBaseHook):
    """Sync clients for every Google API the package calls, from the ``google_cloud_default`` connection.

    :param gcp_conn_id: the Airflow connection (type ``google_cloud_platform``).
    :param impersonation_chain: optional service account(s) to impersonate, as in every google provider hook.
    :param timeout_s: the per-request timeout of every call.
    :param retry_policy: the backoff for transient errors (tests pass a fast one).
    """

    def __init__(
        self,
        gcp_conn_id: str = GoogleBaseHook.default_conn_name,
        impersonation_chain: str | list[str] | None = None,
        *,
        timeout_s: float = 60.0,
        retry_policy: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(gcp_conn_id=gcp_conn_id, impersonation_chain=impersonation_chain, **kwargs)
        self.timeout_s = timeout_s
        self.retry_policy = retry_policy or RetryPolicy()
        self._compute: dict[str, Any] = {}
        self._discovery: dict[tuple[str, str], Any] = {}
        self._project_numbers: dict[str, str] = {}

    # --- endpoints ----------------------------------------------------------------------------------------------
    @property
    def is_anonymous(self) -> bool:
        """Whether the connection asks for AnonymousCredentials (the sandbox)."""
        return bool(self._get_field("is_anonymous", False))

    def endpoint(self, service: str) -> str | None:
        """The base URL override of ``service`` (``endpoints[service]``, else ``api_endpoint``), or ``None``."""
        endpoints = self._get_field("endpoints", None) or {}
        if not isinstance(endpoints, dict):
            raise ValueError(f"connection {self.gcp_conn_id}: extra 'endpoints' must be a JSON object")
        url = endpoints.get(service) or self._get_field("api_endpoint", None)
        return str(url).rstrip("/") if url else None

    def _client_options(self, service: str) -> Any:
        return self.get_client_options(api_endpoint_override=self.endpoint(service))

    # --- google-cloud clients -----------------------------------------------------------------------------------
    def compute(self, name: str) -> Any:
        """The cached compute_v1 client ``name`` (a key of :data:`COMPUTE_CLIENTS`, e.g. ``networks``)."""
        if name not in self._compute:
            cls = COMPUTE_CLIENTS[name]
            # Compute is REST-only; the transport takes an http:// endpoint as is (FACTS §3).
            options = self._client_options("compute")
            self._compute[name] = cls(credentials=self.get_credentials(), client_options=options)
        return self._compute[name]

    @property
    def networks_client(self) -> compute_v1.NetworksClient:
        """VPC networks."""
        return self.compute("networks")

    @property
    def subnetworks_client(self) -> compute_v1.SubnetworksClient:
        """Regional subnetworks."""
        return self.compute("subnetworks")

    @property
    def firewalls_client(self) -> compute_v1.FirewallsClient:
        """Firewall rules."""
        return self.compute("firewalls")

    @property
    def global_addresses_client(self) -> compute_v1.GlobalAddressesClient:
        """Global addresses (the peering range)."""
        return self.compute("global_addresses")

    @property
    def network_profiles_client(self) -> compute_v1.NetworkProfilesClient:
        """Network profiles (the zone's RoCE profile)."""
        return self.compute("network_profiles")

    @property
    def reservations_client(self) -> compute_v1.ReservationsClient:
        """Zonal reservations (the GPU machines)."""
        return self.compute("reservations")

    @property
    def regions_client(self) -> compute_v1.RegionsClient:
        """Regions, with their quotas."""
        return self.compute("regions")

    @property
    def global_operations_client(self) -> compute_v1.GlobalOperationsClient:
        """Compute global operations."""
        return self.compute("global_operations")

    @property
    def region_operations_client(self) -> compute_v1.RegionOperationsClient:
        """Compute region operations."""
        return self.compute("region_operations")

    @cached_property
    def container_client(self) -> container_v1.ClusterManagerClient:
        """GKE over REST: the gRPC transport (the provider's GKEHook) has no endpoint a local server can take."""
        return container_v1.ClusterManagerClient(
            credentials=self.get_credentials(), transport="rest", client_options=self._client_options("container")
        )

    @cached_property
    def lustre_client(self) -> lustre_v1.LustreClient:
        """Managed Lustre over REST, for the same reason as the container client."""
        return lustre_v1.LustreClient(
            credentials=self.get_credentials(), transport="rest", client_options=self._client_options("lustre")
        )

    # --- discovery clients --------------------------------------------------------------------------------------
    def discovery(self, api: str, version: str = "v1") -> Any:
        """The cached googleapiclient client of ``api`` ``version``, built from the bundled discovery document.

        Static discovery: nothing is fetched to build it. With an endpoint override the client's base URL is the
        override (Service Networking, Resource Manager and Service Usage all have an empty servicePath, so their
        method paths start with the version). Anonymous connections get a plain, unauthenticated httplib2 client.
        """
        key = (api, version)
        if key not in self._discovery:
            endpoint = self.endpoint(api)
            client_options = {"api_endpoint": endpoint + "/" + SERVICE_PATHS.get(api, "")} if endpoint else None
            http = build_http() if self.is_anonymous else self._authorize()
            self._discovery[key] = gdiscovery.build(
                api,
                version,
                http=http,
                client_options=client_options,
                static_discovery=True,
                cache_discovery=False,
            )
        return self._discovery[key]

    @property
    def servicenetworking(self) -> Any:
        """Service Networking v1 (the private services peering for Lustre)."""
        return self.discovery("servicenetworking", "v1")

    @property
    def storage(self) -> Any:
        """Cloud Storage JSON API v1 (the pending-checkpoint records and the exported copies in the export bucket)."""
        return self.discovery("storage", "v1")

    @property
    def resourcemanager(self) -> Any:
        """Cloud Resource Manager v1 (the project number)."""
        return self.discovery("cloudresourcemanager", "v1")

    @property
    def serviceusage(self) -> Any:
        """Service Usage v1 (which APIs are enabled)."""
        return self.discovery("serviceusage", "v1")

    # --- calls ---------------------------------------------------------------------------------------------------
    def call(self, method: Callable[..., T], /, *args: Any, what: str, **kwargs: Any) -> T:
        """Call a google-cloud client method under the hook's retry policy.

        The client's own default retry is turned off (``retry=None``): compute retries 503 for up to 600 s by itself,
        which stacked under ours would make a bounded retry unbounded in practice.
        """
        return retry_transient(
            lambda: method(*args, retry=None, timeout=self.timeout_s, **kwargs), what=what, policy=self.retry_policy
        )

    def execute(self, request: HttpRequest, *, what: str) -> dict[str, Any]:
        """Execute a googleapiclient request under the hook's retry policy (its own ``num_retries`` left at 0)."""
        return retry_transient(lambda: request.execute(num_retries=0), what=what, policy=self.retry_policy)

    def project_number(self, project: str) -> str:
        """The project *number* of ``project`` (Cloud Resource Manager ``projects.get``), cached per hook."""
        if project not in self._project_numbers:
            body = self.execute(self.resourcemanager.projects().get(projectId=project), what=f"projects.get {project}")
            self._project_numbers[project] = str(body["projectNumber"])
        return self._project_numbers[project]
