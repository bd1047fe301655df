"""Airflow's task-instance states, and the sets of them the package reasons with, written once.

The words are Airflow's (``airflow.utils.state.TaskInstanceState``; ``none`` is a task with no state yet), spelled
out here so the pure modules (the report, the costs, the Training view's data) need no Airflow import; a test checks
them against Airflow's enum. Every other module reads its states from here.
"""

from __future__ import annotations

SUCCESS = "success"
FAILED = "failed"
UPSTREAM_FAILED = "upstream_failed"
SKIPPED = "skipped"
REMOVED = "removed"
RUNNING = "running"
DEFERRED = "deferred"
QUEUED = "queued"
SCHEDULED = "scheduled"
UP_FOR_RETRY = "up_for_retry"
UP_FOR_RESCHEDULE = "up_for_reschedule"
RESTARTING = "restarting"
NONE = "none"  # no state yet (Airflow's None)

# A task that failed, itself or because one it needs did.
FAILED_STATES = frozenset({FAILED, UPSTREAM_FAILED})
# A task that will not change any more.
ENDED = frozenset({SUCCESS, FAILED, SKIPPED, UPSTREAM_FAILED, REMOVED})
# A task of a run in progress, most telling first (what a deadline alert calls the run's current stage).
ACTIVE: tuple[str, ...] = (RUNNING, DEFERRED, UP_FOR_RETRY, UP_FOR_RESCHEDULE, RESTARTING, QUEUED, SCHEDULED)
# A task that is at work on its resource or about to be (queued, between tries): what it creates or deletes may be
# half there. Not yet scheduled ones, and reschedule (no step of a run reschedules), are not.
AT_WORK = frozenset({RUNNING, DEFERRED, QUEUED, UP_FOR_RETRY, RESTARTING})
# A task that took no part in the run (so it has no stage to report).
NOT_RUN = frozenset({NONE, REMOVED, SKIPPED})
# A step that made (or may have left, when it failed) its resource.
MADE = frozenset({SUCCESS, FAILED})
# A DAG run (its states are a few of the same words) that may still act on its run group.
ACTIVE_RUNS = frozenset({QUEUED, RUNNING})
# Most severe first: a stage's state is the most severe state among its tasks.
SEVERITY: tuple[str, ...] = (
    FAILED,
    UPSTREAM_FAILED,
    UP_FOR_RETRY,
    UP_FOR_RESCHEDULE,
    RESTARTING,
    RUNNING,
    DEFERRED,
    QUEUED,
    SCHEDULED,
    REMOVED,
    NONE,
    SKIPPED,
    SUCCESS,
)
# An unknown state ranks just after upstream_failed, so that it is not hidden behind success.
UNKNOWN_SEVERITY = 2


def severity(state: str) -> int:
    """How severe a task state is (0: the most severe)."""
    return SEVERITY.index(state) if state in SEVERITY else UNKNOWN_SEVERITY
