"""Whole runs that fail after training started, on the sandbox with the local CPU recipe: a failing job and the
zero-reward guard (a failed export that keeps Lustre is the stalled run's, in tests/e2e/test_train.py; the two files
run side by side on two workers). In process (``dag.test``), their logs read from what the run printed: the
``airflow dags test`` command a user types is the main run's, in tests/e2e/test_train.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.e2e.harness import LUSTRE_CHAIN, latest_xcom, run_logged

pytestmark = [pytest.mark.airflow, pytest.mark.usefixtures("fresh_sandbox")]
SPEC = RunSpec()


def test_a_failing_job_fails_the_run_with_the_driver_last_lines_and_teardown_runs(
    sandbox: SandboxProcess, dag: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    result = run_logged(dag, {"extra_overrides": ["policy.optimizer.lr=-1"], "accept_checkpoint_loss": True}, capfd)
    assert result.state == "failed"
    assert result.tasks[t.WAIT] == "failed" and result.tries[t.WAIT] == 1
    assert "driver exit code: 2" in result.output or "exit code 2" in result.output
    assert "Last lines of the driver log:" in result.output
    assert "'policy.optimizer.lr' must be a number > 0.0, got -1" in result.output
    # A bug is never resubmitted (tests/unit/test_recovery_rules.py has the verdicts): the job ran once.
    assert latest_xcom().get((t.WAIT, "recoveries")) is None
    # checkpoint.validate runs after any end of train.wait and skips without a stall's save; the report fails the run.
    assert (result.tasks[t.CHECK_CHECKPOINT], result.tasks[t.RUN_REPORT]) == ("skipped", "failed"), result.tasks
    assert all(result.tasks[s.task_id] == "success" for s in t.teardown_steps())
    assert sandbox.full_inventory()["resources"] == []


def test_every_reward_zero_trips_the_guard_within_k_steps_and_lustre_is_kept_without_an_export(
    sandbox: SandboxProcess, dag: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    conf = {"max_steps": 20, "extra_overrides": ["data.ground_truth=full_solution"], "zero_learning_steps": 3}
    result = run_logged(dag, conf, capfd)
    assert result.state == "failed"
    assert result.tasks[t.WAIT] == "failed"
    assert "advantages" in result.output and "zero_learning_guard" in result.output
    steps = latest_xcom()[(t.WAIT, "steps")]
    assert 3 <= len(steps) < 20 and {s["avg_reward"] for s in steps} == {0.0}
    # A job ran and nothing was exported: teardown keeps Lustre (and what it needs) rather than lose the checkpoint.
    actions = {t: v.get("action") for (t, k), v in latest_xcom().items() if k == "return_value" and isinstance(v, dict)}
    assert actions[t.DELETE_LUSTRE] == "kept-for-checkpoint"
    assert actions[t.DELETE_NET] == "kept-for-lustre"
    kept = {r["kind"] for r in sandbox.inventory()}
    assert kept == LUSTRE_CHAIN
    assert sandbox.full_inventory()["ray_heads"] == []
