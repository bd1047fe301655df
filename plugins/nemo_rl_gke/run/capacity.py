"""The GPU capacity ladder: which capacity options a run tries, in what order, for how long, and what each gave.

A run's ladder is its ``capacity_ladder`` (``OPTION`` or ``OPTION:SECONDS`` rungs, the first one its ``capacity``),
or ``capacity`` alone with ``kube_timeout_s``. ``kube.raycluster`` waits for the GPU workers on one rung at a time;
a rung whose nodes do not come in time, or whose pool reports a stock-out, has its node pool replaced by the next
rung's (:mod:`nemo_rl_gke.operators.capacity`). Each rung tried is one row of the ``capacity`` record in that step's
result, which the later steps (the job's budget, the report's prices) read the served capacity from.

Pure and stdlib-only: imported while Airflow parses DAG files.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run.conf_schema import FLEX_KINDS, FLEX_START, ON_DEMAND, QUEUED, RESERVATION_CAPACITY, SPOT

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec

# How a rung ended (a row's ``outcome``).
SERVED = "served"
STOCKOUT = "stock-out"
NO_NODES = "no-nodes-in-time"
FAILED = "failed"


@dataclass(frozen=True)
class Rung:
    """One option of the ladder and how long its GPU nodes may take to come."""

    capacity: str
    wait_s: float


def parse_rung(text: str, default_wait_s: float) -> Rung:
    """``OPTION`` or ``OPTION:SECONDS`` (the conf's pattern has already checked the form)."""
    option, _, seconds = text.partition(":")
    return Rung(option, float(seconds) if seconds else float(default_wait_s))


def ladder(spec: RunSpec) -> tuple[Rung, ...]:
    """The rungs the run tries, in order: ``capacity_ladder``, or ``capacity`` alone with ``kube_timeout_s``."""
    if not spec.capacity_ladder:
        return (Rung(spec.capacity, float(spec.kube_timeout_s)),)
    return tuple(parse_rung(text, spec.kube_timeout_s) for text in spec.capacity_ladder)


def options(spec: RunSpec) -> tuple[str, ...]:
    """Every capacity option the run may use, in ladder order."""
    return tuple(rung.capacity for rung in ladder(spec))


def may_use_flex_start(spec: RunSpec) -> bool:
    """Whether a rung is flex-start, queued or not: its pool needs a flex-start GKE version and takes a max run time."""
    return any(option in FLEX_KINDS for option in options(spec))


def on_rung(spec: RunSpec, capacity: str) -> RunSpec:
    """The spec as it is on the rung of ``capacity``: its node pool, prices and deadlines are that option's."""
    return spec if spec.capacity == capacity else dataclasses.replace(spec, capacity=capacity)


def pool_capacity(pool: dict[str, Any]) -> str:
    """The capacity option a node pool (the container API's JSON) was created with."""
    config = pool.get("config") or {}
    if (pool.get("queuedProvisioning") or {}).get("enabled"):
        return QUEUED
    if config.get("flexStart"):
        return FLEX_START
    if config.get("spot"):
        return SPOT
    affinity = (config.get("reservationAffinity") or {}).get("consumeReservationType")
    return RESERVATION_CAPACITY if affinity == "SPECIFIC_RESERVATION" else ON_DEMAND


def rung_index(spec: RunSpec, capacity: str) -> int | None:
    """Where ``capacity`` is on the run's ladder (None: not on it)."""
    found = options(spec)
    return found.index(capacity) if capacity in found else None


def longest_wait_s(spec: RunSpec) -> float:
    """The longest the whole ladder can take: every rung's wait, and a pool replaced between each two (each
    replacement's delete and create bounded by ``cluster_timeout_s``)."""
    rungs = ladder(spec)
    return sum(rung.wait_s for rung in rungs) + 2 * spec.cluster_timeout_s * (len(rungs) - 1)


def row(capacity: str, wait_s: float, *, started_at: str, ended_at: str, outcome: str, message: str) -> dict[str, Any]:
    """One rung tried, as the ``capacity`` record keeps it (times are ISO-8601 UTC)."""
    return {
        "capacity": capacity,
        "wait_s": wait_s,
        "started_at": started_at,
        "ended_at": ended_at,
        "outcome": outcome,
        "message": message,
    }


def served_row(result: Any) -> dict[str, Any] | None:
    """The row of the rung whose nodes served the run, from ``kube.raycluster``'s result (None: none, or no such
    result)."""
    rows = (result or {}).get("capacity") if isinstance(result, dict) else None
    for found in reversed(rows or []):
        if isinstance(found, dict) and found.get("outcome") == SERVED:
            return found
    return None


def served_capacity(result: Any) -> str | None:
    """The option whose nodes served the run, from ``kube.raycluster``'s result (None: none, or no such result)."""
    row = served_row(result)
    return None if row is None else str(row.get("capacity"))
