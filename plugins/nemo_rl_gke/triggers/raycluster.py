"""The trigger that waits for a RayCluster to be ready (or to be gone) without holding a worker slot.

Ready is the conditions ``HeadPodReady`` and ``RayClusterProvisioned`` (never ``status.state``) or, where KubeRay
reports no conditions (1.2 without its feature gate), the head and worker pods all Ready; gone is a 404 after a
delete. ``workers`` is ready with every worker the spec asks for ready now (``status.readyWorkerReplicas``):
``RayClusterProvisioned`` stays True once it was, so after a lost node only the count says the replacement joined.
It reads the RayCluster with async calls only, and between two reads watches it from the version read, so a wait
costs a request per change (or per :data:`WATCH_S`) rather than one per poll interval. It ends with exactly one
event::

    {"status": "success" | "error" | "timeout" | "stockout", "message": str, "raycluster": str, "wait_for": str}

With ``node_pool_path`` (a run on a capacity ladder) it also reads the GPU node pool on every poll, and a
``GCE_STOCKOUT`` condition there ends the wait at once (``stockout``): its nodes will not come, and the next rung
need not wait for the rung's deadline to learn it.

A timeout while waiting for readiness says which condition is missing and what the pods and their events say.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from nemo_rl_gke.kube.access import ClusterUnreachableError
from nemo_rl_gke.kube.errors import KubeApiError, is_kube_transient
from nemo_rl_gke.kube.raycluster import (
    CLUSTER_LABEL,
    desired_workers,
    diagnose,
    events_path,
    is_ready,
    pods_not_ready,
    pods_path,
    raycluster_path,
    ready_workers,
    reports_conditions,
)
from nemo_rl_gke.triggers.clients import GCP, KUBE, client_module
from nemo_rl_gke.triggers.operations import ERROR, SUCCESS, TIMEOUT, backoff_delay, long_wait_delay

if TYPE_CHECKING:
    from nemo_rl_gke.kube.async_client import AsyncKubeHook

CLASSPATH = "nemo_rl_gke.triggers.raycluster.RayClusterTrigger"
WAIT_MODES = ("ready", "workers", "deleted")
STOCKOUT = "stockout"
# The longest watch between two reads of the RayCluster (the API server ends a watch by 30 min anyway).
WATCH_S = 300.0


def stockout_message(pool: dict[str, Any] | None) -> str:
    """What a node pool's GCE_STOCKOUT conditions say ("" : none)."""
    found = [c for c in (pool or {}).get("conditions") or [] if c.get("code") == "GCE_STOCKOUT"]
    return "; ".join(str(c.get("message", "")) for c in found)


