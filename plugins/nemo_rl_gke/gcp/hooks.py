"""The sync Google Cloud hook of the package: credentials and project from ``google_cloud_default``, and every client.

The connection's extras (DESIGN rule 7: the same code locally and in the cloud):

- ``key_path`` / ``keyfile_dict``: a service-account key (GoogleBaseHook's own extras); the local sandbox issues one
  (``python -m sandbox credentials``) and, like Google, refuses calls without a valid bearer token;
- ``is_anonymous: true``: AnonymousCredentials (GoogleBaseHook's own extra), for unit tests against scripted servers;
- ``project``: the project GoogleBaseHook reports; for information only, since every resource path comes from the
  RunSpec (one source of names);
- ``api_endpoint``: one base URL for every service (``http://127.0.0.1:PORT`` for the sandbox); absent means Google's
  real endpoints;
- ``endpoints``: ``{service: url}`` per-service overrides that win over ``api_endpoint``. Services are named as in
  :class:`~nemo_rl_gke.gcp.operations.OperationRef`: compute, container, lustre, servicenetworking,
  cloudresourcemanager, serviceusage, storage.

Clients are built lazily and cached on the hook, with their own retries turned off: :meth:`GcpHook.call` and
:meth:`GcpHook.execute` apply two bounded retry policies, whichever client library sent the request:

- transient errors (429, 5xx, 403 ``rateLimitExceeded``/``userRateLimitExceeded``, a dropped socket): seconds;
- "busy" refusals that clear once another operation ends (compute ``resourceNotReady`` and "There is a peering
  operation in progress", GKE ``FAILED_PRECONDITION`` "incompatible operation", ``ABORTED``): minutes.

Any other 4xx (a 400, a permission 403, a 409 ``alreadyExists``) surfaces at once. Errors are told apart by the
body's ``error.status``, ``error.errors[].reason`` and ErrorInfo ``details[].reason``; text only where Google gives
nothing else (see :data:`BUSY_TEXT`).
"""

from __future__ import annotations

import json
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

from nemo_rl_gke.gcp.credentials import shared_credentials

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
# A 403 with one of these reasons is a rate quota ("wait a minute then try again", compute api-quota docs), not a
# missing permission. ErrorInfo spells it RATE_LIMIT_EXCEEDED.
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})
# Compute's reason for "the resource is still being created or deleted": retry once that operation ends.
BUSY_REASONS = frozenset({"resourceNotReady"})
# ABORTED is google.rpc's "retry at a higher level": e.g. Lustre's "unable to queue the operation" while another
# transfer runs on the instance (FACTS §14).
BUSY_STATUSES = frozenset({"ABORTED"})
# Google gives these only as text: their reason is the generic failedPrecondition/FAILED_PRECONDITION (GKE) or none
# that tells them from a permanent 400 (compute). terraform-provider-google matches the same text
# (IsPeeringOperationInProgress, the node pool's retry on "incompatible operation").
BUSY_TEXT = (
    "There is a peering operation in progress",
    "There is a route operation in progress",
    "is running incompatible operation",
    "Please wait and try again once it is done",
)
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


@dataclass(frozen=True)
class ErrorFacts:
    """What a Google error body says: HTTP status, ``error.status``, every reason and the message."""

    http: int | None
    status: str
    reasons: frozenset[str]
    message: str


def _error_payload(exc: BaseException) -> dict[str, Any]:
    """The ``error`` object of the response body, from either client family; ``{}`` when there is none."""
    raw: Any = None
    if isinstance(exc, HttpError):
        raw = exc.content
    elif isinstance(exc, api_exceptions.GoogleAPICallError):
        response = exc.response
        raw = getattr(response, "content", None) if response is not None else None
    if isinstance(raw, bytes | str) and raw:
        try:
            body = json.loads(raw)
        except ValueError:
            return {}
        error = body.get("error") if isinstance(body, dict) else None
        return error if isinstance(error, dict) else {}
    return {}


