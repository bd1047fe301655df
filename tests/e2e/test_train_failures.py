"""A whole run that fails after training started, on the sandbox with the local CPU recipe: a failing job (a bug,
never resubmitted). In process (``dag.test``), its log read from what the run printed: the ``airflow dags test``
command a user types is the main run's, in tests/e2e/test_train.py.

Not a whole run of its own: the zero-learning guard stops a real Ray job within k steps (tests/gcp/test_rayjob.py),
the recipe's ``full_solution`` ground truth never rewards (tests/recipes/test_grpo_cpu.py), and a job that ran with
nothing exported keeps Lustre for its checkpoint (tests/operators/test_ownership.py); a failed export that keeps
Lustre is the stalled run's, in tests/e2e/test_train.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from sandbox.files import gcs_root
from sandbox.testing import SandboxProcess

from nemo_rl_gke.run import topology as t
from tests.e2e.harness import latest_xcom, run_logged

pytestmark = [pytest.mark.airflow, pytest.mark.usefixtures("fresh_sandbox")]


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
    # The Ray logs outlived the cluster: teardown copied them to the export bucket before deleting the RayCluster
    # (the driver's error in the job's log, on the head), with their index (tests/gcp/test_ray_log_archive.py has the
    # alert's link).
    logs = latest_xcom()[(t.DELETE_RAYCLUSTER, "return_value")]["ray_logs"]
    assert logs["files"] > 0 and logs["errors"] == 0, logs
    bucket, _, prefix = logs["uri"].removeprefix("gs://").partition("/")
    head = gcs_root(sandbox.state_dir) / bucket / prefix / "head"
    drivers = list(head.glob("job-driver-*.log"))
    assert any("must be a number > 0.0, got -1" in d.read_text() for d in drivers), drivers
    assert (head.parent / "index.json").is_file()
