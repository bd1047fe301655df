"""Async REST access to Google Cloud for triggers: GETs of long-running operations, nothing else.

The triggerer runs every trigger on one event loop, so this module never makes a sync HTTP call or builds a sync client
inside it: the connection comes from the async SDK API, and the only sync work (building Google credentials and
refreshing them) runs in a worker thread via ``sync_to_async``, the way the google provider's own async hooks do it.

The endpoints come from the same connection extras the sync :class:`~nemo_rl_gke.gcp.hooks.GcpHook` reads
(``api_endpoint`` for every service, or a per-service ``endpoints`` map), which is how the local sandbox is reached.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import aiohttp
from airflow.providers.google.common.hooks.base_google import GoogleBaseAsyncHook, GoogleBaseHook
from asgiref.sync import sync_to_async

from nemo_rl_gke.airflow_compat import get_async_connection, get_async_extra_dejson
from nemo_rl_gke.gcp.credentials import shared_credentials
from nemo_rl_gke.gcp.errors import PermanentApiError, TransientApiError

if TYPE_CHECKING:
    from airflow.providers.google.common.hooks.base_google import _CredentialsToken

DEFAULT_ENDPOINTS: dict[str, str] = {
    "compute": "https://compute.googleapis.com",
    "container": "https://container.googleapis.com",
    "lustre": "https://lustre.googleapis.com",
    "servicenetworking": "https://servicenetworking.googleapis.com",
}
# 408 and 429 say "try later"; every 5xx is the server's problem, not the request's.
TRANSIENT_STATUSES = frozenset({408, 429})
# A 403 with a rate-quota reason says "try later" too (the sync hook's RATE_LIMIT_REASONS; not imported from there,
# which would load every google.cloud client into the triggerer).
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})
DEFAULT_REQUEST_TIMEOUT_S = 30.0
_PREFIX = "extra__google_cloud_platform__"


def conn_extra(extras: Mapping[str, Any], name: str) -> Any:
    """One field of a google_cloud_platform connection's extras, plain or with the legacy ``extra__...__`` prefix."""
    value = extras.get(name, extras.get(_PREFIX + name))
    return None if value == "" else value


def endpoint_for(extras: Mapping[str, Any], service: str) -> str:
    """Base URL of one service: the per-service ``endpoints`` map wins over ``api_endpoint``, then Google's default."""
    endpoints = conn_extra(extras, "endpoints") or {}
    if isinstance(endpoints, str):
        # The connection form stores extras as strings; a JSON map typed into it arrives as text.
        endpoints = json.loads(endpoints)
    url = endpoints.get(service) or conn_extra(extras, "api_endpoint") or DEFAULT_ENDPOINTS.get(service)
    if not url:
        raise ValueError(f"no endpoint for service {service!r}: set 'endpoints.{service}' or 'api_endpoint'")
    return str(url).rstrip("/")


def is_anonymous(extras: Mapping[str, Any]) -> bool:
    """Whether the connection asks for no credentials at all (unit tests against scripted servers)."""
    value = conn_extra(extras, "is_anonymous")
    if isinstance(value, str):
        return value.strip().lower() in {"true", "1", "yes"}
    return bool(value)


def _error_text(raw: str) -> str:
    """The message of a Google error body (``{"error": {"code", "message", "status"}}``), else the raw text."""
    try:
        err = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return raw.strip()[:500]
    if isinstance(err, dict):
        return " ".join(str(p) for p in (err.get("status"), err.get("message")) if p) or raw.strip()[:500]
    return str(err)[:500] if err else raw.strip()[:500]


def _is_rate_limited(status: int, raw: str) -> bool:
    """A 403 whose body names a rate quota in ``errors[].reason`` or an ErrorInfo ``details[].reason``."""
    if status != 403:
        return False
    try:
        err = json.loads(raw).get("error") or {}
    except (ValueError, AttributeError):
        return False
    if not isinstance(err, dict):
        return False
    entries = [*(err.get("errors") or []), *(err.get("details") or [])]
    return any(isinstance(e, dict) and e.get("reason") in RATE_LIMIT_REASONS for e in entries)


