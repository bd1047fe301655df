"""Long-running operations: the latency model and the operation record every service renders in its own format.

An operation is scheduled when it starts (``start`` + ``duration``) and finishes by the wall clock: nothing runs in
the background. The store settles every operation whose time has come at the start of each request
(:meth:`sandbox.store.Store.settle`), which applies its effect (resources become ready, or go away) in end-time
order. ``duration`` is the latency table's seconds for the operation's kind times the global scale; 0 is instant.
A fault can make an operation end in error (``outcome="error"``) or never end (``outcome="hang"``).
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandbox.errors import ApiError

# Seconds per operation kind: roughly what the real APIs take for the tutorial's resources.
DEFAULT_LATENCY_SECONDS: dict[str, float] = {
    "compute.networks.insert": 20.0,
    "compute.networks.delete": 20.0,
    "compute.subnetworks.insert": 10.0,
    "compute.subnetworks.delete": 10.0,
    "compute.firewalls.insert": 5.0,
    "compute.firewalls.delete": 5.0,
    "compute.globalAddresses.insert": 5.0,
    "compute.globalAddresses.delete": 5.0,
    "servicenetworking.connections.create": 60.0,
    "servicenetworking.connections.deleteConnection": 40.0,
    # Not an operation: how long Service Networking still counts a deleted Lustre instance as a producer on the
    # connection, so deleteConnection keeps failing with code 9 (FACTS §13, terraform-provider-google #18834).
    "servicenetworking.producers.linger": 5.0,
    "compute.networks.removePeering": 10.0,
    "lustre.instances.create": 600.0,
    "lustre.instances.delete": 300.0,
    "lustre.instances.exportData": 120.0,
    "lustre.instances.importData": 120.0,
    "container.clusters.create": 420.0,
    "container.clusters.delete": 300.0,
    "container.nodePools.create": 300.0,
    "container.nodePools.delete": 240.0,
    "container.nodePools.setSize": 60.0,
}
# An operation reads PENDING for this share of its duration before it reads RUNNING.
PENDING_SHARE = 0.1
OUTCOMES = ("ok", "error", "hang")


class LatencyModel:
    """Seconds per operation kind (:data:`DEFAULT_LATENCY_SECONDS`, overridable), times a global scale."""

    def __init__(self, scale: float = 1.0, seconds: Mapping[str, float] | None = None) -> None:
        if scale < 0 or not math.isfinite(scale):
            raise ValueError(f"latency scale must be a finite number >= 0, got {scale}")
        self.scale = scale
        self.base: dict[str, float] = dict(DEFAULT_LATENCY_SECONDS)
        for kind, value in (seconds or {}).items():
            if value < 0:
                raise ValueError(f"latency of {kind} must be >= 0, got {value}")
            self.base[kind] = float(value)

    def seconds(self, kind: str) -> float:
        """How long an operation of ``kind`` takes, scaled (unknown kinds are instant)."""
        return self.base.get(kind, 0.0) * self.scale

    def to_json(self) -> dict[str, Any]:
        """The model as the admin API shows it: scale, unscaled seconds and scaled seconds."""
        return {
            "scale": self.scale,
            "seconds": dict(self.base),
            "scaled_seconds": {kind: self.seconds(kind) for kind in self.base},
        }


def new_operation_id(at: float) -> str:
    """A name unique across every service: container and lustre share the operations path shape on one port."""
    return f"operation-{int(at * 1000)}-{secrets.token_hex(6)}"


@dataclass
class Effect:
    """What an operation does to the store when it finishes.

    ``ready`` resources leave their creating phase (or, on error, go away or turn ERROR); ``remove`` resources go
    away with their children (or, on error, go back to ready); ``copy`` copies a local directory tree (``[src,
    dst]``) and fails the operation with NOT_FOUND when the source is missing.
    """

    ready: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    copy: list[str] | None = None


@dataclass
class Operation:
    """One long-running operation, in a service-neutral form that each API module renders its own way."""

    id: str
    service: str
    kind: str
    verb: str
    project: str
    location: str
    target: str
    start: float
    duration: float
    outcome: str = "ok"
    error: dict[str, Any] | None = None
    effect: Effect = field(default_factory=Effect)
    request_id: str | None = None
    finished: float | None = None
    snapshot: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> float | None:
        """When the operation is due to finish; ``None`` for an operation that hangs."""
        return None if self.outcome == "hang" else self.start + self.duration

    @property
    def done(self) -> bool:
        """Whether the store has settled the operation (its effect is applied)."""
        return self.finished is not None

    def status(self, at: float) -> str:
        """``PENDING``, ``RUNNING`` or ``DONE`` (compute's and container's status names)."""
        if self.done:
            return "DONE"
        return "PENDING" if at - self.start < PENDING_SHARE * self.duration else "RUNNING"

    def progress(self, at: float) -> int:
        """Percent complete by the clock (a hanging operation stops short of 100)."""
        if self.done:
            return 100
        if self.duration <= 0:
            return 99
        return max(0, min(99, int(100 * (at - self.start) / self.duration)))

    def api_error(self) -> ApiError | None:
        """The error the operation ended with, if it ended in error."""
        return ApiError.from_record(self.error) if self.done and self.error else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe record for the state file."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Operation:
        """The inverse of :meth:`to_json`."""
        record = dict(record)
        record["effect"] = Effect(**record.get("effect", {}))
        return cls(**record)
