"""Errors where Google puts them (issue 17 item 4), met by the operators step by step against the sandbox: a
peering delete refused inside its operation, a second Lustre transfer, the resume import into a fresh Lustre."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from sandbox.testing import SandboxProcess, start_sandbox

from nemo_rl_gke import outcomes
from nemo_rl_gke import topology as t
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
