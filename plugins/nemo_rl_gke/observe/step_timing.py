"""Step timing: the stall rule (how long the job may go without a new step) and the progress mark it compares.

Pure and stdlib-only (the triggerer imports it).
"""

from __future__ import annotations

from collections.abc import Sequence

from nemo_rl_gke.observe.metrics import RunMetrics, StepMetrics, _mean

# Before the first step: pulling the image, loading the model and starting vLLM take tens of minutes on GKE.
STARTUP_ALLOWANCE_S = 3600.0
# After it: this many mean step times, and never less than the floor (a validation or a save makes a step longer).
STALL_STEP_FACTOR = 10.0
STALL_FLOOR_S = 900.0


def mean_step_time(steps: Sequence[StepMetrics]) -> float | None:
    """The mean ``Total step time`` of the completed steps, None before the first."""
    return _mean([s.total_step_time_s for s in steps if s.completed])


def stall_after(steps: Sequence[StepMetrics], override_s: float | None = None) -> float:
    """Seconds without a new step that make a stall. Before a step time is known: :data:`STARTUP_ALLOWANCE_S` (or
    the conf's ``stall_after_s`` if longer: loading a model is no stall). After: the conf's ``stall_after_s`` when
    set, else :data:`STALL_STEP_FACTOR` x the mean step time, at least :data:`STALL_FLOOR_S`."""
    mean = mean_step_time(steps)
    if mean is None:
        return max(STARTUP_ALLOWANCE_S, float(override_s or 0.0))
    if override_s:
        return float(override_s)
    return max(STALL_FLOOR_S, STALL_STEP_FACTOR * mean)


def progress_mark(metrics: RunMetrics) -> tuple[int, int, int]:
    """What grows while a job trains: step headers, completed steps and checkpoint saves."""
    return len(metrics.steps), sum(1 for s in metrics.steps if s.completed), len(metrics.checkpoints)
