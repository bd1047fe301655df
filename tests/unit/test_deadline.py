"""One clock for every stop: the run's limits, the job's save deadline, the trigger's stop, the loss, and one price
for every figure of the moment (the stop message, the report, the view and the alert)."""

from __future__ import annotations

import json
import math

import pytest

from nemo_rl_gke.observe.alert_messages import failure_alert
from nemo_rl_gke.observe.report import RunInputs, TaskTiming, build_report
from nemo_rl_gke.observe.training_view import budget
from nemo_rl_gke.run import costs
from nemo_rl_gke.run import deadline as d
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.budget import pool_rate, run_clock
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.spec import RunSpec, default_conf

T0 = 1_800_000_000.0


def _spec(**conf: object) -> RunSpec:
    return RunSpec.from_conf({**default_conf(), **conf})


def test_every_limit_is_one_epoch_counted_from_its_own_origin_and_the_earliest_is_the_deadline() -> None:
    spec = _spec(capacity="flex_start", flex_start_max_hours=2, max_run_hours=3, max_run_usd=100, job_timeout_s=7200)
    clock = run_clock(
        spec,
        Deployment(),
        run_started_at=T0,
        pool_ready_at=T0 + 300,
        served_started_at=T0 + 900,
        submitted_at=T0 + 1200,
    )
    by_kind = {limit.kind: limit for limit in clock.limits}
    rate = pool_rate(spec)
    price, _ = costs.gpu_hour_price("b200", 0.0, "flex_start")
    assert rate == pytest.approx(price * spec.gpus_per_node * spec.worker_replicas)
    assert by_kind[d.HOURS].at == T0 + 3 * 3600 and not by_kind[d.HOURS].hard
    # USD at the served capacity's price, from when the GPU pool came up: the report's cost model.
    assert by_kind[d.USD].at == pytest.approx(T0 + 300 + 100 / rate * 3600) and not by_kind[d.USD].hard
    # Flex-start's nodes end maxRunDuration after they start, which is after the served rung's wait began: hard.
    assert by_kind[d.CAPACITY_END].at == T0 + 900 + 2 * 3600 and by_kind[d.CAPACITY_END].hard
    assert by_kind[d.JOB_TIMEOUT].at == T0 + 1200 + 7200
    assert clock.deadline == by_kind[d.USD] == min(clock.limits, key=lambda limit: limit.at)
    assert clock.usd_at(T0 + 300 + 3600) == pytest.approx(rate)
    assert _round_trips(clock)


def _round_trips(clock: d.RunClock) -> bool:
    return d.RunClock.from_dict(json.loads(json.dumps(clock.to_dict()))) == clock


def test_a_reservation_run_without_budgets_has_only_the_job_timeout() -> None:
    clock = run_clock(_spec(), Deployment(max_run_hours=0, max_run_usd=0), run_started_at=T0, submitted_at=T0 + 10)
    assert [limit.kind for limit in clock.limits] == [d.JOB_TIMEOUT]
    assert run_clock(_spec(), Deployment(max_run_hours=0, max_run_usd=0), run_started_at=T0).deadline is None


def test_the_setup_reserve_is_measured_on_earlier_runs_else_the_recipes() -> None:
    assert d.setup_reserve(600, []) == d.SetupReserve(600.0, "the recipe's setup_s (600 s)")
    measured = d.setup_reserve(600, [50, float("nan"), -1, 80, 40, 30, 20, 10])
    # The slowest of the newest five valid ones (80, 40, 30, 20, 10), with room to spare.
    assert measured.seconds == pytest.approx(80 * d.SETUP_RESERVE_FACTOR)
    assert "last 5 runs" in measured.source
    assert d.setup_reserve(600, [12.0]).seconds == pytest.approx(12 * d.SETUP_RESERVE_FACTOR)


