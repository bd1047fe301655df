"""Why a teardown keeps a resource of its group that it could delete: Lustre while any checkpoint on it is pending
(no export has copied it, nobody released it), and what Lustre needs while it stays (the peering, its range and the
main network).

One decision for every teardown: the DAG's delete steps (:class:`~nemo_rl_gke.operators.gcp.DeleteGcpResourceOperator`)
and the sweeper (:mod:`nemo_rl_gke.sweeper`) both ask here. Pure: the caller reads the Lustre instance (or knows it is
gone, or will be) and passes what it read.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run import outcomes, topology

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.resources.lustre import LustreInstance
    from nemo_rl_gke.run.ownership import PendingCheckpoint

log = logging.getLogger(__name__)


def storage_keys() -> frozenset[str]:
    """The resources whose deletion depends on Lustre's state: Lustre itself and every resource it needs."""
    return topology.requires(topology.LUSTRE) | {topology.LUSTRE}


def checkpoint_at_risk(
    lustre: LustreInstance,
    actual: dict[str, Any] | None,
    records: Sequence[PendingCheckpoint],
    *,
    run: str,
    accepts_own_loss: bool,
    release_run: str,
) -> str:
    """Why deleting Lustre now would lose the only copy of a checkpoint ('' when it would not, DESIGN rule 4).

    ``actual`` is the instance as read now (None: it is gone); ``records`` are its checkpoint records
    (:meth:`LustreInstance.records`). ``run`` is who would delete it; a pending record is released only by that run
    accepting the loss of its own checkpoint, or by naming the record's run (``release_run``). Every pending record
    that is not released keeps the instance, whoever's run it is.
    """
    if actual is None:
        return ""
    pending = [r for r in records if r.pending]
    held = [r for r in pending if not r.releasable_by(run, accepts_own_loss=accepts_own_loss, release_run=release_run)]
    for released in (r for r in pending if r not in held):
        log.warning("Deleting %s with the unexported checkpoint of run %s (%s): released", lustre.label,
                    released.run, released.where)  # fmt: skip
    if not held:
        return ""
    what = "; ".join(f"run {r.run}, step {r.step}, {r.where}" if not r.dirs else f"listed by run {r.run}: {r.where}"
                     for r in held)  # fmt: skip
    releases = ", ".join(f"release_checkpoint_of_run={r.run!r}" for r in dict.fromkeys(held))
    return (
        f"it holds the only copy of {len(held)} checkpoint(s) that no export has copied ({what}). Export them "
        f"(gcloud lustre instances export-data), or let a later run's teardown delete them, one conf per run: "
        f"{releases}"
    )


def kept_for_storage(
    key: str,
    lustre: LustreInstance,
    lustre_actual: dict[str, Any] | None,
    *,
    run: str,
    records: Sequence[PendingCheckpoint] = (),
    accepts_own_loss: bool = False,
    release_run: str = "",
) -> tuple[str, str] | None:
    """Whether the teardown of ``key`` must keep it for Lustre's sake: ``(action, reason)``, or None.

    Lustre with an unreleased pending record -> ``kept-for-checkpoint``; a resource Lustre needs while Lustre still
    exists (``lustre_actual`` not None, whoever's it is) -> ``kept-for-lustre``.
    """
    if key == topology.LUSTRE:
        reason = checkpoint_at_risk(
            lustre, lustre_actual, records, run=run, accepts_own_loss=accepts_own_loss, release_run=release_run
        )
        return (outcomes.KEPT_FOR_CHECKPOINT, reason) if reason else None
    if key in topology.requires(topology.LUSTRE) and lustre_actual is not None:
        return outcomes.KEPT_FOR_LUSTRE, f"{lustre.label} still exists and needs it"
    return None
