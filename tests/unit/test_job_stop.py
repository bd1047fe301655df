"""The job trigger's stop rules (decide/job_stop.py): each rule on its own, and which wins when several hold."""

from __future__ import annotations

import dataclasses

import pytest

from nemo_rl_gke.decide.job_stop import Decision, Reading, Rule, decide
from nemo_rl_gke.run.deadline import GO_ON, STOP, STOP_AT_NEXT_SAVE

RUNNING = Reading(status="RUNNING")
# Every rule's trigger at once: the first in the module's order wins.
EVERYTHING = Reading(
    status="RUNNING",
    no_learning=True,
    converged_save=10,
    clock=STOP,
    save_since_near=10,
    stalled=True,
    job_time_left_s=-1.0,
)


def test_a_running_job_with_nothing_to_say_is_polled_again() -> None:
    assert decide(RUNNING) is None
    assert decide(dataclasses.replace(RUNNING, clock=GO_ON)) is None


@pytest.mark.parametrize(
    ("reading", "rule"),
    [
        (Reading(status="SUCCEEDED"), Rule.FINISHED),
        (Reading(status="FAILED", exited_at_own_deadline=True), Rule.FINISHED),
        (Reading(status="SUCCEEDED", exited_at_own_deadline=True), Rule.OWN_DEADLINE_SAVE),
        (dataclasses.replace(RUNNING, no_learning=True), Rule.ZERO_LEARNING),
        (dataclasses.replace(RUNNING, converged_save=5), Rule.CONVERGED),
        (dataclasses.replace(RUNNING, clock=STOP), Rule.DEADLINE),
        (dataclasses.replace(RUNNING, clock=STOP_AT_NEXT_SAVE, save_since_near=7), Rule.DEADLINE_AT_SAVE),
        (dataclasses.replace(RUNNING, stalled=True), Rule.STALLED),
        (dataclasses.replace(RUNNING, job_time_left_s=0.0), Rule.TIMEOUT),
    ],
)
def test_each_rule_on_its_own(reading: Reading, rule: Rule) -> None:
    # Only a job that ended by itself is left alone; every other rule stops it first.
    assert decide(reading) == Decision(rule, stops_job=rule not in (Rule.FINISHED, Rule.OWN_DEADLINE_SAVE))


def test_the_rules_order_decides_when_several_hold() -> None:
    order = []
    reading = EVERYTHING
    for field, quiet in [
        ("no_learning", False),
        ("converged_save", None),
        ("clock", None),
        ("stalled", False),
        ("job_time_left_s", 1.0),
    ]:
        decision = decide(reading)
        assert decision is not None
        order.append(decision.rule)
        reading = dataclasses.replace(reading, **{field: quiet})
    assert order == [Rule.ZERO_LEARNING, Rule.CONVERGED, Rule.DEADLINE, Rule.STALLED, Rule.TIMEOUT]
    assert decide(reading) is None
    # The job's own end comes first of all: its status is final whatever else was read.
    assert decide(dataclasses.replace(EVERYTHING, status="STOPPED")) == Decision(Rule.FINISHED, stops_job=False)


def test_a_deadline_that_waits_for_the_next_save_lets_the_stall_rule_speak_until_that_save() -> None:
    near = dataclasses.replace(RUNNING, clock=STOP_AT_NEXT_SAVE)
    assert decide(near) is None
    assert decide(dataclasses.replace(near, stalled=True)) == Decision(Rule.STALLED, stops_job=True)
    assert decide(dataclasses.replace(near, stalled=True, save_since_near=4)).rule is Rule.DEADLINE_AT_SAVE
