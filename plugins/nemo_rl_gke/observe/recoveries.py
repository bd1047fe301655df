"""What a node-loss recovery cost, and one run's steps across its attempts.

A recovery resubmits the job from its newest checkpoint: the steps it finished after that save are lost (trained
again by the next attempt), and so is the time until the next attempt starts. Both are counted in GPU-hours at the
run's size (every GPU of the RayCluster's workers waits while one node is replaced).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nemo_rl_gke.observe.metrics import StepMetrics

ATTEMPT_SUFFIX = "-r"


def attempt_id(base: str, attempt: int) -> str:
    """The submission id of attempt ``attempt`` (0: the first submission, whose id is the base)."""
    return base if attempt == 0 else f"{base}{ATTEMPT_SUFFIX}{attempt}"


def recovery_record(
    *,
    attempt: int,
    failed_job: str,
    rule: str,
    why: str,
    failed_at: float,
    steps: Sequence[StepMetrics],
    resumed_from: int | None,
    gpus: int,
) -> dict[str, Any]:
    """The row of one recovery, before its resubmission (``resubmitted_at`` and the time to recover are added
    then by :func:`resubmitted`). ``steps`` are the failed attempt's, ``resumed_from`` the step it saved last."""
    done = [s for s in steps if s.completed]
    last = done[-1].step if done else None
    lost = [s for s in done if resumed_from is None or s.step > resumed_from]
    lost_s = sum(s.total_step_time_s or 0.0 for s in lost)
    return {
        "attempt": attempt,
        "failed_job": failed_job,
        "rule": rule,
        "why": why,
        "failed_at": failed_at,
        "failed_at_step": last,
        "resumed_from": resumed_from,
        "steps_lost": len(lost),
        "lost_step_seconds": round(lost_s, 3),
        "gpus": gpus,
        "gpu_hours_lost": round(lost_s * gpus / 3600.0, 6),
    }


def resubmitted(record: dict[str, Any], submission_id: str, at: float) -> dict[str, Any]:
    """The row once the next attempt is submitted: the wait for the replacement counts as lost GPU time too."""
    waited = max(at - float(record["failed_at"]), 0.0)
    lost_s = float(record["lost_step_seconds"]) + waited
    return {
        **record,
        "submission_id": submission_id,
        "resubmitted_at": at,
        "time_to_recover_s": round(waited, 3),
        "gpu_hours_lost": round(lost_s * int(record["gpus"]) / 3600.0, 6),
    }


def merge_attempts(attempts: Sequence[Sequence[StepMetrics]], resumed: Sequence[int | None]) -> list[dict[str, Any]]:
    """One table of the run's steps: each attempt's rows up to the step the next one resumed from, marked with
    their attempt (``resumed[i]`` is the step attempt ``i + 1`` resumed from)."""
    rows: list[dict[str, Any]] = []
    for index, steps in enumerate(attempts):
        cut = resumed[index] if index < len(resumed) else None
        for step in steps:
            if step.completed and (cut is None or step.step <= cut):
                rows.append({**step.to_dict(), "attempt": index})
    return rows


def recoveries_text(recoveries: Sequence[dict[str, Any]]) -> str:
    """One line per recovery, for the task log, the report and the alerts."""
    lines = []
    for r in recoveries:
        recover = r.get("time_to_recover_s")
        lines.append(
            f"recovery {r['attempt']}: {r['failed_job']} failed at step {r.get('failed_at_step')} ({r['rule']}: "
            f"{r['why']}); resumed from step {r.get('resumed_from')}, {r['steps_lost']} step(s) lost"
            + (f", {recover:.0f}s to recover" if recover is not None else "")
            + f", {r['gpu_hours_lost']:.3f} GPU-h lost"
        )
    return "\n".join(lines)
