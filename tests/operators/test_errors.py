"""Errors where Google puts them (issue 17 item 4), met by the operators step by step against the sandbox: a
peering delete refused inside its operation, a second Lustre transfer, the resume import into a fresh Lustre."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import Asset
from airflow.sdk.exceptions import TaskDeferred
from sandbox.testing import SandboxProcess, request_json, start_sandbox

from nemo_rl_gke.airflow_compat import AirflowException, AirflowFailException
from nemo_rl_gke.dag_factory import OPERATORS
from nemo_rl_gke.gcp.hooks import RetryPolicy
from nemo_rl_gke.run import outcomes
from nemo_rl_gke.run import topology as t
from tests.operators.harness import Run, gcp_conn, operator, project_resources, run_step, start_run, trigger_events

__all__ = ["gcp_conn"]
pytestmark = pytest.mark.usefixtures("gcp_conn")
_projects = itertools.count(1)
SCALE = 0.001


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    with start_sandbox(tmp_path_factory.mktemp("errors-sandbox"), latency_scale=SCALE) as running:
        yield running


@pytest.fixture
def project(sandbox: SandboxProcess) -> Iterator[str]:
    yield f"op-errors-{next(_projects):03d}"
    sandbox.clear_faults()
    sandbox.set_latency(scale=SCALE, defaults=True)


def run_through(run: Run, task_id: str, limit: int = 4) -> tuple[Any, list[str]]:
    """One try of a step, following every deferral (execute_complete may defer again); the result and the path of
    every operation it waited on."""
    context = run.context(task_id)
    task = operator(task_id)
    task.pre_execute(context)
    waited: list[str] = []
    call, kwargs = task.execute, {}
    for _ in range(limit):
        try:
            result = call(context, **kwargs)
        except TaskDeferred as deferred:
            waited.append(deferred.trigger.operation["path"])
            [event] = trigger_events(deferred.trigger)
            call, kwargs = getattr(operator(task_id), deferred.method_name), {"event": event}
            continue
        run.xcom[(task_id, t.RETURN)] = result
        return result, waited
    raise AssertionError(f"{task_id} deferred more than {limit} times: {waited}")


def test_a_peering_delete_refused_inside_its_operation_falls_back_to_remove_peering(
    sandbox: SandboxProcess, project: str
) -> None:
    run = start_run(project)
    for key in (t.NET, t.PEERING_RANGE, t.PEERING, t.LUSTRE):
        run_step(run, key)
    # Service Networking keeps counting the deleted Lustre as a producer for a while (FACTS §13): for all this test.
    sandbox.set_latency(seconds={"servicenetworking.producers.linger": 600_000})
    run_step(run, t.DELETE_LUSTRE)
    result, waited = run_through(run, t.DELETE_PEERING)
    assert result["action"] == outcomes.DELETED
    # deleteConnection's operation failed with code 9, then compute's removePeering took the peering away.
    assert waited[0].startswith("/v1/operations/"), waited
    assert "/compute/v1/" in waited[1] and len(waited) == 2, waited
    removals = [c for c in sandbox.calls() if c["path"].endswith(f"/global/networks/{run.spec.network}/removePeering")]
    assert [c["status"] for c in removals] == [200]
    for key in (t.DELETE_PEERING_RANGE, t.DELETE_NET):
        result, _ = run_step(run, key)
        assert result["action"] == outcomes.DELETED, key
    assert project_resources(sandbox, project) == {}


class _Events:
    """What ResumeOperator reads of Airflow's inlet events: ``ascending(False).limit(n)``, newest first."""

    def __init__(self, events: list[SimpleNamespace]) -> None:
        self.events = events

    def ascending(self, ascending: bool) -> _Events:
        return _Events(sorted(self.events, key=lambda e: e.timestamp, reverse=not ascending))

    def limit(self, n: int) -> list[SimpleNamespace]:
        return self.events[:n]


def _lustre_dir(sandbox: SandboxProcess, project: str) -> Path:
    [item] = [i for i in sandbox.inventory() if i["kind"] == "lustre.instance" and f"/{project}/" in i["path"]]
    return Path(item["data_dir"])


