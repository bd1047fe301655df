"""Runs that share a project: two deployments, two run groups, a held lease, a pending checkpoint, a shared peering.

Each scenario drives the real operators step by step against the sandbox (tests/operators/harness.py), with the
steps each scenario is about: the whole-DAG wiring of lease, teardown and release is covered by tests/e2e.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox.testing import SandboxProcess, start_sandbox

from nemo_rl_gke.airflow_compat import AirflowFailException
from nemo_rl_gke.gcp.lease import read_lease
from nemo_rl_gke.gcp.pending import CheckpointRecords
from nemo_rl_gke.observe.training_view import pending_checkpoints
from nemo_rl_gke.operators.rayjob import mark_checkpoint_pending
from nemo_rl_gke.run import outcomes
from nemo_rl_gke.run import topology as t
from sandbox import files
from tests.operators.harness import (
    DAG_ID,
    Run,
    gcp_conn,
    operator,
    project_resources,
    run_step,
    start_run,
)

__all__ = ["gcp_conn"]
pytestmark = pytest.mark.usefixtures("gcp_conn")
_projects = itertools.count(1)
LUSTRE_CHAIN = [t.NET, t.PEERING_RANGE, t.PEERING, t.LUSTRE]
LUSTRE_TEARDOWN = [t.DELETE_LUSTRE, t.DELETE_PEERING, t.DELETE_PEERING_RANGE, t.DELETE_NET]
# A second group on the same VPC: other Lustre and cluster names (so another range), the network adopted.
# The validator the validation job ships (run here as the job runs it, on the instance's files).
REMOTE = Path(__file__).resolve().parents[2] / "plugins" / "nemo_rl_gke" / "remote"
SECOND_GROUP = {"lustre_name": "nemo-rl-lustre-b", "cluster_name": "nemo-rl-cluster-b", "adopt_existing": True}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    with start_sandbox(tmp_path_factory.mktemp("ownership-sandbox"), latency_scale=0.0) as running:
        yield running


@pytest.fixture
def project(sandbox: SandboxProcess) -> Iterator[str]:
    """A project of the test's own; no fault outlives the test."""
    yield f"owners-{next(_projects):03d}"
    sandbox.clear_faults()


def _hook() -> Any:
    from nemo_rl_gke.gcp.hooks import GcpHook

    return GcpHook()


def _steps(run: Run, task_ids: list[str]) -> dict[str, str]:
    """Run each step once; the action each one reports."""
    return {task_id: run_step(run, task_id)[0]["action"] for task_id in task_ids}


def _writes_since(sandbox: SandboxProcess, seq: int) -> list[str]:
    return [f"{c['method']} {c['path']}" for c in sandbox.calls(since=seq) if c["method"] != "GET"]


def _last_seq(sandbox: SandboxProcess) -> int:
    calls = sandbox.calls()
    return calls[-1]["seq"] if calls else 0


