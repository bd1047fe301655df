"""Node-loss recovery: whether a failed job is resubmitted, from which step, and what a recovery that cannot go on
leaves to export.

``train.wait`` (``operators/rayjob.py``) reads the failed job (Ray's account, the driver's last lines, the steps its
log holds), classifies it with the rules (:mod:`nemo_rl_gke.decide.recovery_rules`), asks :func:`after_failure`, and
acts: wait for the RayCluster's replacement worker, or fail. When the wait for the replacement ends it asks
:func:`after_replacement`: resubmit from the step the recovery chose, or fail. A failure that has a checkpoint
exports it (``train.validate`` and the export run next), so a run that loses its nodes for good still hands over what
it learned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from nemo_rl_gke.decide.recovery_rules import Verdict


class Move(Enum):
    """What the wait task does about a failed job."""

    NOT_RECOVERED = "not recovered"  # no rule recovers it: the job's failure is the run's, as without recovery
    RECOVER = "recover"  # wait for the replacement worker, then resubmit
    RESUBMIT = "resubmit"  # the replacement is there: fence the failed attempt and submit the next
    GIVE_UP = "give up"  # recoveries used up, or the replacement never came: fail, exporting the checkpoint if any


@dataclass(frozen=True)
class Recovery:
    """The answer: the move, the step the next attempt resumes from (or the checkpoint a give-up exports; None: no
    checkpoint), and for a give-up why, in words."""

    move: Move
    resume_from: int | None = None
    why: str = ""


def after_failure(
    verdict: Verdict, *, used: int, max_recoveries: int, saved: int | None, started_from: int | None
) -> Recovery:
    """What to do about a failed job, given the rules' verdict, the recoveries this run used, the newest save the
    failed attempt finished (``saved``) and the step the attempt itself resumed from (``started_from``).

    The next attempt resumes from the newest save: this attempt's, else where this attempt started.
    """
    if not verdict.recoverable:
        return Recovery(Move.NOT_RECOVERED)
    resume_from = saved if saved is not None else started_from
    if used >= max_recoveries:
        spent = "recovery (max_recoveries) is" if max_recoveries == 1 else "recoveries (max_recoveries) are"
        return Recovery(Move.GIVE_UP, resume_from, f"{verdict.text()}; its {max_recoveries} {spent} used up")
    return Recovery(Move.RECOVER, resume_from)


def after_replacement(succeeded: bool, message: str, *, attempt: int, resume_from: int | None) -> Recovery:
    """What to do when the wait for recovery ``attempt``'s replacement ended: resubmit once the RayCluster has all
    its workers again, else give up (exporting ``resume_from`` when there is one)."""
    if succeeded:
        return Recovery(Move.RESUBMIT, resume_from)
    why = f"recovery {attempt}: the RayCluster did not get its workers back: {message}"
    return Recovery(Move.GIVE_UP, resume_from, why)


def attempt_to_follow(max_recoveries: int, submitted: Callable[[int], bool]) -> int:
    """The newest attempt Ray has (0: the first submission), so a retried wait follows it and never starts one:
    attempts are submitted in order, so the first one Ray does not know ends the count."""
    attempt = 0
    while attempt < max_recoveries and submitted(attempt + 1):
        attempt += 1
    return attempt
