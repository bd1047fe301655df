"""Async GETs against the run's cluster API for triggers (kubernetes_asyncio), with no sync call on the event loop.

The cluster's endpoint and CA come from the container API through :class:`~nemo_rl_gke.gcp.async_hooks.GcpAsyncHook`,
which also gives the bearer token (refreshed in a worker thread), so the triggerer never builds a sync client.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any

import aiohttp
from kubernetes_asyncio import client as kclient
from kubernetes_asyncio.client.exceptions import ApiException

from nemo_rl_gke.gcp.async_hooks import GcpAsyncHook
from nemo_rl_gke.kube.access import ClusterAccess
from nemo_rl_gke.kube.errors import OBJECT_RESPONSES, KubeApiError, tls_error


class AsyncKubeHook:
    """``await get(path)`` on the cluster at ``cluster_path`` (``projects/P/locations/L/clusters/C``).

    Use it as an async context manager so both HTTP sessions close on the loop that opened them. ``access`` is the
    cluster's endpoint and CA when the caller knows them already; else they are read from the container API on first
    use.
    """

    def __init__(
        self, gcp_conn_id: str, cluster_path: str, request_timeout_s: float = 30.0, access: ClusterAccess | None = None
    ) -> None:
        self.gcp = GcpAsyncHook(gcp_conn_id, request_timeout_s=request_timeout_s)
        self.cluster_path = cluster_path
        self.request_timeout_s = request_timeout_s
        self.access = access
        self._api: kclient.ApiClient | None = None

    async def __aenter__(self) -> AsyncKubeHook:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the Kubernetes and Google sessions."""
        if self._api is not None:
            await self._api.close()
            self._api = None
        await self.gcp.close()

    async def _client(self) -> kclient.ApiClient:
        if self._api is None:
            if self.access is None:
                cluster = await self.gcp.get_json("container", f"/v1/{self.cluster_path}")
                self.access = ClusterAccess.from_cluster(cluster, f"GKE cluster {self.cluster_path}")
            # Verified against the cluster's CA (the system's when it reports none); never switched off.
            config = kclient.Configuration(host=self.access.host, ssl_ca_cert=self.access.ca_file())
            self._api = kclient.ApiClient(config)
        return self._api

    async def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        """GET ``path``: the object, or None on 404. Other failures raise :class:`KubeApiError` (status None for a
        connection error or timeout)."""
        api = await self._client()
        headers = {k: v for k, v in (await self.gcp.headers()).items() if k == "Authorization"}
        headers["Accept"] = "application/json"
        try:
            answer = await api.call_api(
                path,
                "GET",
                query_params=list((query or {}).items()),
                header_params=headers,
                response_types_map=OBJECT_RESPONSES,
                auth_settings=[],
                _return_http_data_only=True,
                _preload_content=True,
                _request_timeout=self.request_timeout_s,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            message = str(exc.reason or "")
            with contextlib.suppress(ValueError, AttributeError):
                message = str(json.loads(exc.body or "{}").get("message", message))
            raise KubeApiError(f"GET {path}: HTTP {exc.status}: {message}", status=exc.status) from exc
        except aiohttp.ClientConnectorCertificateError as exc:
            raise tls_error(f"GET {path}", api.configuration.host, exc.certificate_error) from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeApiError(f"GET {path}: {type(exc).__name__}: {exc}", status=None) from exc
        return dict(answer or {})

    async def watch(self, path: str, query: Mapping[str, str], timeout_s: float) -> AsyncIterator[dict[str, Any]]:
        """Watch the list at ``path`` (``watch=true``, ``query`` adds the selectors and ``resourceVersion``) for at
        most ``timeout_s``: each event (``{"type", "object"}``) as the server sends it. Fails as :meth:`get` does;
        an ERROR event (a ``410 Expired`` version) raises :class:`KubeApiError` with its code."""
        api = await self._client()
        headers = {k: v for k, v in (await self.gcp.headers()).items() if k == "Authorization"}
        headers["Accept"] = "application/json"
        params = {
            **query,
            "watch": "true",
            "timeoutSeconds": str(max(1, int(timeout_s))),
            "allowWatchBookmarks": "true",
        }
        try:
            response = await api.call_api(
                path,
                "GET",
                query_params=list(params.items()),
                header_params=headers,
                auth_settings=[],
                _return_http_data_only=True,
                _preload_content=False,
                # The server ends the stream at timeoutSeconds; this only bounds a connection that went silent.
                _request_timeout=timeout_s + self.request_timeout_s,
            )
            async with response:
                if not 200 <= response.status <= 299:
                    message = str(response.reason or "")
                    with contextlib.suppress(ValueError, AttributeError):
                        message = str(json.loads(await response.read() or b"{}").get("message", message))
                    raise KubeApiError(f"watch {path}: HTTP {response.status}: {message}", status=response.status)
                while line := await response.content.readline():
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise KubeApiError(
                            f"watch {path}: {status.get('message')}",
                            status=status.get("code"),
                            reason=status.get("reason", ""),
                        )
                    yield event
        except ApiException as exc:
            raise KubeApiError(f"watch {path}: HTTP {exc.status}: {exc.reason}", status=exc.status) from exc
        except aiohttp.ClientConnectorCertificateError as exc:
            raise tls_error(f"watch {path}", api.configuration.host, exc.certificate_error) from exc
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise KubeApiError(f"watch {path}: {type(exc).__name__}: {exc}", status=None) from exc
