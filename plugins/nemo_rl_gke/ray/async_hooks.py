"""The Ray Jobs API for triggers (async, aiohttp only): a job's status, its driver log from an offset, stopping it.

The counterpart of :class:`~nemo_rl_gke.ray.hooks.RayJobsHook`, built from what a trigger may store in the metadata DB:
the address, whether it needs the Google token (only through the API server), the CA that signs it, and where the Ray
token is (KubeRay's Secret on the cluster), never a token. Both tokens are fetched here: the Google one through
:class:`~nemo_rl_gke.gcp.async_hooks.GcpAsyncHook`, the Ray one through the async Kubernetes hook
(:mod:`nemo_rl_gke.kube.async_client`, in :meth:`RayJobsAsyncHook.read_ray_token`). TLS is verified
against the cluster's CA, or the system's CAs; never switched off.

The log comes from Ray's ``/logs/tail`` websocket where it gets through (:mod:`.log_tail`), else from whole ``/logs``
downloads. Decoding a whole log (it can be megabytes) runs in a worker thread, not on the triggerer's event loop.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
from airflow.sdk import BaseHook

from nemo_rl_gke.gcp.async_hooks import GcpAsyncHook
from nemo_rl_gke.kube.async_client import AsyncKubeHook
from nemo_rl_gke.ray.errors import RayJobsApiError, RayJobsTransientError, RayTlsError, tls_error
from nemo_rl_gke.ray.log_tail import DRAIN_TIMEOUT_S, QUICK_END_BYTES, StreamRefused, TailStream
from nemo_rl_gke.ray.submit import hide_secret_bodies, ray_token_headers, ray_token_of

REQUEST_TIMEOUT_S = 60.0
# 408 and 429 say "try later"; every 5xx is the server's (or the proxy's) problem, not the request's.
TRANSIENT_STATUSES = frozenset({408, 429})


@dataclass(frozen=True)
class LogText:
    """Driver-log text from character ``start`` of the log on; ``start`` None: the whole log, which replaced a
    longer one read before (Ray job logs only grow). ``fallback`` says why the tail websocket was given up for
    whole downloads on this read ('' when it was not)."""

    text: str | None
    start: int | None
    fallback: str = ""


class RayJobsAsyncHook(BaseHook):
    """Async Ray Jobs API of one dashboard; use it as an async context manager (or call :meth:`close`) so its
    sessions close on the loop that opened them. Closed, it can be used again: the sessions reopen, the Ray token
    and the byte counts stay.

    :param address: the Ray dashboard base URL (the service-proxy path, or the deployment's URL).
    :param needs_token: send the Google bearer token of ``gcp_conn_id`` (only through the API server).
    :param gcp_conn_id: the connection the Google token and the cluster's API come from.
    :param ca_pem: the CA that signs an https ``address`` (the GKE API server's own); empty: the system's CAs.
    :param cluster_path: the GKE cluster (``projects/P/locations/L/clusters/C``) whose API holds the Ray token.
    :param ray_token_secret: the API path of KubeRay's Secret with the Ray token (empty: no token auth).
    :param log_stream: read logs through the tail websocket (False: whole downloads only).
    """

    def __init__(
        self,
        address: str,
        *,
        needs_token: bool = False,
        gcp_conn_id: str = "google_cloud_default",
        ca_pem: str = "",
        cluster_path: str = "",
        ray_token_secret: str = "",
        log_stream: bool = True,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        super().__init__()
        self.address = address.rstrip("/")
        self.needs_token = needs_token
        self.gcp_conn_id = gcp_conn_id
        self.ca_pem = ca_pem
        self.cluster_path = cluster_path
        self.ray_token_secret = ray_token_secret
        self.log_stream = log_stream
        self.request_timeout_s = request_timeout_s
        self._gcp: GcpAsyncHook | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ray_headers: dict[str, str] = {}
        self._tails: dict[str, TailStream] = {}
        self._download_bytes = 0
        self._fallback = ""  # why the tail websocket was given up, until a read returns it

    async def __aenter__(self) -> RayJobsAsyncHook:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the log streams and the HTTP sessions."""
        for tail in self._tails.values():
            await tail.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._gcp is not None:
            await self._gcp.close()
            self._gcp = None

    # --- the connection -----------------------------------------------------------------------------------------
    @property
    def has_ray_token(self) -> bool:
        """Whether the Ray token has been read (requests carry it from then on)."""
        return bool(self._ray_headers)

    async def read_ray_token(self) -> str:
        """Read the Ray token from KubeRay's Secret, once (the caller retries), and send it from now on; '' when the
        RayCluster has no token auth. Returned so the caller can mask it; raises RayTokenMissingError or
        KubeApiError."""
        if not self.ray_token_secret:
            return ""
        hide_secret_bodies()
        async with AsyncKubeHook(self.gcp_conn_id, self.cluster_path) as kube:
            secret = await kube.get(self.ray_token_secret)
        token = ray_token_of(secret, self.ray_token_secret)
        self._ray_headers = ray_token_headers(token)
        return token

    async def headers(self) -> dict[str, str]:
        """What a request carries: the Google token through the API server, and the Ray token once read."""
        if not self.needs_token:
            return {"Accept": "application/json", **self._ray_headers}
        if self._gcp is None:
            self._gcp = GcpAsyncHook(self.gcp_conn_id)
        return {**(await self._gcp.headers()), **self._ray_headers}

    def _ssl_context(self) -> ssl.SSLContext | None:
        """The TLS check against the cluster's own CA when there is one (None: the system's CAs)."""
        return ssl.create_default_context(cadata=self.ca_pem) if self.ca_pem else None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
            context = self._ssl_context()
            connector = aiohttp.TCPConnector(ssl=context) if context is not None else None
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        return self._session

    async def _request(self, method: str, path: str) -> tuple[int, bytes]:
        """One request; the status and the undecoded body. Raises RayTlsError or RayJobsTransientError."""
        headers = await self.headers()
        try:
            async with self._client().request(method, f"{self.address}{path}", headers=headers) as response:
                return response.status, await response.read()
        except aiohttp.ClientConnectorCertificateError as exc:
            raise self._tls_error(exc) from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise RayJobsTransientError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    def _tls_error(self, exc: aiohttp.ClientConnectorCertificateError) -> RayTlsError:
        # A wrong CA, or a server that is not the cluster's: waiting cannot fix it.
        return tls_error(self.address, "the cluster's CA" if self.ca_pem else "the system's CAs", exc.certificate_error)

    async def _json(self, method: str, path: str) -> tuple[int, Any]:
        """One request; the status and the JSON body (the text when it is not JSON, None when empty)."""
        status, raw = await self._request(method, path)
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text

    # --- the domain methods ---------------------------------------------------------------------------------------
    async def status(self, submission_id: str) -> dict[str, Any] | None:
        """The job's details (``GET /api/jobs/{id}``: status, message, error type, exit code...); None when Ray has
        no such job. Raises RayJobsApiError, RayJobsTransientError or RayTlsError."""
        status, body = await self._json("GET", f"/api/jobs/{submission_id}")
        if status >= 500 or status in TRANSIENT_STATUSES:
            raise RayJobsTransientError(f"GET /api/jobs/{submission_id}: HTTP {status}: {str(body)[:300]}")
        if status == 404:
            return None
        if status >= 400 or not isinstance(body, dict):
            raise RayJobsApiError(status, body)
        return body

    async def stop(self, submission_id: str) -> bool:
        """Ask Ray to stop the job, once; True when it was running. Raises RayJobsApiError for any answer but 200
        (a 404: no such job), RayJobsTransientError when none came, or RayTlsError."""
        status, body = await self._json("POST", f"/api/jobs/{submission_id}/stop")
        if status != 200 or not isinstance(body, dict):
            raise RayJobsApiError(status, body)
        return bool(body.get("stopped"))

    async def logs(self, submission_id: str, offset: int, *, to_end: bool = False) -> LogText:
        """What the driver log holds from character ``offset`` on, as far as it is known now.

        Read from the tail websocket (each byte once; opened on the first call) or, where none gets through, from
        a whole download. ``to_end``: the job is terminal, so the stream is read to its end; if Ray does not end it
        in time, or the log is short (:data:`~nemo_rl_gke.ray.log_tail.QUICK_END_BYTES`), one whole download
        completes the log. Text None: nothing could be read this time (an error answer
        to a download: not an empty log, which would read as a replaced one). Raises RayTlsError for a certificate
        that does not verify, RayJobsTransientError for a download that got no answer.
        """
        if self.log_stream:
            tail = self._tails.get(submission_id)
            if tail is None:
                url = f"{self.address}/api/jobs/{submission_id}/logs/tail"
                tail = self._tails[submission_id] = TailStream(url, self.headers, self._ssl_context())
            try:
                await tail.ensure_open()
            except aiohttp.ClientConnectorCertificateError as exc:
                raise self._tls_error(exc) from exc
            except StreamRefused as exc:
                self._fallback = str(exc)
                await tail.close()
                self.log_stream = False
            else:
                drain_s = DRAIN_TIMEOUT_S if tail.bytes_received > QUICK_END_BYTES else 0.0
                if not to_end or await tail.drain(drain_s):
                    return _from_offset(*tail.take(), offset)
                # Ray did not end the stream in time (or a short log is quicker to download than to wait for): the
                # download holds what the stream has, and the rest. The stream's text is taken after it, so a
                # download that raises leaves it for the next read.
                download = await self._download(submission_id, offset)
                streamed = _from_offset(*tail.take(), offset)
                return download if download.text is not None else streamed
        read = await self._download(submission_id, offset)
        fallback, self._fallback = self._fallback, ""
        return LogText(read.text, read.start, fallback)

    def stream_state(self, submission_id: str) -> str:
        """The job's tail websocket: ``"live"`` (open and reading: the log arrives without requests, and Ray closes it
        when the job is terminal), ``"closed"`` (it ended or broke: the job may have ended) or ``"none"`` (not opened,
        or logs are downloaded)."""
        tail = self._tails.get(submission_id)
        if not self.log_stream or tail is None:
            return "none"
        return "live" if tail.live else "closed"

    async def _download(self, submission_id: str, offset: int) -> LogText:
        status, body = await self._request("GET", f"/api/jobs/{submission_id}/logs")
        self._download_bytes += len(body)
        return await asyncio.to_thread(_downloaded, status, body, offset)

    @property
    def bytes_fetched(self) -> int:
        """Log bytes fetched so far, by the streams and by whole-log downloads."""
        return self._download_bytes + sum(tail.bytes_received for tail in self._tails.values())


def _from_offset(text: str, start: int, offset: int) -> LogText:
    """The part of ``text`` (from character ``start`` of the log) at or past ``offset``: a reopened stream resends
    the log from its start."""
    return LogText(text[max(0, offset - start) :], max(start, offset))


def _downloaded(status: int, body: bytes, offset: int) -> LogText:
    """The log of a ``GET /api/jobs/{id}/logs`` answer from ``offset`` on (decoded here, in a worker thread)."""
    text = _log_text(status, body)
    if text is None or len(text) < offset:
        return LogText(text, None)
    return LogText(text[offset:], offset)


def _log_text(status: int, body: bytes) -> str | None:
    """The ``logs`` text of a ``GET /api/jobs/{id}/logs`` answer, or None for anything else.

    None, not "": the follower reads a log shorter than what it has seen as a replaced one and would start over,
    showing every line again, after a single error answer.
    """
    if status != 200:
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    logs = data.get("logs") if isinstance(data, dict) else None
    if not isinstance(logs, str):
        return None
    # JSON may carry lone surrogates ("\udcff" for an undecodable byte), which no log handler can encode.
    return logs.encode("utf-8", "replace").decode("utf-8")
