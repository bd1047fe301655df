"""When ``train.wait``'s trigger ends its wait on the Ray job, and whether that ends the job too.

The trigger (``triggers/rayjob.py``) reads the job at each poll: its status, what is new in its log, the zero-learning
guard's verdict, the run clock's decision, how long since the last step. It puts what it read in a :class:`Reading`,
asks :func:`decide`, and acts on the answer: stop the job when the rule says so, then send the rule's event. The rules,
first match wins:

1. The job ended by itself: after its own deadline save (NeMo RL's ``checkpoint_must_save_by`` exit), or otherwise.
2. The guard saw no learning: stop now.
3. The run converged and the save after it finished: stop.
4. The run's deadline (budget, capacity end, job timeout) is reached: stop now, or at the job's next save once it is
   near (:meth:`nemo_rl_gke.run.deadline.RunClock.decide`).
5. No new step within the stall bound: stop.
6. The job timeout (from the submit) has passed: stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from nemo_rl_gke.run.deadline import STOP, STOP_AT_NEXT_SAVE

# Ray's terminal job states, as the trigger's events name them.
TERMINAL = {"SUCCEEDED": "success", "FAILED": "failed", "STOPPED": "stopped"}
# The event statuses of the rules that stop the job (train.wait reads them: decide/job_end.py).
ZERO_LEARNING, CONVERGED, STALLED, TIMED_OUT, BUDGET = "zero_learning", "converged", "stalled", "timeout", "budget"


class Rule(Enum):
    """Why the wait ends (the order is :func:`decide`'s)."""

    OWN_DEADLINE_SAVE = "the job saved at its own deadline and exited"
    FINISHED = "the job ended"
    ZERO_LEARNING = "no learning"
    CONVERGED = "converged and saved"
    DEADLINE = "the run's deadline"
    DEADLINE_AT_SAVE = "the save after the run's deadline came near"
    STALLED = "stalled"
    TIMEOUT = "the job timeout"


@dataclass(frozen=True)
class Reading:
    """What the trigger read at one poll (a poll whose read failed transiently read nothing of the job itself: its
    status is the last one known, and the guard's fields are empty)."""

    status: str  # Ray's job status
    exited_at_own_deadline: bool = False  # the log shows NeMo RL's checkpoint_must_save_by exit
    no_learning: bool = False  # the zero-learning guard says stop now
    converged_save: int | None = None  # the save that finished after the run converged
    clock: str | None = None  # the run clock's decision (None: the run has no deadline)
    save_since_near: int | None = None  # a save after the deadline came near (with STOP_AT_NEXT_SAVE)
    stalled: bool = False  # no new step in the log within the stall bound
    job_time_left_s: float = 1.0  # until the job timeout, from the submit


@dataclass(frozen=True)
class Decision:
    """The rule that ends the wait, and whether the trigger stops the job first."""

    rule: Rule
    stops_job: bool


def decide(reading: Reading) -> Decision | None:
    """The rule that ends the wait now (None: poll again)."""
    if reading.status in TERMINAL:
        own = reading.status == "SUCCEEDED" and reading.exited_at_own_deadline
        return Decision(Rule.OWN_DEADLINE_SAVE if own else Rule.FINISHED, stops_job=False)
    if reading.no_learning:
        return Decision(Rule.ZERO_LEARNING, stops_job=True)
    if reading.converged_save is not None:
        return Decision(Rule.CONVERGED, stops_job=True)
    if reading.clock == STOP:
        return Decision(Rule.DEADLINE, stops_job=True)
    if reading.clock == STOP_AT_NEXT_SAVE and reading.save_since_near is not None:
        return Decision(Rule.DEADLINE_AT_SAVE, stops_job=True)
    if reading.stalled:
        return Decision(Rule.STALLED, stops_job=True)
    if reading.job_time_left_s <= 0:
        return Decision(Rule.TIMEOUT, stops_job=True)
    return None
