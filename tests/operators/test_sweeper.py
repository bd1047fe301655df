"""The sweeper against the sandbox: a run killed mid-way, warm groups, other deployments, foreign resources, held
leases and dry runs.

Groups are made by the real operators step by step (tests/operators/harness.py); the sweep is the real
:class:`~nemo_rl_gke.operators.sweeper.SweepOperator`, its deferrals run to their trigger's event and resumed on a fresh
operator, as Airflow does. Its task instance answers other runs' states from a table the test gives, and fails for a
run it does not know, as Airflow's API does (404).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from sandbox.testing import SandboxProcess, request_json, start_sandbox

from nemo_rl_gke.airflow_compat import AirflowException
from nemo_rl_gke.gcp.lease import acquire, read_lease, release
from nemo_rl_gke.operators.rayjob import mark_checkpoint_pending
from nemo_rl_gke.operators.sweeper import STATE_KEY, TEXT_KEY, SweepOperator
from nemo_rl_gke.run import outcomes
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.ownership import FREE, SWEEPER_DAG_ID, Owner
from nemo_rl_gke.sweeper import Sweep
from tests.operators.harness import (
    DAG_ID,
    Run,
    gcp_conn,
    operator,
    project_resources,
    run_step,
    start_run,
    trigger_events,
)

__all__ = ["gcp_conn"]
pytestmark = pytest.mark.usefixtures("gcp_conn")
_projects = itertools.count(1)
_sweeps = itertools.count(1)
HOUR = 3600.0
ALLOWED_ENV = "AIRFLOW__NEMO_RL_GKE__ALLOWED_PROJECTS"
# Everything a run makes before it trains, but the node pool (it goes with the cluster, as the sweep says).
INFRA = [s.task_id for s in t.gcp_resources() if s.task_id != t.NODE_POOL]
# What Lustre keeps while it holds a pending checkpoint.
FOR_LUSTRE = {t.PEERING, t.PEERING_RANGE, t.LUSTRE_FW, t.NET}
# Every run here is a 2-GPU-node run on the reservation the node pool checks.
RESERVATION = "gpu-res"
# Another group's names: none of its resources shares a name with the default group's.
OTHER_NAMES = {
    "network": "net-2",
    "gvnic_prefix": "gv-2",
    "rdma_prefix": "rd-2",
    "cluster_name": "c-2",
    "lustre_name": "l-2",
}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    with start_sandbox(tmp_path_factory.mktemp("sweeper-sandbox"), latency_scale=0.0) as running:
        yield running


@pytest.fixture
def project(sandbox: SandboxProcess) -> Iterator[str]:
    """A project of the test's own; no fault outlives the test."""
    yield f"sweep-{next(_projects):03d}"
    sandbox.clear_faults()


class SweepTaskInstance:
    """What the sweep operator uses of its task instance: its own XCom, and other runs' states."""

    def __init__(self, states: dict[str, str]) -> None:
        self.states = states
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        json.dumps(value)  # XCom values must be JSON-serializable, as Airflow's are
        self.xcom[key] = value

    def xcom_pull(self, task_ids: str | None = None, key: str = "return_value", **_: Any) -> Any:
        return self.xcom.get(key)

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        run = f"{dag_id}/{run_id}"
        if run not in self.states:
            raise RuntimeError(f"Dag run with dag_id '{dag_id}' and run_id '{run_id}' was not found")
        return self.states[run]


class SweepResult:
    """One sweep task: its report (XCom return value), its text, the waits it deferred on, and its run."""

    def __init__(self, run: str, ti: SweepTaskInstance, report: dict[str, Any], deferrals: int) -> None:
        self.run = run
        self.ti = ti
        self.report = report
        self.deferrals = deferrals

    @property
    def text(self) -> str:
        return self.ti.xcom[TEXT_KEY]

    def group(self, group: str) -> dict[str, Any]:
        (found,) = [g for g in self.report["groups"] if g["group"] == group]
        return found

    def kept(self, group: str) -> dict[str, str]:
        """Kept resource label -> outcome word."""
        return {k["resource"]: k["action"] for k in self.group(group)["kept"]}


