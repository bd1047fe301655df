"""The sweeper's decisions without a cloud: which lease records it takes on, what it rebuilds from their names, the
order it deletes in, what it keeps for Lustre's sake, and its report."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from nemo_rl_gke.decide import sweep
from nemo_rl_gke.decide.sweep import group_spec, judge, needs
from nemo_rl_gke.decide.teardown import kept_for_storage, storage_keys
from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.observe.sweep_report import GroupReport, Kept, SweepReport
from nemo_rl_gke.preflight.offline import check_conf
from nemo_rl_gke.run import outcomes
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.conf_schema import GROUP_NAME_PARAMS
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.ownership import FREE, HELD, SWEEPER_DAG_ID, Lease, PendingCheckpoint
from nemo_rl_gke.run.spec import RunSpec
from tests.owners import TEST_RUN, owner_of

NOW = 1_800_000_000.0
HOUR = 3600.0
GROUP = RunSpec().group_id
SWEEP_RUN = f"{SWEEPER_DAG_ID}/scheduled__2027-01-15T10:00:00+00:00"


def _lease(**changes: Any) -> Lease:
    base = {
        "group": GROUP,
        "deployment": "default",
        "run": TEST_RUN,
        "state": HELD,
        "acquired_at": NOW - 5 * HOUR,
        "expires_at": NOW - HOUR,
        "released_at": None,
        "warm": False,
        "names": RunSpec().group_names,
    }
    return Lease(**{**base, **changes})


def _judge(lease: Lease, state: str | None = "failed", ttl_hours: float = 24, me: str = "") -> tuple[bool, str]:
    asked: list[str] = []

    def run_state(run: str) -> str | None:
        asked.append(run)
        return state

    return judge(lease, deployment="default", now=NOW, ttl_hours=ttl_hours, run_state=run_state, me=me)


@pytest.mark.parametrize(
    ("lease", "state", "take", "why"),
    [
        (_lease(deployment="team-b"), "failed", False, "another deployment's (team-b): never touched"),
        (_lease(expires_at=NOW + HOUR), "failed", False, f"held by run {TEST_RUN} until 2027-01-15T09:00:00Z"),
        (_lease(), "failed", True, f"the lease of run {TEST_RUN} expired 2027-01-15T07:00:00Z and the run is failed"),
        (_lease(), "success", True, "the run is success"),
        (_lease(), "running", False, f"but run {TEST_RUN} is still running"),
        (_lease(), "queued", False, "is still queued"),
        (_lease(), None, False, f"the state of run {TEST_RUN} is unknown: left alone until it can be told"),
        (_lease(state=FREE, warm=True, released_at=NOW - 2 * HOUR), None, False, "warm, idle 2.0 h of its 24 h"),
        (_lease(state=FREE, warm=True, released_at=NOW - 30 * HOUR), None, True, "warm and idle 30.0 h, longer"),
        (_lease(state=FREE, warm=True, released_at=NOW, run=SWEEP_RUN), "success", True, f"left by sweep {SWEEP_RUN}"),
        (_lease(state=FREE, warm=True, released_at=NOW, run=SWEEP_RUN), "running", False, "is still running"),
        (_lease(state=FREE, released_at=NOW - 60), "success", True, "with nothing kept: checked for leftovers"),
        (_lease(state=FREE, released_at=NOW - 60), "running", False, "released 2027-01-15T07:59:00Z by run"),
    ],
)
def test_which_lease_records_the_sweep_takes_on(lease: Lease, state: str | None, take: bool, why: str) -> None:
    taken, reason = _judge(lease, state)
    assert taken is take and why in reason


def test_a_retry_of_a_sweep_takes_back_what_its_earlier_try_held_or_left() -> None:
    # The task's retry runs in the same DAG run, which is still running: its own record must not block it.
    held = _lease(run=SWEEP_RUN, expires_at=NOW + HOUR)
    left = _lease(state=FREE, warm=True, released_at=NOW, run=SWEEP_RUN)
    for lease in (held, left):
        assert _judge(lease, "running", me=SWEEP_RUN) == (
            True,
            f"held or left by an earlier try of this sweep ({SWEEP_RUN}): tried again",
        )
        assert _judge(lease, "running", me=f"{SWEEP_RUN}-other")[0] is False


def test_a_warm_group_s_own_ttl_applies() -> None:
    idle = _lease(state=FREE, warm=True, released_at=NOW - 5 * HOUR)
    assert _judge(idle, ttl_hours=4)[0] and not _judge(idle, ttl_hours=6)[0]


def test_the_names_rebuild_exactly_the_resources_of_a_run_with_any_other_conf() -> None:
    conf = {
        "project": "nemo-rl-other",
        "network": "lab-net",
        "gvnic_prefix": "lab-gv",
        "rdma_prefix": "lab-rd",
        "lustre_name": "lab-lustre",
        "cluster_name": "lab-cluster",
        "node_pool_name": "lab-pool",
        "teardown_policy": t.KEEP_WARM,
        "lustre_capacity_gib": 36000,
        "gpu_type": "h200",
        "region": "europe-west4",
        "zone": "europe-west4-b",
    }
    # The run was started where its deployment allowed; group_spec (bare defaults) rebuilds it all the same.
    run, findings = check_conf(conf, Deployment(gcp_project="nemo-rl-other", allowed_regions=("europe-west4",)))
    assert run is not None, findings
    spec, problem = group_spec(_lease(group=run.group_id, names=run.group_names))
    assert problem == "" and spec is not None and spec.group_id == run.group_id
    ours, rebuilt = resources(run, owner_of(run)), resources(spec, owner_of(spec))
    assert [(r.key, r.label, r.delete_request.path) for r in ours.values()] == [
        (r.key, r.label, r.delete_request.path) for r in rebuilt.values()
    ]


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        ({}, "records no names"),
        ({**RunSpec().group_names, "teardown_policy": "keep_all"}, "other names than project"),
        ({k: v for k, v in RunSpec().group_names.items() if k != "namespace"}, "other names than project"),
        ({**RunSpec().group_names, "network": "../x"}, '[name.compute] network="../x"'),
        ({**RunSpec().group_names, "network": "another-net"}, "describe group nemo-rl-cluster-"),
    ],
)
def test_names_a_run_would_refuse_or_of_another_group_are_not_used(names: dict[str, str], problem: str) -> None:
    spec, why = group_spec(_lease(names=names))
    assert spec is None and problem in why


def test_the_sweep_deletes_no_kubernetes_object_so_lustre_waits_for_the_cluster_instead() -> None:
    deletions = [s for s in t.teardown_steps() if s.op is t.Op.DELETE_GCP]
    waits = {s.task_id: needs(s) for s in deletions}
    assert waits[t.DELETE_LUSTRE] == (t.DELETE_CLUSTER,) and waits[t.DELETE_CLUSTER] == ()
    assert waits[t.DELETE_NET] == t.step(t.DELETE_NET).needs
    kube = {s.task_id for s in t.teardown_steps() if s.op is t.Op.DELETE_KUBE}
    assert kube and not kube & {need for found in waits.values() for need in found}


def test_lustre_with_a_pending_checkpoint_keeps_itself_and_what_it_needs() -> None:
    spec = RunSpec()
    lustre = resources(spec, owner_of(spec))[t.LUSTRE]
    found = {"labels": {}}
    pending = [PendingCheckpoint(TEST_RUN, 7, "/data/x")]
    sweeper = {"run": SWEEP_RUN}
    kept = kept_for_storage(t.LUSTRE, lustre, found, records=pending, **sweeper)  # type: ignore[arg-type]
    assert kept is not None and kept[0] == outcomes.KEPT_FOR_CHECKPOINT and "step 7" in kept[1]
    # Only naming the record's run releases it; the sweeper never does (no conf), a blanket flag does not either.
    named = {"accepts_own_loss": False, "release_run": TEST_RUN}
    assert kept_for_storage(t.LUSTRE, lustre, found, records=pending, **sweeper, **named) is None  # type: ignore[arg-type]
    assert kept_for_storage(t.LUSTRE, lustre, found, records=pending, run=SWEEP_RUN, accepts_own_loss=True)  # type: ignore[arg-type]
    assert kept_for_storage(t.LUSTRE, lustre, found, **sweeper) is None  # type: ignore[arg-type]
    # An exported record is a receipt: it keeps nothing. Another run's pending record still keeps it after a release.
    other = PendingCheckpoint("dag/other", 3, "/data/y")
    receipt = PendingCheckpoint(TEST_RUN, 7, "/data/x", uri="gs://b/dag/run/step_7/")
    assert kept_for_storage(t.LUSTRE, lustre, found, records=[receipt], **sweeper) is None  # type: ignore[arg-type]
    both = kept_for_storage(t.LUSTRE, lustre, found, records=[*pending, other], **sweeper, **named)  # type: ignore[arg-type]
    assert both is not None and "run dag/other, step 3, /data/y/step_3" in both[1] and TEST_RUN not in both[1]
    # Directories a listing found that no record named: only naming the listing run releases them.
    unrecorded = PendingCheckpoint(TEST_RUN, 0, "", dirs=("/lost/step_2",))
    own = {"run": TEST_RUN, "accepts_own_loss": True}
    assert kept_for_storage(t.LUSTRE, lustre, found, records=[unrecorded], **own) is not None  # type: ignore[arg-type]
    # An instance marked before records: its label mark still counts (its run shows as the label's digest).
    marked = {"labels": PendingCheckpoint(TEST_RUN, 7, "/data/x").labels, "description": ""}
    legacy = lustre.legacy_mark(marked)  # type: ignore[attr-defined]
    assert legacy is not None and legacy.belongs_to(TEST_RUN) and legacy.step == 7
    # What Lustre needs stays while it exists, whatever its records; nothing else does.
    assert storage_keys() == {t.LUSTRE, t.PEERING, t.PEERING_RANGE, t.LUSTRE_FW, t.NET}
    for key in storage_keys() - {t.LUSTRE}:
        assert kept_for_storage(key, lustre, {"labels": {}}, **sweeper)[0] == outcomes.KEPT_FOR_LUSTRE  # type: ignore[arg-type,index]
        assert kept_for_storage(key, lustre, None, **sweeper) is None  # type: ignore[arg-type]
    assert kept_for_storage(t.GKE_CLUSTER, lustre, marked, records=pending, **sweeper) is None  # type: ignore[arg-type]


def _report(dry_run: bool) -> SweepReport:
    swept = GroupReport(
        group=GROUP,
        why="the lease of run x expired",
        found=("network a", "Lustre instance b"),
        deleted=("network a",),
        kept=(Kept("Lustre instance b", outcomes.KEPT_FOR_CHECKPOINT, "it holds the only copy"),),
        lease="released, warm: the next sweep tries again",
        notes=("the node pool and the Kubernetes objects go with the cluster",),
    )
    skipped = GroupReport(group="other-1234", why="held", skipped="held by run y until z")
    return SweepReport("p-123456", "default", SWEEP_RUN, dry_run, NOW, (swept, skipped))


def test_the_report_says_what_was_found_deleted_kept_and_skipped() -> None:
    text = _report(False).to_text()
    assert "1 group(s) swept, 1 skipped; 1 resource(s) deleted, 1 kept, 0 failed" in text
    assert f"{GROUP}  2      1        1     0       released, warm: the next sweep tries again" in text
    assert "  kept (kept-for-checkpoint): Lustre instance b: it holds the only copy" in text
    assert "skipped:\n  other-1234: held by run y until z" in text
    assert "would delete" not in text and "dry run" not in text
    as_dict = _report(False).to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict and as_dict["at"] == "2027-01-15T08:00:00Z"
    assert as_dict["groups"][0]["kept"] == [
        {"resource": "Lustre instance b", "action": "kept-for-checkpoint", "reason": "it holds the only copy"}
    ]


def test_a_dry_run_report_says_would_delete() -> None:
    text = _report(True).to_text()
    assert "(dry run: nothing was written)" in text and "1 resource(s) would be deleted" in text
    assert "  would delete: network a" in text


def test_every_group_name_param_is_recorded() -> None:
    assert set(RunSpec().group_names) == set(GROUP_NAME_PARAMS)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"project": "nemo-rl-demo", "dry-run": True}, "unknown param(s) 'dry-run': the sweeper takes only project"),
        ({"project": "Bad Project"}, "param project:"),
        ({"project": "nemo-rl-demo", "dry_run": "yes"}, "param dry_run must be true or false"),
        ({"project": "nemo-rl-demo", "warm_ttl_hours": float("nan")}, "param warm_ttl_hours must be a number"),
    ],
)
def test_a_bad_sweeper_param_fails_the_task_naming_it(params: dict, message: str) -> None:
    from nemo_rl_gke.airflow_compat import AirflowFailException
    from nemo_rl_gke.operators.sweeper import sweep_params

    with pytest.raises(AirflowFailException, match=re.escape(message)):
        sweep_params(params)
    assert sweep_params({"project": "nemo-rl-demo"}) == ("nemo-rl-demo", False, 24.0)


def _settle(group: sweep.GroupSweep, key: str, action: str) -> None:
    group.resources[key] = sweep.ResourceSweep(key, key, action, owned=True)


def test_the_sweep_deletes_in_waves_each_starting_once_what_it_needs_has_settled() -> None:
    group = sweep.GroupSweep("g", "why")
    # First wave: what needs nothing (the cluster, the gVNIC firewall).
    assert sweep.startable(group) == [t.GKE_CLUSTER, "network.gvnic-fw"]
    _settle(group, "network.gvnic-fw", outcomes.DELETED)
    group.resources[t.GKE_CLUSTER] = sweep.ResourceSweep(t.GKE_CLUSTER, "cluster", sweep.DELETING, owned=True)
    # A deletion under way holds back all that waits for it.
    assert sweep.startable(group) == []
    _settle(group, t.GKE_CLUSTER, outcomes.DELETED)
    wave = sweep.startable(group)
    assert wave[0] == t.LUSTRE and "network.gvnic-sub" in wave and "network.net" not in wave
    for key in wave:
        _settle(group, key, outcomes.DELETED)
    # The peering waits for Lustre, the range for the peering, the networks for their subnets.
    assert "storage.peering" in sweep.startable(group)


def test_a_deletion_that_failed_or_was_not_reached_stops_all_that_waits_for_it() -> None:
    found = ["cluster", "gvnic-sub", "gvnic-net", "gvnic-fw"]
    group = sweep.GroupSweep("g", "why", found=found, ours=[t.GKE_CLUSTER, "network.gvnic-sub", "network.gvnic-net"])
    _settle(group, t.GKE_CLUSTER, sweep.FAILED)
    _settle(group, "network.gvnic-fw", outcomes.DELETED)
    assert sweep.startable(group) == []
    labels = {d.deletes[0]: d.deletes[0] for d in sweep.deletions()} | {
        t.GKE_CLUSTER: "cluster", "network.gvnic-sub": "gvnic-sub", "network.gvnic-net": "gvnic-net",
        "network.gvnic-fw": "gvnic-fw",
    }  # fmt: skip
    rows = sweep.unreached(group, labels, lambda d, so_far: sweep.blocked_by(so_far, d, labels))
    # What the survey found is not reached (and stays the group's), each naming what it waited for, a deletion not
    # reached before it included; what the survey did not find is absent.
    assert rows["network.gvnic-sub"].action == sweep.NOT_REACHED and rows["network.gvnic-sub"].owned
    assert rows["network.gvnic-sub"].reason == "not reached: it waits for cluster that did not go"
    assert rows["network.gvnic-net"].reason == "not reached: it waits for gvnic-sub that did not go"
    assert rows[t.LUSTRE].action == outcomes.ABSENT
    assert t.GKE_CLUSTER not in rows
    group.resources.update(rows)
    # Something of the group is left: the lease is released warm, for the next sweep.
    assert not sweep.lease_goes(group)


def test_the_lease_record_goes_once_nothing_of_the_group_is_left() -> None:
    group = sweep.GroupSweep("g", "why")
    _settle(group, t.GKE_CLUSTER, outcomes.DELETED)
    group.resources["network.net"] = sweep.ResourceSweep("network.net", "net", outcomes.ABSENT)
    # Someone else's resource under the group's name is not the group's: it does not hold the record.
    group.resources[t.LUSTRE] = sweep.ResourceSweep(t.LUSTRE, "lustre", outcomes.KEPT_UNOWNED, owned=False)
    assert sweep.lease_goes(group)
    _settle(group, "network.gvnic-fw", outcomes.KEPT_BY_POLICY)
    assert not sweep.lease_goes(group)


def test_a_deletion_waited_on_is_deleted_once_gone_and_failed_with_its_waits_reason_otherwise() -> None:
    assert sweep.settled_as(False, "anything") == (outcomes.DELETED, "")
    assert sweep.settled_as(True, "its delete did not finish: error: boom") == (
        sweep.FAILED,
        "its delete did not finish: error: boom",
    )
