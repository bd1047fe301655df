"""The GCP and live-preflight operators against the real local sandbox: real clients, real HTTP, real deferrals.

See tests/operators/harness.py for how a step runs here (only the task instance is a stand-in).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from sandbox.testing import SandboxProcess, request_json, start_sandbox

from nemo_rl_gke.airflow_compat import AirflowException, AirflowFailException
from nemo_rl_gke.operators.base import DEFERRAL_BACKSTOP_S, LEASE_MARGIN_S, LEASE_RENEW_AHEAD_S
from nemo_rl_gke.run import outcomes
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.times import epoch_of
from nemo_rl_gke.triggers.operations import OperationTrigger
from tests.operators.harness import (
    POLL,
    REGION,
    ZONE,
    Run,
    gcp_conn,
    operator,
    project_resources,
    run_step,
    start_run,
    trigger_events,
)
from tests.paths import ROOT

__all__ = ["gcp_conn"]
pytestmark = pytest.mark.usefixtures("gcp_conn")
_projects = itertools.count(1)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    with start_sandbox(tmp_path_factory.mktemp("gcp-sandbox"), latency_scale=0.0) as running:
        yield running


@pytest.fixture
def project() -> str:
    """A fresh project per test: the sandbox scopes every resource by project, so tests cannot see each other's."""
    return f"op-test-{next(_projects):03d}"


def spec_of(run: Run) -> RunSpec:
    return RunSpec.from_conf(run.xcom[(t.VALIDATE, t.RETURN)])


def live(sandbox: SandboxProcess, project: str) -> dict[str, dict[str, Any]]:
    return project_resources(sandbox, project)


def deletes(sandbox: SandboxProcess, project: str, since: int) -> list[str]:
    return [c["path"] for c in sandbox.calls(since) if c["method"] == "DELETE" and f"/{project}/" in c["path"]]


# --- ensure ----------------------------------------------------------------------------------------------------
def test_ensure_defers_while_the_operation_runs(sandbox: SandboxProcess, project: str) -> None:
    """No worker slot during the wait: execute() hands the running create to the triggerer and returns at once."""
    sandbox.add_fault({"method": "POST", "path": f"/projects/{project}/global/networks$"}, operation="hang")
    run = start_run(project, network_timeout_s=321)
    spec = spec_of(run)

    started = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        operator(t.NET).execute(run.context(t.NET))
    # It deferred while the create still runs (the fault keeps that operation going), so it never waited on it.
    creates = [o for o in sandbox.operations() if o["target"].endswith(f"/networks/{spec.network}")]
    assert [o["status"] for o in creates] == ["RUNNING"], creates

    trigger = deferred.value.trigger
    assert isinstance(trigger, OperationTrigger)
    assert deferred.value.method_name == "execute_complete"
    # The result so far waits in XCom: `airflow dags test` drops deferral kwargs.
    assert run.xcom[(t.NET, t.PENDING)] == {"key": t.NET, "name": "nemo-rl-net", "action": outcomes.CREATED}
    assert trigger.poll_interval == spec.poll_interval_s == POLL
    assert trigger.timeout == spec.network_timeout_s == 321
    assert started <= trigger.started_at <= time.time()
    assert deferred.value.timeout == timedelta(seconds=321 + DEFERRAL_BACKSTOP_S)
    classpath, kwargs = trigger.serialize()
    assert classpath == "nemo_rl_gke.triggers.operations.OperationTrigger"
    assert kwargs["operation"]["path"].startswith(f"/compute/v1/projects/{project}/global/operations/")
    assert kwargs["operation"]["resource"] == "network nemo-rl-net"
    assert live(sandbox, project)["nemo-rl-net"]["phase"] != "ready"

    async def still_waiting() -> None:
        task = asyncio.create_task(anext(trigger.run()))
        await asyncio.sleep(0.5)
        assert not task.done()  # polled for half a second, the operation still runs: no event
        task.cancel()

    asyncio.run(still_waiting())


