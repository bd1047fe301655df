"""The sweeper's decisions: which run groups a sweep takes on, and in which waves their resources go.

The sweep (``sweeper.py``) reads every lease record of the project, asks :func:`judge` whether to take the group on and
:func:`group_spec` which resources the record names; then, pass by pass, it asks :func:`startable` which deletions
may start now (every deletion they need has settled, none of them stuck), decides each resource as a run's teardown
does (:func:`nemo_rl_gke.decide.teardown.sweep_verdict`), and deletes. When nothing more can start it asks
:func:`unreached` what was left behind and :func:`lease_goes` whether the group's record is removed or released warm.
The state in between (:class:`GroupSweep`, :class:`ResourceSweep`) is plain data, so it survives a deferral.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from nemo_rl_gke.preflight.bounds import BOUND_RULES
from nemo_rl_gke.preflight.offline import check_conf
from nemo_rl_gke.run import outcomes, topology
from nemo_rl_gke.run import task_states as ts
from nemo_rl_gke.run.conf_schema import GROUP_NAME_PARAMS
from nemo_rl_gke.run.ownership import FREE, HELD, SWEEPER_DAG_ID, Lease
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.times import shown_or_dash

HOUR_S = 3600.0
# A resource's state within a sweep, beyond the outcomes words: its delete is under way, or it did not go.
DELETING = "deleting"
FAILED = "failed"
NOT_REACHED = "not-reached"
STUCK = frozenset({FAILED, NOT_REACHED})  # a deletion that waits for one of these is not reached
# Each pass settles at least one resource of every group it works on, so this many passes is a bug, not a slow API.
MAX_PASSES = 3 * len(topology.teardown_steps())

# ``run_state("dag_id/run_id")``: the Airflow state of a run, or None when it cannot be told.
RunState = Callable[[str], "str | None"]


def is_sweeper_run(run: str) -> bool:
    """Whether ``run`` (``dag_id/run_id``) is a run of the sweeper."""
    return run.startswith(SWEEPER_DAG_ID + "/")


def judge(
    lease: Lease, *, deployment: str, now: float, ttl_hours: float, run_state: RunState, me: str = ""
) -> tuple[bool, str]:
    """Whether the sweep takes on the group of ``lease``, and why (or why not), in words for the report.

    ``me`` is the judging sweep's own run: a group an earlier try of it held or left is its own to try again.
    """
    if lease.deployment != deployment:
        return False, f"another deployment's ({lease.deployment}): never touched"
    if me and lease.run == me:
        return True, f"held or left by an earlier try of this sweep ({me}): tried again"
    if lease.held_at(now):
        return False, f"held by run {lease.run} until {shown_or_dash(lease.expires_at)}"
    left_by_sweep = lease.state == FREE and lease.warm and is_sweeper_run(lease.run)
    if lease.state == FREE and lease.warm and not left_by_sweep:
        idle_h = (now - (lease.released_at if lease.released_at is not None else lease.expires_at)) / HOUR_S
        if idle_h <= ttl_hours:
            return False, f"warm, idle {idle_h:.1f} h of its {ttl_hours:g} h"
        return True, f"warm and idle {idle_h:.1f} h, longer than its {ttl_hours:g} h (last run {lease.run})"
    state = run_state(lease.run)
    if state is None:
        return False, f"the state of run {lease.run} is unknown: left alone until it can be told"
    if state in ts.ACTIVE_RUNS:  # it may still act on its group: its resources are left alone
        if lease.state == FREE:
            return False, f"released {shown_or_dash(lease.released_at)} by run {lease.run}, which is still {state}"
        return False, f"its lease expired {shown_or_dash(lease.expires_at)} but run {lease.run} is still {state}"
    if lease.state == HELD:
        return True, f"the lease of run {lease.run} expired {shown_or_dash(lease.expires_at)} and the run is {state}"
    if left_by_sweep:
        return True, f"left by sweep {lease.run}, which had to keep something: tried again"
    return True, f"released by run {lease.run} ({state}) with nothing kept: checked for leftovers"


def group_spec(lease: Lease) -> tuple[RunSpec | None, str]:
    """The spec the lease's recorded names describe, or why there is none (the record is anyone's to write: only names
    a run would accept, for exactly the lease's group, are used)."""
    if not lease.names:
        return None, "its lease records no names (written before leases did), so its resources cannot be found"
    if set(lease.names) != set(GROUP_NAME_PARAMS):
        return None, f"its lease records other names than {', '.join(GROUP_NAME_PARAMS)}: not touched"
    _, findings = check_conf(dict(lease.names))
    # Rules that look at parameters other than the names judge the defaults filled in here, not the group. The
    # deployment's bounds say where a run may start, not what may be cleaned up: a group they now exclude still goes.
    wrong = [f for f in findings if set(f.params) <= set(GROUP_NAME_PARAMS) and not f.rule_id.startswith(BOUND_RULES)]
    if wrong:
        return None, "the names its lease records are not valid: " + "; ".join(str(f) for f in wrong)
    spec = RunSpec.from_conf(dict(lease.names))
    if spec.group_id != lease.group:
        return None, f"the names its lease records describe group {spec.group_id}, not {lease.group}: not touched"
    return spec, ""