def sweep(
    project: str, states: dict[str, str] | None = None, *, dry_run: bool = False, warm_ttl_hours: float = 24
) -> SweepResult:
    """One try of the sweep task: execute, then each deferral's trigger to its event and ``execute_complete`` on a
    fresh operator, until it returns. A sweep that raises after reporting still hands back its report."""
    run_id = f"scheduled__sweep-{next(_sweeps)}"
    ti = SweepTaskInstance(dict(states or {}))
    params = {"project": project, "dry_run": dry_run, "warm_ttl_hours": warm_ttl_hours}
    context = {"ti": ti, "dag": SimpleNamespace(dag_id=SWEEPER_DAG_ID), "run_id": run_id, "params": params}
    call = lambda: SweepOperator(task_id="sweep", poll_interval_s=0.05).execute(context)  # noqa: E731
    # The deployment allows the test's project (the connection names "sandbox"), as it must for a sweep there.
    with allowed_project(project):
        return _sweep_until_done(call, context, ti, run_id)


@contextmanager
def allowed_project(project: str) -> Iterator[None]:
    """``[nemo_rl_gke] allowed_projects`` names ``project`` while the block runs."""
    before = os.environ.get(ALLOWED_ENV)
    os.environ[ALLOWED_ENV] = project
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ALLOWED_ENV, None)
        else:
            os.environ[ALLOWED_ENV] = before


def _sweep_until_done(call: Any, context: dict[str, Any], ti: Any, run_id: str) -> SweepResult:
    deferrals = 0
    while True:
        try:
            report = call()
        except TaskDeferred as deferred:
            deferrals += 1
            (event,) = trigger_events(deferred.trigger)
            resume = getattr(SweepOperator(task_id="sweep", poll_interval_s=0.05), deferred.method_name)
            call = lambda resume=resume, event=event: resume(context, event=event)  # noqa: E731
            continue
        except AirflowException:
            report = ti.xcom["return_value"]
        return SweepResult(f"{SWEEPER_DAG_ID}/{run_id}", ti, report, deferrals)


def _hook() -> Any:
    from nemo_rl_gke.gcp.hooks import GcpHook

    return GcpHook()


def _steps(run: Run, task_ids: list[str]) -> dict[str, str]:
    return {task_id: run_step(run, task_id)[0]["action"] for task_id in task_ids}


def _expire(run: Run, hours_ago: float = 1.0) -> None:
    """The run's lease, as a killed run leaves it: still held, its expiry passed."""
    outcome, _ = acquire(_hook(), run.spec.project, run.owner, 1.0, now=time.time() - hours_ago * HOUR)
    assert outcome == "renewed"


def _labels(run: Run, keys: set[str] | list[str]) -> set[str]:
    found = run.resources()
    return {found[key].label for key in keys}


def _writes_since(sandbox: SandboxProcess, seq: int) -> list[str]:
    return [f"{c['method']} {c['path']}" for c in sandbox.calls(since=seq) if c["method"] != "GET"]


def _last_seq(sandbox: SandboxProcess) -> int:
    calls = sandbox.calls()
    return calls[-1]["seq"] if calls else 0


def _exported(run: Run, step: int) -> None:
    """What checkpoint.export does once the export succeeded: the run's record names the copy."""
    from nemo_rl_gke.gcp.pending import CheckpointRecords
    from nemo_rl_gke.run.ownership import PendingCheckpoint

    actual = run.resources()[t.LUSTRE].get(_hook())
    uri = run.spec.export_uri(DAG_ID, run.run_id, step)
    CheckpointRecords(_hook(), run.spec, actual).put(
        PendingCheckpoint(run.owner.run, step, run.spec.checkpoint_dir, uri)
    )


def _killed_run(sandbox: SandboxProcess, project: str) -> Run:
    """A run that made its networks, storage and cluster, marked Lustre for the checkpoint its job was about to
    write, and was killed: teardown never ran and its lease is held but expired."""
    run = start_run(project, reservation=RESERVATION)
    sandbox.seed_reservation(project, run.spec.zone, RESERVATION, run.spec.effective_machine_type, 4)
    assert set(_steps(run, [*INFRA, t.NODE_POOL]).values()) == {outcomes.CREATED}
    mark_checkpoint_pending(operator(t.SUBMIT), run.context(t.SUBMIT), run.spec, 20)
    _expire(run)
    return run


