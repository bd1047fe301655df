"""The sync Kubernetes hook for the run's GKE cluster: discovery, get, list, server-side apply, delete.

``GKEHook`` cannot reach a cluster through an endpoint override (FACTS §3), so the cluster's endpoint and CA come from
our own GCP hook, and the bearer token from the same ``google_cloud_default`` credentials, refreshed before it
expires. Paths are built from API discovery (``/api/v1``, ``/apis/{group}/{version}``), as kubectl does, so any kind
the cluster serves can be applied without a table of kinds here. Transient failures (429, 5xx, connection errors) are
retried with the package's backoff; everything else surfaces at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import kubernetes.client
import urllib3
from kubernetes.client.exceptions import ApiException

from nemo_rl_gke.gcp.hooks import GcpHook, RetryPolicy, retry_transient
from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.kube.access import ClusterAccess, DashboardAddress, dashboard_address
from nemo_rl_gke.kube.errors import (
    OBJECT_RESPONSES,
    TLS_VERIFY_FAILED,
    TRANSIENT_STATUSES,
    KubeApiError,
    is_kube_transient,
    tls_error,
)
from nemo_rl_gke.run.deployment import load_deployment
from nemo_rl_gke.run.ownership import reader
from nemo_rl_gke.run.topology import GKE_CLUSTER

if TYPE_CHECKING:
    from nemo_rl_gke.run.deployment import Deployment
    from nemo_rl_gke.run.spec import RunSpec

# Re-exported: the errors live in kube.errors, which the triggers import without the sync clients.
__all__ = [
    "OBJECT_RESPONSES",
    "TLS_VERIFY_FAILED",
    "TRANSIENT_STATUSES",
    "KubeApiError",
    "KubeHook",
    "ObjectRef",
    "is_kube_transient",
    "tls_error",
]
log = logging.getLogger(__name__)

FIELD_MANAGER = "airflow-nemo-rl-gke"
APPLY_PATCH = "application/apply-patch+yaml"
# The kubernetes client's auth setting (and api_key identifier) for a bearer token.
BEARER = "BearerToken"
# Refresh the Google token this long before it expires, so a request never goes out with a stale one.
TOKEN_MARGIN_S = 300


@dataclass(frozen=True)
class ObjectRef:
    """Which object: apiVersion, kind, name, namespace (None when cluster-scoped)."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectRef:
        """The reference of a manifest."""
        meta = obj["metadata"]
        return cls(str(obj["apiVersion"]), str(obj["kind"]), str(meta["name"]), meta.get("namespace"))

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


def _status_error(what: str, exc: ApiException) -> KubeApiError:
    reason, message = "", str(exc.reason or "")
    try:
        body = json.loads(exc.body or "{}")
        reason, message = str(body.get("reason", "")), str(body.get("message", message))
    except (ValueError, AttributeError):
        pass
    return KubeApiError(f"{what}: HTTP {exc.status}: {message}", status=exc.status, reason=reason)


