"""A whole run that loses a GPU worker node mid-training, on the sandbox with the local CPU recipe: the job fails the
way it does on GKE (Ray's ActorDiedError / ActorUnavailableError), a recovery rule calls it a lost node, the DAG waits
deferred for the node pool's replacement, fences the failed attempt and resubmits from the newest save; the run then
finishes, validates and exports its last step. In process (``dag.test``), its log read from what the run printed,
and every trigger callback of the run timed by its CPU (tests/e2e/slow_callbacks.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.e2e.harness import latest_xcom, run_logged
from tests.e2e.slow_callbacks import slow_callbacks

pytestmark = [pytest.mark.airflow, pytest.mark.usefixtures("fresh_sandbox")]
SPEC = RunSpec()
SAVE_PERIOD = 5
LOSE_AFTER_SAVE = 10
SLOW_CALLBACK_S = 0.2


def _lose_workers_once_ray_runs(
    sandbox: SandboxProcess,
    found: list[dict[str, Any]],
    after_saves: tuple[int, ...],
    replace_after_s: float,
    loss: dict[str, Any],
) -> None:
    """Arm one node loss per save in ``after_saves`` as soon as the run's RayCluster has a Ray: a worker is lost (as
    ``loss`` says: killed by default) as soon as that checkpoint is saved, and the node pool replaces it
    ``replace_after_s`` later."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        heads = sandbox.full_inventory()["ray_heads"]
        if heads:
            for step in after_saves:
                found.append(
                    sandbox.lose_node(heads[0]["raycluster"], after_save=step, replace_after_s=replace_after_s, **loss)
                )
            return
        time.sleep(0.2)


def _losing(
    sandbox: SandboxProcess, after_saves: tuple[int, ...], replace_after_s: float, **loss: Any
) -> tuple[Any, list]:
    armed: list[dict[str, Any]] = []
    thread = threading.Thread(
        target=_lose_workers_once_ray_runs, args=(sandbox, armed, after_saves, replace_after_s, loss), daemon=True
    )
    thread.start()
    return thread, armed


def test_a_preempted_spot_node_is_recovered_from_the_newest_save_and_the_run_exports_its_last_step(
    sandbox: SandboxProcess, dag: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    # A Spot run: Compute Engine preempts a worker's VM during step 11 or 12 (SIGTERM, then SIGKILL 2 s later, its
    # notice cut from 30 s to keep the test short) and the pool's autoscaler gets a new Spot node 3 s later.
    losing, armed = _losing(sandbox, (LOSE_AFTER_SAVE,), 3.0, mode="preempted", notice_s=2.0)
    conf = {
        "capacity": "spot",
        "max_steps": 30,
        "extra_overrides": [f"checkpointing.save_period={SAVE_PERIOD}"],
        "max_recoveries": 2,
    }
    # Every trigger of the run (provisioning, the job, the recovery wait, teardown), on the loop they would share in
    # a triggerer: no callback may take it for more than 0.2 s.
    with slow_callbacks(SLOW_CALLBACK_S) as slow:
        result = run_logged(dag, conf, capfd)
    losing.join(timeout=5)
    assert result.state == "success", result.output[-4000:]
    assert slow == [], slow
    [loss] = sandbox.node_losses()
    assert loss["state"] == "replaced" and loss["id"] == armed[0]["id"] and loss["mode"] == "preempted"
    xcom = latest_xcom()
    [recovery] = xcom[(t.WAIT, "recoveries")]
    # Ray's own error for a worker whose node died, matched by a rule that says so in the log.
    assert recovery["rule"] in ("actor-died", "actor-unavailable", "node-died"), recovery
    assert f"recovery rule '{recovery['rule']}': recoverable" in result.output
    assert recovery["resumed_from"] == 10 and recovery["steps_lost"] <= 2, recovery
    assert recovery["submission_id"].endswith("-r1") and recovery["gpu_hours_lost"] > 0
    # Fenced: the failed attempt had ended (Ray's end_time) before the next one was submitted.
    assert recovery["failed_at"] <= recovery["resubmitted_at"]
    assert f"Fenced: Ray job {recovery['failed_job']} is FAILED" in result.output
    # One table across both attempts: steps 1-10 from the first, 11-30 from the second, none twice.
    steps = xcom[(t.WAIT, "steps")]
    assert [s["step"] for s in steps] == list(range(1, 31))
    assert {s["attempt"] for s in steps if s["step"] <= 10} == {0} and {s["attempt"] for s in steps[10:]} == {1}
    summary = xcom[(t.WAIT, "summary")]
    assert summary["recoveries"] == 1 and summary["steps_completed"] == 30
    assert summary["checkpoints"][:2] == [5, 10], summary["checkpoints"]
    assert xcom[(t.WAIT, "return_value")]["final_step"] == 30
    assert xcom[(t.CHECK_CHECKPOINT, "return_value")]["step"] == 30
    assert sandbox.full_inventory()["resources"] == []


def test_a_third_lost_node_with_max_recoveries_2_fails_the_run_with_its_newest_save_validated_and_exported(
    sandbox: SandboxProcess, dag: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    # A save every 5 steps and a node lost just after each of saves 5, 10 and 15: three attempts, each cut short.
    losing, armed = _losing(sandbox, (SAVE_PERIOD, 2 * SAVE_PERIOD, 3 * SAVE_PERIOD), 1.0)
    # Half a second more a step (asleep): a loaded machine's job must not reach its next save before the lost node
    # fails it, or one attempt would meet two of the losses.
    overrides = [f"checkpointing.save_period={SAVE_PERIOD}", "sandbox.step_delay_s=0.5"]
    conf = {"max_steps": 30, "extra_overrides": overrides, "max_recoveries": 2}
    result = run_logged(dag, conf, capfd)
    losing.join(timeout=5)
    assert result.state == "failed", result.output[-4000:]
    assert result.tasks[t.WAIT] == "failed" and result.tries[t.WAIT] == 1, result.errors()
    assert [loss["id"] for loss in sandbox.node_losses()] == [a["id"] for a in armed]
    xcom = latest_xcom()
    # Two recoveries, from saves 5 and 10; the third loss found none left.
    recoveries = xcom[(t.WAIT, "recoveries")]
    assert [(r["attempt"], r["resumed_from"]) for r in recoveries] == [(1, 5), (2, 10)], recoveries
    assert [r["submission_id"][-3:] for r in recoveries] == ["-r1", "-r2"]
    assert "its 2 recoveries (max_recoveries) are used up. Checkpoint step 15 is validated and exported next" in (
        result.output
    )
    # The newest save, the third attempt's, is the run's checkpoint: validated, exported, and so Lustre is deleted.
    assert xcom[(t.CHECK_CHECKPOINT, "return_value")]["step"] == 15
    assert result.tasks[t.EXPORT] == "success" and xcom[(t.EXPORT, "return_value")]["step"] == 15
    assert all(result.tasks[s.task_id] == "success" for s in t.teardown_steps()), result.tasks
    assert sandbox.full_inventory()["resources"] == []
