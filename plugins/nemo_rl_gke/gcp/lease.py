"""A run group's lease: which run may create, change and delete the group's resources right now.

The lease lives on the cloud side, so two Airflows, or a manual run and a scheduled one, see each other: it is an item
of the project's common instance metadata (Compute ``projects.get`` / ``setCommonInstanceMetadata``), keyed by the
group. Every write sends the metadata fingerprint it read, and Compute refuses a stale one (412), so two runs that
read a free lease at the same moment cannot both take it: the loser reads again and finds the winner.

A lease names its holder (deployment and run) and an expiry, which the run pushes forward as it works. An expired
lease may be taken over (and the takeover is logged). Releasing it keeps the record, marked free: the group's
resources may outlive the run (a warm cluster), and the next run, or the sweeper, reads when it was last used.

A lease also records the GPU nodes its run may hold. Taking one counts the GPU nodes of the deployment's other live
leases in the project, in the same read the fingerprinted write depends on, so two runs that each fit the
deployment's ``max_gpu_nodes_total`` but not together cannot both take theirs: the second is refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from google.cloud import compute_v1

from nemo_rl_gke.gcp.hooks import http_status
from nemo_rl_gke.run.ownership import FREE, HELD, Lease, lease_key, leases_in, live_gpu_leases
from nemo_rl_gke.run.times import shown_or_dash

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.run.ownership import Owner

log = logging.getLogger(__name__)

# Concurrent writers retry on a stale fingerprint; a handful of rounds settles even the 13 network tasks of a run.
MAX_ROUNDS = 20
# A write's operation is short (seconds); it is waited for so a read right after sees what was written.
WRITE_WAIT_S = 60.0
# Compute's limit on a project's common instance metadata: every key and value together (FACTS §21), shared with
# ssh-keys, OS Login and whatever else the project keeps there.
METADATA_LIMIT_BYTES = 512 * 1024


class LeaseError(RuntimeError):
    """The lease cannot be read or written."""


class LeaseHeldError(LeaseError):
    """Another run holds the group's lease and it has not expired."""

    def __init__(self, lease: Lease) -> None:
        super().__init__(
            f"run group {lease.group} is held by run {lease.run} of deployment {lease.deployment} since "
            f"{shown_or_dash(lease.acquired_at)}, until {shown_or_dash(lease.expires_at)} unless it renews"
        )
        self.lease = lease


class GpuNodesBoundError(LeaseError):
    """The deployment's other live runs in the project hold too many GPU nodes for this run to start now."""

    def __init__(self, gpu_nodes: int, bound: int, others: list[Lease]) -> None:
        used = sum(lease.gpu_nodes for lease in others)
        holders = ", ".join(f"run {lease.run} ({lease.gpu_nodes})" for lease in others)
        super().__init__(
            f"this run's {gpu_nodes} GPU nodes and the {used} this deployment's other live runs in the project hold "
            f"({holders}) would pass the deployment's max_gpu_nodes_total of {bound}"
        )
        self.used = used


class MetadataFullError(LeaseError):
    """The project's common instance metadata has no room for the lease: retrying cannot help, cleaning can."""

    def __init__(self, project: str, group: str, items: Mapping[str, str], size: int) -> None:
        records = leases_in(dict(items))
        free = [lease for lease in records if lease.state == FREE]
        largest = sorted(items, key=lambda k: len(k) + len(items[k].encode()), reverse=True)[:5]
        shown = ", ".join(f"{k} ({len(k) + len(items[k].encode()):,} B)" for k in largest)
        super().__init__(
            f"project {project}'s common instance metadata would be {size:,} bytes with the lease of group {group}, "
            f"over Compute's limit of {METADATA_LIMIT_BYTES:,} bytes for every key and value together, so the lease "
            f"cannot be written and nothing was started. It holds {len(items)} keys, {len(records)} of them run "
            f"leases ({len(free)} released); the largest: {shown}. Fix: run the nemo_rl_gke_sweeper DAG, which "
            "removes the lease records of groups with nothing left, or remove keys nobody uses: gcloud compute "
            f"project-info remove-metadata --project {project} --keys=KEY,..."
        )
        self.size = size