def test_ensure_creates_every_operation_shape_then_finds_them(sandbox: SandboxProcess, project: str) -> None:
    """compute, longrunning (Service Networking, Lustre) and container operations, each through defer and resume."""
    run = start_run(project, network_timeout_s=111, storage_timeout_s=222, cluster_timeout_s=333)
    timeouts = {t.NET: 111, t.PEERING_RANGE: 222, t.PEERING: 222, t.LUSTRE: 222, t.GKE_CLUSTER: 333}
    for key, timeout in timeouts.items():
        result, deferred = run_step(run, key)
        assert deferred is not None, key
        assert {k: v for k, v in result.items() if k != "ready_at"} == {
            "key": key,
            "name": result["name"],
            "action": outcomes.CREATED,
        }
        assert epoch_of(result["ready_at"]) is not None
        assert deferred.trigger.timeout == timeout
    assert {"nemo-rl-net", "nemo-rl-lustre-range", "nemo-rl-lustre", "nemo-rl-cluster"} <= set(live(sandbox, project))

    # Idempotent: a re-run (task retry, second DAG run) finds each resource ready and does not defer at all.
    for key in (t.NET, t.LUSTRE, t.GKE_CLUSTER):
        result, deferred = run_step(run, key)
        assert deferred is None
        assert result["action"] == outcomes.EXISTS


def test_operation_error_fails_without_retry(sandbox: SandboxProcess, project: str) -> None:
    sandbox.add_fault(
        {"method": "POST", "path": f"/projects/{project}/global/networks$"},
        operation="error",
        message="Quota 'NETWORKS' exceeded. Limit: 5.0 globally.",
        error_status="RESOURCE_EXHAUSTED",
    )
    with pytest.raises(AirflowFailException) as failure:
        run_step(start_run(project), t.NET)
    message = str(failure.value)
    assert f"network nemo-rl-net ({t.NET})" in message
    assert "Quota 'NETWORKS' exceeded" in message
    assert f"/compute/v1/projects/{project}/global/operations/" in message
    assert "last state DONE" in message


def test_timeout_fails_retryably_naming_the_resource_and_its_state(sandbox: SandboxProcess, project: str) -> None:
    sandbox.add_fault({"method": "POST", "path": f"/projects/{project}/locations/{REGION}/clusters$"}, operation="hang")
    run = start_run(project)
    run_step(run, t.NET)
    with pytest.raises(TaskDeferred) as deferred:
        operator(t.GKE_CLUSTER).execute(run.context(t.GKE_CLUSTER))
    # The spec's cluster timeout is an hour; the same trigger with a short deadline stands in for the wait.
    _, kwargs = deferred.value.trigger.serialize()
    event = trigger_events(OperationTrigger(**{**kwargs, "timeout": 0.3, "started_at": time.time()}))[0]
    assert event["status"] == "timeout"

    with pytest.raises(AirflowException) as failure:
        operator(t.GKE_CLUSTER).execute_complete(run.context(t.GKE_CLUSTER), event=event)
    # Retryable (not AirflowFailException): a retry re-runs ensure, which finds the cluster and waits on it again.
    assert not isinstance(failure.value, AirflowFailException)
    message = str(failure.value)
    assert f"GKE cluster nemo-rl-cluster ({t.GKE_CLUSTER})" in message
    assert "timeout" in message
    assert f"last state {event['state']}" in message
    assert event["state"] in {"PENDING", "RUNNING"}


def test_polling_error_event_fails_retryably(project: str) -> None:
    event = {
        "status": "error",
        "message": "polling operation /v1/x on GKE cluster nemo-rl-cluster failed, not retried: HTTP 403: denied",
        "operation": {"service": "container", "path": "/v1/x", "shape": "container", "resource": "GKE cluster"},
        "state": "RUNNING",
    }
    run = start_run(project)
    with pytest.raises(AirflowException) as failure:
        operator(t.GKE_CLUSTER).execute_complete(run.context(t.GKE_CLUSTER), event=event)
    assert not isinstance(failure.value, AirflowFailException)
    assert "HTTP 403: denied" in str(failure.value)
    assert "last state RUNNING" in str(failure.value)


def test_a_raycluster_that_timed_out_fails_for_good_with_what_is_stuck(project: str) -> None:
    # The readiness message says what is stuck (tests/gcp/test_kube.py builds it against the sandbox): a retry would
    # only wait again, so it is final, and teardown runs on the failed task as after any other.
    stuck = "missing HeadPodReady (False, HeadPodNotReady); Unschedulable: 0/2 nodes are available"
    run = start_run(project)
    with pytest.raises(AirflowFailException) as failure:
        event = {"status": "timeout", "message": stuck}
        operator(t.RAYCLUSTER).execute_complete(run.context(t.RAYCLUSTER), event=event)
    assert str(failure.value) == f"timeout: {stuck}"


