"""Keep or delete at teardown: Lustre while any checkpoint on it is pending (no export has copied it, nobody released
it), what Lustre needs while it stays (the peering, its range and the main network), then the resource's own
ownership verdict.

One decision for every teardown (:func:`kept_for_storage`): the DAG's delete steps
(:class:`~nemo_rl_gke.operators.gcp.DeleteGcpResourceOperator`) and the sweeper (:mod:`nemo_rl_gke.sweeper`) both read
the Lustre instance and its records, ask here, and keep what it says; what it lets go, the delete action still
refuses when the resource is not the run group's (:func:`~nemo_rl_gke.gcp.resources.actions.delete_verdict`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.run import outcomes, topology

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.resources.base import Resource
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
    mounted: str = "",
) -> tuple[str, str] | None:
    """Whether the teardown of ``key`` must keep it for Lustre's sake: ``(action, reason)``, or None.

    Lustre with an unreleased pending record -> ``kept-for-checkpoint``; Lustre that a PV of a live cluster still
    names (``mounted``: why, '' when none does) -> ``kept-for-lustre``; a resource Lustre needs while Lustre still
    exists (``lustre_actual`` not None, whoever's it is) -> ``kept-for-lustre``.
    """
    if key == topology.LUSTRE:
        reason = checkpoint_at_risk(
            lustre, lustre_actual, records, run=run, accepts_own_loss=accepts_own_loss, release_run=release_run
        )
        if reason:
            return outcomes.KEPT_FOR_CHECKPOINT, reason
        return (outcomes.KEPT_FOR_LUSTRE, mounted) if mounted else None
    if key in topology.requires(topology.LUSTRE) and lustre_actual is not None:
        return outcomes.KEPT_FOR_LUSTRE, f"{lustre.label} still exists and needs it"
    return None


def sweep_verdict(
    key: str,
    resource: Resource,
    actual: dict[str, Any] | None,
    lustre: LustreInstance,
    lustre_actual: dict[str, Any] | None,
    *,
    run: str,
    records: Sequence[PendingCheckpoint] = (),
    mounted: str = "",
) -> tuple[str, str, bool]:
    """What the sweeper's teardown of ``key`` does now, as a run's teardown decides it: ``(action, reason, owned)``,
    action ``deleted`` when it goes. The sweeper takes on a group with no live run as its own (``used``); ownership is
    still checked."""
    if actual is None:
        return outcomes.ABSENT, "", False
    owned = resource.owned(actual)
    kept = kept_for_storage(key, lustre, lustre_actual, run=run, records=records, mounted=mounted)
    if kept:
        return kept[0], kept[1], owned
    verdict = delete_verdict(resource, actual, used=True)
    return verdict, unowned_reason(resource, actual) if verdict == outcomes.KEPT_UNOWNED else "", owned


def lustre_goes(lustre: LustreInstance, actual: dict[str, Any] | None, *, used: bool) -> bool:
    """Whether a run's teardown deletes the Lustre instance it read (``actual``): then its checkpoint records go
    with it."""
    return actual is not None and delete_verdict(lustre, actual, used=used) == outcomes.DELETED


def unowned_reason(resource: Resource, actual: Mapping[str, Any]) -> str:
    """Why a resource is not the group's to delete: whose it is, or that it carries no owner record of ours."""
    found = resource.recorded_owner(dict(actual))
    return f"it belongs to {found}" if found else f"no owner record of this package in its {resource.marker_where}"


def delete_verdict(resource: Resource, actual: dict[str, Any] | None, *, used: bool) -> str:
    """The delete action's own verdict on ``resource`` as read (:func:`nemo_rl_gke.gcp.resources.delete_verdict`)."""
    # lazy: gcp/'s resource modules import Airflow's hooks, which no decision loads at import
    from nemo_rl_gke.gcp.resources.actions import delete_verdict as verdict

    return verdict(resource, actual, used=used)
