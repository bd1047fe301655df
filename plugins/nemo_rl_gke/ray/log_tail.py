"""The Ray job's driver log, fetched only where it is new: Ray's tail websocket, or the whole log as a fallback.

``GET /api/jobs/{id}/logs`` answers the whole log every time: after hours of vLLM output, tens of MB per poll through
the API server. Ray's dashboard also serves ``/api/jobs/{id}/logs/tail`` (ray dashboard/modules/job/job_head.py,
what ``ray job logs --follow`` reads): a websocket that sends the log from its start, then each chunk as the job
writes it, and closes once the job is terminal and the file is read to its end. The Kubernetes API server's service
proxy passes the upgrade on (kube-apiserver's UpgradeAwareHandler), so one connection carries each byte once.

The state API was no alternative: ``/api/v0/logs/file?submission_id=...`` takes ``lines`` (the last N lines), not an
offset, and ``/api/v0/logs/stream`` follows the file for ever, with no end that says the log is complete.

A stream that breaks is reopened and resends the log from its start; the async hook
(:meth:`~nemo_rl_gke.ray.async_hooks.RayJobsAsyncHook.logs`) skips what was read. A proxy or Ray that refuses the
upgrade (any 4xx but 408/429, or an answer that is not a websocket) makes the hook fall back to whole-log polls,
which the trigger says once in the task log.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable

import aiohttp

# After the job is terminal, Ray reads the file to its end and closes the stream; past this, one whole-log GET.
DRAIN_TIMEOUT_S = 30.0
# Ray closes the stream 2-4 s after the job ended (its tail loop sleeps 1 s at each end of file, and again before it
# checks the job's status: ray dashboard/modules/job/job_manager.py, tail_job_logs). A log up to this size downloads
# in far less than that, so a terminal job's log this short is completed by one whole-log GET at once instead.
QUICK_END_BYTES = 256 * 1024
# Consecutive failures to open the stream (5xx, connection errors) before whole-log polls take over.
MAX_STREAM_FAILURES = 3
# A ping every 30 s keeps an idle stream (a job that prints nothing for a while) open through proxies.
HEARTBEAT_S = 30.0


class StreamRefused(Exception):
    """The tail websocket cannot be had here (a proxy without upgrades, or a Ray without the route)."""


class TailStream:
    """One ``/logs/tail`` websocket, read in the background: the text received, where it starts, and how it ended.

    :param url: the websocket's URL (the dashboard address + ``/api/jobs/{id}/logs/tail``).
    :param headers: gives the request headers (the Google and the Ray token), awaited at each connect.
    :param ssl_context: the TLS check of an https URL (the cluster's CA), or None for the system's CAs.
    """

    def __init__(
        self,
        url: str,
        headers: Callable[[], Awaitable[dict[str, str]]],
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url
        self._headers = headers
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._chunks: list[str] = []
        self._position = 0  # characters of this connection's stream handed out by take()
        self.bytes_received = 0
        self.failures = 0
        self.ended = False  # Ray closed the stream normally: the job is terminal and its log complete
        self.error = ""

    async def ensure_open(self) -> None:
        """Open the stream unless it runs or has ended; raises :class:`StreamRefused` when it cannot be had, and
        aiohttp's ``ClientConnectorCertificateError`` for a certificate that does not verify."""
        if self.ended or (self._task is not None and not self._task.done()):
            return
        if self._task is not None:
            # The last connection broke (a proxy restart, a network blip): reopen it, within the failure budget.
            self._failed(self.error or "the stream closed")
        if self._session is None:
            # No total timeout: the stream lasts as long as the job. Connecting is bounded.
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)
            connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        try:
            ws = await self._session.ws_connect(self.url, headers=await self._headers(), heartbeat=HEARTBEAT_S)
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status < 400 or (exc.status < 500 and exc.status not in (408, 429)):
                raise StreamRefused(f"HTTP {exc.status} to the websocket upgrade") from exc
            self._failed(f"HTTP {exc.status}")
            return
        except aiohttp.ClientConnectorCertificateError:
            raise  # a certificate that does not verify: no retry can fix it
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            return
        # A new connection resends the log from its start.
        self._chunks.clear()
        self._position = 0
        self.error = ""
        self._task = asyncio.get_running_loop().create_task(self._read(ws))

    def _failed(self, error: str) -> None:
        self.failures += 1
        self.error = error
        if self.failures >= MAX_STREAM_FAILURES:
            raise StreamRefused(f"{self.failures} attempts failed, the last: {error}")

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    self.failures = 0
                    self._chunks.append(message.data)
                    self.bytes_received += len(message.data.encode("utf-8", "replace"))
                elif message.type == aiohttp.WSMsgType.ERROR:
                    self.error = f"websocket error: {ws.exception()}"
                    return
            # The iterator ends on Ray's close frame: a normal end means the whole log was sent.
            if ws.close_code in (aiohttp.WSCloseCode.OK, None) and not self.error:
                self.ended = True
                self.failures = 0
            else:
                self.error = f"closed with code {ws.close_code}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            with contextlib.suppress(Exception):
                await ws.close()

    @property
    def live(self) -> bool:
        """The connection is open and being read (not ended, not broken)."""
        return self._task is not None and not self._task.done()

    def take(self) -> tuple[str, int]:
        """The text received since the last call and the character of the log it starts at."""
        text = "".join(self._chunks)
        self._chunks.clear()
        start = self._position
        self._position += len(text)
        return text, start

    async def drain(self, timeout: float = DRAIN_TIMEOUT_S) -> bool:
        """Wait for Ray to end the stream (the job is terminal); True when it did within ``timeout``."""
        if self._task is not None and not self._task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
        return self.ended

    async def close(self) -> None:
        """Stop reading and close the connection."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._session is not None:
            await self._session.close()
            self._session = None