def metadata_bytes(items: Mapping[str, str]) -> int:
    """What Compute counts against the metadata limit: every key and value, in bytes."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in items.items())


class LeaseLostError(LeaseError):
    """This run no longer holds its group's lease (it expired and another run took it, or it was released)."""


def read_lease(hook: GcpHook, project: str, group: str) -> Lease | None:
    """The group's lease record, or None when there is none."""
    items, _ = _read(hook, project)
    return Lease.from_value(items.get(lease_key(group)))


def leases(hook: GcpHook, project: str) -> list[Lease]:
    """Every lease record in the project (for the sweeper and the report)."""
    items, _ = _read(hook, project)
    return leases_in(items)


def _read(hook: GcpHook, project: str) -> tuple[dict[str, str], str]:
    client = hook.compute("projects")
    found = hook.call(client.get, project=project, what=f"read the metadata of project {project}")
    metadata = found.common_instance_metadata
    return {item.key: item.value for item in metadata.items}, metadata.fingerprint


def _update(
    hook: GcpHook, project: str, group: str, change: Callable[[Lease | None, list[Lease]], Lease | None]
) -> tuple[Lease | None, Lease | None]:
    """Read the group's lease, write ``change(lease, every lease record of the project)`` unless it returns the lease
    unchanged; retried while another writer got there first. Returns (the lease read, the lease now)."""
    key = lease_key(group)
    for _ in range(MAX_ROUNDS):
        items, fingerprint = _read(hook, project)
        before = Lease.from_value(items.get(key))
        after = change(before, leases_in(items))
        if after == before:
            return before, after
        read = items
        items = {k: v for k, v in items.items() if k != key}
        if after is not None:
            items[key] = after.to_value()
            size = metadata_bytes(items)
            if size > METADATA_LIMIT_BYTES and size > metadata_bytes(read):
                raise MetadataFullError(project, group, read, size)
        metadata = compute_v1.Metadata(
            fingerprint=fingerprint, items=[compute_v1.Items(key=k, value=v) for k, v in items.items()]
        )
        try:
            operation = hook.call(
                hook.compute("projects").set_common_instance_metadata_unary,
                project=project,
                metadata_resource=metadata,
                what=f"write the lease of group {group}",
            )
        except Exception as exc:
            if http_status(exc) == 412:
                continue  # someone wrote since we read: read again and decide again
            if http_status(exc) == 400 and "metadata" in str(exc).lower() and "size" in str(exc).lower():
                # Another writer filled it between our read and our write: say what to clean all the same.
                raise MetadataFullError(project, group, read, metadata_bytes(items)) from exc
            raise
        _wait(hook, project, operation.name)
        return before, after
    raise LeaseError(f"the lease of group {group} kept changing under {MAX_ROUNDS} attempts to write it")


def _wait(hook: GcpHook, project: str, name: str) -> None:
    deadline = time.monotonic() + WRITE_WAIT_S
    client = hook.compute("global_operations")
    while True:
        operation = hook.call(client.get, project=project, operation=name, what=f"operation {name}")
        if operation.status == compute_v1.Operation.Status.DONE:
            if operation.error and operation.error.errors:
                raise LeaseError(f"writing the lease failed: {operation.error.errors[0].message}")
            return
        if time.monotonic() > deadline:
            raise LeaseError(f"writing the lease did not finish in {WRITE_WAIT_S:.0f}s (operation {name})")
        time.sleep(0.5)