def test_another_deployment_with_the_same_names_waits_for_the_lease_then_never_touches_what_it_finds(
    sandbox: SandboxProcess, project: str
) -> None:
    team_a = start_run(project, deployment="team-a", teardown_policy=t.KEEP_ALL)
    assert _steps(team_a, [t.NET]) == {t.NET: outcomes.CREATED}

    # Same names from another Airflow: the group's lease is held, so it fails at once, naming the holder, and
    # writes nothing at all.
    seq = _last_seq(sandbox)
    team_b = start_run(project, deployment="team-b", lease=False)
    with pytest.raises(AirflowFailException) as held:
        run_step(team_b, t.LEASE)
    assert f"held by run {DAG_ID}/{team_a.run_id} of deployment team-a" in str(held.value)
    assert "Nothing was touched" in str(held.value) and "lease_held=wait" in str(held.value)
    assert _writes_since(sandbox, seq) == []

    # Team A keeps its network and lets go of the lease (warm: it kept something).
    assert _steps(team_a, [t.DELETE_NET, t.RELEASE_LEASE]) == {
        t.DELETE_NET: outcomes.KEPT_BY_POLICY,
        t.RELEASE_LEASE: "released",
    }
    lease = read_lease(_hook(), project, team_a.owner.group)
    assert lease is not None and lease.warm and not lease.held_at(time.time())
    # The record names the group's resources: what a sweeper rebuilds them from when no run will tear them down.
    assert lease.names == team_a.spec.group_names and lease.names["network"] == "nemo-rl-net"

    # Now team B gets the lease, but the network is team A's: refused, and its teardown keeps it.
    assert run_step(team_b, t.LEASE)[0]["outcome"] == "acquired"
    with pytest.raises(AirflowFailException, match="deployment team-a"):
        run_step(team_b, t.NET)
    assert _steps(team_b, [t.DELETE_NET, t.RELEASE_LEASE])[t.DELETE_NET] == outcomes.KEPT_UNOWNED
    assert set(project_resources(sandbox, project)) == {"nemo-rl-net"}

    # Team A's next run reuses it and deletes it.
    again = start_run(project, deployment="team-a")
    assert _steps(again, [t.NET, t.DELETE_NET, t.RELEASE_LEASE]) == {
        t.NET: outcomes.EXISTS,
        t.DELETE_NET: outcomes.DELETED,
        t.RELEASE_LEASE: "released",
    }
    assert project_resources(sandbox, project) == {}


def test_two_groups_share_the_vpc_s_peering_connection_and_each_tears_down_only_its_range(
    sandbox: SandboxProcess, project: str
) -> None:
    first = start_run(project)
    assert set(_steps(first, [t.NET, t.PEERING_RANGE, t.PEERING]).values()) == {outcomes.CREATED}
    # Another group in the same deployment runs side by side: its own lease, the VPC adopted, its own range added
    # to the VPC's one Service Networking connection.
    second = start_run(project, **SECOND_GROUP)
    assert second.owner.group != first.owner.group
    assert _steps(second, [t.NET, t.PEERING_RANGE, t.PEERING]) == {
        t.NET: outcomes.ADOPTED,
        t.PEERING_RANGE: outcomes.CREATED,
        t.PEERING: outcomes.CREATED,
    }
    connection = first.resources()[t.PEERING]
    ranges = set(connection.get(_hook())["reservedPeeringRanges"])
    assert ranges == {first.spec.peering_range, second.spec.peering_range}

    # The second group's teardown takes only its own range out of the connection, and keeps the adopted VPC.
    assert _steps(second, [t.DELETE_PEERING, t.DELETE_PEERING_RANGE, t.DELETE_NET]) == {
        t.DELETE_PEERING: outcomes.DELETED,
        t.DELETE_PEERING_RANGE: outcomes.DELETED,
        t.DELETE_NET: outcomes.KEPT_UNOWNED,
    }
    assert connection.get(_hook())["reservedPeeringRanges"] == [first.spec.peering_range]
    # The first group's teardown removes the last range, so the connection goes with it.
    assert set(_steps(first, [t.DELETE_PEERING, t.DELETE_PEERING_RANGE, t.DELETE_NET]).values()) == {outcomes.DELETED}
    assert project_resources(sandbox, project) == {}