class RayClusterTrigger(BaseTrigger):
    """Polls one RayCluster until it is ready (or deleted), fails, or the deadline passes; yields one event.

    :param cluster_path: the GKE cluster (``projects/P/locations/L/clusters/C``) whose API serves the RayCluster.
    :param namespace: the RayCluster's namespace.
    :param name: the RayCluster's name.
    :param wait_for: ``ready``, ``workers`` (ready, and every worker ready now) or ``deleted``.
    :param gcp_conn_id: the Airflow connection with the endpoints and credentials.
    :param poll_interval: seconds between polls.
    :param timeout: seconds from ``started_at`` until a ``timeout`` event.
    :param started_at: epoch seconds the wait began (serialized, so a triggerer restart keeps the deadline).
    :param node_pool_path: the GPU pool's container API path (``/v1/projects/...``): a stock-out on it ends the wait.
    """

    def __init__(
        self,
        cluster_path: str,
        namespace: str,
        name: str,
        *,
        wait_for: str = "ready",
        gcp_conn_id: str = "google_cloud_default",
        poll_interval: float = 15.0,
        timeout: float = 1800.0,
        started_at: float | None = None,
        node_pool_path: str | None = None,
    ) -> None:
        super().__init__()
        if wait_for not in WAIT_MODES:
            raise ValueError(f"wait_for must be one of {WAIT_MODES}, got {wait_for!r}")
        self.cluster_path = cluster_path
        self.namespace = namespace
        self.name = name
        self.wait_for = wait_for
        self.gcp_conn_id = gcp_conn_id
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.started_at = float(started_at) if started_at is not None else time.time()
        self.node_pool_path = node_pool_path
        # Watches until the API server refuses one (not serialized: a resumed trigger tries again).
        self._watching = True

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Classpath and the kwargs ``__init__`` takes."""
        return (
            CLASSPATH,
            {
                "cluster_path": self.cluster_path,
                "namespace": self.namespace,
                "name": self.name,
                "wait_for": self.wait_for,
                "gcp_conn_id": self.gcp_conn_id,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
                "started_at": self.started_at,
                "node_pool_path": self.node_pool_path,
            },
        )

    def _event(self, status: str, message: str) -> TriggerEvent:
        return TriggerEvent({"status": status, "message": message, "raycluster": self.name, "wait_for": self.wait_for})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until done or the deadline, then yield one event; every exception becomes an ``error`` event."""
        try:
            event = await self._wait()
        except Exception as exc:
            self.log.exception("Unexpected error while waiting for RayCluster %s", self.name)
            event = self._event(
                ERROR, f"unexpected error waiting for RayCluster {self.name}: {type(exc).__name__}: {exc}"
            )
        yield event

    async def _wait(self) -> TriggerEvent:
        path = raycluster_path(self.namespace, self.name)
        failures, last_error = 0, ""
        clients = await client_module(KUBE)
        async with contextlib.AsyncExitStack() as stack:
            kube = await stack.enter_async_context(clients.AsyncKubeHook(self.gcp_conn_id, self.cluster_path))
            gcp = None
            if self.node_pool_path:
                gcp = await stack.enter_async_context((await client_module(GCP)).GcpAsyncHook(self.gcp_conn_id))
            while True:
                # A capacity wait can last days: it polls the cluster and the node pool less as it goes on.
                delay = long_wait_delay(self.poll_interval, time.time() - self.started_at)
                try:
                    obj = await kube.get(path)
                    # Without conditions (KubeRay 1.2, no feature gate) the pods say whether it is ready.
                    waits_ready = self.wait_for in ("ready", "workers")
                    fallback = waits_ready and obj is not None and not reports_conditions(obj)
                    pods = await self._pods(kube) if fallback else []
                except ClusterUnreachableError as exc:
                    if self.wait_for == "deleted":
                        return self._event(SUCCESS, f"RayCluster {self.name} is gone with its cluster ({exc})")
                    return self._event(ERROR, f"cannot reach the cluster of RayCluster {self.name}: {exc}")
                except KubeApiError as exc:
                    if not is_kube_transient(exc):
                        return self._event(ERROR, f"reading RayCluster {self.name} failed, not retried: {exc}")
                    failures, last_error = failures + 1, str(exc)
                    delay = backoff_delay(failures, self.poll_interval)
                    self.log.warning("Transient error %d reading RayCluster %s: %s", failures, self.name, exc)
                else:
                    failures, last_error = 0, ""
                    done = self._answer(obj, pods, fallback=fallback)
                    if done is not None:
                        return done
                    stockout = await self._stockout(gcp) if waits_ready else ""
                    if stockout:
                        return self._event(
                            STOCKOUT, f"the GPU node pool reports a stock-out (GCE_STOCKOUT: {stockout})"
                        )
                remaining = self.started_at + self.timeout - time.time()
                if remaining <= 0:
                    return self._event(TIMEOUT, await self._timeout_message(kube, last_error))
                pause = min(delay, remaining)
                if self._watching and not failures and not fallback and obj is not None:
                    # One watch instead of a poll per interval: it ends at the object's next change. The node pool
                    # has no watch, so a ladder's wait still looks at it every interval.
                    await self._until_changed(kube, obj, pause if gcp is not None else min(remaining, WATCH_S), pause)
                else:
                    await asyncio.sleep(pause)

    def _answer(self, obj: dict[str, Any] | None, pods: list[dict[str, Any]], *, fallback: bool) -> TriggerEvent | None:
        """The event one read of the RayCluster ends the wait with (None: keep waiting)."""
        if self.wait_for == "deleted":
            return self._event(SUCCESS, f"RayCluster {self.name} is deleted") if obj is None else None
        if obj is None:
            return self._event(ERROR, f"RayCluster {self.name} does not exist (deleted while waiting?)")
        if self.wait_for == "ready" and is_ready(obj):
            return self._event(SUCCESS, f"RayCluster {self.name} is ready (HeadPodReady, RayClusterProvisioned)")
        if self.wait_for == "workers" and is_ready(obj):
            ready, wanted = ready_workers(obj), desired_workers(obj)
            if ready >= wanted:
                return self._event(SUCCESS, f"RayCluster {self.name} is ready with {ready} of {wanted} workers")
        if fallback and not pods_not_ready(obj, pods):
            return self._event(
                SUCCESS,
                f"RayCluster {self.name} is ready: its head and {len(pods) - 1} worker pods are Ready (KubeRay "
                "reports no conditions)",
            )
        return None

    async def _until_changed(self, kube: AsyncKubeHook, obj: dict[str, Any], span: float, pause: float) -> None:
        """Wait up to ``span`` seconds for the RayCluster to change after the version read (a watch from its
        resourceVersion). A watch the API server refuses makes this wait a ``pause`` and the next ones polls."""
        started = time.monotonic()
        query = {
            "fieldSelector": f"metadata.name={self.name}",
            "resourceVersion": str(obj.get("metadata", {}).get("resourceVersion") or "0"),
        }
        try:
            async for event in kube.watch(raycluster_path(self.namespace, self.name).rpartition("/")[0], query, span):
                if event.get("type") != "BOOKMARK":
                    return
        except KubeApiError as exc:
            if exc.status == 410:  # the version is too old to watch from: read the object again
                return
            self.log.warning("Watching RayCluster %s failed (%s); polling it instead", self.name, exc)
            self._watching = False
            await asyncio.sleep(max(0.0, pause - (time.monotonic() - started)))

    async def _stockout(self, gcp: Any) -> str:
        """The GPU pool's stock-out, if it reports one ("" : none, no pool to read, or the pool could not be read:
        the RayCluster's own wait goes on)."""
        if gcp is None:
            return ""
        try:
            return stockout_message(await gcp.get_json("container", str(self.node_pool_path)))
        except Exception as exc:
            self.log.warning("Could not read node pool %s: %s", self.node_pool_path, exc)
            return ""

    async def _pods(self, kube: AsyncKubeHook) -> list[dict[str, Any]]:
        found = await kube.get(pods_path(self.namespace), {"labelSelector": f"{CLUSTER_LABEL}={self.name}"})
        return list((found or {}).get("items") or [])

    async def _timeout_message(self, kube: AsyncKubeHook, last_error: str) -> str:
        head = f"timed out after {self.timeout:.0f}s waiting for RayCluster {self.name} to be {self.wait_for}"
        if self.wait_for == "deleted":
            return head
        try:
            obj = await kube.get(raycluster_path(self.namespace, self.name))
            items = await self._pods(kube)
            events: list[dict[str, Any]] = []
            for pod in items:
                pod_name = pod.get("metadata", {}).get("name", "")
                found = await kube.get(
                    events_path(self.namespace), {"fieldSelector": f"involvedObject.name={pod_name}"}
                )
                events += list((found or {}).get("items") or [])
            detail = diagnose(self.name, obj, items, events)
        except KubeApiError as exc:
            detail = f"and the diagnosis failed: {exc}"
        if last_error:
            detail += f"; last poll error: {last_error}"
        return f"{head}: {detail}"
