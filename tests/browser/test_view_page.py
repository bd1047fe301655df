"""The training view's page in Chromium, fed a snapshot built by :func:`build_view` (the page's own HTML, script and
style, served at its URL by Playwright's router): what it draws for a run the JSON describes, without a whole run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from nemo_rl_gke.observe.training_view import ViewInputs, build_view
from nemo_rl_gke.plugin import URL_PREFIX
from nemo_rl_gke.run import costs, topology
from nemo_rl_gke.run.spec import default_conf
from tests.paths import ROOT
from tests.ui.snapshots import NOW, attempt_log, task_states

pytestmark = pytest.mark.browser
STATIC = ROOT / "plugins/nemo_rl_gke/static"
ORIGIN = "http://127.0.0.1:9"  # never reached: every request is answered by the router below


@pytest.fixture
def served(browser: Any) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A page whose requests the router answers: the view's files, and ``snapshot["view"]`` as its data."""
    snapshot: dict[str, Any] = {}
    context = browser.new_context(viewport={"width": 1400, "height": 1000})

    def answer(route: Any) -> None:
        path = route.request.url.split("?", 1)[0].removeprefix(ORIGIN)
        if path == f"{URL_PREFIX}/training":
            route.fulfill(body=(STATIC / "training_view.html").read_text(), content_type="text/html")
        elif path.startswith(f"{URL_PREFIX}/training/static/"):
            name = path.rsplit("/", 1)[1]
            kind = "text/javascript" if name.endswith(".js") else "text/css"
            route.fulfill(body=(STATIC / name).read_text(), content_type=kind)
        elif path == f"{URL_PREFIX}/training/data":
            route.fulfill(body=json.dumps(snapshot["view"]), content_type="application/json")
        else:
            route.fulfill(status=404, body="")

    context.route("**/*", answer)
    yield context.new_page(), snapshot
    context.close()


def test_each_attempt_after_a_recovery_starts_at_a_mark_on_every_curve(served: tuple[Any, dict[str, Any]]) -> None:
    page, snapshot = served
    lines = [*attempt_log("job", range(1, 13), 30, (5, 10), 0), *attempt_log("job-r1", range(11, 21), 30, (), 1)]
    recoveries = [{"attempt": 1, "resumed_from": 10, "rule": "actor-died", "failed_job": "job"}]
    snapshot["view"] = build_view(ViewInputs("d", "r", "running", NOW, task_states(**{topology.WAIT: "deferred"}),
                                             conf=default_conf(), log_lines=lines, recoveries=recoveries))  # fmt: skip
    page.goto(f"{ORIGIN}{URL_PREFIX}/training?dag_id=d&run_id=r&poll=60")
    page.wait_for_function("() => Number(document.body.dataset.points) === 20")
    assert page.evaluate("() => document.body.dataset.error || ''") == ""
    marks = page.locator("svg[data-curve] line.attempt[data-attempt='1']")
    # The reward curve and the loss curve (the others have no points from this log but the loss and reward's).
    assert marks.count() >= 2
    assert "attempt 1: resumed from step 10 after actor-died" in (marks.first.text_content() or "")
    reward = page.locator("svg[data-curve='reward']")
    assert (
        reward.locator("circle.pt").count() == 20 and reward.locator("text.attempt").first.text_content() == "attempt 1"
    )


def test_a_ladder_run_shows_the_capacity_that_served_it_and_how_each_rung_ended(
    served: tuple[Any, dict[str, Any]],
) -> None:
    page, snapshot = served
    conf = {**default_conf(), "capacity_ladder": ["reservation:60", "flex_start:120"]}
    rows = [
        {"capacity": "reservation", "outcome": "stock-out", "started_at": "2026-12-04T00:00:00+00:00"},
        {"capacity": "flex_start", "outcome": "served", "started_at": "2026-12-04T00:00:01+00:00"},
    ]
    tasks = task_states(**{topology.NODE_POOL: "success", topology.RAYCLUSTER: "success", topology.WAIT: "deferred"})
    snapshot["view"] = build_view(ViewInputs("d", "r", "running", NOW, tasks, conf=conf,
                                             results={topology.RAYCLUSTER: {"capacity": rows}}))  # fmt: skip
    page.goto(f"{ORIGIN}{URL_PREFIX}/training?dag_id=d&run_id=r&poll=60")
    page.locator("#capacity").filter(has_text="GPU capacity").wait_for()
    assert page.evaluate("() => document.body.dataset.error || ''") == ""
    assert page.locator("#capacity").text_content() == (
        "GPU capacity flex_start (ladder: reservation: stock-out, flex_start: served)"
    )
    # Priced as the rung that served: flex-start's discount, not the reservation's list price.
    flex, _ = costs.gpu_hour_price("b200", 0.0, "flex_start")
    assert flex < costs.gpu_hour_price("b200", 0.0, "reservation")[0]
    assert (page.locator("#price").text_content() or "").startswith(f"{flex:g} USD per GPU-hour")
    # One option is no ladder: the line stays empty.
    snapshot["view"] = build_view(ViewInputs("d", "r", "running", NOW, tasks, conf=default_conf()))
    page.reload()
    page.locator("#price").filter(has_text="USD per GPU-hour").wait_for()
    assert page.locator("#capacity").text_content() == ""


def test_the_model_card_shows_the_decision_and_a_score_per_run_on_a_zero_to_one_scale(
    served: tuple[Any, dict[str, Any]],
) -> None:
    page, snapshot = served
    decided = {
        "outcome": "not-promoted",
        "reason": "score 0.5273 is below the published model's 0.6133 + margin 0",
        "published": 0.6133,
        "hf_uri": "gs://b/d/night-4/data/ckpt/step_12/hf/",
        "benchmark": "gsm8k",
    }
    result = {"dataset": "gsm8k", "metric": "pass", "k": 1, "problems": 256}
    evaluated = {"score": 0.5273, "baseline": 0.0078, "result": result}
    nights = [(0.3086, "promoted"), (0.6133, "promoted"), (0.59, "not-promoted"), (0.5273, "not-promoted")]
    history = [{"run_id": f"night-{i}", "score": s, "outcome": o} for i, (s, o) in enumerate(nights, start=1)]
    results = {
        topology.CONVERT: {"hf_path": "/data/ckpt/step_12/hf"},
        topology.EVALUATE: evaluated,
        topology.PUBLISH: decided,
    }
    snapshot["view"] = build_view(
        ViewInputs("d", "night-4", "success", NOW, task_states(), results, default_conf(), history=history)
    )
    page.goto(f"{ORIGIN}{URL_PREFIX}/training?dag_id=d&run_id=night-4&poll=60")
    card = page.locator("#model")
    card.locator("svg[data-curve='score-by-run']").wait_for()
    assert page.locator("#model-decision").text_content() == "not-promoted"
    cells = {k: page.locator(f"#model-{k}").text_content() for k in ("score", "baseline", "published")}
    assert cells == {"score": "0.5273", "baseline": "0.0078", "published": "0.6133"}
    chart = card.locator("svg[data-curve='score-by-run']")
    assert chart.locator("circle.pt").count() == 4
    assert [chart.locator("text").nth(i).text_content() for i in range(4)] == ["1", "0", "run 1", "run 4"]
    assert chart.locator("circle.pt title").last.text_content() == "night-4: 0.5273 (not-promoted)"
    card.screenshot(path=str(ROOT / ".airflow/screenshots/training-view-model-nights.png"))