def test_a_pending_checkpoint_survives_the_next_runs_failure_and_teardown_until_its_run_is_named(
    sandbox: SandboxProcess, project: str
) -> None:
    trained = start_run(project)
    assert set(_steps(trained, LUSTRE_CHAIN).values()) == {outcomes.CREATED}
    # What the submit step does before the job writes its first checkpoint; the export then failed.
    mark_checkpoint_pending(operator(t.SUBMIT), trained.context(t.SUBMIT), trained.spec, 20)
    kept = _steps(trained, [*LUSTRE_TEARDOWN, t.RELEASE_LEASE])
    assert kept[t.DELETE_LUSTRE] == outcomes.KEPT_FOR_CHECKPOINT
    assert {kept[k] for k in LUSTRE_TEARDOWN[1:]} == {outcomes.KEPT_FOR_LUSTRE}

    # Tomorrow's run of the group fails after finding Lustre; accepting the loss of *its own* checkpoint does not
    # release yesterday's.
    tomorrow = start_run(project, accept_checkpoint_loss=True)
    assert _steps(tomorrow, LUSTRE_CHAIN)[t.LUSTRE] == outcomes.EXISTS
    result, _ = run_step(tomorrow, t.DELETE_LUSTRE)
    assert result["action"] == outcomes.KEPT_FOR_CHECKPOINT
    assert f"release_checkpoint_of_run='{DAG_ID}/{trained.run_id}'" in result["reason"]
    _steps(tomorrow, [*LUSTRE_TEARDOWN[1:], t.RELEASE_LEASE])
    assert "nemo-rl-lustre" in project_resources(sandbox, project)

    # Naming the run releases it: that run's teardown deletes it all.
    release = start_run(project, release_checkpoint_of_run=f"{DAG_ID}/{trained.run_id}")
    _steps(release, LUSTRE_CHAIN)
    assert set(_steps(release, LUSTRE_TEARDOWN).values()) == {outcomes.DELETED}
    assert project_resources(sandbox, project) == {}


def test_a_run_that_waits_for_a_held_group_takes_it_when_the_holder_lets_go(
    sandbox: SandboxProcess, project: str
) -> None:
    holder = start_run(project)
    waiter = start_run(project, lease=False, lease_held="wait", lease_wait_s=60)
    seq = _last_seq(sandbox)
    release = threading.Timer(1.0, run_step, args=(holder, t.RELEASE_LEASE))
    release.start()
    try:
        result, deferred = run_step(waiter, t.LEASE)
    finally:
        release.join()
    assert deferred is not None and result["outcome"] == "acquired"
    # While it waited it wrote nothing but the lease it took in the end.
    assert [w for w in _writes_since(sandbox, seq) if "setCommonInstanceMetadata" not in w] == []
    lease = read_lease(_hook(), project, waiter.owner.group)
    assert lease is not None and lease.holds(waiter.owner)


def test_a_held_group_skips_the_run_when_the_conf_says_skip(sandbox: SandboxProcess, project: str) -> None:
    start_run(project)
    skipper = start_run(project, lease=False, lease_held="skip")
    seq = _last_seq(sandbox)
    assert run_step(skipper, t.LEASE) == ("skipped", None)
    assert _writes_since(sandbox, seq) == []


# --- many pending checkpoints on one instance (issue 18) -----------------------------------------------------------
def _lustre_dir(sandbox: SandboxProcess, run: Run) -> Path:
    """The sandbox's directory standing for the instance's filesystem (what the pods mount as /data)."""
    return files.lustre_dir(sandbox.state_dir, run.spec.project, run.spec.zone, run.spec.lustre_name)


def _trained(sandbox: SandboxProcess, run: Run, step: int, checkpoint_dir: str | None = None) -> None:
    """What the job leaves on Lustre: ``checkpoint_dir/step_N`` with a file in it."""
    where = (checkpoint_dir or run.spec.checkpoint_dir).removeprefix("/data").strip("/")
    step_dir = _lustre_dir(sandbox, run) / where / f"step_{step}"
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / "training_info.json").write_text(json.dumps({"total_steps": step}))


def _submit(sandbox: SandboxProcess, run: Run, step: int) -> None:
    """The submit step's record, then the job's checkpoint."""
    mark_checkpoint_pending(operator(t.SUBMIT), run.context(t.SUBMIT), run.spec, step)
    _trained(sandbox, run, step)


def _export(run: Run, step: int) -> dict[str, Any]:
    """The real export step (Lustre exportData, deferred), after a job that ended at ``step``."""
    run.xcom[(t.WAIT, t.RETURN)] = {"final_step": step, "converged_at": None}
    run.xcom[(t.CHECK_CHECKPOINT, t.RETURN)] = {"valid": True, "step": step}  # only a validated step is exported
    result, deferred = run_step(run, t.EXPORT)
    assert deferred is not None and result["action"] == outcomes.EXPORTED, result
    return result