def test_the_job_is_given_the_time_left_less_its_setup_and_its_save() -> None:
    clock = d.RunClock((d.Limit(d.HOURS, T0 + 3600, False, "the budget"),))
    save_by = clock.save_by(T0, d.SetupReserve(600, "the recipe's"))
    assert save_by is not None
    assert save_by.margin_s == 360 and save_by.reserve_s == 600
    assert save_by.seconds == 3600 - 600 - 360 and save_by.text == "00:00:44:00"
    assert "3600 s left, less 600 s reserved for NeMo RL's setup (the recipe's) and 360 s" in save_by.explain()
    # A reserve larger than half the time left is cut: a tight deadline still trains (the overrun covers the rest).
    tight = clock.save_by(T0 + 3000, d.SetupReserve(900, "measured"))
    assert tight is not None and tight.reserve_s == 300 and tight.seconds == 600 - 300 - 60
    assert "cut to 50% of the time left" in tight.explain()
    with pytest.raises(d.BudgetSpentError, match="1s is left before the budget"):
        clock.save_by(T0 + 3599, d.SetupReserve(10, "x"))
    assert d.RunClock().save_by(T0, d.SetupReserve(10, "x")) is None


@pytest.mark.parametrize(
    ("hard", "overrun_s", "setup_done", "expected"),
    [
        # Setup ended on time: the job's own save is due before the deadline; the stop is the deadline.
        (False, 600.0, T0 + 100, T0 + 1000),
        # Setup ended late: the stop waits for the save the job is due to make, within the overrun.
        (False, 600.0, T0 + 300, T0 + 300 + 800 + 20),
        # Much later: the overrun caps it.
        (False, 600.0, T0 + 900, T0 + 1600),
        # Setup not seen yet: only waiting can let the job save, so the stop is the cap.
        (False, 600.0, None, T0 + 1600),
        # No overrun allowed, or a hard limit: the deadline, whatever the setup did.
        (False, 0.0, T0 + 300, T0 + 1000),
        (True, 600.0, T0 + 300, T0 + 1000),
        (True, 600.0, None, T0 + 1000),
    ],
)
def test_the_stop_waits_for_the_jobs_own_deadline_save_within_the_overrun_never_past_a_hard_end(
    hard: bool, overrun_s: float, setup_done: float | None, expected: float
) -> None:
    clock = d.RunClock((d.Limit(d.HOURS, T0 + 1000, hard, "the limit"),), overrun_s=overrun_s).with_job(800, 20)
    assert clock.stop_at(setup_done) == pytest.approx(expected)
    assert clock.stop_at(setup_done) <= clock.cap


def test_a_hard_end_caps_the_overrun_of_an_earlier_soft_deadline() -> None:
    soft = d.Limit(d.USD, T0 + 1000, False, "the USD budget")
    hard = d.Limit(d.CAPACITY_END, T0 + 1200, True, "flex-start's end")
    clock = d.RunClock((soft, hard), overrun_s=3600).with_job(800, 20)
    assert clock.deadline == soft and clock.hard_end == hard and clock.cap == T0 + 1200
    assert clock.stop_at(T0 + 600) == T0 + 1200
    assert d.RunClock().stop_at(T0) == math.inf and d.RunClock().cap == math.inf


def test_a_job_without_a_deadline_is_stopped_at_the_deadline_as_before() -> None:
    # A trigger serialized before the clock, or a job given no checkpoint_must_save_by: no save is due, so the
    # stop is the deadline itself.
    clock = d.RunClock((d.Limit(d.HOURS, T0 + 1000, False, "the budget"),), overrun_s=600)
    assert clock.stop_at(None) == T0 + 1000 and clock.stop_at(T0 + 900) == T0 + 1000


def test_the_loss_of_a_stop_names_steps_gpu_hours_and_why() -> None:
    clock = d.RunClock((d.Limit(d.HOURS, T0 + 1000, False, "the run's 1 h budget"),), gpus=16).with_job(800, 20)
    loss = clock.loss(
        steps_lost=7, lost_since=T0 + 100, stopped_at=T0 + 1000, setup_done_at=T0 + 400, attempt_started_at=T0
    )
    assert loss.steps == 7 and loss.gpu_hours == pytest.approx(900 / 3600 * 16)
    assert "NeMo RL's setup took 400s, so its deadline save was due 220s after the stop" in loss.why
    assert "budget_overrun_minutes=0" in loss.why
    assert loss.text().startswith("lost 7 step(s) (4.00 GPU-hours): ")
    early = clock.loss(steps_lost=0, lost_since=T0, stopped_at=T0 + 1000, setup_done_at=None, attempt_started_at=T0)
    assert "setup had not ended 1000s after the submit" in early.why
    capped = d.RunClock((d.Limit(d.HOURS, T0 + 1000, False, "b"),), overrun_s=600, gpus=8).with_job(900, 20)
    late = capped.loss(steps_lost=3, lost_since=T0, stopped_at=T0 + 1600, setup_done_at=T0 + 900, attempt_started_at=T0)
    assert "the overrun of 10 min to finish a save ran out" in late.why