def test_a_run_killed_mid_way_is_swept_and_its_pending_checkpoint_survives_until_released(
    sandbox: SandboxProcess, project: str
) -> None:
    killed = _killed_run(sandbox, project)
    group = killed.owner.group
    everything = _labels(killed, [s.deletes[0] for s in t.teardown_steps() if s.op is t.Op.DELETE_GCP])
    assert len(everything) == len(INFRA)

    first = sweep(project, {killed.owner.run: "failed"})

    swept = first.group(group)
    assert swept["skipped"] == ""
    assert f"the lease of run {killed.owner.run} expired" in swept["why"] and "the run is failed" in swept["why"]
    assert set(swept["found"]) == everything
    # Lustre stays for its checkpoint, and with it the peering, its range, its firewall rule and the main network;
    # the rest is gone.
    kept = _labels(killed, FOR_LUSTRE | {t.LUSTRE})
    assert first.kept(group) == {
        **{label: outcomes.KEPT_FOR_LUSTRE for label in _labels(killed, FOR_LUSTRE)},
        **{label: outcomes.KEPT_FOR_CHECKPOINT for label in _labels(killed, [t.LUSTRE])},
    }
    assert set(swept["deleted"]) == everything - kept and swept["failed"] == []
    assert f"release_checkpoint_of_run='{killed.owner.run}'" in first.text
    assert swept["notes"] == [
        f"the node pool and the Kubernetes objects go with GKE cluster {killed.spec.cluster_name}"
    ]
    left = project_resources(sandbox, project)
    spec = killed.spec
    assert set(left) == {spec.network, spec.peering_range, spec.lustre_firewall, spec.lustre_name}
    # The waves were waited on by deferring, never in the worker.
    assert first.deferrals >= 3
    # The group is left warm by this sweep, so the next one tries again whatever the warm TTL.
    lease = read_lease(_hook(), project, group)
    assert lease is not None and lease.state == FREE and lease.warm and lease.run == first.run
    assert lease.names == killed.spec.group_names

    # Still marked: the next sweep keeps it all again.
    again = sweep(project, {first.run: "success"})
    assert again.group(group)["deleted"] == [] and set(again.kept(group)) == kept
    assert again.group(group)["notes"] == []  # the cluster was gone already

    # The checkpoint is exported: its record becomes a receipt, as checkpoint.export's unmark makes it.
    _exported(killed, 20)
    last = sweep(project, {again.run: "success"})
    assert f"left by sweep {again.run}" in last.group(group)["why"]
    assert set(last.group(group)["deleted"]) == kept and last.group(group)["kept"] == []
    assert last.group(group)["lease"].startswith("forgotten")
    assert project_resources(sandbox, project) == {}
    assert read_lease(_hook(), project, group) is None


def test_another_deployments_group_and_a_foreign_network_are_never_touched(
    sandbox: SandboxProcess, project: str
) -> None:
    # Team B's run died too, with its own names: its group is its deployment's business.
    theirs = start_run(project, deployment="team-b", network="net-b", cluster_name="cluster-b", lustre_name="lustre-b")
    assert _steps(theirs, [t.NET]) == {t.NET: outcomes.CREATED}
    _expire(theirs)
    their_lease = read_lease(_hook(), project, theirs.owner.group)
    # A network somebody made by hand, which one of our groups used as it was (adopted, never ours).
    request_json(
        f"{sandbox.url}/compute/v1/projects/{project}/global/networks",
        "POST",
        {"name": "hand-made-net", "autoCreateSubnetworks": True},
    )
    ours = start_run(project, network="hand-made-net", adopt_existing=True)
    assert _steps(ours, [t.NET]) == {t.NET: outcomes.ADOPTED}
    _expire(ours)
    seq = _last_seq(sandbox)

    result = sweep(project, {theirs.owner.run: "failed", ours.owner.run: "failed"})

    assert result.group(theirs.owner.group)["skipped"] == "another deployment's (team-b): never touched"
    assert read_lease(_hook(), project, theirs.owner.group) == their_lease
    mine = result.group(ours.owner.group)
    assert mine["found"] == ["network hand-made-net"] and mine["deleted"] == []
    ((kept,),) = [mine["kept"]]
    assert kept["action"] == outcomes.KEPT_UNOWNED and "no owner record" in kept["reason"]
    # Nothing of our group was left, so its lease record went, without ever taking the lease.
    assert mine["lease"] == "forgotten: nothing of the group was left"
    assert read_lease(_hook(), project, ours.owner.group) is None
    assert set(project_resources(sandbox, project)) == {"net-b", "hand-made-net"}
    writes = _writes_since(sandbox, seq)
    assert writes and all("setCommonInstanceMetadata" in w for w in writes), writes