def error_facts(exc: BaseException) -> ErrorFacts:
    """The status, reasons and message of a google-cloud or googleapiclient error (empty for anything else)."""
    payload = _error_payload(exc)
    reasons = {str(e.get("reason")) for e in payload.get("errors") or [] if isinstance(e, dict) and e.get("reason")}
    reasons |= {
        str(d.get("reason"))
        for d in payload.get("details") or []
        if isinstance(d, dict) and d.get("@type", "").endswith("google.rpc.ErrorInfo") and d.get("reason")
    }
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        reasons |= {str(e["reason"]) for e in exc.errors if isinstance(e, dict) and e.get("reason")}
        if exc.reason:
            reasons.add(str(exc.reason))
    message = str(payload.get("message") or getattr(exc, "message", "") or exc)
    return ErrorFacts(http_status(exc), str(payload.get("status") or ""), frozenset(reasons), message)


def is_transient(exc: BaseException) -> bool:
    """Whether an error is worth retrying soon: 429, 500, 502, 503, 504, UNAVAILABLE, DEADLINE_EXCEEDED, a dropped
    socket, and a 403 whose reason is a rate quota (``rateLimitExceeded``, ``userRateLimitExceeded``).

    Any other 400, 403, 404 and 409 is not: the same request would fail the same way (see :func:`is_busy` for the
    refusals that clear once another operation ends).
    """
    if isinstance(exc, _TRANSIENT_EXCEPTIONS):
        return True
    status = http_status(exc)
    if status in TRANSIENT_STATUSES:
        return True
    if status == 403 and error_facts(exc).reasons & RATE_LIMIT_REASONS:
        return True
    grpc_status = getattr(exc, "grpc_status_code", None)
    return grpc_status is not None and getattr(grpc_status, "name", "") in _GRPC_TRANSIENT


def is_busy(exc: BaseException) -> bool:
    """Whether the API refused because another operation holds the resource: worth retrying for minutes.

    compute 400 ``resourceNotReady`` or "There is a peering operation in progress", GKE 400 FAILED_PRECONDITION
    "Cluster is running incompatible operation" / "Operation ... is currently ... Please wait and try again once it
    is done", and any ABORTED (Lustre's second transfer on an instance).
    """
    status = http_status(exc)
    if status not in (400, 409):
        return False
    facts = error_facts(exc)
    if facts.status in BUSY_STATUSES or facts.reasons & BUSY_REASONS:
        return True
    return status == 400 and busy_text(facts.message)


def busy_text(message: str) -> bool:
    """Whether an error message is one of the busy refusals Google gives only as text (:data:`BUSY_TEXT`); also how
    an operation that failed inside with one of them is told apart (Service Networking's code 3)."""
    return any(text in message for text in BUSY_TEXT)


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


# Refusals that last as long as another operation: a GKE cluster's reconcile or upgrade, a peering change, a
# Lustre transfer. Up to 12 calls, 10 s doubling to 90 s with full jitter: at most 13 minutes of waits, about 6.5 on
# average (GKE's own reconciles take minutes; terraform-provider-google waits out the same refusals).
BUSY_RETRY = RetryPolicy(attempts=12, initial_s=10.0, maximum_s=90.0)


def retry_transient(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy = RetryPolicy(),
    transient: Callable[[BaseException], bool] = is_transient,
    busy: Callable[[BaseException], bool] | None = None,
    busy_policy: RetryPolicy = BUSY_RETRY,
) -> T:
    """Call ``fn``; on a transient error sleep and call it again, at most ``policy.attempts`` times in all.

    Anything that is not transient is raised at once, and the last transient error is raised when the attempts run out.
    ``transient`` tells them apart (Google's errors by default; the Kubernetes hook passes its own). ``busy`` errors
    (:func:`is_busy` for Google's) are retried under the longer ``busy_policy``, counted apart.
    """
    delays = {"transient": policy.delays(), "busy": busy_policy.delays()}
    limits = {"transient": policy.attempts, "busy": busy_policy.attempts}
    tries = {"transient": 0, "busy": 0}
    while True:
        try:
            return fn()
        except Exception as exc:
            kind = "busy" if busy is not None and busy(exc) else "transient" if transient(exc) else None
            if kind is None:
                raise
            tries[kind] += 1
            if tries[kind] >= limits[kind]:
                raise
            delay = delays[kind][tries[kind] - 1]
            log.warning(
                "%s: %s error (retry %s of %s) in %.2fs: %s", what, kind, tries[kind], limits[kind] - 1, delay, exc
            )
            time.sleep(delay)


