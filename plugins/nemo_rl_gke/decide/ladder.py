"""The capacity ladder's walk: which rung a run is on, and what follows when a rung's wait for GPU nodes ends.

``kube.raycluster`` waits for the RayCluster's GPU workers one rung at a time (``operators/capacity.py``). When a wait
ends, the operator reads how (served, a stock-out the pool reported, no nodes within the rung's seconds, another
failure), asks :func:`after_rung`, and acts: return the served rung, replace the pool with the next rung's, or fail
naming every rung tried. The rungs themselves (what the conf gives, a pool's option, the served rung of a result) are
:mod:`nemo_rl_gke.run.capacity`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from nemo_rl_gke.run import capacity
from nemo_rl_gke.run.capacity import Rung


class Move(Enum):
    """What the ladder does after a rung's wait."""

    SERVED = "served"  # the rung's nodes came: the run goes on there
    NEXT = "next rung"  # replace the pool with the next rung's and wait again
    FAIL = "fail"  # no rung left, or a failure a next rung would not cure


@dataclass(frozen=True)
class RungEnd:
    """The answer to a rung's end: the move, the rung to go to (:attr:`Move.NEXT`), and the rows of every rung tried,
    this one last."""

    move: Move
    rows: tuple[dict[str, Any], ...]
    next_rung: int | None = None

    def tried(self) -> str:
        """Every rung tried and how it ended, for a failure's message."""
        return "; ".join(f"{r['capacity']}: {r['outcome']}" for r in self.rows)


def after_rung(
    rungs: Sequence[Rung], index: int, ended: Mapping[str, Any], before: Sequence[dict[str, Any]]
) -> RungEnd:
    """What follows rung ``index``'s wait, given its row (:func:`~nemo_rl_gke.run.capacity.row`, whose ``outcome``
    says how it ended) and the rows of the rungs tried before it.

    Served: go on. A stock-out or no nodes in time, with a rung left: the next one. Anything else (a pod that cannot
    start, image pulls, an API error) fails at once: the next rung's nodes would meet the same problem.
    """
    rows = (*before, dict(ended))
    outcome = ended.get("outcome")
    if outcome == capacity.SERVED:
        return RungEnd(Move.SERVED, rows)
    if outcome in (capacity.STOCKOUT, capacity.NO_NODES) and index + 1 < len(rungs):
        return RungEnd(Move.NEXT, rows, index + 1)
    return RungEnd(Move.FAIL, rows)


def current_rung(spec_options: Sequence[str], pool: Mapping[str, Any] | None) -> int:
    """The rung whose pool exists now (a retried try goes on where the last one was): 0 when there is no pool, or
    its option is not on the ladder."""
    if pool is None:
        return 0
    found = capacity.pool_capacity(dict(pool))
    return spec_options.index(found) if found in spec_options else 0


def kept_rung(spec_options: Sequence[str], first: str, pool: Mapping[str, Any] | None) -> str | None:
    """The rung an existing pool is on when it is not the first (a cluster kept warm after a run that fell down the
    ladder keeps that rung's pool: it is the run's, not drift); None otherwise."""
    if pool is None:
        return None
    found = capacity.pool_capacity(dict(pool))
    return found if found != first and found in spec_options else None


def replaced_pool_blocks(delete_status: str, old_pool: Mapping[str, Any] | None) -> bool:
    """Whether the old rung's pool stops the ladder: its delete did not succeed and the pool is still there (a
    failed delete of a pool that is gone anyway blocks nothing)."""
    return delete_status != "success" and old_pool is not None
