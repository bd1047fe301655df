"""The sweeper: deletes what no run will tear down any more, from the lease records of this deployment's run groups.

A run's own teardown deletes its group's resources. Two things outlive it: a run killed mid-way (its teardown never
ran; its lease stays ``held`` until it expires) and a warm group (a run kept its cluster and storage; the lease is
``free`` and ``warm`` since it was released). The lease record names the group's resources (``Lease.names``), so the
sweeper rebuilds them from there. A group is swept when its lease is this deployment's and:

- held but expired, and the run that held it is no longer queued or running (its state unknown: left alone);
- free and warm, idle longer than its warm TTL (hours), or left warm by an earlier sweep that had to keep something;
- free with nothing kept, once its run has ended: a teardown that failed may have left something, and the record is
  tidied away when nothing is left.

For each swept group it takes the group's lease as its own run (the fingerprint lock makes it and a run starting on
the group exclusive: whoever is first), then deletes in the topology's teardown order, a wave at a time: a deletion
starts once every deletion it needs has finished. It decides what goes exactly as a run's teardown does
(:func:`~nemo_rl_gke.gcp.resources.delete_verdict`, :func:`~nemo_rl_gke.decide.teardown.kept_for_storage`): never
another deployment's or group's resource, or a foreign one, and never Lustre while it holds a checkpoint no export has
copied (:mod:`nemo_rl_gke.gcp.pending`: any run's pending record keeps it), nor what Lustre needs. The Kubernetes
objects and the node pool go with the cluster, so Lustre waits for the cluster instead of for them; when the cluster
stays (adopted, or kept), the group's own Kubernetes objects in it are deleted before Lustre is decided, and Lustre is
kept while a PV there still names it (someone else's, or one that would not go). When nothing of the group is left,
the lease record is removed; otherwise it is released, warm, and the next sweep tries again. A dry run reads and
reports, and writes nothing (not even the lease).

This module reads and acts; what it decides is asked of the decisions layer: which groups, in which waves, and what
becomes of the lease record (:mod:`nemo_rl_gke.decide.sweep`), and keep or delete for each resource
(:mod:`nemo_rl_gke.decide.teardown`).

The caller waits on the operations each pass returns (the operator defers on them) and calls :meth:`Sweep.advance`
again. The sweep's state is plain data (:meth:`Sweep.to_dict`) so it survives a deferral. No Airflow import here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.decide.sweep import (
    DELETING,
    FAILED,
    MAX_PASSES,
    NOT_REACHED,
    GroupSweep,
    ResourceSweep,
    RunState,
    blocked_by,
    deletions,
    group_spec,
    judge,
    lease_goes,
    settled_as,
    startable,
    unreached,
)
from nemo_rl_gke.decide.teardown import storage_keys, sweep_verdict, unowned_reason
from nemo_rl_gke.observe.sweep_report import GroupReport, Kept, SweepReport
from nemo_rl_gke.run import outcomes, topology
from nemo_rl_gke.run.ownership import Lease, Owner, PendingCheckpoint, owner_from_labels
from nemo_rl_gke.run.spec import RunSpec

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.gcp.operations import OperationRef
    from nemo_rl_gke.gcp.resources import Resource
    from nemo_rl_gke.gcp.resources.lustre import LustreInstance

log = logging.getLogger(__name__)


class SweepError(RuntimeError):
    """The sweep cannot go on (a bug, or a state that no longer fits the code)."""


@dataclass
class Sweep:
    """One sweep of one project: every lease record judged, and the swept groups' resources, pass by pass.

    Build it with :meth:`start`; call :meth:`advance` until it returns no operation, waiting on the ones it returns in
    between; then :meth:`report`.
    """

    project: str
    deployment: str
    run: str
    dry_run: bool
    at: float
    groups: list[GroupSweep] = field(default_factory=list)
    passes: int = 0
    waits: dict[str, str] = field(default_factory=dict)  # operation path -> how its wait ended, when not well

    # --- start: read, judge, survey ------------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        hook: GcpHook,
        *,
        project: str,
        deployment: str,
        run: str,
        now: float,
        run_state: RunState,
        warm_ttl_hours: float,
        ttl_hours: Mapping[str, float] | None = None,
        dry_run: bool = False,
    ) -> Sweep:
        """Read every lease record of ``project``, judge each, and look at the resources of those to sweep.

        ``run`` is the sweeper's own ``dag_id/run_id``; ``ttl_hours`` may give a group its own warm TTL. A dry run is
        complete when this returns: it has decided what it would delete and keep, and written nothing.
        """
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.lease import leases

        sweep = cls(project, deployment, run, dry_run, now)
        for lease in sorted(leases(hook, project), key=lambda found: found.group):
            ttl = (ttl_hours or {}).get(lease.group, warm_ttl_hours)
            take, why = judge(lease, deployment=deployment, now=now, ttl_hours=ttl, run_state=run_state, me=run)
            group = GroupSweep(lease.group, why, dict(lease.names), record=lease.to_value())
            sweep.groups.append(group)
            if not take:
                group.skipped = why
                continue
            spec, problem = group_spec(lease)
            if spec is None:
                group.skipped = problem
                log.warning("Group %s is not swept: %s", lease.group, problem)
                continue
            try:
                sweep._survey(hook, group, spec)
            except Exception as exc:  # one group's unreadable resource must not stop the others
                group.skipped = f"its resources could not be read: {exc}"
                log.warning("Group %s is not swept: %s", lease.group, exc)
        return sweep

    def owner(self, group: str) -> Owner:
        """The sweeper's identity on a group: it judges ownership and takes the lease as this."""
        return Owner(self.deployment, group, self.run)

    def _resources(self, group: GroupSweep) -> dict[str, Resource]:
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.resources import resources

        return resources(RunSpec.from_conf(group.names), self.owner(group.group))

    def _survey(self, hook: GcpHook, group: GroupSweep, spec: RunSpec) -> None:
        """Read every resource of the group; for a dry run, decide all of it as if each wave went through."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.resources import resources

        found = resources(spec, self.owner(group.group))
        actual = {s.deletes[0]: found[s.deletes[0]].get(hook) for s in deletions()}
        group.found = [found[key].label for key, value in actual.items() if value is not None]
        group.ours = [key for key, value in actual.items() if value is not None and found[key].owned(value)]
        if not self.dry_run:
            if not group.ours:
                self._forget_untouched(hook, group, found, actual)
            return
        for deletion in deletions():
            key = deletion.deletes[0]
            lustre = group.resources.get(topology.LUSTRE)
            # Lustre stands for what it needs unless this dry run would delete it (or found it gone).
            stays = key == topology.LUSTRE or (lustre is not None and lustre.action not in outcomes.GONE)
            records, mounted = [], ""
            if key == topology.LUSTRE and actual[key] is not None:
                records = found[key].records(hook, actual[key])  # type: ignore[attr-defined]
                # The cluster is decided after Lustre in the table: a PV matters only in a cluster that stays.
                cluster = self._decide(found, topology.GKE_CLUSTER, actual[topology.GKE_CLUSTER], None)[0]
                if cluster != outcomes.DELETED:
                    mounted = self._clear_cluster(hook, group, found, write=False)
            action, reason, owned = self._decide(
                found, key, actual[key], actual[topology.LUSTRE] if stays else None, records, mounted=mounted
            )
            group.resources[key] = ResourceSweep(key, found[key].label, action, reason, owned)
        group.done = True
        group.lease = "untouched (dry run)"

    def _forget_untouched(
        self, hook: GcpHook, group: GroupSweep, found: Mapping[str, Resource], actual: Mapping[str, Any]
    ) -> None:
        """Nothing of the group is left: remove its lease record without taking the lease (so no run starting on
        the group meets a held lease), unless somebody wrote the record since it was read."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.lease import forget

        for key, value in actual.items():
            if value is not None:  # someone else's resource under the group's name: reported, never touched
                group.resources[key] = ResourceSweep(
                    key, found[key].label, outcomes.KEPT_UNOWNED, unowned_reason(found[key], value)
                )
        removed = forget(hook, self.project, group.group, only_if=Lease.from_value(group.record))
        group.lease = "forgotten: nothing of the group was left" if removed else "changed since it was read: left"
        group.done = True

    # --- deciding -----------------------------------------------------------------------------------------------
    def _decide(
        self,
        found: Mapping[str, Resource],
        key: str,
        actual: dict[str, Any] | None,
        lustre: dict[str, Any] | None,
        records: Sequence[PendingCheckpoint] = (),
        *,
        mounted: str = "",
    ) -> tuple[str, str, bool]:
        """What the teardown of ``key`` does now, as a run's teardown decides it: (action, reason, owned); action
        ``deleted`` means it goes. ``lustre`` is the Lustre instance as it stands (None: gone, or going), ``records``
        its checkpoint records, ``mounted`` why a PV in the group's live cluster still names it ('' when none does)."""
        lustre_resource: LustreInstance = found[topology.LUSTRE]  # type: ignore[assignment]
        return sweep_verdict(
            key, found[key], actual, lustre_resource, lustre, run=self.run, records=records, mounted=mounted
        )

    # --- passes ---------------------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Whether every group is done or skipped."""
        return not any(group.active for group in self.groups)

    def advance(self, hook: GcpHook, *, now: float, lease_ttl_s: float) -> list[OperationRef]:
        """One pass over every group still at work: settle the deletions waited on, start the next wave, and finish
        a group once nothing more can go. Returns the operations to wait on before the next pass (none: done)."""
        if self.dry_run or self.finished:
            return []
        self.passes += 1
        if self.passes > MAX_PASSES:
            raise SweepError(f"the sweep did not settle in {MAX_PASSES} passes")
        waiting: list[OperationRef] = []
        for group in self.groups:
            if group.active:
                try:
                    waiting += self._advance_group(hook, group, now, lease_ttl_s)
                except Exception as exc:  # the lease could not be written: this group stops, the others go on
                    group.done = True
                    group.lease = f"could not be written ({exc}): it expires by itself and a later sweep retries"
                    log.warning("Group %s: %s", group.group, group.lease)
        return waiting

    def _advance_group(self, hook: GcpHook, group: GroupSweep, now: float, lease_ttl_s: float) -> list[OperationRef]:
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.lease import LeaseHeldError, LeaseLostError, acquire, renew
        from nemo_rl_gke.gcp.operations import OperationRef

        owner = self.owner(group.group)
        if not group.held:
            try:
                outcome, _ = acquire(hook, self.project, owner, lease_ttl_s, now=now)
            except LeaseHeldError as exc:
                group.skipped = f"a run took the group meanwhile ({exc})"
                return []
            group.held = True
            log.info("Group %s: lease %s by sweep %s", group.group, outcome, self.run)
        try:
            lease = renew(hook, self.project, owner, now + lease_ttl_s)
        except LeaseLostError as exc:
            group.done = True
            group.lease = f"lost ({exc}): nothing more deleted"
            lost = "the sweep lost the group's lease"
            self._not_reached(group, self._resources(group), lambda _deletion, _so_far: lost)
            return []
        found = self._resources(group)
        self._settle(hook, group, found)
        waiting = []
        # Until nothing more can start now: what settles at once (absent, kept) may let a deletion declared before it
        # start (Lustre waits for the cluster, which comes after it in the table).
        while keys := startable(group):
            for key in keys:
                result = self._delete(hook, group, found, key)
                group.resources[key] = result
                if result.operation is not None:
                    waiting.append(OperationRef.from_dict(result.operation))
        if not waiting and all(r.settled for r in group.resources.values()):
            self._finish(hook, group, found, lease)
        return waiting

    def _clear_cluster(
        self, hook: GcpHook, group: GroupSweep, found: Mapping[str, Resource], *, write: bool = True
    ) -> str:
        """Before Lustre goes while the group's cluster stays (adopted, or its deletion kept it): delete the group's
        Kubernetes objects in it, then say which PV there still names the instance ('' when none does, or the
        cluster is gone). A cluster that cannot be read keeps Lustre: nobody can tell what mounts it. A dry run
        (``write=False``) deletes nothing and counts only the PVs that the real sweep would not delete."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.kube.client import KubeHook
        from nemo_rl_gke.kube.objects import GROUPS, delete_objects, group_objects

        cluster = found[topology.GKE_CLUSTER]
        try:
            if cluster.get(hook) is None:
                return ""
            spec = RunSpec.from_conf(group.names)
            kube = KubeHook(spec, hook)
            owner = self.owner(group.group)
            if write:
                # The RayCluster first, as a run's teardown does.
                objects = [group_objects(spec, name, owner) for name in reversed(GROUPS)]
                done = [r for group_of in objects for r in delete_objects(kube, group_of, owner)]
                gone = [str(r.ref) for r in done if r.action == outcomes.DELETED]
                group.kube_objects = f"the group's {', '.join(gone)} deleted from it" if gone else ""
            names = [
                pv["metadata"]["name"]
                for pv in kube.list("v1", "PersistentVolume", None)
                if (pv.get("spec", {}).get("csi") or {}).get("volumeHandle") == spec.lustre_volume_handle
                and (write or not owner.owns(owner_from_labels(pv["metadata"].get("labels"))))
            ]
        except Exception as exc:  # the cluster's API did not answer: what mounts Lustre there is unknown
            return f"{cluster.label} still exists and its PVs could not be read ({exc})"
        if not names:
            return ""
        return f"PV {', '.join(names)} in {cluster.label}, which stays, still names it: delete the PV first"

    def _settle(self, hook: GcpHook, group: GroupSweep, found: Mapping[str, Resource]) -> None:
        """Read again what was being deleted: gone, or failed (with how its wait ended)."""
        for result in group.resources.values():
            if result.settled:
                continue
            path = (result.operation or {}).get("path", "")
            try:
                actual = found[result.key].get(hook)
            except Exception as exc:
                actual, ended = {}, f"it could not be read after its delete ({exc})"
            else:
                ended = self.waits.get(path) or "it still exists after its delete operation finished"
            result.action, result.reason = settled_as(actual is not None, ended)
            result.operation = None
            if result.action == FAILED:
                log.warning("%s: %s", result.label, ended)
            else:
                log.info("%s deleted", result.label)

    def _delete(self, hook: GcpHook, group: GroupSweep, found: Mapping[str, Resource], key: str) -> ResourceSweep:
        """Decide about one resource now and, when it goes, request its deletion."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.resources import delete_resource

        resource = found[key]
        try:
            lustre = found[topology.LUSTRE].get(hook) if key in storage_keys() else None
            records: list[PendingCheckpoint] = []
            mounted = ""
            if key == topology.LUSTRE and lustre is not None:
                records = found[topology.LUSTRE].records(hook, lustre)  # type: ignore[attr-defined]
                mounted = self._clear_cluster(hook, group, found)
            action, reason, owned = self._decide(found, key, resource.get(hook), lustre, records, mounted=mounted)
            if action != outcomes.DELETED:
                if action in outcomes.KEPT:
                    log.warning("%s kept (%s): %s", resource.label, action, reason)
                return ResourceSweep(key, resource.label, action, reason, owned)
            result = delete_resource(resource, hook, used=True)
        except Exception as exc:
            log.warning("%s: the delete failed: %s", resource.label, exc)
            return ResourceSweep(key, resource.label, FAILED, str(exc), True)
        if result.operation is not None:
            return ResourceSweep(key, resource.label, DELETING, "", True, result.operation.to_dict())
        # Gone in between (absent), or judged otherwise on the second read (a race): as delete_resource says.
        return ResourceSweep(key, resource.label, result.action, "", result.action not in outcomes.GONE)

    @staticmethod
    def _not_reached(
        group: GroupSweep,
        found: Mapping[str, Resource],
        why: Callable[[topology.Step, Mapping[str, ResourceSweep]], str],
    ) -> None:
        """Record every deletion the sweep did not get to (:func:`~nemo_rl_gke.decide.sweep.unreached`)."""
        group.resources.update(unreached(group, {key: r.label for key, r in found.items()}, why))

    def _finish(self, hook: GcpHook, group: GroupSweep, found: Mapping[str, Resource], lease: Lease) -> None:
        """Nothing more can go: remove the lease record when nothing of the group is left, else release it warm."""
        # lazy: the cloud clients (gcp/, kube.client, triggers/) stay out of DAG parsing
        from nemo_rl_gke.gcp.lease import forget, release

        labels = {key: r.label for key, r in found.items()}
        self._not_reached(group, found, lambda deletion, so_far: blocked_by(so_far, deletion, labels))
        if lease_goes(group):
            removed = forget(hook, self.project, group.group, unless_held=False, only_if=lease)
            group.lease = "forgotten: nothing of the group is left" if removed else "changed meanwhile: left"
        else:
            release(hook, self.project, self.owner(group.group), warm=True)
            group.lease = "released, warm: the next sweep tries again"
        group.done = True

    def note_wait(self, operation: Mapping[str, Any], status: str, message: str) -> None:
        """Record how the wait on one operation ended when it did not end well (the next pass reads it)."""
        if status != "success":
            self.waits[str(operation.get("path", ""))] = f"its delete did not finish: {status}: {message}"

    # --- report and state -----------------------------------------------------------------------------------------
    def report(self) -> SweepReport:
        """What the sweep found, deleted, kept and skipped, per group."""
        return SweepReport(
            project=self.project,
            deployment=self.deployment,
            run=self.run,
            dry_run=self.dry_run,
            at=self.at,
            groups=tuple(self._group_report(group) for group in self.groups),
        )

    def _group_report(self, group: GroupSweep) -> GroupReport:
        results = list(_in_order(group))
        gone = [r.label for r in results if r.action == outcomes.DELETED]
        kept = [r for r in results if r.action in outcomes.KEPT or r.action == NOT_REACHED]
        notes: tuple[str, ...] = ()
        cluster = group.resources.get(topology.GKE_CLUSTER)
        if not group.skipped and cluster is not None and cluster.action != outcomes.ABSENT:
            goes = cluster.action == outcomes.DELETED
            notes = (
                f"the node pool and the Kubernetes objects go with {cluster.label}"
                if goes
                else f"{cluster.label} stays: "
                + (group.kube_objects or "the sweeper deleted none of the group's Kubernetes objects in it"),
            )
        return GroupReport(
            group=group.group,
            why=group.why,
            skipped=group.skipped,
            found=tuple(group.found),
            deleted=tuple(gone),
            kept=tuple(Kept(r.label, r.action, r.reason) for r in kept),
            failed=tuple(Kept(r.label, FAILED, r.reason) for r in results if r.action in (FAILED, DELETING)),
            lease=group.lease,
            notes=notes,
        )

    def to_dict(self) -> dict[str, Any]:
        """The state as JSON values (it waits in XCom while the operator defers)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sweep:
        """Inverse of :meth:`to_dict`."""
        groups = []
        for raw in data["groups"]:
            resources = {k: ResourceSweep(**v) for k, v in raw["resources"].items()}
            groups.append(GroupSweep(**{**raw, "resources": resources}))
        return cls(**{**data, "groups": groups})


def _in_order(group: GroupSweep) -> Iterator[ResourceSweep]:
    for deletion in deletions():
        result = group.resources.get(deletion.deletes[0])
        if result is not None:
            yield result
