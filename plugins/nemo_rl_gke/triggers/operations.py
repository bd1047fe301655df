"""The trigger that waits for one Google Cloud long-running operation without holding a worker slot.

It understands the four operation shapes (compute global/region, container, google.longrunning for Lustre and
Service Networking) through :func:`nemo_rl_gke.gcp.operations.operation_status`, polls with async HTTP only, and ends
with exactly one :class:`TriggerEvent`::

    {"status": "success" | "error" | "timeout", "message": str, "operation": <OperationRef dict>, "state": str}

``state`` is the operation's last state as read (``DONE`` once it finished, ``UNKNOWN`` if it was never read).
An ``error`` with state ``DONE`` means the operation itself failed; any other ``error`` came from polling it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from nemo_rl_gke.gcp.errors import PermanentApiError, TransientApiError
from nemo_rl_gke.gcp.operations import OperationRef, operation_status
from nemo_rl_gke.triggers.clients import GCP, client_module

CLASSPATH = "nemo_rl_gke.triggers.operations.OperationTrigger"
SUCCESS, ERROR, TIMEOUT = "success", "error", "timeout"
UNKNOWN_STATE = "UNKNOWN"
# Transient poll errors back off from min(1 s, poll interval), doubling, up to 4 poll intervals: a 429 storm across
# every deferred task of a run eases off instead of hammering the API, yet a blip costs at most a few seconds.
BACKOFF_INITIAL_S = 1.0
BACKOFF_FACTOR = 2.0
BACKOFF_CAP_POLLS = 4.0
# A long wait polls less and less: the interval doubles every LONG_WAIT_DOUBLING_S of waiting, up to LONG_WAIT_CAP_S.
# A Lustre create (minutes) polls as before; a wait of days (flex-start's queue, a week-long job) costs a few times
# what an hour's does, not a hundred times (docs/request-budget.md).
LONG_WAIT_DOUBLING_S = 1800.0
LONG_WAIT_CAP_S = 900.0


def backoff_delay(failures: int, poll_interval: float, rng: random.Random | None = None) -> float:
    """Seconds to wait after ``failures`` consecutive transient errors: exponential, capped, with equal jitter.

    Half the delay is fixed and half random, so concurrent triggers that failed together do not retry in lockstep.
    """
    cap = max(poll_interval * BACKOFF_CAP_POLLS, 0.0)
    delay = min(min(BACKOFF_INITIAL_S, poll_interval) * BACKOFF_FACTOR ** max(failures - 1, 0), cap)
    return delay / 2 + (rng or random).uniform(0, delay / 2)


def long_wait_delay(poll_interval: float, waited_s: float) -> float:
    """Seconds to the next poll of a wait that has lasted ``waited_s``: ``poll_interval`` at first, doubling every
    :data:`LONG_WAIT_DOUBLING_S`, never above :data:`LONG_WAIT_CAP_S` (nor below ``poll_interval``)."""
    if poll_interval >= LONG_WAIT_CAP_S:
        return poll_interval
    factor = 2.0 ** (max(0.0, waited_s) / LONG_WAIT_DOUBLING_S)
    return min(poll_interval * factor, LONG_WAIT_CAP_S)


class OperationTrigger(BaseTrigger):
    """Polls one long-running operation until it is done, fails, or the deadline passes; yields one event.

    :param operation: the :class:`~nemo_rl_gke.gcp.operations.OperationRef` as a dict (``to_dict()``).
    :param gcp_conn_id: Airflow connection with the endpoint overrides and credentials.
    :param poll_interval: seconds between polls of a running operation.
    :param timeout: seconds from ``started_at`` until the trigger gives up with a ``timeout`` event.
    :param started_at: epoch seconds the wait began. The operator sets it once; because it is serialized, a triggerer
        restart or a re-deferral keeps the original deadline instead of starting the clock again.
    """

    def __init__(
        self,
        operation: dict[str, Any],
        gcp_conn_id: str = "google_cloud_default",
        poll_interval: float = 15.0,
        timeout: float = 3600.0,
        started_at: float | None = None,
    ) -> None:
        super().__init__()
        self.operation = dict(operation)
        self.gcp_conn_id = gcp_conn_id
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.started_at = float(started_at) if started_at is not None else time.time()
        self._last_state = UNKNOWN_STATE

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Classpath and kwargs the triggerer re-creates this trigger from (the same kwargs ``__init__`` takes)."""
        return (
            CLASSPATH,
            {
                "operation": self.operation,
                "gcp_conn_id": self.gcp_conn_id,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
                "started_at": self.started_at,
            },
        )

    @property
    def deadline(self) -> float:
        """Epoch seconds after which the wait ends with a ``timeout`` event."""
        return self.started_at + self.timeout

    def _what(self) -> str:
        """The operation and the resource it changes, for messages (works on a malformed operation dict too)."""
        return f"operation {self.operation.get('path', '?')} on {self.operation.get('resource', '?')}"

    def _event(self, status: str, message: str) -> TriggerEvent:
        return TriggerEvent(
            {"status": status, "message": message, "operation": self.operation, "state": self._last_state}
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until the operation finishes or the deadline passes, then yield one event and return.

        Every exception is turned into an ``error`` event (DESIGN rule 3): a trigger that crashes leaves the task
        deferred with nothing but a stack trace in the triggerer log. Cancellation (``CancelledError``, a
        BaseException) still propagates, so the triggerer can stop the trigger.
        """
        try:
            event = await self._wait()
        except Exception as exc:
            self.log.exception("Unexpected error while waiting for %s", self._what())
            event = self._event(
                ERROR, f"unexpected error while waiting for {self._what()}: {type(exc).__name__}: {exc}"
            )
        yield event

    async def _wait(self) -> TriggerEvent:
        ref = OperationRef.from_dict(self.operation)
        failures = 0
        last_error = ""
        hooks = await client_module(GCP)
        async with hooks.GcpAsyncHook(self.gcp_conn_id) as hook:
            while True:
                try:
                    body = await hook.get_json(ref.service, ref.path)
                except TransientApiError as exc:
                    # Counted toward the deadline below: an API that stays down ends in a timeout that says so.
                    failures += 1
                    last_error = str(exc)
                    delay = backoff_delay(failures, self.poll_interval)
                    self.log.warning(
                        "Transient error %d polling %s (retry in %.1fs): %s", failures, ref.path, delay, exc
                    )
                except PermanentApiError as exc:
                    return self._event(ERROR, f"polling {self._what()} failed, not retried: {exc}")
                else:
                    failures, last_error = 0, ""
                    status = operation_status(ref.shape, body)
                    if status.state != self._last_state:
                        self.log.info("%s: %s", self._what(), status.state)
                    self._last_state = status.state
                    if status.failed:
                        return self._event(ERROR, f"{self._what()} failed: {status.error}")
                    if status.done:
                        return self._event(SUCCESS, f"{self._what()} finished")
                    delay = long_wait_delay(self.poll_interval, time.time() - self.started_at)
                remaining = self.deadline - time.time()
                if remaining <= 0:
                    message = (
                        f"timed out after {self.timeout:.0f}s waiting for {ref.resource}: operation {ref.path} "
                        f"last state {self._last_state}"
                    )
                    if last_error:
                        message += f"; last poll error: {last_error}"
                    return self._event(TIMEOUT, message)
                # The last sleep is cut to the deadline, so the final poll happens right at it.
                await asyncio.sleep(min(delay, remaining))
