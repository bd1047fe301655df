"""Why a teardown keeps a resource of its group that it could delete: Lustre while it holds a checkpoint no export
has copied, and what Lustre needs while it stays (the peering, its range and the main network).

One decision for every teardown: the DAG's delete steps (:class:`~nemo_rl_gke.operators.gcp.DeleteGcpResourceOperator`)
and the sweeper (:mod:`nemo_rl_gke.sweeper`) both ask here. Pure: the caller reads the Lustre instance (or knows it is
gone, or will be) and passes what it read.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from nemo_rl_gke import outcomes, topology

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.resources.lustre import LustreInstance

log = logging.getLogger(__name__)


def storage_keys() -> frozenset[str]:
    """The resources whose deletion depends on Lustre's state: Lustre itself and every resource it needs."""
    return topology.requires(topology.LUSTRE) | {topology.LUSTRE}


def checkpoint_at_risk(
    lustre: LustreInstance, actual: dict[str, Any] | None, *, run: str, accepts_own_loss: bool, release_run: str
) -> str:
    """Why deleting Lustre now would lose the only copy of a checkpoint ('' when it would not, DESIGN rule 4).

    ``actual`` is the instance as read now (None: it is gone). ``run`` is who would delete it; a mark is released only
    by that run accepting the loss of its own checkpoint, or by naming the marking run (``release_run``).
    """
    pending = lustre.pending_checkpoint(actual) if actual is not None else None
    if pending is None:
        return ""
    if pending.releasable_by(run, accepts_own_loss=accepts_own_loss, release_run=release_run):
        log.warning("Deleting %s with the unexported checkpoint of run %s: released", lustre.label, pending.run)
        return ""
    where = pending.path or lustre.spec.checkpoint_dir
    return (
        f"it holds the only copy of a checkpoint (run {pending.run}, step {pending.step}, {where}) that no "
        f"export has copied. Export it (gcloud lustre instances export-data), or let teardown delete it: "
        f"release_checkpoint_of_run={pending.run!r} in a later run's conf"
    )


def kept_for_storage(
    key: str,
    lustre: LustreInstance,
    lustre_actual: dict[str, Any] | None,
    *,
    run: str,
    accepts_own_loss: bool = False,
    release_run: str = "",
) -> tuple[str, str] | None:
    """Whether the teardown of ``key`` must keep it for Lustre's sake: ``(action, reason)``, or None.

    Lustre with an unreleased checkpoint mark -> ``kept-for-checkpoint``; a resource Lustre needs while Lustre still
    exists (``lustre_actual`` not None, whoever's it is) -> ``kept-for-lustre``.
    """
    if key == topology.LUSTRE:
        reason = checkpoint_at_risk(
            lustre, lustre_actual, run=run, accepts_own_loss=accepts_own_loss, release_run=release_run
        )
        return (outcomes.KEPT_FOR_CHECKPOINT, reason) if reason else None
    if key in topology.requires(topology.LUSTRE) and lustre_actual is not None:
        return outcomes.KEPT_FOR_LUSTRE, f"{lustre.label} still exists and needs it"
    return None