def _pending(run: Run) -> list[tuple[str, int, str]]:
    """The pending checkpoints the instance's records list: (run, step, directory)."""
    lustre = run.resources()[t.LUSTRE]
    actual = lustre.get(_hook())
    assert actual is not None
    return sorted((r.run, r.step, r.path) for r in lustre.records(_hook(), actual) if r.pending)  # type: ignore[attr-defined]


def _listing(sandbox: SandboxProcess, run: Run) -> None:
    """The validation job's report, as the real validator prints it when run on the instance's filesystem (what the
    Ray job does on the cluster): it lists every step_N there for teardown to compare."""
    from nemo_rl_gke.remote.report import find_report

    mount = _lustre_dir(sandbox, run)
    # As the job runs it: python -m remote from the directory that holds the folder (the job's working_dir).
    ran = subprocess.run(
        [sys.executable, "-m", "remote", "validate", str(mount / run.spec.checkpoint_dir.removeprefix("/data/")),
         "--list-steps", str(mount)],
        capture_output=True, text=True, check=False, timeout=120, cwd=REMOTE.parent,
    )  # fmt: skip
    report = find_report(ran.stdout)
    assert report is not None, ran.stderr
    run.xcom[(t.CHECK_CHECKPOINT, t.CHECKPOINT_REPORT)] = report


def test_a_second_run_on_the_instance_keeps_the_first_runs_pending_checkpoint(
    sandbox: SandboxProcess, project: str
) -> None:
    first = start_run(project, checkpoint_dir="/data/nemo_rl_gemma3_27b_3_17")
    assert set(_steps(first, LUSTRE_CHAIN).values()) == {outcomes.CREATED}
    _submit(sandbox, first, 10)
    # Its export failed: teardown keeps the instance for run 1.
    assert _steps(first, [*LUSTRE_TEARDOWN, t.RELEASE_LEASE])[t.DELETE_LUSTRE] == outcomes.KEPT_FOR_CHECKPOINT

    # Run 2, same group, the next experiment's directory: it trains, exports, and tears down.
    second = start_run(project, checkpoint_dir="/data/next_experiment")
    assert _steps(second, LUSTRE_CHAIN)[t.LUSTRE] == outcomes.EXISTS
    _submit(sandbox, second, 10)
    _export(second, 10)
    result, _ = run_step(second, t.DELETE_LUSTRE)

    assert result["action"] == outcomes.KEPT_FOR_CHECKPOINT
    assert f"run {first.owner.run}, step 10, /data/nemo_rl_gemma3_27b_3_17/step_10" in result["reason"]
    assert second.owner.run not in result["reason"]
    assert second.spec.lustre_name in project_resources(sandbox, project)
    assert _pending(second) == [(first.owner.run, 10, first.spec.checkpoint_dir)]
    # What the Training view and the run report list: every pending checkpoint, with the conf that releases it.
    assert pending_checkpoints(result) == [
        {"run": first.owner.run, "step": 10, "where": "/data/nemo_rl_gemma3_27b_3_17/step_10",
         "release": f"release_checkpoint_of_run='{first.owner.run}'"}
    ]  # fmt: skip
    assert (_lustre_dir(sandbox, first) / "nemo_rl_gemma3_27b_3_17/step_10/training_info.json").exists()


