"""The trigger that waits, without a worker slot, for another run to let go of a run group's lease.

It reads the project's metadata with async HTTP only and ends with exactly one event::

    {"status": "success" | "timeout" | "error", "message": str, "holder": str}

``success`` means the lease is free or expired now; the operator then takes it (and waits again if another run was
quicker). Reading is all it does: taking the lease needs the fingerprinted write, which the operator makes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from nemo_rl_gke.gcp.async_hooks import GcpAsyncHook, PermanentApiError, TransientApiError
from nemo_rl_gke.ownership import Lease, lease_key
from nemo_rl_gke.triggers.operations import ERROR, SUCCESS, TIMEOUT, backoff_delay

CLASSPATH = "nemo_rl_gke.triggers.lease.LeaseTrigger"


class LeaseTrigger(BaseTrigger):
    """Polls a run group's lease until nobody holds it, or the deadline passes; yields one event.

    :param project: the project whose metadata holds the lease.
    :param group: the run group.
    :param gcp_conn_id: the Airflow connection with the endpoints and credentials.
    :param poll_interval: seconds between reads.
    :param timeout: seconds from ``started_at`` until a ``timeout`` event.
    :param started_at: epoch seconds the wait began (serialized, so a triggerer restart keeps the deadline).
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
    ) -> None:
        super().__init__()
        self.project = project
        self.group = group
        self.gcp_conn_id = gcp_conn_id
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.started_at = float(started_at) if started_at is not None else time.time()

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
        failures, holder = 0, ""
        async with GcpAsyncHook(self.gcp_conn_id) as hook:
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
                    value = next((i.get("value") for i in items if i.get("key") == lease_key(self.group)), None)
                    lease = Lease.from_value(value)
                    if lease is None or not lease.held_at(time.time()):
                        return {"status": SUCCESS, "message": f"the lease of group {self.group} is free"}
                    if lease.run != holder:
                        holder = lease.run
                        self.log.info("Group %s is held by run %s of %s", self.group, lease.run, lease.deployment)
                remaining = self.started_at + self.timeout - time.time()
                if remaining <= 0:
                    return {
                        "status": TIMEOUT,
                        "message": f"group {self.group} was still held by run {holder} after {self.timeout:.0f}s",
                        "holder": holder,
                    }
                await asyncio.sleep(min(delay, remaining))
