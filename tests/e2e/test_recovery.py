"""A whole run that loses a GPU worker node mid-training, on the sandbox with the local CPU recipe: the job fails the
way it does on GKE (Ray's ActorDiedError / ActorUnavailableError), a recovery rule calls it a lost node, the DAG waits
deferred for the node pool's replacement, fences the failed attempt and resubmits from the newest save. A loss past
``max_recoveries`` fails the run, and its newest save is validated and exported. In process (``dag.test``), its log
read from what the run printed, and every trigger callback of the run timed by its CPU (tests/e2e/slow_callbacks.py).
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
SLOW_CALLBACK_S = 0.2


def _lose_workers_once_ray_runs(
    sandbox: SandboxProcess,
    found: list[dict[str, Any]],
    losses: tuple[tuple[int, dict[str, Any]], ...],
    replace_after_s: float,
) -> None:
    """Arm each of ``losses`` (a save's step, and how the node is lost: killed by default) as soon as the run's
    RayCluster has a Ray: a worker is lost as soon as that checkpoint is saved, and the node pool replaces it
    ``replace_after_s`` later."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        heads = sandbox.full_inventory()["ray_heads"]
        if heads:
            for step, loss in losses:
                found.append(
                    sandbox.lose_node(heads[0]["raycluster"], after_save=step, replace_after_s=replace_after_s, **loss)
                )
            return
        time.sleep(0.2)


def _losing(
    sandbox: SandboxProcess, losses: tuple[tuple[int, dict[str, Any]], ...], replace_after_s: float
) -> tuple[Any, list]:
    armed: list[dict[str, Any]] = []
    thread = threading.Thread(
        target=_lose_workers_once_ray_runs, args=(sandbox, armed, losses, replace_after_s), daemon=True
    )
    thread.start()
    return thread, armed


def test_a_preempted_spot_node_is_recovered_from_the_newest_save_and_a_loss_past_max_recoveries_exports_the_last_save(
    sandbox: SandboxProcess, dag: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    # One run for both ends of recovery (each whole run costs CI minutes). A Spot run allowed one recovery: Compute
    # Engine preempts a worker's VM just after save 5 (SIGTERM, then SIGKILL 2 s later, its notice cut from 30 s to
    # keep the test short) and the pool's autoscaler gets a new Spot node 3 s later; the resubmitted attempt loses
    # its node (killed) just after save 10, with no recovery left.
    losing, armed = _losing(
        sandbox, ((SAVE_PERIOD, {"mode": "preempted", "notice_s": 2.0}), (2 * SAVE_PERIOD, {})), 3.0
    )
    # Half a second more a step (asleep): the preempted job cannot reach save 10 within its 2 s notice, however fast
    # the machine, so each attempt meets one loss.
    overrides = [f"checkpointing.save_period={SAVE_PERIOD}", "sandbox.step_delay_s=0.5"]
    conf = {"capacity": "spot", "max_steps": 30, "extra_overrides": overrides, "max_recoveries": 1}
    # Every trigger of the run (provisioning, the job, the recovery wait, teardown), on the loop they would share in
    # a triggerer: no callback may take it for more than 0.2 s.
    with slow_callbacks(SLOW_CALLBACK_S) as slow:
        result = run_logged(dag, conf, capfd)
    losing.join(timeout=5)
    assert result.state == "failed", result.output[-4000:]
    assert result.tasks[t.WAIT] == "failed" and result.tries[t.WAIT] == 1, result.errors()
    assert slow == [], slow
    losses = sandbox.node_losses()
    assert [loss["id"] for loss in losses] == [a["id"] for a in armed]
    assert [loss["mode"] for loss in losses] == ["preempted", "killed"] and losses[0]["state"] == "replaced", losses
    xcom = latest_xcom()
    [recovery] = xcom[(t.WAIT, "recoveries")]
    # Ray's own error for a worker whose node died, matched by a rule that says so in the log.
    assert recovery["rule"] in ("actor-died", "actor-unavailable", "node-died"), recovery
    assert f"recovery rule '{recovery['rule']}': recoverable" in result.output
    # At most the steps of the 2 s notice are lost (half a second or more each).
    assert recovery["resumed_from"] == SAVE_PERIOD and recovery["steps_lost"] <= 4, recovery
    assert recovery["submission_id"].endswith("-r1") and recovery["gpu_hours_lost"] > 0
    # Fenced: the failed attempt had ended (Ray's end_time) before the next one was submitted.
    assert recovery["failed_at"] <= recovery["resubmitted_at"]
    assert f"Fenced: Ray job {recovery['failed_job']} is FAILED" in result.output
    # One table across both attempts: steps 1-5 from the first, 6-10 from the second, none twice.
    steps = [(s["step"], s["attempt"]) for s in xcom[(t.WAIT, "steps")]]
    assert steps[:10] == [(n, 0 if n <= SAVE_PERIOD else 1) for n in range(1, 11)], steps
    assert len({n for n, _ in steps}) == len(steps), steps
    summary = xcom[(t.WAIT, "summary")]
    assert summary["recoveries"] == 1 and summary["checkpoints"][:2] == [5, 10], summary
    # The second loss found no recovery left: the newest save, the second attempt's, is the run's checkpoint:
    # validated, exported, and so Lustre is deleted.
    assert "its 1 recovery (max_recoveries) is used up. Checkpoint step 10 is validated and exported next" in (
        result.output
    )
    # The failure alert says how far training got, from the table pushed before the failure.
    assert "Reward so far: no training ran" not in result.output
    assert xcom[(t.CHECK_CHECKPOINT, "return_value")]["step"] == 10
    assert result.tasks[t.EXPORT] == "success" and xcom[(t.EXPORT, "return_value")]["step"] == 10
    assert all(result.tasks[s.task_id] == "success" for s in t.teardown_steps()), result.tasks
    assert sandbox.full_inventory()["resources"] == []