def test_a_held_lease_a_running_run_and_an_unknown_run_are_left_alone(sandbox: SandboxProcess, project: str) -> None:
    held = start_run(project)
    alive = start_run(project, **OTHER_NAMES)
    unknown = start_run(project, network="net-3", cluster_name="c-3", lustre_name="l-3")
    for run in (held, alive, unknown):
        assert _steps(run, [t.NET]) == {t.NET: outcomes.CREATED}
    _expire(alive)
    _expire(unknown)
    seq = _last_seq(sandbox)

    result = sweep(project, {held.owner.run: "running", alive.owner.run: "running"})

    assert result.group(held.owner.group)["skipped"].startswith(f"held by run {held.owner.run} until ")
    assert result.group(alive.owner.group)["skipped"].endswith(f"but run {alive.owner.run} is still running")
    assert "is unknown: left alone" in result.group(unknown.owner.group)["skipped"]
    assert "3 skipped; 0 resource(s) deleted" in result.text
    assert _writes_since(sandbox, seq) == []
    assert set(project_resources(sandbox, project)) == {"nemo-rl-net", "net-2", "net-3"}


def test_a_run_that_takes_the_group_first_wins_over_the_sweep(sandbox: SandboxProcess, project: str) -> None:
    killed = start_run(project)
    assert _steps(killed, [t.NET]) == {t.NET: outcomes.CREATED}
    _expire(killed)
    sweeper = Owner("default", "-", f"{SWEEPER_DAG_ID}/scheduled__race")
    started = Sweep.start(
        _hook(),
        project=project,
        deployment="default",
        run=sweeper.run,
        now=time.time(),
        run_state=lambda run: "failed",
        warm_ttl_hours=24,
    )
    # Between the sweep's read and its first write, tonight's run of the group takes the expired lease over.
    tonight = start_run(project)
    seq = _last_seq(sandbox)
    assert started.advance(_hook(), now=time.time(), lease_ttl_s=600) == []
    (group,) = started.report().groups
    assert group.skipped.startswith("a run took the group meanwhile") and tonight.owner.run in group.skipped
    assert _writes_since(sandbox, seq) == []
    lease = read_lease(_hook(), project, killed.owner.group)
    assert lease is not None and lease.holds(tonight.owner)


def test_a_warm_group_idle_past_its_ttl_is_swept_and_one_within_it_is_not(
    sandbox: SandboxProcess, project: str
) -> None:
    stale = start_run(project, teardown_policy=t.KEEP_WARM)
    fresh = start_run(project, teardown_policy=t.KEEP_WARM, **OTHER_NAMES)
    made = [t.NET, t.GVNIC_NET, t.GVNIC_FW]
    for run, idle_h in ((stale, 30.0), (fresh, 1.0)):
        assert _steps(run, made) == dict.fromkeys(made, outcomes.CREATED)
        # The last run kept its group warm and let go of it idle_h hours ago.
        release(_hook(), project, run.owner, warm=True, now=time.time() - idle_h * HOUR)

    result = sweep(project, warm_ttl_hours=24)

    assert result.group(fresh.owner.group)["skipped"] == "warm, idle 1.0 h of its 24 h"
    swept = result.group(stale.owner.group)
    assert swept["why"].startswith("warm and idle 30.0 h, longer than its 24 h")
    assert set(swept["deleted"]) == _labels(stale, made)
    assert read_lease(_hook(), project, stale.owner.group) is None
    assert set(project_resources(sandbox, project)) == {
        fresh.spec.network,
        fresh.spec.gvnic_network,
        fresh.spec.gvnic_firewall,
    }


