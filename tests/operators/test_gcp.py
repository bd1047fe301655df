"""The GCP operators against the real local sandbox: real clients, real HTTP, real deferrals.

The context is a minimal dict (a task instance whose ``xcom_pull`` answers the validated conf, and whose
``xcom_push`` records), but everything on the GCP side is real: the operators build their hook from
``AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT`` pointing at the sandbox, the deferral raises ``TaskDeferred`` with the actual
trigger, and that trigger is run to its event before ``execute_complete`` is called on a fresh operator, as Airflow
does after a deferral.
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
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from sandbox.testing import SandboxProcess, request_json, start_sandbox

from nemo_rl_gke.operators.gcp import (
    DEFERRAL_BACKSTOP_S,
    DeleteGcpResourceOperator,
    EnsureGcpResourceOperator,
    PreflightLiveOperator,
)
from nemo_rl_gke.operators.preflight import FINDINGS_KEY, VALIDATE_TASK_ID
from nemo_rl_gke.preflight import check_conf
from nemo_rl_gke.spec import RunSpec
from nemo_rl_gke.triggers.operations import OperationTrigger
from tests.paths import ROOT

REGION, ZONE = "us-central1", "us-central1-b"  # a RoCE zone of the sandbox
POLL = 0.05
_projects = itertools.count(1)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    with start_sandbox(tmp_path_factory.mktemp("gcp-sandbox"), latency_scale=0.0) as running:
        yield running


@pytest.fixture(autouse=True)
def gcp_conn(sandbox: SandboxProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """google_cloud_default -> the sandbox, exactly as a deployment would configure it for local runs."""
    extras = {"is_anonymous": True, "api_endpoint": sandbox.url, "project": "sandbox"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps({"conn_type": "google_cloud_platform", "extra": extras})
    )


@pytest.fixture
def project() -> str:
    """A fresh project per test: the sandbox scopes every resource by project, so tests cannot see each other's."""
    return f"op-test-{next(_projects):03d}"


class FakeTaskInstance:
    """Just what the operators use of a task instance: the validate task's XCom, and a record of pushes."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.pushed: dict[str, Any] = {}

    def xcom_pull(self, task_ids: str | None = None, key: str = "return_value", **_: Any) -> Any:
        if (task_ids, key) == (VALIDATE_TASK_ID, "return_value"):
            return self.conf
        # Nothing else ran in these tests: no training job, no export (so teardown may delete Lustre).
        assert task_ids in ("train.submit", "checkpoint.export", "teardown.delete-lustre"), (task_ids, key)
        return None

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def context_for(project: str, **conf: Any) -> dict[str, Any]:
    """A context whose validate task accepted this conf (validated for real)."""
    raw = {"project": project, "region": REGION, "zone": ZONE, "reservation": "gpu-res", "poll_interval_s": POLL}
    raw.update(conf)
    spec, findings = check_conf(raw)
    assert spec is not None, findings
    return {"ti": FakeTaskInstance(spec.to_conf())}


def spec_of(context: dict[str, Any]) -> RunSpec:
    return RunSpec.from_conf(context["ti"].conf)


def trigger_events(trigger: OperationTrigger) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), 60))


def fresh(operator: Any) -> Any:
    """A new instance with the same arguments: Airflow resumes a deferred task on a new operator object."""
    return type(operator)(task_id=operator.task_id, resource_key=operator.resource_key)


def run_task(operator: Any, context: dict[str, Any]) -> tuple[dict[str, str], TaskDeferred | None]:
    """execute(); on a deferral run the trigger to its one event and resume with execute_complete."""
    try:
        return operator.execute(context), None
    except TaskDeferred as deferred:
        events = trigger_events(deferred.trigger)
        assert len(events) == 1
        resumed = getattr(fresh(operator), deferred.method_name)
        return resumed(context, event=events[0], **(deferred.kwargs or {})), deferred


def live(sandbox: SandboxProcess, project: str) -> dict[str, dict[str, Any]]:
    """The sandbox's inventory of one project, by resource name."""
    return {r["name"]: r for r in sandbox.inventory() if f"projects/{project}/" in r["path"]}


def deletes(sandbox: SandboxProcess, project: str, since: int) -> list[str]:
    return [c["path"] for c in sandbox.calls(since) if c["method"] == "DELETE" and f"/{project}/" in c["path"]]