class GcpHook(GoogleBaseHook):
    """Sync clients for every Google API the package calls, from the ``google_cloud_default`` connection.

    :param gcp_conn_id: the Airflow connection (type ``google_cloud_platform``).
    :param impersonation_chain: optional service account(s) to impersonate, as in every google provider hook.
    :param timeout_s: the per-request timeout of every call.
    :param retry_policy: the backoff for transient errors (tests pass a fast one).
    :param busy_policy: the longer backoff for refusals while another operation runs (:func:`is_busy`).
    """

    def __init__(
        self,
        gcp_conn_id: str = GoogleBaseHook.default_conn_name,
        impersonation_chain: str | list[str] | None = None,
        *,
        timeout_s: float = 60.0,
        retry_policy: RetryPolicy | None = None,
        busy_policy: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(gcp_conn_id=gcp_conn_id, impersonation_chain=impersonation_chain, **kwargs)
        self.timeout_s = timeout_s
        self.retry_policy = retry_policy or RetryPolicy()
        self.busy_policy = busy_policy or BUSY_RETRY
        self._compute: dict[str, Any] = {}
        self._discovery: dict[tuple[str, str], Any] = {}
        self._project_numbers: dict[str, str] = {}

    def get_credentials_and_project_id(self) -> tuple[Any, str | None]:
        """The connection's credentials and project, shared by every hook of this process on the same connection
        (see :mod:`nemo_rl_gke.gcp.credentials`)."""
        if self._cached_credentials is None:
            self._cached_credentials, self._cached_project_id = shared_credentials(
                self, super().get_credentials_and_project_id
            )
        return self._cached_credentials, self._cached_project_id

    # --- endpoints ----------------------------------------------------------------------------------------------
    @property
    def is_anonymous(self) -> bool:
        """Whether the connection asks for AnonymousCredentials (unit tests only: the sandbox wants a token)."""
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
        """Cloud Storage JSON API v1 (the export bucket, its IAM policy, the pending-checkpoint records, the copies)."""
        return self.discovery("storage", "v1")

    @property
    def resourcemanager(self) -> Any:
        """Cloud Resource Manager v1 (the project number)."""
        return self.discovery("cloudresourcemanager", "v1")

    @property
    def serviceusage(self) -> Any:
        """Service Usage v1 (which APIs are enabled)."""
        return self.discovery("serviceusage", "v1")

    @property
    def serviceusage_beta(self) -> Any:
        """Service Usage v1beta1 (consumer quota metrics: the GPU quota per GPU family)."""
        return self.discovery("serviceusage", "v1beta1")

    # --- calls ---------------------------------------------------------------------------------------------------
    def call(self, method: Callable[..., T], /, *args: Any, what: str, **kwargs: Any) -> T:
        """Call a google-cloud client method under the hook's retry policy.

        The client's own default retry is turned off (``retry=None``): compute retries 503 for up to 600 s by itself,
        which stacked under ours would make a bounded retry unbounded in practice.
        """
        return retry_transient(
            lambda: method(*args, retry=None, timeout=self.timeout_s, **kwargs),
            what=what,
            policy=self.retry_policy,
            busy=is_busy,
            busy_policy=self.busy_policy,
        )

    def execute(self, request: HttpRequest, *, what: str) -> dict[str, Any]:
        """Execute a googleapiclient request under the hook's retry policy (its own ``num_retries`` left at 0)."""
        return retry_transient(
            lambda: request.execute(num_retries=0),
            what=what,
            policy=self.retry_policy,
            busy=is_busy,
            busy_policy=self.busy_policy,
        )

    def project_number(self, project: str) -> str:
        """The project *number* of ``project`` (Cloud Resource Manager ``projects.get``), cached per hook."""
        if project not in self._project_numbers:
            body = self.execute(self.resourcemanager.projects().get(projectId=project), what=f"projects.get {project}")
            self._project_numbers[project] = str(body["projectNumber"])
        return self._project_numbers[project]
