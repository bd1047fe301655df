"""Node-loss recovery's decisions (``decide/recovery.py``) and the job's end (``decide/job_end.py``), on every state
the wait task can be in."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nemo_rl_gke.decide import job_end, recovery
from nemo_rl_gke.decide.recovery import Move
from nemo_rl_gke.decide.recovery_rules import BEFORE_FIRST_STEP, UNMATCHED, Verdict

LOST_NODE = Verdict("node-died", True, "a node stopped answering Ray's health checks")


@pytest.mark.parametrize(
    ("verdict", "used", "saved", "started_from", "move", "resume_from"),
    [
        # A failure no rule recovers is the run's, whatever was saved.
        (UNMATCHED, 0, 4, None, Move.NOT_RECOVERED, None),
        (BEFORE_FIRST_STEP, 0, None, None, Move.NOT_RECOVERED, None),
        # A lost node resumes from the attempt's newest save...
        (LOST_NODE, 0, 4, None, Move.RECOVER, 4),
        # ...or, when it saved nothing, from where it started itself (a resumed run, a previous recovery).
        (LOST_NODE, 1, None, 6, Move.RECOVER, 6),
        (LOST_NODE, 0, None, None, Move.RECOVER, None),
        # Recoveries used up: give up, exporting that same step.
        (LOST_NODE, 2, 8, 6, Move.GIVE_UP, 8),
        (LOST_NODE, 2, None, None, Move.GIVE_UP, None),
    ],
)
def test_a_failed_job_is_recovered_only_by_a_rule_and_while_recoveries_are_left(
    verdict: Verdict, used: int, saved: int | None, started_from: int | None, move: Move, resume_from: int | None
) -> None:
    answer = recovery.after_failure(verdict, used=used, max_recoveries=2, saved=saved, started_from=started_from)
    assert (answer.move, answer.resume_from) == (move, resume_from)
    if move is Move.GIVE_UP:
        assert answer.why == f"{verdict.text()}; its 2 recoveries (max_recoveries) are used up"


def test_one_recovery_is_named_in_the_singular() -> None:
    answer = recovery.after_failure(LOST_NODE, used=1, max_recoveries=1, saved=3, started_from=None)
    assert answer.why.endswith("its 1 recovery (max_recoveries) is used up")


def test_the_replacement_wait_resubmits_or_gives_up_with_the_recoverys_step() -> None:
    assert recovery.after_replacement(True, "ready", attempt=1, resume_from=5) == recovery.Recovery(Move.RESUBMIT, 5)
    gave_up = recovery.after_replacement(False, "timeout after 900s", attempt=2, resume_from=5)
    assert (gave_up.move, gave_up.resume_from) == (Move.GIVE_UP, 5)
    assert gave_up.why == "recovery 2: the RayCluster did not get its workers back: timeout after 900s"


def test_a_retried_wait_follows_the_newest_attempt_ray_has_and_never_looks_past_the_limit() -> None:
    asked: list[int] = []

    def submitted(known: set[int]) -> Callable[[int], bool]:
        def ask(attempt: int) -> bool:
            asked.append(attempt)
            return attempt in known

        return ask

    assert recovery.attempt_to_follow(3, submitted(set())) == 0
    assert recovery.attempt_to_follow(3, submitted({1, 2})) == 2
    asked.clear()
    assert recovery.attempt_to_follow(2, submitted({1, 2, 3})) == 2
    assert asked == [1, 2]


@pytest.mark.parametrize(
    ("status", "final_step", "later", "expected"),
    [
        # A deadline stop hands on the newest save that finished, even one after the save the trigger saw.
        ("budget", 4, 6, job_end.JobEnd(True, 6, pending=True)),
        ("budget", 4, None, job_end.JobEnd(True, 4, pending=True)),
        # Nothing saved before the deadline: the run fails.
        ("budget", None, None, job_end.JobEnd(False)),
        # A stall fails the task, and its save is still validated and exported.
        ("stalled", 3, 2, job_end.JobEnd(False, 3, pending=True)),
        ("stalled", None, None, job_end.JobEnd(False)),
        ("converged", 8, 10, job_end.JobEnd(True, 10, pending=True, converged_at=7)),
        # A job that ran to its end leaves its last save to the recipe (no step named: the recipe's last).
        ("success", 20, None, job_end.JobEnd(True, 20)),
        ("success", None, None, job_end.JobEnd(True, None)),
        ("zero_learning", 2, 2, job_end.JobEnd(False)),
        ("failed", 2, 2, job_end.JobEnd(False)),
    ],
)
def test_the_jobs_end_says_whether_the_task_succeeds_and_which_checkpoint_is_the_runs(
    status: str, final_step: int | None, later: int | None, expected: job_end.JobEnd
) -> None:
    converged_at = 7 if status == "converged" else None
    assert job_end.after_wait(status, final_step, later, converged_at) == expected
