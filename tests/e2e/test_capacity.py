"""A whole run down the GPU capacity ladder, on the sandbox with the local CPU recipe: the reservation is used up by
others, so its rung reports a stock-out and the run replaces the GPU pool with a flex-start one (networks, Lustre and
the cluster kept). The flex-start nodes come from the Dynamic Workload Scheduler's queue after its delay and end at
the pool's maxRunDuration: that end (flex_start_max_hours, counted from when the flex-start rung's wait began) is the
run's deadline, so the job is given NeMo RL's checkpoint_must_save_by to save before it, less what the recipe's setup
needs, and the trigger stops it at the end at the latest. The test asserts the save, not which clock came first: the
job also saves every SAVE_PERIOD steps, so however slowly this machine loads the model, the stop loses fewer steps than
that, and the newest save is the checkpoint validated and exported. The report names each rung and its wait, and
prices the run as flex-start.

One run for both of the issue's ladder and flex-start cases: each whole-DAG run costs CI minutes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.run import capacity, costs, deadline
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.e2e.harness import latest_xcom, run_logged

pytestmark = [pytest.mark.airflow, pytest.mark.usefixtures("fresh_sandbox")]
SPEC = RunSpec()
# 144 s of flex-start nodes: the job starts with most of it left and cannot finish 400 steps in it. Not less: on a
# loaded 2-core machine NeMo RL's setup alone took 38 s (CI, 2026-12-06), and with 90 s its deadline save then fell
# after the nodes' end (the run fails then, rightly: "newest saved step None").
FLEX_HOURS = 0.04
FLEX_DELAY_S = 3.0
SAVE_PERIOD = 20


def _seconds(row: dict[str, Any]) -> float:
    return (datetime.fromisoformat(row["ended_at"]) - datetime.fromisoformat(row["started_at"])).total_seconds()


def test_a_full_reservation_falls_to_flex_start_which_saves_before_its_nodes_end_and_exports_that_checkpoint(
    sandbox: SandboxProcess, dag: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    machine = SPEC.effective_machine_type
    # Every reserved machine is taken by someone else; the queue serves flex-start after 3 s.
    sandbox.seed_reservation(SPEC.project, SPEC.zone, SPEC.reservation, machine, SPEC.worker_replicas,
                             in_use_count=SPEC.worker_replicas)  # fmt: skip
    sandbox.set_capacity(flex_start_delay_s=FLEX_DELAY_S)
    conf = {
        "capacity_ladder": ["reservation:60", "flex_start:120"],
        "flex_start_max_hours": FLEX_HOURS,
        "max_steps": 400,
        # The test is about the deadline: a fast machine's job that converges first would end the run otherwise.
        "zero_learning_guard": False,
        # Half a second a step (asleep): 400 steps outlast the 144 s, which local steps alone would not.
        "extra_overrides": [f"checkpointing.save_period={SAVE_PERIOD}", "sandbox.step_delay_s=0.5"],
    }
    try:
        result = run_logged(dag, conf, capfd)
    finally:
        sandbox.seed_reservation(SPEC.project, SPEC.zone, SPEC.reservation, machine, SPEC.worker_replicas)
    assert result.state == "success", result.errors()
    xcom = latest_xcom()
    rows = xcom[(t.RAYCLUSTER, "return_value")]["capacity"]
    assert [(r["capacity"], r["outcome"]) for r in rows] == [
        ("reservation", capacity.STOCKOUT),
        ("flex_start", capacity.SERVED),
    ], rows
    assert "GCE_STOCKOUT" in rows[0]["message"] or "does not have available resources" in rows[0]["message"], rows
    # The flex-start nodes came no sooner than the queue's delay (the outcomes say each rung ended before its time).
    assert _seconds(rows[1]) >= FLEX_DELAY_S, rows
    assert "replacing the node pool with rung 2, flex_start" in result.output
    # The pool was replaced, nothing else: one create of each rung's pool, one delete between, one cluster.
    posts = [c["path"] for c in sandbox.calls() if c["method"] == "POST" and c["status"] == 200]
    assert len([p for p in posts if p.endswith("/nodePools")]) == 2, posts
    assert len([p for p in posts if p.endswith("/clusters")]) == 1, posts

    # The job was stopped at a save before GKE took the nodes (no recovery: no node ended under it), and the newest
    # save is what was validated and exported.
    waited = xcom[(t.WAIT, "return_value")]
    assert waited["stopped_at_budget"] is True and waited["final_step"] < 400, waited
    budget = xcom[(t.WAIT, "budget")]
    assert budget["hours_limit"] == pytest.approx(FLEX_HOURS, abs=1e-4) and budget["stopped_at_budget"], budget
    stop = budget["stop"]
    # A hard end is never waited past for a save: the stop came at the first check at or after it (how far after is
    # the machine's speed), and the trigger never said it was waiting for one.
    assert stop["limit"] == deadline.CAPACITY_END and "waiting up to" not in result.output, stop
    # The job was given the deadline less the recipe's setup reserve; whichever came first (its own deadline save,
    # or the trigger's stop at the nodes' end), fewer than a save period's steps were lost.
    assert f"Run deadline capacity_end: the flex_start nodes' end ({FLEX_HOURS:g} h" in result.output
    assert "checkpointing.checkpoint_must_save_by=00:00:" in result.output
    step = waited["final_step"]
    summary = xcom[(t.WAIT, "summary")]
    assert not xcom.get((t.WAIT, "recoveries")) and summary["checkpoints"][-1] == step, summary
    assert stop["lost"] is None or stop["lost"]["steps"] < SAVE_PERIOD, stop
    assert xcom[(t.CHECK_CHECKPOINT, "return_value")]["step"] == step
    assert result.tasks[t.EXPORT] == "success" and xcom[(t.EXPORT, "return_value")]["step"] == step

    # The report names each rung, how it ended and its wait, and prices the GPU hours as flex-start.
    report = xcom[(t.RUN_REPORT, t.REPORT_TEXT)]
    assert "rung 1 reservation      stock-out after" in report and "(waits up to 60 s)" in report
    assert "rung 2 flex_start       served after" in report and "(waits up to 120 s)" in report
    assert f"{costs.CAPACITY_PRICE_SHARES['flex_start'][0]:.2f} x list" in report
    assert sandbox.full_inventory()["resources"] == []
    with capfd.disabled():
        said = ("rung", "checkpoint_must_save_by", "stopped at", "GCE_STOCKOUT", "setup ended")
        print("\n" + "\n".join(line for line in result.output.splitlines() if any(w in line for w in said)))
        print("\n".join(line for line in report.splitlines() if "rung" in line or "GPU" in line))
        lost = stop["lost"]["steps"] if stop["lost"] else 0
        print(f"stopped at flex-start's end at step {step} ({lost} steps lost); served after {_seconds(rows[1]):.1f} s")
