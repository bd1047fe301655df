"""What ``train.wait`` makes of the job's end: whether the task succeeds, and which checkpoint is the run's.

The job trigger ends its wait with an event whose ``status`` names the rule (``decide/job_stop.py``); the operator
reads the job's log for the newest save that finished, asks :func:`after_wait`, and acts: mark the checkpoint pending
(Lustre is kept until the export copies it), then return or fail. A failed job goes to node-loss recovery first
(``decide/recovery.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_rl_gke.decide.job_stop import BUDGET, CONVERGED, STALLED, TERMINAL

SUCCESS = TERMINAL["SUCCEEDED"]


@dataclass(frozen=True)
class JobEnd:
    """The answer: whether the task succeeds, and the checkpoint step validated and exported next (None: the
    recipe's last step on a success, or none on a failure). ``pending`` says whether that step is marked pending
    here (a stop chose it); a job that ran to its end leaves its last save to the recipe's schedule."""

    succeeds: bool
    checkpoint: int | None = None
    pending: bool = False
    converged_at: int | None = None


def after_wait(status: str, final_step: int | None, later_save: int | None, converged_at: int | None) -> JobEnd:
    """The job's end, from the event's ``status`` and ``final_step`` (the save the trigger saw), and the newest save
    the job's whole log shows (``later_save``: a stop can land after the job saved once more).

    - A stop at the run's deadline: success, with the newest finished save.
    - A stall with a save: failure, and that save is still validated and exported.
    - Converged: success, with the newest finished save.
    - The job's own end: success, with the step the event names, or the recipe's last.
    - Anything else (no save before a stop, the zero-learning guard, a failed job no recovery took): failure.
    """
    newest = None if final_step is None else max(int(final_step), later_save or 0)
    if status in (BUDGET, STALLED) and newest is not None:
        return JobEnd(status == BUDGET, newest, pending=True)
    if status == CONVERGED and newest is not None:
        return JobEnd(True, newest, pending=True, converged_at=converged_at)
    if status == SUCCESS:
        return JobEnd(True, None if final_step is None else int(final_step))
    return JobEnd(False)