def deletions() -> tuple[topology.Step, ...]:
    """The teardown steps that delete a GCP resource, in the topology's order."""
    return tuple(s for s in topology.teardown_steps() if s.op is topology.Op.DELETE_GCP)


def cluster_deletion() -> str:
    deletion = topology.teardown_of(topology.GKE_CLUSTER)
    assert deletion is not None
    return deletion.task_id


def needs(deletion: topology.Step) -> tuple[str, ...]:
    """The deletions ``deletion`` waits for. Kubernetes objects go with the cluster (a cluster that stays has the
    group's objects deleted before Lustre is decided), so a wait for them is a wait for the cluster's deletion."""
    found: list[str] = []
    for need in deletion.needs:
        if topology.step(need).op is topology.Op.DELETE_GCP:
            found.append(need)
        elif deletion.task_id != cluster_deletion():
            found.append(cluster_deletion())
    return tuple(dict.fromkeys(found))


@dataclass
class ResourceSweep:
    """What the sweep did, or is doing, to one resource of a group."""

    key: str
    label: str
    action: str
    reason: str = ""
    owned: bool = False
    operation: dict[str, str] | None = None

    @property
    def settled(self) -> bool:
        """Whether its deletion is no longer under way."""
        return self.action != DELETING


@dataclass
class GroupSweep:
    """One run group: why the sweep takes it on (or not), what it found, and what became of each resource."""

    group: str
    why: str
    names: dict[str, str] = field(default_factory=dict)
    skipped: str = ""
    found: list[str] = field(default_factory=list)
    ours: list[str] = field(default_factory=list)  # keys of what it found that is this deployment's and group's
    resources: dict[str, ResourceSweep] = field(default_factory=dict)
    lease: str = ""
    held: bool = False
    done: bool = False
    record: str = ""  # the lease record as read, to remove it only if nobody wrote it since
    kube_objects: str = ""  # what it deleted from a cluster that stays

    @property
    def active(self) -> bool:
        """Whether the sweep still works on it."""
        return not self.skipped and not self.done


def startable(group: GroupSweep) -> list[str]:
    """The resources whose deletion may start now, in teardown order: not yet decided, and every deletion they need
    settled without failing (what settles at once, absent or kept, may let one declared before it start)."""
    return [d.deletes[0] for d in deletions() if d.deletes[0] not in group.resources and _needs_settled(group, d)]


def _needs_settled(group: GroupSweep, deletion: topology.Step) -> bool:
    for need in needs(deletion):
        done = group.resources.get(topology.step(need).deletes[0])
        if done is None or not done.settled or done.action in STUCK:
            return False
    return True


def blocked_by(resources: Mapping[str, ResourceSweep], deletion: topology.Step, labels: Mapping[str, str]) -> str:
    """Why ``deletion`` was not reached: the deletions it waits for that did not go (``resources``: what became of
    each so far; ``labels``: each key's label)."""
    keys = [topology.step(n).deletes[0] for n in needs(deletion)]
    stuck = [labels[k] for k in keys if k in resources and resources[k].action in STUCK]
    return f"not reached: it waits for {', '.join(stuck) or 'a deletion'} that did not go"


def unreached(
    group: GroupSweep,
    labels: Mapping[str, str],
    why: Callable[[topology.Step, Mapping[str, ResourceSweep]], str],
) -> dict[str, ResourceSweep]:
    """Every deletion the sweep did not get to, in teardown order: not reached when the survey found the resource
    (``why`` says why, given what became of each deletion so far, these rows included), absent otherwise."""
    rows: dict[str, ResourceSweep] = {}
    for deletion in deletions():
        key = deletion.deletes[0]
        if key in group.resources:
            continue
        if labels[key] in group.found:
            reason = why(deletion, {**group.resources, **rows})
            rows[key] = ResourceSweep(key, labels[key], NOT_REACHED, reason, key in group.ours)
        else:
            rows[key] = ResourceSweep(key, labels[key], outcomes.ABSENT)
    return rows


def lease_goes(group: GroupSweep) -> bool:
    """Whether the group's lease record is removed (nothing of the group is left) rather than released warm, for
    the next sweep to try again."""
    return not any(r.owned and r.action not in outcomes.GONE for r in group.resources.values())


def settled_as(still_there: bool, wait: str) -> tuple[str, str]:
    """A deletion waited on, read again: (action, reason). Gone is deleted; still there failed, for the reason its
    wait gave (``wait``: how it ended, or that the resource could not be read)."""
    return (outcomes.DELETED, "") if not still_there else (FAILED, wait)