def acquire(
    hook: GcpHook,
    project: str,
    owner: Owner,
    ttl_s: float,
    *,
    now: float | None = None,
    names: Mapping[str, str] | None = None,
    gpu_nodes: int = 0,
    max_gpu_nodes_total: int | None = None,
) -> tuple[str, Lease]:
    """Take the group's lease for ``owner``'s run for ``ttl_s`` seconds, recording the group's ``names`` (else the
    names the record had) and the run's ``gpu_nodes``.

    Returns ``("acquired", lease)`` for a free group, ``("renewed", lease)`` when this run already holds it, or
    ``("taken-over", previous)`` when it took over an expired lease. Raises :class:`LeaseHeldError` when another run
    holds it, and :class:`GpuNodesBoundError` when a new hold would put the deployment's live leases in the project
    past ``max_gpu_nodes_total`` (None: no bound).
    """
    at = time.time() if now is None else now

    def take(lease: Lease | None, found: list[Lease]) -> Lease | None:
        if lease is not None and lease.held_at(at) and not lease.holds(owner):
            raise LeaseHeldError(lease)
        mine = lease is not None and lease.holds(owner)
        if max_gpu_nodes_total is not None and not mine:
            others = live_gpu_leases(found, owner.deployment, owner.group, at)
            if gpu_nodes + sum(o.gpu_nodes for o in others) > max_gpu_nodes_total:
                raise GpuNodesBoundError(gpu_nodes, max_gpu_nodes_total, others)
        acquired = lease.acquired_at if mine and lease is not None else at
        warm = lease.warm if lease is not None else False
        recorded = dict(names) if names is not None else (dict(lease.names) if lease is not None else {})
        nodes = gpu_nodes or (lease.gpu_nodes if mine and lease is not None else 0)
        return Lease(owner.group, owner.deployment, owner.run, HELD, acquired, at + ttl_s, None, warm, recorded, nodes)

    before, after = _update(hook, project, owner.group, take)
    assert after is not None
    if before is not None and before.holds(owner):
        return "renewed", after
    if before is not None and before.state == HELD:
        log.warning(
            "Took over the expired lease of group %s from run %s of deployment %s (expired %s)",
            owner.group,
            before.run,
            before.deployment,
            shown_or_dash(before.expires_at),
        )
        return "taken-over", before
    return "acquired", after


def renew(hook: GcpHook, project: str, owner: Owner, until: float, *, ahead_s: float = 0.0) -> Lease:
    """Make sure this run holds the lease until at least ``until``, writing only when it would expire sooner; a write
    sets the expiry ``ahead_s`` past ``until``, so renewals in the next ``ahead_s`` seconds only read.

    Raises :class:`LeaseLostError` when another run holds it, or it was released.
    """

    def extend(lease: Lease | None, _: list[Lease]) -> Lease | None:
        if lease is None or not lease.holds(owner):
            holder = "nobody" if lease is None or lease.state != HELD else f"run {lease.run} of {lease.deployment}"
            raise LeaseLostError(
                f"this run ({owner.run}) no longer holds the lease of group {owner.group}: {holder} does"
            )
        return lease if lease.expires_at >= until else replace(lease, expires_at=until + ahead_s)

    _, after = _update(hook, project, owner.group, extend)
    assert after is not None
    return after


def release(
    hook: GcpHook, project: str, owner: Owner, *, warm: bool, gone: bool = False, now: float | None = None
) -> Lease | None:
    """Free the group's lease if this run holds it, recording whether the group's resources were kept (``warm``);
    with ``gone`` (teardown deleted every resource of the group) the record itself is removed, so a project's
    metadata does not fill with the leases of groups that no longer exist.

    Returns the freed record (with ``gone``: the record as it was), or None when this run did not hold it (then
    nothing is written).
    """
    at = time.time() if now is None else now

    def free(lease: Lease | None, _: list[Lease]) -> Lease | None:
        if lease is None or not lease.holds(owner):
            return lease
        if gone:
            return None
        return replace(lease, state=FREE, released_at=at, expires_at=at, warm=warm)

    before, after = _update(hook, project, owner.group, free)
    if before is None or not before.holds(owner):
        return None
    return before if gone else after


def forget(
    hook: GcpHook,
    project: str,
    group: str,
    *,
    unless_held: bool = True,
    now: float | None = None,
    only_if: Lease | None = None,
) -> bool:
    """Remove a group's lease record (its resources are gone); a held, unexpired lease stays when ``unless_held``.

    ``only_if``: remove it only when the record is still exactly this one, so a run that took the lease since it was
    read keeps it (the fingerprint lock makes the check and the removal one step). Returns whether it was removed.
    """
    at = time.time() if now is None else now

    def drop(lease: Lease | None, _: list[Lease]) -> Lease | None:
        if lease is not None and unless_held and lease.held_at(at):
            return lease
        if only_if is not None and lease != only_if:
            return lease
        return None

    before, after = _update(hook, project, group, drop)
    return before is not None and after is None
