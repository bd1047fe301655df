"""Every stop ends at a save, however slowly the job starts: a whole run on the sandbox with the local CPU recipe
whose setup (NeMo RL's model load, ``sandbox.setup_delay_s``) outlasts what the run could reserve for it before a
tight deadline. NeMo RL starts checkpoint_must_save_by's clock only after that setup, so its deadline save falls
after the deadline; the deployment allows an overrun to finish it, so the trigger waits for it, and that checkpoint
is validated and exported. The deadline is the job timeout, counted from the submit, so how long provisioning takes
on a loaded machine changes nothing; it is one of the run's limits like the budget, on one clock.
"""

from __future__ import annotations

from typing import Any

import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.run import deadline
from nemo_rl_gke.run import topology as t
from tests.e2e.harness import latest_xcom, run_logged

pytestmark = [pytest.mark.airflow, pytest.mark.usefixtures("fresh_sandbox")]
JOB_TIMEOUT_S = 20
SETUP_DELAY_S = 25


def test_a_setup_slower_than_a_tight_deadline_allows_overruns_to_the_jobs_own_save_which_is_validated_and_exported(
    sandbox: SandboxProcess, dag: Any, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__NEMO_RL_GKE__BUDGET_OVERRUN_MINUTES", "10")
    conf = {
        "max_steps": 400,
        "job_timeout_s": JOB_TIMEOUT_S,
        "zero_learning_guard": False,
        # No periodic save: the deadline's save is the only one. The setup alone outlasts the job timeout.
        "extra_overrides": [
            "checkpointing.save_period=1000",
            f"sandbox.setup_delay_s={SETUP_DELAY_S}",
            "sandbox.step_delay_s=0.1",
        ],
    }
    result = run_logged(dag, conf, capfd)
    assert result.state == "success", result.errors()
    xcom = latest_xcom()
    # The submit gave the job the time left less a reserve for the setup (the recipe's 30 s, or what this DAG's
    # earlier runs measured, at most half the 20 s left) and the save's margin: the delay outlasts it either way.
    submitted = xcom[(t.SUBMIT, "return_value")]["save_by"]
    assert submitted["reserve_s"] <= JOB_TIMEOUT_S * deadline.MAX_RESERVE_SHARE < SETUP_DELAY_S, submitted
    assert "Run deadline job_timeout_s: the job timeout (20 s, job_timeout_s)" in result.output
    assert f"checkpointing.checkpoint_must_save_by={submitted['text']} (20 s left, less " in result.output
    # The trigger saw NeMo RL's setup end after the deadline and waited within the overrun; the job saved.
    assert "waiting up to" in result.output and "budget_overrun_minutes" in result.output
    waited = xcom[(t.WAIT, "return_value")]
    stop = xcom[(t.WAIT, "budget")]["stop"]
    step = waited["final_step"]
    assert waited["stopped_at_budget"] is True and step is not None and step < 400, waited
    assert stop["limit"] == deadline.JOB_TIMEOUT and stop["overrun_s"] > 0 and stop["lost"] is None, stop
    summary = xcom[(t.WAIT, "summary")]
    assert summary["checkpoints"] == [step] and summary["startup_s"] >= SETUP_DELAY_S, summary
    assert xcom[(t.CHECK_CHECKPOINT, "return_value")]["step"] == step
    assert result.tasks[t.EXPORT] == "success" and xcom[(t.EXPORT, "return_value")]["step"] == step
    report = xcom[(t.RUN_REPORT, t.REPORT_TEXT)]
    assert f"stopped at the job timeout (job_timeout_s): {summary['steps_completed']} of 400 steps, " in report
    assert "past the job timeout (20 s, job_timeout_s) to finish its deadline save" in report
    assert sandbox.full_inventory()["resources"] == []
    with capfd.disabled():
        print(
            f"\nslow setup: startup {summary['startup_s']} s, job timeout {JOB_TIMEOUT_S} s, reserve "
            f"{submitted['reserve_s']:.0f} s, checkpoint_must_save_by {submitted['text']}, "
            f"{stop['overrun_s']:.1f} s past the deadline, step {step} saved, validated and exported"
        )
