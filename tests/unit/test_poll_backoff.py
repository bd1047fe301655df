"""Long waits poll less (triggers/operations.long_wait_delay): a wait of days costs a few times an hour's polls, and the
job's trigger still polls often enough to stop it in time."""

from __future__ import annotations

import time

import pytest

from nemo_rl_gke.run.deadline import Limit, RunClock
from nemo_rl_gke.triggers.operations import LONG_WAIT_CAP_S, LONG_WAIT_DOUBLING_S, long_wait_delay
from nemo_rl_gke.triggers.rayjob import RayJobTrigger

HOUR = 3600.0


def polls(poll_interval: float, seconds: float) -> int:
    """How many polls a wait of ``seconds`` makes on this schedule."""
    at, count = 0.0, 0
    while at < seconds:
        at += long_wait_delay(poll_interval, at)
        count += 1
    return count


def test_the_interval_doubles_every_half_hour_up_to_the_cap() -> None:
    assert long_wait_delay(15.0, 0) == 15.0
    assert long_wait_delay(15.0, LONG_WAIT_DOUBLING_S) == pytest.approx(30.0)
    assert long_wait_delay(15.0, 2 * LONG_WAIT_DOUBLING_S) == pytest.approx(60.0)
    assert long_wait_delay(15.0, 7 * 24 * HOUR) == LONG_WAIT_CAP_S
    assert long_wait_delay(1200.0, 10 * HOUR) == 1200.0  # a slower poll interval is never made faster
    # A Lustre create (15 min) polls almost as it always did.
    assert polls(15.0, 900) in range(50, 61)


def test_a_week_costs_a_few_hours_worth_of_polls() -> None:
    hour, week = polls(15.0, HOUR), polls(15.0, 7 * 24 * HOUR)
    assert week / hour < 7, (hour, week)  # it was 168 with a fixed interval
    print(f"polls: 1 h {hour}, 7 days {week}, ratio {week / hour:.2f}")


def _trigger(**kwargs: object) -> RayJobTrigger:
    now = time.time()
    return RayJobTrigger(
        address="http://127.0.0.1:1",
        submission_id="job",
        poll_interval=15.0,
        started_at=now - 3 * 24 * HOUR,
        timeout=30 * 24 * HOUR,
        stall_after_s=4 * 24 * HOUR,
        **kwargs,  # type: ignore[arg-type]
    )


def test_the_job_trigger_stretches_its_polls_but_never_past_a_stop() -> None:
    now = time.time()
    far = _trigger()
    assert far._poll_delay(now) == LONG_WAIT_CAP_S
    # A deadline 10 minutes away: at most half of it, so the stop is seen in time.
    clock = RunClock((Limit("max_run_hours", now + 600, False, "the run's hours"),))
    near = _trigger(clock=clock.to_dict())
    assert near._poll_delay(now) == pytest.approx(300, abs=1)
    # Waiting for a save to stop at: the plain interval.
    waiting = _trigger()
    waiting._budget_near_index = 3
    assert waiting._poll_delay(now) == 15.0
    # A fresh job polls at its interval.
    fresh = _trigger(attempt_started_at=now)
    assert fresh._poll_delay(now) == 15.0