def test_three_runs_two_failed_exports_keep_the_instance_until_both_are_released(
    sandbox: SandboxProcess, project: str
) -> None:
    runs = []
    for n, exported in ((1, False), (2, True), (3, False)):
        run = start_run(project, checkpoint_dir=f"/data/exp_{n}")
        _steps(run, LUSTRE_CHAIN)
        _submit(sandbox, run, 5)
        if exported:
            _export(run, 5)
        assert _steps(run, [*LUSTRE_TEARDOWN, t.RELEASE_LEASE])[t.DELETE_LUSTRE] == outcomes.KEPT_FOR_CHECKPOINT
        runs.append(run)
    one, _, three = runs
    assert _pending(three) == sorted([(one.owner.run, 5, "/data/exp_1"), (three.owner.run, 5, "/data/exp_3")])

    # Releasing run 1 leaves run 3's checkpoint: still kept, and the reason names only run 3 now.
    release_one = start_run(project, release_checkpoint_of_run=one.owner.run)
    _steps(release_one, LUSTRE_CHAIN)
    result, _ = run_step(release_one, t.DELETE_LUSTRE)
    assert result["action"] == outcomes.KEPT_FOR_CHECKPOINT
    assert f"release_checkpoint_of_run='{three.owner.run}'" in result["reason"]
    assert f"release_checkpoint_of_run='{one.owner.run}'" not in result["reason"]
    # A release is final: the released record is gone even though the instance stays for run 3.
    assert _pending(release_one) == [(three.owner.run, 5, "/data/exp_3")]
    _steps(release_one, [*LUSTRE_TEARDOWN[1:], t.RELEASE_LEASE])

    # Releasing run 3 as well: nothing pending is left, so the instance and what it needs go, its records with it.
    release_three = start_run(project, release_checkpoint_of_run=three.owner.run)
    _steps(release_three, LUSTRE_CHAIN)
    assert _pending(release_three) == [(three.owner.run, 5, "/data/exp_3")]
    assert set(_steps(release_three, LUSTRE_TEARDOWN).values()) == {outcomes.DELETED}
    assert project_resources(sandbox, project) == {}
    assert CheckpointRecords(_hook(), release_three.spec, None).names() == []


def test_a_step_directory_no_record_names_keeps_the_instance(sandbox: SandboxProcess, project: str) -> None:
    run = start_run(project)
    _steps(run, LUSTRE_CHAIN)
    _submit(sandbox, run, 10)
    # A directory whose record was lost in a crash: it is on the instance, and nothing names it.
    _trained(sandbox, run, 7, "/data/crashed_run")
    _export(run, 10)
    _listing(sandbox, run)
    listed = run.xcom[(t.CHECK_CHECKPOINT, t.CHECKPOINT_REPORT)]["steps_present"]
    assert listed == ["/crashed_run/step_7", "/nemo_rl_gemma3_27b_3_17/step_10"]

    result, _ = run_step(run, t.DELETE_LUSTRE)

    # Its own step_10 is exported (a receipt accounts for it); step_7 is neither exported nor released.
    assert result["action"] == outcomes.KEPT_FOR_CHECKPOINT
    assert f"listed by run {run.owner.run}: /crashed_run/step_7" in result["reason"]
    assert "step_10" not in result["reason"]
    assert _pending(run) == [(run.owner.run, 0, "")]
    _steps(run, [*LUSTRE_TEARDOWN[1:], t.RELEASE_LEASE])
    # Accepting the loss of its own checkpoint does not release what nobody recorded; naming the run does.
    careless = start_run(project, accept_checkpoint_loss=True)
    _steps(careless, LUSTRE_CHAIN)
    assert run_step(careless, t.DELETE_LUSTRE)[0]["action"] == outcomes.KEPT_FOR_CHECKPOINT
    _steps(careless, [*LUSTRE_TEARDOWN[1:], t.RELEASE_LEASE])
    release = start_run(project, release_checkpoint_of_run=run.owner.run)
    _steps(release, LUSTRE_CHAIN)
    assert set(_steps(release, LUSTRE_TEARDOWN).values()) == {outcomes.DELETED}