def test_a_scheduled_warm_group_idles_for_its_schedule_files_ttl_not_the_params(
    sandbox: SandboxProcess, project: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    from nemo_rl_gke.run import paths

    nightly = start_run(project, teardown_policy=t.KEEP_WARM, **OTHER_NAMES)
    made = [t.NET, t.GVNIC_NET, t.GVNIC_FW]
    assert _steps(nightly, made) == dict.fromkeys(made, outcomes.CREATED)
    release(_hook(), project, nightly.owner, warm=True, now=time.time() - 2 * HOUR)
    # The schedule whose nights use this group lets it idle 1 h; the sweeper's own param says 24.
    schedule = {
        "description": "test nights",
        "cron": "0 1 * * *",
        "steps_per_run": 10,
        "warm_ttl_hours": 1,
        "conf": {"mode": "apply", "teardown_policy": t.KEEP_WARM, **nightly.spec.group_names},
    }
    (tmp_path / "nightly.yaml").write_text(yaml.safe_dump(schedule))
    monkeypatch.setattr(paths, "SCHEDULES_DIR", tmp_path)

    result = sweep(project, warm_ttl_hours=24)

    swept = result.group(nightly.owner.group)
    assert swept["why"].startswith("warm and idle 2.0 h, longer than its 1 h"), swept
    assert set(swept["deleted"]) == _labels(nightly, made)


def test_a_dry_run_lists_what_it_would_delete_and_keep_and_writes_nothing(
    sandbox: SandboxProcess, project: str
) -> None:
    killed = _killed_run(sandbox, project)
    lease = read_lease(_hook(), project, killed.owner.group)
    before = project_resources(sandbox, project)
    seq = _last_seq(sandbox)

    result = sweep(project, {killed.owner.run: "failed"}, dry_run=True)

    assert _writes_since(sandbox, seq) == []
    assert project_resources(sandbox, project) == before
    assert read_lease(_hook(), project, killed.owner.group) == lease
    swept = result.group(killed.owner.group)
    kept = _labels(killed, FOR_LUSTRE | {t.LUSTRE})
    assert set(swept["deleted"]) == set(swept["found"]) - kept and swept["deleted"]
    assert set(result.kept(killed.owner.group)) == kept
    assert swept["lease"] == "untouched (dry run)" and result.deferrals == 0
    assert "(dry run: nothing was written)" in result.text and "would delete" in result.text
    # Without the pending record the dry run would delete it all.
    _exported(killed, 20)
    seq = _last_seq(sandbox)
    result = sweep(project, {killed.owner.run: "failed"}, dry_run=True)
    assert set(result.group(killed.owner.group)["deleted"]) == set(swept["found"])
    assert _writes_since(sandbox, seq) == []


def test_a_failed_deletion_is_reported_what_needs_it_waits_and_the_next_sweep_finishes(
    sandbox: SandboxProcess, project: str
) -> None:
    killed = start_run(project)
    assert set(_steps(killed, [t.NET, t.GVNIC_NET, t.GVNIC_SUB, t.GVNIC_FW]).values()) == {outcomes.CREATED}
    _expire(killed)
    # The subnet's delete operation ends in error once.
    sandbox.add_fault(
        {"method": "DELETE", "path": f"/projects/{project}/regions/[^/]+/subnetworks/"}, operation="error", times=1
    )

    first = sweep(project, {killed.owner.run: "failed"})

    group = first.group(killed.owner.group)
    (failed,) = group["failed"]
    assert failed["resource"] == f"subnet {killed.spec.gvnic_subnet}" and "did not finish" in failed["reason"]
    # The gVNIC network needs its subnet gone: not reached. The rest went.
    assert first.kept(killed.owner.group) == {f"network {killed.spec.gvnic_network}": "not-reached"}
    assert set(group["deleted"]) == _labels(killed, [t.NET, t.GVNIC_FW])
    assert group["lease"] == "released, warm: the next sweep tries again"

    last = sweep(project, {first.run: "failed"})
    assert set(last.group(killed.owner.group)["deleted"]) == _labels(killed, [t.GVNIC_SUB, t.GVNIC_NET])
    assert project_resources(sandbox, project) == {}
    assert read_lease(_hook(), project, killed.owner.group) is None


def test_the_sweep_state_survives_a_deferral_as_json(sandbox: SandboxProcess, project: str) -> None:
    killed = start_run(project)
    assert _steps(killed, [t.NET]) == {t.NET: outcomes.CREATED}
    _expire(killed)
    ti = SweepTaskInstance({killed.owner.run: "failed"})
    params = {"project": project, "dry_run": False, "warm_ttl_hours": 24}
    context = {"ti": ti, "dag": SimpleNamespace(dag_id=SWEEPER_DAG_ID), "run_id": "manual__json", "params": params}
    with allowed_project(project), pytest.raises(TaskDeferred) as deferred:
        SweepOperator(task_id="sweep").execute(context)
    state = json.loads(json.dumps(ti.xcom[STATE_KEY]))
    assert Sweep.from_dict(state["sweep"]).to_dict() == state["sweep"]
    assert deferred.value.trigger.serialize()[1]["operation"]["resource"] == f"network {killed.spec.network}"


def test_an_adopted_cluster_loses_the_groups_objects_and_keeps_the_lustre_a_pv_there_names(
    sandbox: SandboxProcess, project: str
) -> None:
    from nemo_rl_gke.kube.client import KubeHook, ObjectRef
    from nemo_rl_gke.kube.objects import group_objects

    # Team B's cluster, with a PV of theirs that mounts the Lustre instance our group is about to make.
    theirs = start_run(project, deployment="team-b")
    assert set(_steps(theirs, [t.NET, t.GKE_CLUSTER]).values()) == {outcomes.CREATED}
    release(_hook(), project, theirs.owner, warm=False)
    their_pv = group_objects(theirs.spec, t.LUSTRE_STORAGE, theirs.owner, lustre_address="10.9.0.2")[0]
    their_pv = {**their_pv, "metadata": {**their_pv["metadata"], "name": "team-b-lustre-pv"}}
    their_pv["spec"] = {k: v for k, v in their_pv["spec"].items() if k != "claimRef"}
    kube = KubeHook(theirs.spec, _hook())
    kube.apply(their_pv)
    # Our run adopts their network and cluster, makes Lustre and its own PV/PVC there, and is killed.
    ours = start_run(project, adopt_existing=True)
    made = _steps(ours, [t.NET, t.PEERING_RANGE, t.PEERING, t.LUSTRE, t.GKE_CLUSTER])
    assert made[t.GKE_CLUSTER] == outcomes.ADOPTED and made[t.LUSTRE] == outcomes.CREATED
    applied, _ = run_step(ours, t.LUSTRE_STORAGE)
    assert [o["action"] for o in applied["objects"]] == ["created", "created"]
    pvc = ObjectRef("v1", "PersistentVolumeClaim", ours.spec.lustre_pvc, ours.spec.namespace)
    assert kube.get(pvc) is not None
    _expire(ours)
    # A dry run says the same about Lustre, and deletes nothing in the cluster.
    dry = sweep(project, {ours.owner.run: "failed"}, dry_run=True)
    assert dry.kept(ours.owner.group)[_labels(ours, [t.LUSTRE]).pop()] == outcomes.KEPT_FOR_LUSTRE
    assert kube.get(pvc) is not None

    result = sweep(project, {ours.owner.run: "failed"})

    group = result.group(ours.owner.group)
    lustre = _labels(ours, [t.LUSTRE]).pop()
    cluster = _labels(ours, [t.GKE_CLUSTER]).pop()
    kept = {k["resource"]: k for k in group["kept"]}
    assert kept[lustre]["action"] == outcomes.KEPT_FOR_LUSTRE
    assert kept[lustre]["reason"] == (
        f"PV team-b-lustre-pv in {cluster}, which stays, still names it: delete the PV first"
    )
    assert kept[cluster]["action"] == outcomes.KEPT_UNOWNED
    # Our own objects in the cluster that stays went first; theirs stayed.
    assert kube.get(pvc) is None
    assert kube.get(ObjectRef("v1", "PersistentVolume", ours.spec.lustre_pv)) is None
    assert kube.get(ObjectRef("v1", "PersistentVolume", "team-b-lustre-pv")) is not None
    assert group["notes"] == [
        f"{cluster} stays: the group's PersistentVolumeClaim {ours.spec.namespace}/{ours.spec.lustre_pvc}, "
        f"PersistentVolume {ours.spec.lustre_pv} deleted from it"
    ]
    assert ours.spec.lustre_name in project_resources(sandbox, project)

    # Once their PV is gone, the next sweep deletes the Lustre.
    kube.delete(ObjectRef("v1", "PersistentVolume", "team-b-lustre-pv"))
    again = sweep(project, {result.run: "success"})
    assert lustre in again.group(ours.owner.group)["deleted"]


def test_the_sweeper_refuses_a_project_the_deployment_does_not_allow(sandbox: SandboxProcess, project: str) -> None:
    ti = SweepTaskInstance({})
    params = {"project": project, "dry_run": True, "warm_ttl_hours": 24}
    context = {"ti": ti, "dag": SimpleNamespace(dag_id=SWEEPER_DAG_ID), "run_id": "manual__outside", "params": params}
    seq = sandbox.calls()[-1]["seq"] if sandbox.calls() else 0
    with pytest.raises(AirflowException, match=r"\[deployment.project\].*allowed_projects"):
        SweepOperator(task_id="sweep").execute(context)
    assert sandbox.calls(since=seq) == []
