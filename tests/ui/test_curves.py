"""The Training view's curves (observe/curves.py): bounded with every peak kept, each step computed once, and a
poll sending only what changed, which the page's merge turns into exactly the whole curves."""

from __future__ import annotations

from typing import Any

import pytest

from nemo_rl_gke.observe import curves
from nemo_rl_gke.observe.curves import BUCKETS, MAX_POINTS, TENTATIVE_STEPS, RunCurves, series, width_for
from nemo_rl_gke.observe.metrics import RunMetrics, StepMetrics
from nemo_rl_gke.observe.training_view import ViewInputs, build_view
from nemo_rl_gke.run.spec import default_conf
from tests.ui.snapshots import NOW, task_states


def _step(n: int, total: int = 20_000) -> StepMetrics:
    # A noisy reward with one spike and one dip far from the bucket edges; validation every 50 steps.
    reward = 1.0 if n == 4321 else (-1.0 if n == 8765 else (n % 7) / 10)
    step = StepMetrics(step=n, total_steps=total, loss=1 / n, avg_reward=reward, e2e_tokens_per_s_per_gpu=100.0 + n % 3)
    if n % 50 == 0:
        step.val_accuracy = n / total
    return step


def _metrics(steps: int) -> RunMetrics:
    metrics = RunMetrics()
    metrics.steps = [_step(n) for n in range(1, steps + 1)]
    return metrics


def test_curves_at_10000_steps_keep_the_bound_and_every_peak() -> None:
    view = build_view(
        ViewInputs("d", "r", "running", NOW, task_states(), conf=default_conf(), attempts=[_metrics(10_000)])
    )
    reward = view["series"]["reward"]
    assert len(reward) <= MAX_POINTS and view["points"] == 10_000 and view["shown"]["reward"] == len(reward)
    assert [4321, 1.0] in reward and [8765, -1.0] in reward
    assert reward[0] == [1, 0.1] and reward[-1][0] == 10_000
    assert [p[0] for p in reward] == sorted(p[0] for p in reward)
    assert all(len(points) <= MAX_POINTS for points in view["series"].values())
    # A short run sends every point.
    short = series(_metrics(30))
    assert short["reward"] == [[n, (n % 7) / 10] for n in range(1, 31)]


def test_the_width_is_the_smallest_power_of_two_that_bounds_the_buckets() -> None:
    assert [width_for(n) for n in (0, BUCKETS, BUCKETS + 1, 4 * BUCKETS, 4 * BUCKETS + 1)] == [1, 1, 2, 4, 8]


def _merge(held: dict[str, Any], answer: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    """The page's merge (static/training_view.js withHeldSeries): its points up to ``from``, then the answer's."""
    sent, window = answer
    return {
        key: ([p for p in held.get(key, []) if p[0] <= window["from"]] if window["from"] else []) + points
        for key, points in sent.items()
    }


def test_a_page_polling_a_growing_run_holds_exactly_the_whole_curves_and_gets_a_few_points_a_poll() -> None:
    metrics, kept = RunMetrics(), RunCurves()
    held: dict[str, Any] = {}
    token, sent_late = "", []
    for size in [*range(1, 40), *range(40, 3000, 37), *range(3000, 3050)]:
        metrics.steps = [_step(n) for n in range(1, size + 1)]
        answer = kept.window(*kept.update(metrics), token)
        held, token = _merge(held, answer), answer[1]["token"]
        assert held == series(metrics), size  # as if every point had been sent
        if size > 3000:
            sent_late.append(sum(len(points) for points in answer[0].values()))
    # Late polls send the open buckets only: a few points, not the whole bounded curves (~2,000 each).
    assert max(sent_late) <= 40, sent_late


def test_each_step_is_computed_once_but_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    added: list[int] = []
    real = curves._add

    def counted(points: Any, step: StepMetrics, n: int) -> int:
        added.append(step.step)
        return real(points, step, n)

    monkeypatch.setattr(curves, "_add", counted)
    kept = RunCurves()
    kept.update(_metrics(10_000))
    assert len(added) == 10_000
    added.clear()
    kept.update(_metrics(10_001))
    assert sorted(added) == list(range(10_001 - TENTATIVE_STEPS, 10_002)), added


def test_a_token_that_no_longer_holds_gets_every_point() -> None:
    kept = RunCurves()
    metrics = _metrics(500)
    _, window = kept.window(*kept.update(metrics))
    assert window["from"] == 0 and window["token"].endswith(".1.498")
    # The same run: only what follows its closed buckets.
    assert kept.window(*kept.update(metrics), window["token"])[1]["from"] == 498
    # Another API server worker's (or a restarted one's) curves of the same run never take this token.
    other = RunCurves()
    assert other.window(*other.update(metrics), window["token"])[1]["from"] == 0
    # The steps were re-read differently (a recovery merged another attempt in): the buckets start over.
    metrics.steps[10] = _step(9999)
    answer = kept.window(*kept.update(metrics, layout=(2, (11,))), window["token"])
    assert answer[1]["from"] == 0 and answer[0] == series(metrics)
    # A token of another width, a made-up one, one too long: every point.
    prefix = window["token"].rsplit(".", 1)[0]
    for token in (window["token"].replace(".1.", ".2."), "x", "1.1." + "9" * 80, prefix + ".\u00b2", prefix + ".-1"):
        assert kept.window(*kept.update(metrics, layout=(2, (11,))), token)[1]["from"] == 0