class GcpAsyncHook(GoogleBaseAsyncHook):
    """Async counterpart of the sync GCP hook, for triggers: ``await get_json(service, path)`` on one aiohttp session.

    Use it as an async context manager (or call :meth:`close`) so the session is closed on the loop that opened it.
    """

    # Credentials are all the async side needs from the sync hook; GoogleBaseHook builds them without loading any
    # google.cloud client.
    sync_hook_class = GoogleBaseHook

    def __init__(
        self,
        gcp_conn_id: str = "google_cloud_default",
        *,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(gcp_conn_id=gcp_conn_id, **kwargs)
        self.gcp_conn_id = gcp_conn_id
        self.request_timeout_s = request_timeout_s
        self._extras: dict[str, Any] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._token: _CredentialsToken | None = None

    async def __aenter__(self) -> GcpAsyncHook:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session, if one was opened."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def extras(self) -> dict[str, Any]:
        """The connection's extras, fetched once through the async connection API (no sync call on the loop)."""
        if self._extras is None:
            conn = await get_async_connection(self.gcp_conn_id, hook=self)
            self._extras = dict(await get_async_extra_dejson(conn))
        return self._extras

    async def base_url(self, service: str) -> str:
        """The base URL of ``service`` for this connection."""
        return endpoint_for(await self.extras(), service)

    async def headers(self, *, refresh: bool = False) -> dict[str, str]:
        """Request headers: a bearer token unless the connection is anonymous (``refresh``: get a new one first)."""
        headers = {"Accept": "application/json"}
        if is_anonymous(await self.extras()):
            return headers
        if self._token is None:
            # Building the sync hook reads the connection, key files and environment: all sync I/O, so in a thread.
            self._token = await sync_to_async(self._build_token)(self._get_session())
        token = self._token
        # The provider's token assumes a 3600 s lifetime and reuses it for half that; the credentials know their
        # real expiry, so a shorter-lived token is renewed in time too.
        if refresh or (token.access_token and not token.credentials.valid):
            await token.acquire_access_token()
        headers["Authorization"] = f"Bearer {await token.get()}"
        return headers

    def _build_token(self, session: aiohttp.ClientSession) -> _CredentialsToken:
        """A gcloud-aio Token over the connection's credentials (key file, ADC, impersonation chain...).

        Runs in a worker thread. The provider's token class refreshes the credentials in a thread as well.
        """
        from airflow.providers.google.common.hooks.base_google import _CredentialsToken

        sync_hook = self.sync_hook_class(**self._hook_kwargs)
        credentials, project = shared_credentials(sync_hook, sync_hook.get_credentials_and_project_id)
        return _CredentialsToken(credentials, project=project, session=session, scopes=sync_hook.scopes)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.request_timeout_s))
        return self._session

    async def get_json(self, service: str, path: str) -> dict[str, Any]:
        """GET ``path`` (with its version prefix) from ``service`` and return the JSON object.

        Raises :class:`TransientApiError` for 408/429/5xx, a rate-limited 403, connection errors and timeouts, and
        :class:`PermanentApiError` for any other non-2xx status or a body that is not a JSON object.
        """
        url = await self.base_url(service) + (path if path.startswith("/") else "/" + path)
        headers = await self.headers()
        try:
            async with self._get_session().get(url, headers=headers) as resp:
                raw = await resp.text()
                status = resp.status
            if status == 401 and "Authorization" in headers:
                # As google-auth's AuthorizedSession does: one new token and one more try (a revoked or early-expired
                # token), then the 401 stands.
                headers = await self.headers(refresh=True)
                async with self._get_session().get(url, headers=headers) as resp:
                    raw = await resp.text()
                    status = resp.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise TransientApiError(
                f"GET {service} {path}: {type(exc).__name__}: {exc}", status=None, service=service, path=path
            ) from exc
        if status >= 400:
            retry = status >= 500 or status in TRANSIENT_STATUSES or _is_rate_limited(status, raw)
            cls = TransientApiError if retry else PermanentApiError
            raise cls(
                f"GET {service} {path}: HTTP {status}: {_error_text(raw)}", status=status, service=service, path=path
            )
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise PermanentApiError(
                f"GET {service} {path}: HTTP {status} with a body that is not JSON: {raw[:200]!r}",
                status=status,
                service=service,
                path=path,
            ) from exc
        if not isinstance(body, dict):
            raise PermanentApiError(
                f"GET {service} {path}: expected a JSON object, got {type(body).__name__}",
                status=status,
                service=service,
                path=path,
            )
        return body