def test_unowned_resource_fails_fast_and_survives_teardown(sandbox: SandboxProcess, project: str) -> None:
    # Someone else's network of the same name: no ownership marker in its description.
    request_json(
        f"{sandbox.url}/compute/v1/projects/{project}/global/networks",
        "POST",
        {"name": "nemo-rl-net", "autoCreateSubnetworks": True, "description": "the platform team's"},
    )
    run = start_run(project)
    with pytest.raises(AirflowFailException, match=r"not this run group's"):
        run_step(run, t.NET)

    since = len(sandbox.calls())
    result, deferred = run_step(run, t.DELETE_NET)
    assert deferred is None and result["action"] == outcomes.KEPT_UNOWNED
    assert result["reason"] == (
        "network nemo-rl-net (network.net): not this run group's (no owner record of this package in its "
        "description): never deleted"
    )
    assert deletes(sandbox, project, since) == []
    assert "nemo-rl-net" in live(sandbox, project)


# --- delete ----------------------------------------------------------------------------------------------------
def test_delete_defers_and_deletes_in_teardown_order(sandbox: SandboxProcess, project: str) -> None:
    run = start_run(project, teardown_timeout_s=777)
    for key in (t.NET, t.PEERING_RANGE, t.PEERING, t.LUSTRE, t.GKE_CLUSTER):
        run_step(run, key)
    for key in (t.DELETE_LUSTRE, t.DELETE_PEERING, t.DELETE_PEERING_RANGE, t.DELETE_CLUSTER, t.DELETE_NET):
        result, deferred = run_step(run, key)
        assert deferred is not None, key
        assert deferred.trigger.timeout == 777
        assert result["action"] == outcomes.DELETED
    assert live(sandbox, project) == {}

    # 404 is success: deleting what is already gone needs no operation and no deferral.
    result, deferred = run_step(run, t.DELETE_NET)
    assert (result["action"], deferred) == (outcomes.ABSENT, None)


@pytest.mark.parametrize("policy", [t.KEEP_WARM, t.KEEP_ALL])
def test_delete_honours_keeping_policies(sandbox: SandboxProcess, project: str, policy: str) -> None:
    run = start_run(project, teardown_policy=policy)
    for key in (t.NET, t.GKE_CLUSTER):
        run_step(run, key)
    since = len(sandbox.calls())
    for key in (t.DELETE_CLUSTER, t.DELETE_NET):
        result, deferred = run_step(run, key)
        assert (result["action"], deferred) == (outcomes.KEPT_BY_POLICY, None)
    assert deletes(sandbox, project, since) == []
    assert {"nemo-rl-net", "nemo-rl-cluster"} <= set(live(sandbox, project))


@pytest.mark.parametrize(
    ("policy", "action"),
    [(t.DELETE_ALL, outcomes.NOT_NEEDED), (t.KEEP_WARM, outcomes.ABSENT), (t.KEEP_ALL, outcomes.KEPT_BY_POLICY)],
)
def test_the_pool_s_scale_step_does_what_its_step_facts_say_and_holds_the_lease(
    sandbox: SandboxProcess, project: str, policy: str, action: str
) -> None:
    """delete_all: the pool goes with its cluster; keep_cluster_and_storage: scaled down (here: no pool, so absent);
    keep_all: kept as it is. Either way the step renews the group's lease first (its step holds it)."""
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.gcp.lease import read_lease

    assert t.step(t.SCALE_POOL).holds_lease
    run = start_run(project, teardown_policy=policy)
    before = read_lease(GcpHook(), project, run.owner.group)
    result, deferred = run_step(run, t.SCALE_POOL)
    assert (result["action"], deferred) == (action, None)
    after = read_lease(GcpHook(), project, run.owner.group)
    assert before is not None and after is not None and after.expires_at > before.expires_at


def test_a_step_that_renews_writes_the_lease_ahead_so_the_next_steps_only_read_it(
    sandbox: SandboxProcess, project: str
) -> None:
    """Each step checks it still holds the lease (a read); only a renewal that would fall short writes, and it writes
    LEASE_RENEW_AHEAD_S past what the step needs, so the steps that follow within minutes write nothing."""
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.gcp.lease import read_lease

    run = start_run(project)
    since = len(sandbox.calls())
    steps = [t.NET, t.GVNIC_NET, t.RDMA_NET]
    for key in steps:
        run_step(run, key)
    made = sandbox.calls(since)
    writes = [c for c in made if c["path"].endswith("/setCommonInstanceMetadata")]
    reads = [c for c in made if c["method"] == "GET" and c["path"] == f"/compute/v1/projects/{project}"]
    assert len(writes) == 1 and len(reads) >= len(steps), [(c["method"], c["path"]) for c in made]
    lease = read_lease(GcpHook(), project, run.owner.group)
    assert lease is not None
    needed = time.time() + DEFERRAL_BACKSTOP_S + LEASE_MARGIN_S
    assert lease.expires_at > needed + LEASE_RENEW_AHEAD_S / 2


