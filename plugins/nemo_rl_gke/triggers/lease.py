"""The trigger that waits, without a worker slot, for another run to let go of a run group's lease, and (with a
GPU bound) for the deployment's other live runs in the project to leave room for this run's GPU nodes.

It reads the project's metadata with async HTTP only and ends with exactly one event::

    {"status": "success" | "timeout" | "error", "message": str, "holder": str}

``success`` means the lease is free or expired now and the GPU nodes fit; the operator then takes it (and waits
again if another run was quicker). Reading is all it does: taking the lease needs the fingerprinted write, which
the operator makes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from nemo_rl_gke.gcp.errors import PermanentApiError, TransientApiError
from nemo_rl_gke.run.ownership import Lease, lease_key, leases_in, live_gpu_leases
from nemo_rl_gke.triggers.clients import GCP, client_module
from nemo_rl_gke.triggers.operations import ERROR, SUCCESS, TIMEOUT, backoff_delay

CLASSPATH = "nemo_rl_gke.triggers.lease.LeaseTrigger"


class LeaseTrigger(BaseTrigger):
    """Polls a run group's lease until nobody holds it (and the GPU nodes fit), or the deadline passes; yields one
    event.

    :param project: the project whose metadata holds the lease.
    :param group: the run group.
    :param gcp_conn_id: the Airflow connection with the endpoints and credentials.
    :param poll_interval: seconds between reads.
    :param timeout: seconds from ``started_at`` until a ``timeout`` event.
    :param started_at: epoch seconds the wait began (serialized, so a triggerer restart keeps the deadline).
    :param deployment: the waiting run's deployment, whose other live leases count against the GPU bound.
    :param gpu_nodes: the waiting run's GPU nodes.
    :param max_gpu_nodes_total: the deployment's bound on its live runs' GPU nodes in the project (0: none).
    """

    def __init__(
        self,
        project: str,
        group: str,
        *,
        gcp_conn_id: str = "google_cloud_default",
        poll_interval: float = 15.0,
        timeout: float = 3600.0,
        started_at: float | None = None,
        deployment: str = "",
        gpu_nodes: int = 0,
        max_gpu_nodes_total: int = 0,
    ) -> None:
        super().__init__()
        self.project = project
        self.group = group
        self.gcp_conn_id = gcp_conn_id
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.started_at = float(started_at) if started_at is not None else time.time()
        self.deployment = deployment
        self.gpu_nodes = int(gpu_nodes)
        self.max_gpu_nodes_total = int(max_gpu_nodes_total)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Classpath and the kwargs ``__init__`` takes."""
        return (
            CLASSPATH,
            {
                "project": self.project,
                "group": self.group,
                "gcp_conn_id": self.gcp_conn_id,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
                "started_at": self.started_at,
                "deployment": self.deployment,
                "gpu_nodes": self.gpu_nodes,
                "max_gpu_nodes_total": self.max_gpu_nodes_total,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Read the lease until it is free; every exception becomes an ``error`` event."""
        try:
            event = await self._wait()
        except Exception as exc:
            self.log.exception("Unexpected error while waiting for the lease of group %s", self.group)
            event = {"status": ERROR, "message": f"waiting for the lease failed: {type(exc).__name__}: {exc}"}
        yield TriggerEvent({"holder": "", **event})

    async def _wait(self) -> dict[str, Any]:
        failures, holder, used = 0, "", None
        hooks = await client_module(GCP)
        async with hooks.GcpAsyncHook(self.gcp_conn_id) as hook:
            while True:
                delay = self.poll_interval
                try:
                    body = await hook.get_json("compute", f"/compute/v1/projects/{self.project}")
                except TransientApiError as exc:
                    failures += 1
                    delay = backoff_delay(failures, self.poll_interval)
                    self.log.warning("Transient error %d reading the lease of %s: %s", failures, self.group, exc)
                except PermanentApiError as exc:
                    return {"status": ERROR, "message": f"reading the lease of group {self.group} failed: {exc}"}
                else:
                    failures = 0
                    items = (body.get("commonInstanceMetadata") or {}).get("items") or []
                    found = {
                        i["key"]: i.get("value") for i in items if isinstance(i, dict) and isinstance(i.get("key"), str)
                    }
                    now = time.time()
                    lease = Lease.from_value(found.get(lease_key(self.group)))
                    if lease is not None and lease.held_at(now):
                        used = None
                        if lease.run != holder:
                            holder = lease.run
                            self.log.info("Group %s is held by run %s of %s", self.group, lease.run, lease.deployment)
                    else:
                        used = self._gpu_nodes_used(found, now)
                        if used is None:
                            return {"status": SUCCESS, "message": f"the lease of group {self.group} is free"}
                        holder = ""
                remaining = self.started_at + self.timeout - time.time()
                if remaining <= 0:
                    return {"status": TIMEOUT, "message": self._still(holder, used), "holder": holder}
                await asyncio.sleep(min(delay, remaining))

    def _gpu_nodes_used(self, items: dict[str, Any], now: float) -> int | None:
        """None when this run's GPU nodes fit beside the deployment's other live runs, else the nodes they hold."""
        if not self.max_gpu_nodes_total:
            return None
        others = live_gpu_leases(leases_in(items), self.deployment, self.group, now)
        used = sum(lease.gpu_nodes for lease in others)
        return None if self.gpu_nodes + used <= self.max_gpu_nodes_total else used

    def _still(self, holder: str, used: int | None) -> str:
        if used is not None:
            return (
                f"after {self.timeout:.0f}s, this deployment's other live runs in the project still held {used} GPU "
                f"nodes, leaving no room for this run's {self.gpu_nodes} under its max_gpu_nodes_total of "
                f"{self.max_gpu_nodes_total}"
            )
        return f"group {self.group} was still held by run {holder} after {self.timeout:.0f}s"