class KubeHook:
    """Sync access to the Kubernetes API of the run's GKE cluster.

    :param spec: the run (names the cluster and the namespace).
    :param gcp_hook: the GCP hook whose connection gives the cluster, its CA and the bearer token.
    """

    def __init__(self, spec: RunSpec, gcp_hook: GcpHook, *, retry_policy: RetryPolicy | None = None) -> None:
        self.spec = spec
        self.gcp_hook = gcp_hook
        self.retry_policy = retry_policy or gcp_hook.retry_policy
        self._discovered: dict[str, dict[str, tuple[str, bool]]] = {}

    # --- connection -----------------------------------------------------------------------------------------------
    @cached_property
    def access(self) -> ClusterAccess:
        """Endpoint and CA of the cluster; raises ClusterUnreachableError when it is missing or not running."""
        cluster = resources(self.spec, reader())[GKE_CLUSTER]
        return ClusterAccess.from_cluster(cluster.get(self.gcp_hook), cluster.label)

    @cached_property
    def _credentials(self) -> Any:
        # One credentials object per hook, so its token is reused until it expires soon (not fetched per request).
        return self.gcp_hook.get_credentials()

    def token(self) -> str | None:
        """A valid Google access token, or None for an anonymous connection."""
        if self.gcp_hook.is_anonymous:
            return None
        import google.auth.transport.requests

        credentials = self._credentials
        if not credentials.valid or _expires_soon(credentials):
            credentials.refresh(google.auth.transport.requests.Request())
        return str(credentials.token)

    @cached_property
    def api_client(self) -> kubernetes.client.ApiClient:
        """A kubernetes ApiClient on the cluster's https endpoint, verifying it against the cluster's CA, with a
        refreshing bearer token."""
        config = kubernetes.client.Configuration()
        config.host = self.access.host
        config.ssl_ca_cert = self.access.ca_file()
        if not self.gcp_hook.is_anonymous:
            # kubernetes 36 sends the header only when 'BearerToken' is already a key of api_key, looks the prefix up
            # under 'BearerToken', and runs the refresh hook only then (FACTS §19): so the first token is set here.
            config.api_key[BEARER] = self.token()
            config.api_key_prefix[BEARER] = "Bearer"
            config.refresh_api_key_hook = self._refresh_token
        return kubernetes.client.ApiClient(config)

    def _refresh_token(self, config: kubernetes.client.Configuration) -> None:
        # Called by the client before every request: the token is re-read, and refreshed only when it expires soon.
        config.api_key[BEARER] = self.token()

    def dashboard(self, deployment: Deployment | None = None) -> DashboardAddress:
        """Where the RayCluster's dashboard is (see :func:`~nemo_rl_gke.kube.access.dashboard_address`): the
        deployment's ``ray_dashboard_url`` (read now when not given), else the run's head service via the API."""
        deployment = deployment or load_deployment()
        access = None if deployment.ray_dashboard_url else self.access
        return dashboard_address(self.spec, access, deployment, google_endpoint=self.gcp_hook.endpoint("container"))

    def dashboard_headers(self, address: DashboardAddress) -> dict[str, str]:
        """The headers a Ray Jobs client needs for ``address``: the bearer token through the API server."""
        token = self.token() if address.needs_token else None
        return {"Authorization": f"Bearer {token}"} if token else {}

    # --- raw requests ---------------------------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        what: str = "",
    ) -> dict[str, Any]:
        """One API call, retried when transient; the JSON answer as a dict."""
        what = what or f"{method} {path}"

        def call() -> dict[str, Any]:
            try:
                response = self.api_client.call_api(
                    path,
                    method,
                    query_params=list((query or {}).items()),
                    header_params={"Content-Type": content_type, "Accept": "application/json"},
                    body=body,
                    auth_settings=[BEARER],
                    response_types_map=OBJECT_RESPONSES,
                    _preload_content=True,
                    _return_http_data_only=True,
                    _request_timeout=self.gcp_hook.timeout_s,
                )
            except ApiException as exc:
                raise _status_error(what, exc) from exc
            except urllib3.exceptions.MaxRetryError as exc:
                if isinstance(exc.reason, urllib3.exceptions.SSLError):
                    raise tls_error(what, self.access.host, exc.reason) from exc
                raise
            return dict(response or {})

        return retry_transient(call, what=what, policy=self.retry_policy, transient=is_kube_transient)

    # --- discovery and paths --------------------------------------------------------------------------------------
    def resource_info(self, api_version: str, kind: str) -> tuple[str, bool]:
        """(plural, namespaced) of a kind, from the cluster's discovery document for its groupVersion."""
        if api_version not in self._discovered:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            doc = self.request("GET", base, what=f"discover {api_version}")
            self._discovered[api_version] = {
                r["kind"]: (r["name"], bool(r["namespaced"])) for r in doc.get("resources", []) if "/" not in r["name"]
            }
        try:
            return self._discovered[api_version][kind]
        except KeyError:
            raise KubeApiError(
                f"the cluster does not serve {kind} in {api_version} (is its CRD or GKE add-on installed?)",
                status=404,
                reason="NotFound",
            ) from None

    def path(self, ref: ObjectRef, *, collection: bool = False) -> str:
        """The REST path of an object (or, with ``collection``, of its type in its namespace)."""
        plural, namespaced = self.resource_info(ref.api_version, ref.kind)
        base = "/api/v1" if ref.api_version == "v1" else f"/apis/{ref.api_version}"
        if namespaced:
            base += f"/namespaces/{ref.namespace or self.spec.namespace}"
        return f"{base}/{plural}" if collection else f"{base}/{plural}/{ref.name}"

    # --- verbs ----------------------------------------------------------------------------------------------------
    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        """The object, or None on 404."""
        try:
            return self.request("GET", self.path(ref), what=f"get {ref}")
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, api_version: str, kind: str, namespace: str | None, *, labels: str = "", fields: str = ""
    ) -> list[dict[str, Any]]:
        """Objects of one kind (in ``namespace`` when namespaced), filtered by label and field selectors."""
        ref = ObjectRef(api_version, kind, "", namespace)
        query = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v}
        answer = self.request("GET", self.path(ref, collection=True), query=query, what=f"list {kind}")
        return list(answer.get("items") or [])

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply with this package as field manager (force: the package owns these fields), with strict
        field validation: a field the API server does not know (a KubeRay or GKE field this version lacks) fails the
        apply instead of being dropped."""
        ref = ObjectRef.of(obj)
        return self.request(
            "PATCH",
            self.path(ref),
            query={"fieldManager": FIELD_MANAGER, "force": "true", "fieldValidation": "Strict"},
            body=dict(obj),
            content_type=APPLY_PATCH,
            what=f"apply {ref}",
        )

    def delete(self, ref: ObjectRef) -> bool:
        """Delete with background propagation; False when it was already gone (404 counts as done)."""
        try:
            self.request("DELETE", self.path(ref), body={"propagationPolicy": "Background"}, what=f"delete {ref}")
        except KubeApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _expires_soon(credentials: Any) -> bool:
    import datetime

    expiry = getattr(credentials, "expiry", None)
    if expiry is None:
        return False
    remaining = expiry - datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    return remaining.total_seconds() < TOKEN_MARGIN_S