def test_failed_delete_is_retryable_and_names_the_resource(sandbox: SandboxProcess, project: str) -> None:
    run = start_run(project)
    run_step(run, t.NET)
    sandbox.add_fault(
        {"method": "DELETE", "path": f"/projects/{project}/global/networks/nemo-rl-net$"},
        operation="error",
        message="The network resource is already being used by 'firewall-x'",
    )
    with pytest.raises(AirflowException) as failure:
        run_step(run, t.DELETE_NET)
    assert not isinstance(failure.value, AirflowFailException)
    assert f"network nemo-rl-net ({t.NET})" in str(failure.value)
    assert "already being used" in str(failure.value)
    assert "nemo-rl-net" in live(sandbox, project)
    # The retry succeeds once the fault is gone.
    result, _ = run_step(run, t.DELETE_NET)
    assert result["action"] == outcomes.DELETED


def test_delete_whose_operation_failed_but_resource_is_gone_succeeds(sandbox: SandboxProcess, project: str) -> None:
    run = start_run(project)
    event = {"status": "error", "message": "operation failed: NOT_FOUND", "operation": {}, "state": "DONE"}
    result = operator(t.DELETE_NET).execute_complete(run.context(t.DELETE_NET), event=event)
    assert result == {"key": t.NET, "name": "nemo-rl-net", "action": outcomes.DELETED}


# --- preflight_live --------------------------------------------------------------------------------------------
def test_preflight_live_fails_with_every_finding(sandbox: SandboxProcess, project: str) -> None:
    # No reservation anywhere, and a zone without the RoCE network profile: two problems, reported together.
    run = start_run(project, zone="us-central1-c")
    with pytest.raises(AirflowFailException) as failure:
        run_step(run, t.PREFLIGHT_LIVE)
    pushed = run.xcom[(t.PREFLIGHT_LIVE, t.FINDINGS)]
    rule_ids = {f["rule_id"] for f in pushed}
    assert {"live.reservation", "live.network-profile"} <= rule_ids
    for finding in pushed:
        assert f"[{finding['rule_id']}]" in str(failure.value)
    assert str(failure.value).startswith(f"{len(pushed)} problem(s)")


def test_preflight_live_refuses_missing_secrets_before_anything_exists(
    sandbox: SandboxProcess, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_HUGGINGFACE_DEFAULT", json.dumps({"conn_type": "generic", "password": "hf_x"}))
    monkeypatch.delenv("AIRFLOW_CONN_WANDB_DEFAULT", raising=False)
    with pytest.raises(AirflowFailException, match=r"\[secrets.present\] wandb_conn_id=\"wandb_default\""):
        run_step(start_run(project), t.PREFLIGHT_LIVE)
    assert live(sandbox, project) == {}


def test_preflight_live_passes_with_the_reservation(
    sandbox: SandboxProcess, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for conn in ("HUGGINGFACE_DEFAULT", "WANDB_DEFAULT"):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn}", json.dumps({"conn_type": "generic", "password": "tok"}))
    run = start_run(project)
    spec = spec_of(run)
    sandbox.seed_reservation(
        project, ZONE, spec.reservation, machine_type=spec.effective_machine_type, count=spec.worker_replicas
    )
    bucket = {"project": project, "name": spec.export_bucket_name, "lustre_agent_role": "roles/storage.objectUser"}
    sandbox.seed({"buckets": [bucket]})
    assert run_step(run, t.PREFLIGHT_LIVE) == (None, None)
    assert (t.PREFLIGHT_LIVE, t.FINDINGS) not in run.xcom


def test_operators_module_is_light_at_parse_time() -> None:
    """The DAG file imports the operators: no google client, hook or resource module may come with them."""
    import subprocess
    import sys

    code = (
        "import sys, nemo_rl_gke.dag_factory; "
        "heavy = [m for m in sys.modules if m.startswith(('google.cloud.', 'googleapiclient', 'aiohttp', "
        "'nemo_rl_gke.gcp', 'nemo_rl_gke.triggers'))]; print(heavy)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
