"""A fault in any create, wait or delete step, one step at a time through the operators against the sandbox.

Every GCP resource gets a refused create (HTTP 400), an operation that ends in error, and (if it has a teardown step)
a refused delete. Each case provisions only what the step needs, in a project of its own, and then runs the whole
teardown in the topology's order, as the DAG does after a failure: nothing of the run may be left. The DAG-level
consequences (teardown after a failed task, the run's state) are covered by a few whole-DAG runs in tests/e2e.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from sandbox.testing import SandboxProcess, start_sandbox

from nemo_rl_gke.airflow_compat import AirflowFailException
from nemo_rl_gke.run import outcomes
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.faults import create_match, delete_match
from tests.operators.harness import ZONE, Run, gcp_conn, project_resources, run_step, start_run

__all__ = ["gcp_conn"]
pytestmark = pytest.mark.usefixtures("gcp_conn")
_projects = itertools.count(1)
ENSURES = [s.task_id for s in t.gcp_resources()]
DELETES = [s.task_id for s in t.teardown_steps() if s.op is t.Op.DELETE_GCP]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    with start_sandbox(tmp_path_factory.mktemp("fault-sandbox"), latency_scale=0.0) as running:
        yield running


@pytest.fixture
def run(sandbox: SandboxProcess) -> Iterator[Run]:
    """A run in a project of its own (its reservation seeded for the node pool); no fault outlives the test."""
    project = f"fault-{next(_projects):03d}"
    started = start_run(project)
    spec = RunSpec.from_conf(started.xcom[(t.VALIDATE, t.RETURN)])
    sandbox.seed_reservation(project, ZONE, spec.reservation, spec.effective_machine_type, spec.worker_replicas)
    yield started
    sandbox.clear_faults()


def _provision(run: Run, keys: list[str]) -> None:
    for key in ENSURES:
        if key in keys:
            result, _ = run_step(run, key)
            assert result["action"] == outcomes.CREATED, key


def _teardown_leaves_nothing(sandbox: SandboxProcess, run: Run, project: str) -> None:
    """Every teardown step in the topology's order, each retried once if it fails, as Airflow would."""
    for step in t.teardown_steps():
        try:
            run_step(run, step.task_id)
        except AirflowFailException:
            raise
        except Exception:
            run_step(run, step.task_id)
    assert project_resources(sandbox, project) == {}


def _project(run: Run) -> str:
    return str(run.xcom[(t.VALIDATE, t.RETURN)]["project"])


@pytest.mark.parametrize("key", ENSURES)
def test_a_refused_create_fails_its_task_at_once_and_teardown_removes_the_rest(
    sandbox: SandboxProcess, run: Run, key: str
) -> None:
    spec = RunSpec.from_conf(run.xcom[(t.VALIDATE, t.RETURN)])
    _provision(run, sorted(t.requires(key)))
    sandbox.add_fault(create_match(run.resources()[key]), status=400, message="injected: invalid request")
    with pytest.raises(AirflowFailException, match="injected: invalid request"):
        run_step(run, key)
    assert [f["fired"] for f in sandbox.faults()] == [1]
    assert run.resources()[key].name not in project_resources(sandbox, spec.project)
    _teardown_leaves_nothing(sandbox, run, spec.project)


@pytest.mark.parametrize("key", ENSURES)
def test_an_operation_that_ends_in_error_fails_its_task_at_once_and_teardown_removes_the_rest(
    sandbox: SandboxProcess, run: Run, key: str
) -> None:
    spec = RunSpec.from_conf(run.xcom[(t.VALIDATE, t.RETURN)])
    _provision(run, sorted(t.requires(key)))
    sandbox.add_fault(create_match(run.resources()[key]), operation="error", message="injected: operation failed")
    with pytest.raises(AirflowFailException) as failure:
        run_step(run, key)
    assert "injected: operation failed" in str(failure.value) and "last state DONE" in str(failure.value)
    assert [f["fired"] for f in sandbox.faults()] == [1]
    _teardown_leaves_nothing(sandbox, run, spec.project)


@pytest.mark.parametrize("teardown", DELETES)
def test_a_refused_delete_fails_retryably_and_the_retry_deletes(
    sandbox: SandboxProcess, run: Run, teardown: str
) -> None:
    (key,) = t.step(teardown).deletes
    _provision(run, sorted({key, *t.requires(key)}))
    sandbox.add_fault(delete_match(run.resources()[key]), status=400, message="injected: delete refused")
    for step in t.teardown_steps():
        if step.task_id != teardown:
            run_step(run, step.task_id)
            continue
        with pytest.raises(Exception) as failure:
            run_step(run, teardown)
        # Retryable: a delete refused while a dependent is still going away succeeds on a later try.
        assert not isinstance(failure.value, AirflowFailException)
        assert "injected: delete refused" in str(failure.value)
        result, _ = run_step(run, teardown)
        assert result["action"] == outcomes.DELETED
    assert [f["fired"] for f in sandbox.faults()] == [1]
    assert project_resources(sandbox, _project(run)) == {}