def test_resume_none_on_a_warm_lustre_holding_steps_does_not_resume(sandbox: SandboxProcess, project: str) -> None:
    from nemo_rl_gke.plan.ray_job import LINEAGE_EXIT, job_request
    from nemo_rl_gke.run.recipes import load_recipe

    yesterday = start_run(project, teardown_policy=t.KEEP_WARM)
    _steps(yesterday, LUSTRE_CHAIN)
    _submit(sandbox, yesterday, 10)
    _export(yesterday, 10)
    assert _steps(yesterday, [*LUSTRE_TEARDOWN, t.RELEASE_LEASE])[t.DELETE_LUSTRE] == outcomes.KEPT_BY_POLICY
    # Today's run asks for a fresh start in the same directory of the warm instance.
    fresh = start_run(project, resume="none")
    assert _steps(fresh, [*LUSTRE_CHAIN, t.RESUME])[t.RESUME] == outcomes.NOT_NEEDED
    resumed = (fresh.xcom[(t.RESUME, t.RETURN)].get("resumed_from") or {}).get("step")
    job = job_request(fresh.spec, load_recipe(fresh.spec.recipe), DAG_ID, fresh.run_id, resumed_step=resumed)

    # The job's entrypoint, run where the sandbox's Ray runs it: /data is the instance's directory.
    ran = subprocess.run(
        ["bash", "-c", job.entrypoint],
        env={"PATH": "/usr/bin:/bin", "SANDBOX_DATA_DIR": str(_lustre_dir(sandbox, fresh))},
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip

    assert ran.returncode == LINEAGE_EXIT, (ran.returncode, ran.stderr)
    assert ran.stderr.strip() == (
        "nemo-rl-gke: not started: resume=none starts from step 0, but checkpoint_dir /data/nemo_rl_gemma3_27b_3_17 "
        "already holds step_10, which NeMo RL would resume from. Fix: a checkpoint_dir of its own for this run, or "
        "resume=latest to continue that lineage."
    )
    assert ran.stdout == ""


# --- the deployment's bounds (issue 19) ------------------------------------------------------------------------------
# A second group of the same deployment in the same project: other names, so another lease.
OTHER_GROUP = {"cluster_name": "nemo-rl-cluster-b", "lustre_name": "nemo-rl-lustre-b"}
TOTAL_ENV = "AIRFLOW__NEMO_RL_GKE__MAX_GPU_NODES_TOTAL"


def _validate(conf: dict[str, Any]) -> Any:
    """The DAG's validate task on a raw conf (its params), as Airflow runs it."""
    run = Run({}, f"manual__bounds-{next(_projects)}")
    context = {**run.context(t.VALIDATE), "params": conf, "dag_run": None}
    task = operator(t.VALIDATE)
    task.pre_execute(context)
    return task.execute(context), run


BASE_CONF = {"region": "us-central1", "zone": "us-central1-b", "reservation": "gpu-res"}


@pytest.mark.parametrize(
    ("conf", "settings", "rule_id", "named"),
    [
        ({"project": "someone-elses-proj"}, {}, "deployment.project", "allowed_projects"),
        ({"project": "sandbox", "export_bucket": "outsider-drop-box"}, {}, "deployment.export-bucket", "allowed_e"),
        ({"project": "sandbox", "region": "europe-west4", "zone": "europe-west4-b"}, {}, "deployment.region", "regi"),
        ({"project": "sandbox", "worker_replicas": 3, "gpu_pool_max_nodes": 3}, {}, "deployment.gpu-nodes", "per_run"),
        (
            {"project": "sandbox", "recipe": "qwen2.5-7b-gsm8k-v0.7.0", "dtensor_tp": 4, "vllm_tp": 4},
            {"ALLOWED_RECIPES": "gemma3-27b-gsm8k-v0.5.0"},
            "deployment.recipe",
            "allowed_recipes",
        ),
    ],
)
def test_the_validate_task_refuses_a_conf_outside_the_bounds_before_any_call(
    sandbox: SandboxProcess,
    monkeypatch: pytest.MonkeyPatch,
    conf: dict[str, Any],
    settings: dict[str, str],
    rule_id: str,
    named: str,
) -> None:
    for name, value in settings.items():
        monkeypatch.setenv(f"AIRFLOW__NEMO_RL_GKE__{name}", value)
    seq = _last_seq(sandbox)
    with pytest.raises(AirflowFailException) as refused:
        _validate({**BASE_CONF, **conf})
    text = str(refused.value)
    assert f"[{rule_id}]" in text and named in text and "deployment's operator" in text, text
    # Refused before anything exists: not one call reached the sandbox (not even a read).
    assert sandbox.calls(since=seq) == []


def test_the_google_connections_project_is_allowed_by_default(sandbox: SandboxProcess) -> None:
    # The harness's connection names project "sandbox": the same conf there is accepted, and only there.
    seq = _last_seq(sandbox)
    accepted, _ = _validate({**BASE_CONF, "project": "sandbox"})
    assert accepted["project"] == "sandbox" and accepted["export_bucket"] == ""
    assert sandbox.calls(since=seq) == []


def test_a_second_run_that_would_pass_the_gpu_total_fails_per_lease_held_and_writes_nothing(
    sandbox: SandboxProcess, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOTAL_ENV, "3")
    first = start_run(project)  # 2 GPU nodes of 3
    lease = read_lease(_hook(), project, first.owner.group)
    assert lease is not None and lease.gpu_nodes == 2
    second = start_run(project, lease=False, **OTHER_GROUP)
    assert second.owner.group != first.owner.group
    seq = _last_seq(sandbox)
    with pytest.raises(AirflowFailException) as refused:
        run_step(second, t.LEASE)
    assert "max_gpu_nodes_total of 3" in str(refused.value) and f"{DAG_ID}/{first.run_id} (2)" in str(refused.value)
    assert _writes_since(sandbox, seq) == []
    skipper = start_run(project, lease=False, lease_held="skip", **OTHER_GROUP)
    assert run_step(skipper, t.LEASE) == ("skipped", None)
    # Another deployment's runs are not counted against this one's total.
    other = start_run(project, deployment="team-b", **OTHER_GROUP)
    assert read_lease(_hook(), project, other.owner.group).holds(other.owner)


def test_a_second_run_that_would_pass_the_gpu_total_waits_deferred_until_the_first_lets_go(
    sandbox: SandboxProcess, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOTAL_ENV, "3")
    first = start_run(project)
    waiter = start_run(project, lease=False, lease_held="wait", lease_wait_s=60, **OTHER_GROUP)
    release = threading.Timer(1.0, run_step, args=(first, t.RELEASE_LEASE))
    release.start()
    try:
        result, deferred = run_step(waiter, t.LEASE)
    finally:
        release.join()
    assert deferred is not None and result["outcome"] == "acquired"
    kwargs = deferred.trigger.serialize()[1]
    assert (kwargs["gpu_nodes"], kwargs["max_gpu_nodes_total"], kwargs["deployment"]) == (2, 3, "default")
    assert read_lease(_hook(), project, waiter.owner.group).gpu_nodes == 2


def test_two_runs_racing_for_the_gpu_total_cannot_both_take_their_lease(sandbox: SandboxProcess, project: str) -> None:
    from nemo_rl_gke.gcp.lease import GpuNodesBoundError, acquire

    runs = [start_run(project, lease=False), start_run(project, lease=False, **OTHER_GROUP)]
    barrier = threading.Barrier(2)
    outcomes_seen: list[str] = []

    def take(run: Run) -> None:
        hook = _hook()
        barrier.wait()
        try:
            acquire(hook, project, run.owner, 600, gpu_nodes=run.spec.gpu_nodes, max_gpu_nodes_total=3)
            outcomes_seen.append("acquired")
        except GpuNodesBoundError:
            outcomes_seen.append("refused")

    threads = [threading.Thread(target=take, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes_seen) == ["acquired", "refused"]
    held = [read_lease(_hook(), project, run.owner.group) for run in runs]
    assert sum(1 for lease in held if lease is not None and lease.held_at(time.time())) == 1


def test_a_teardown_that_left_nothing_removes_the_groups_lease_record(sandbox: SandboxProcess, project: str) -> None:
    # Leases of groups that no longer exist would fill the project's metadata (512 KB, shared with everything).
    run = start_run(project)
    assert _steps(run, [t.NET]) == {t.NET: outcomes.CREATED}
    deletes = [s.task_id for s in t.teardown_steps() if s.op is t.Op.DELETE_GCP]
    done = _steps(run, [*deletes, t.RELEASE_LEASE])
    assert {done[d] for d in deletes} <= set(outcomes.GONE) and done[t.RELEASE_LEASE] == "removed"
    assert read_lease(_hook(), project, run.owner.group) is None