def test_resume_on_a_new_lustre_imports_into_root_and_waits_out_a_running_transfer(
    sandbox: SandboxProcess, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Night 1 exports step 4 as the DAG does; night 2 gets a new Lustre, where only "/" exists (FACTS §14).
    first = start_run(project, resume="latest")
    for key in (t.NET, t.PEERING_RANGE, t.LUSTRE_FW, t.PEERING, t.LUSTRE):
        run_step(first, key)
    spec = first.spec
    step_dir = _lustre_dir(sandbox, project) / spec.checkpoint_lustre_path(4).lstrip("/")
    step_dir.mkdir(parents=True)
    (step_dir / "training_info.json").write_text('{"current_step": 4}')
    (sandbox.state_dir / "gcs" / spec.export_bucket_name).mkdir(parents=True, exist_ok=True)
    first.xcom[(t.WAIT, t.RETURN)] = {"final_step": 4}
    first.xcom[(t.CHECK_CHECKPOINT, t.RETURN)] = {"valid": True, "step": 4}  # only a validated step is exported
    exported, _ = run_step(first, t.EXPORT)
    assert exported["uri"].endswith(f"{spec.checkpoint_lustre_path(4)}/"), exported
    run_step(first, t.DELETE_LUSTRE)
    run_step(first, t.RELEASE_LEASE)

    second = start_run(project, resume="latest")
    assert run_step(second, t.LUSTRE)[0]["action"] == outcomes.CREATED
    fresh = _lustre_dir(sandbox, project)
    assert not (fresh / spec.checkpoint_lustre_path(4).lstrip("/")).exists()
    # Another transfer is running on the instance: the import is refused ABORTED until it ends, and waits for it.
    (fresh / "other").mkdir()
    sandbox.set_latency(seconds={"lustre.instances.exportData": 300})  # 0.3 s at this scale
    busy_export = {"lustrePath": {"path": "/other"}, "gcsPath": {"uri": f"gs://{spec.export_bucket_name}/other/"}}
    request_json(f"{sandbox.url}/v1/{spec.lustre_path}:exportData", "POST", busy_export)
    monkeypatch.setattr("nemo_rl_gke.gcp.hooks.BUSY_RETRY", RetryPolicy(attempts=60, initial_s=0.02, maximum_s=0.05))

    asset = Asset(name=t.checkpoint_asset("d"))
    event = SimpleNamespace(
        extra={"uri": exported["uri"], "step": 4}, source_dag_id="d", source_run_id="r1", timestamp=1
    )
    context = {**second.context(t.RESUME), "inlet_events": {asset: _Events([event])}}
    resume = OPERATORS[t.step(t.RESUME).op](step=t.RESUME, inlets=[asset])
    resume.pre_execute(context)
    since = len(sandbox.calls())
    with pytest.raises(TaskDeferred) as deferred:
        resume.execute(context)
    imports = [c for c in sandbox.calls(since) if c["path"].endswith(":importData")]
    assert imports[0]["status"] == 409 and imports[-1]["status"] == 200, imports
    [done] = trigger_events(deferred.value.trigger)
    resumed = OPERATORS[t.step(t.RESUME).op](step=t.RESUME, inlets=[asset]).execute_complete(context, event=done)
    assert resumed["action"] == outcomes.IMPORTED and resumed["resumed_from"]["step"] == 4
    # The step is back where NeMo RL looks for it: checkpoint_dir/step_4 on the new instance.
    assert (fresh / spec.checkpoint_lustre_path(4).lstrip("/") / "training_info.json").read_text() == (
        '{"current_step": 4}'
    )


def test_a_used_up_reservation_fails_the_pool_naming_the_reservation_and_what_to_try(
    sandbox: SandboxProcess, project: str
) -> None:
    run = start_run(project)
    spec = run.spec
    sandbox.seed_reservation(project, spec.zone, spec.reservation, spec.effective_machine_type, 2, in_use_count=2)
    for key in (t.NET, t.GVNIC_NET, t.GVNIC_SUB, t.RDMA_NET, *t.RDMA_SUBS, t.GKE_CLUSTER):
        run_step(run, key)
    with pytest.raises(AirflowFailException) as failure:
        run_step(run, t.NODE_POOL)
    message = str(failure.value)
    assert "GCE_STOCKOUT" in message and f"reservation '{spec.reservation}' in zone {spec.zone}" in message
    assert "worker_replicas" in message and "wait" in message and "zone" in message


def test_a_peering_create_that_failed_on_a_concurrent_peering_change_is_retried(
    sandbox: SandboxProcess, project: str
) -> None:
    # Service Networking fails the create inside its operation, code 3, while another peering change runs on the
    # network (terraform-provider-google's error tables quote it): a retry, not a final failure.
    run = start_run(project)
    for key in (t.NET, t.PEERING_RANGE):
        run_step(run, key)
    sandbox.add_fault(
        {"method": "POST", "path": "/v1/services/servicenetworking.googleapis.com/connections$"},
        operation="error",
        error_status="INVALID_ARGUMENT",
        message="There is a peering operation in progress on the local or peer network. Try again later.",
    )
    with pytest.raises(AirflowException) as refused:
        run_step(run, t.PEERING)
    assert not isinstance(refused.value, AirflowFailException)
    assert "3: There is a peering operation in progress" in str(refused.value)
    result, _ = run_step(run, t.PEERING)  # Airflow's retry
    assert result["action"] == outcomes.CREATED