# --- ensure ----------------------------------------------------------------------------------------------------
def test_ensure_defers_while_the_operation_runs(sandbox: SandboxProcess, project: str) -> None:
    """No worker slot during the wait: execute() hands the running create to the triggerer and returns at once."""
    sandbox.add_fault({"method": "POST", "path": f"/projects/{project}/global/networks$"}, operation="hang")
    context = context_for(project, network_timeout_s=321)
    spec = spec_of(context)
    operator = EnsureGcpResourceOperator(task_id="net", resource_key="net")

    started = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(context)
    assert time.time() - started < 10

    trigger = deferred.value.trigger
    assert isinstance(trigger, OperationTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.kwargs == {"action": "created"}
    assert trigger.poll_interval == spec.poll_interval_s == POLL
    assert trigger.timeout == spec.stage_timeout_s("network") == 321
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
    context = context_for(project)
    for key in ("net", "peering-range", "peering", "lustre", "cluster"):
        result, deferred = run_task(EnsureGcpResourceOperator(task_id=key, resource_key=key), context)
        assert deferred is not None, key
        assert result == {"key": key, "name": result["name"], "action": "created"}
        assert deferred.trigger.timeout == spec_of(context).stage_timeout_s(
            {"net": "network", "cluster": "cluster"}.get(key, "storage")
        )
    assert {"nemo-rl-net", "nemo-rl-lustre-range", "nemo-rl-lustre", "nemo-rl-cluster"} <= set(live(sandbox, project))

    # Idempotent: a re-run (task retry, second DAG run) finds each resource ready and does not defer at all.
    for key in ("net", "lustre", "cluster"):
        result, deferred = run_task(EnsureGcpResourceOperator(task_id=key, resource_key=key), context)
        assert deferred is None
        assert result["action"] == "exists"


def test_operation_error_fails_without_retry(sandbox: SandboxProcess, project: str) -> None:
    sandbox.add_fault(
        {"method": "POST", "path": f"/projects/{project}/global/networks$"},
        operation="error",
        message="Quota 'NETWORKS' exceeded. Limit: 5.0 globally.",
        error_status="RESOURCE_EXHAUSTED",
    )
    with pytest.raises(AirflowFailException) as failure:
        run_task(EnsureGcpResourceOperator(task_id="net", resource_key="net"), context_for(project))
    message = str(failure.value)
    assert "network nemo-rl-net (net)" in message
    assert "Quota 'NETWORKS' exceeded" in message
    assert f"/compute/v1/projects/{project}/global/operations/" in message
    assert "last state DONE" in message


def test_timeout_fails_retryably_naming_the_resource_and_its_state(sandbox: SandboxProcess, project: str) -> None:
    sandbox.add_fault({"method": "POST", "path": f"/projects/{project}/locations/{REGION}/clusters$"}, operation="hang")
    context = context_for(project)
    operator = EnsureGcpResourceOperator(task_id="cluster", resource_key="cluster")
    run_task(EnsureGcpResourceOperator(task_id="net", resource_key="net"), context)
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(context)
    # The spec's cluster timeout is an hour; the same trigger with a short deadline stands in for the wait.
    _, kwargs = deferred.value.trigger.serialize()
    event = trigger_events(OperationTrigger(**{**kwargs, "timeout": 0.3, "started_at": time.time()}))[0]
    assert event["status"] == "timeout"

    with pytest.raises(AirflowException) as failure:
        fresh(operator).execute_complete(context, event=event, **deferred.value.kwargs)
    # Retryable (not AirflowFailException): a retry re-runs ensure, which finds the cluster and waits on it again.
    assert not isinstance(failure.value, AirflowFailException)
    message = str(failure.value)
    assert "GKE cluster nemo-rl-cluster (cluster)" in message
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
    operator = EnsureGcpResourceOperator(task_id="cluster", resource_key="cluster")
    with pytest.raises(AirflowException) as failure:
        operator.execute_complete(context_for(project), event=event)
    assert not isinstance(failure.value, AirflowFailException)
    assert "HTTP 403: denied" in str(failure.value)
    assert "last state RUNNING" in str(failure.value)


def test_unowned_resource_fails_fast_and_survives_teardown(sandbox: SandboxProcess, project: str) -> None:
    # Someone else's network of the same name: no ownership marker in its description.
    request_json(
        f"{sandbox.url}/compute/v1/projects/{project}/global/networks",
        "POST",
        {"name": "nemo-rl-net", "autoCreateSubnetworks": True, "description": "the platform team's"},
    )
    context = context_for(project)
    with pytest.raises(AirflowFailException, match="not created by this DAG"):
        EnsureGcpResourceOperator(task_id="net", resource_key="net").execute(context)

    since = len(sandbox.calls())
    result, deferred = run_task(DeleteGcpResourceOperator(task_id="del-net", resource_key="net"), context)
    assert (result, deferred) == ({"key": "net", "name": "nemo-rl-net", "action": "kept-unowned"}, None)
    assert deletes(sandbox, project, since) == []
    assert "nemo-rl-net" in live(sandbox, project)


# --- delete ----------------------------------------------------------------------------------------------------
def test_delete_defers_and_deletes_in_teardown_order(sandbox: SandboxProcess, project: str) -> None:
    context = context_for(project, teardown_timeout_s=777)
    keys = ("net", "peering-range", "peering", "lustre", "cluster")
    for key in keys:
        run_task(EnsureGcpResourceOperator(task_id=key, resource_key=key), context)
    for key in ("lustre", "peering", "peering-range", "cluster", "net"):
        result, deferred = run_task(DeleteGcpResourceOperator(task_id=f"del-{key}", resource_key=key), context)
        assert deferred is not None, key
        assert deferred.trigger.timeout == 777
        assert result["action"] == "deleted"
    assert live(sandbox, project) == {}

    # 404 is success: deleting what is already gone needs no operation and no deferral.
    result, deferred = run_task(DeleteGcpResourceOperator(task_id="del-net", resource_key="net"), context)
    assert (result["action"], deferred) == ("absent", None)


@pytest.mark.parametrize("policy", ["keep_cluster_and_storage", "keep_all"])
def test_delete_honours_keeping_policies(sandbox: SandboxProcess, project: str, policy: str) -> None:
    context = context_for(project, teardown_policy=policy)
    for key in ("net", "cluster"):
        run_task(EnsureGcpResourceOperator(task_id=key, resource_key=key), context)
    since = len(sandbox.calls())
    for key in ("cluster", "net"):
        result, deferred = run_task(DeleteGcpResourceOperator(task_id=f"del-{key}", resource_key=key), context)
        assert (result["action"], deferred) == ("kept-by-policy", None)
    assert deletes(sandbox, project, since) == []
    assert {"nemo-rl-net", "nemo-rl-cluster"} <= set(live(sandbox, project))


def test_failed_delete_is_retryable_and_names_the_resource(sandbox: SandboxProcess, project: str) -> None:
    context = context_for(project)
    run_task(EnsureGcpResourceOperator(task_id="net", resource_key="net"), context)
    sandbox.add_fault(
        {"method": "DELETE", "path": f"/projects/{project}/global/networks/nemo-rl-net$"},
        operation="error",
        message="The network resource is already being used by 'firewall-x'",
    )
    with pytest.raises(AirflowException) as failure:
        run_task(DeleteGcpResourceOperator(task_id="del-net", resource_key="net"), context)
    assert not isinstance(failure.value, AirflowFailException)
    assert "network nemo-rl-net (net)" in str(failure.value)
    assert "already being used" in str(failure.value)
    assert "nemo-rl-net" in live(sandbox, project)
    # The retry succeeds once the fault is gone.
    result, _ = run_task(DeleteGcpResourceOperator(task_id="del-net", resource_key="net"), context)
    assert result["action"] == "deleted"


def test_delete_whose_operation_failed_but_resource_is_gone_succeeds(sandbox: SandboxProcess, project: str) -> None:
    context = context_for(project)
    event = {"status": "error", "message": "operation failed: NOT_FOUND", "operation": {}, "state": "DONE"}
    result = DeleteGcpResourceOperator(task_id="del-net", resource_key="net").execute_complete(context, event=event)
    assert result == {"key": "net", "name": "nemo-rl-net", "action": "deleted"}


# --- preflight_live --------------------------------------------------------------------------------------------
def test_preflight_live_fails_with_every_finding(sandbox: SandboxProcess, project: str) -> None:
    # No reservation anywhere, and a zone without the RoCE network profile: two problems, reported together.
    context = context_for(project, zone="us-central1-c")
    with pytest.raises(AirflowFailException) as failure:
        PreflightLiveOperator(task_id="preflight_live").execute(context)
    pushed = context["ti"].pushed[FINDINGS_KEY]
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
    context = context_for(project)
    with pytest.raises(AirflowFailException, match=r"\[secrets.present\] wandb_conn_id=\"wandb_default\""):
        PreflightLiveOperator(task_id="preflight_live").execute(context)
    assert live(sandbox, project) == {}


def test_preflight_live_passes_with_the_reservation(
    sandbox: SandboxProcess, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for conn in ("HUGGINGFACE_DEFAULT", "WANDB_DEFAULT"):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn}", json.dumps({"conn_type": "generic", "password": "tok"}))
    context = context_for(project)
    spec = spec_of(context)
    sandbox.seed_reservation(
        project, ZONE, spec.reservation, machine_type=spec.effective_machine_type, count=spec.worker_replicas
    )
    assert PreflightLiveOperator(task_id="preflight_live").execute(context) is None
    assert FINDINGS_KEY not in context["ti"].pushed


def test_operators_module_is_light_at_parse_time() -> None:
    """The DAG file imports the operators: no google client, hook or resource module may come with them."""
    import subprocess
    import sys

    code = (
        "import sys, nemo_rl_gke.operators.gcp; "
        "heavy = [m for m in sys.modules if m.startswith(('google.cloud.', 'googleapiclient', 'aiohttp', "
        "'nemo_rl_gke.gcp', 'nemo_rl_gke.triggers'))]; print(heavy)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