def test_one_price_per_moment_in_the_stop_message_the_report_the_view_and_the_alert() -> None:
    # The trigger counts what the GPUs cost at the stop with the clock; everything that says "stopped at budget"
    # afterwards reads that figure, whatever else the report counts until teardown.
    spec = _spec(capacity="flex_start", max_run_usd=50)
    clock = run_clock(spec, Deployment(), run_started_at=T0, pool_ready_at=T0 + 100, submitted_at=T0 + 200)
    stopped_at = clock.deadline.at
    usd = clock.usd_at(stopped_at)
    assert usd == pytest.approx(50.0)
    stop = {"limit": d.USD, "usd": usd, "stopped_at": stopped_at, "lost": None}
    message = f"stopped at budget (max_run_usd): 12 of 400 steps, {usd:,.2f} USD"
    training = {"steps_completed": 12, "max_steps": 400, "stopped_at_budget": True, "deadline_stop": stop}
    timings = [
        TaskTiming(t.NODE_POOL, "success", T0 + 50, T0 + 100),
        TaskTiming(t.deleted_by(t.NODE_POOL).task_id, "success", stopped_at + 500, stopped_at + 600),
    ]
    inputs = RunInputs(
        gpu_type=spec.gpu_type,
        gpus_per_node=spec.gpus_per_node,
        worker_replicas=spec.worker_replicas,
        now=stopped_at + 900,
        capacity="flex_start",
        training_summary=training,
        teardown_actions={t.deleted_by(t.NODE_POOL).task_id: "deleted"},
        pool_ready_at=T0 + 100,
    )
    report = build_report(timings, {}, inputs)
    # The report's GPU section runs to teardown (more USD), at the same price; its stop line is the stop's figure.
    assert report.gpu.price_per_gpu_hour_usd == pytest.approx(costs.gpu_hour_price("b200", 0, "flex_start")[0])
    assert report.gpu.estimated_cost_usd > usd
    assert message in report.to_text()
    view = budget({"stopped_at_budget": True, "stop": stop}, spec, {}, {"estimated_cost_usd": 99.0}, {
        "completed": 12, "total_steps": 400})  # fmt: skip
    assert view["stopped_line"] == message
    alert = failure_alert("d", "r", {t.WAIT: "success"}, training=training, report=report)
    assert alert.outcome == message and message in alert.text()


@pytest.mark.parametrize(
    ("now", "setup_done", "mean_step", "save_begun", "expected"),
    [
        # Far from the stop: go on.
        (T0 + 100, T0 + 50, 10.0, False, d.GO_ON),
        # Near the stop, but the job's own deadline save comes first: go on (a periodic save would cut it short).
        (T0 + 950, T0 + 100, 10.0, False, d.GO_ON),
        # Near the stop and the setup not seen yet: stop at the next save (the stop is the cap then).
        (T0 + 1560, None, 10.0, False, d.STOP_AT_NEXT_SAVE),
        # Past the stop: stop, unless a save has begun and the cap allows waiting for it.
        (T0 + 1000, T0 + 50, 10.0, False, d.STOP),
        (T0 + 1000, T0 + 50, 10.0, True, d.GO_ON),
        (T0 + 1600, None, 10.0, True, d.STOP),
    ],
)
def test_the_trigger_stops_now_at_the_next_save_or_goes_on_as_the_clock_decides(
    now: float, setup_done: float | None, mean_step: float, save_begun: bool, expected: str
) -> None:
    clock = d.RunClock((d.Limit(d.HOURS, T0 + 1000, False, "b"),), overrun_s=600).with_job(800, 20)
    assert clock.decide(now, setup_done_at=setup_done, mean_step_s=mean_step, save_begun=save_begun) == expected
    legacy = d.RunClock((d.Limit(d.HOURS, T0 + 1000, False, "b"),))
    # Without a deadline of its own the job is stopped at its next save once the stop is near, as before.
    assert legacy.decide(T0 + 950, setup_done_at=None, mean_step_s=10.0, save_begun=False) == d.STOP_AT_NEXT_SAVE
    assert d.RunClock().decide(T0, setup_done_at=None, mean_step_s=None, save_begun=False) == d.GO_ON
