"""How ``train.wait``'s task log carries the Ray job's driver log: the one home of what the job trigger writes
(``triggers/rayjob.py``) and the Training view reads back (``observe/training_view.py``).

Each driver-log line is one task-log message with :data:`JOB_LINE` before it. Before an attempt's lines, the trigger
writes :data:`FOLLOWING` and the job's submission id; a restarted trigger writes it again with the same id, with
:data:`RESUMED_AT` and the log position when it goes on where the one before stopped (``triggers/log_position.py``),
without when it starts the job's log again.
"""

from __future__ import annotations

JOB_LINE = "[ray job] "
FOLLOWING = "Following Ray job "
RESUMED_AT = " from log character "


def job_line(text: str) -> str:
    """A driver-log line as the task log carries it."""
    return f"{JOB_LINE}{text}"


def following_line(submission_id: str, resumed_at: int = 0) -> str:
    """The line before a job's driver-log lines; ``resumed_at`` > 0: the position a restarted trigger goes on from."""
    return f"{FOLLOWING}{submission_id}{RESUMED_AT}{resumed_at}" if resumed_at else f"{FOLLOWING}{submission_id}"


def driver_text(line: str) -> str | None:
    """The driver-log text of a task-log message (None: not a driver-log line)."""
    return line[len(JOB_LINE) :] if line.startswith(JOB_LINE) else None


def followed(line: str) -> tuple[str, bool] | None:
    """The submission id of a :func:`following_line`, and whether it resumes a log already followed (None: not
    such a line)."""
    if not line.startswith(FOLLOWING):
        return None
    submission, resumed, _ = line[len(FOLLOWING) :].strip().partition(RESUMED_AT)
    return submission, bool(resumed)
