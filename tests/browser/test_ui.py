"""The UI as a person uses it, in Chromium against a real Airflow and the sandbox: the form, the training view
while the job trains, and the extra links. Structural assertions only (what is shown, and that it agrees with the
data it came from), never how long anything took."""

from __future__ import annotations

import os
import re
import signal
from typing import Any

import pytest

from bench import airflow_restart, worker_slots
from nemo_rl_gke import links
from nemo_rl_gke.docs import DAG_DESCRIPTION
from nemo_rl_gke.observe.driver_log import FOLLOWING
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.times import epoch_of
from tests.browser.stack import (
    DAG_ID,
    HF_TOKEN,
    LOCAL_CONF,
    SCREENSHOTS,
    Stack,
    extra_links,
    grid_task_states,
    kill_component,
    layout,
    run_url,
    screenshot,
    task_instances,
    task_log,
    task_runner_pid,
    training_banner,
    trigger,
    view_data,
    view_url,
    wait_for,
    wait_run,
    wait_task_state,
    xcom_value,
)

pytestmark = [pytest.mark.airflow, pytest.mark.browser]
# Enough steps to watch the curves grow; the local recipe's rewards reach 1.0 for several steps in a row before
# that, which the zero-learning guard would (rightly) stop, so it is off for this run.
WATCH_STEPS = 30
STEP_DELAY_S = 1
# A bound, not a timing: on a loaded CI machine (load average 10, 2026-12-06) the run's end took over 420 s.
RUN_TIMEOUT_S = 900
# Longer than the kill takes to follow: the answer to the killed try's submit never reaches anyone.
HOLD_S = 60
# The window's bottom edge: the tests' browser context is 1400x1000.
FOLD = 1000


def test_the_form_triggers_a_plan_of_the_tutorial_with_its_defaults(stack: Stack, page: Any) -> None:
    airflow = stack.airflow
    page.goto(f"{airflow.url}/dags/{DAG_ID}/details")
    page.get_by_text(DAG_DESCRIPTION).first.wait_for()
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    trigger_button = dialog.get_by_role("button", name="Trigger", exact=True)
    # The open section leads with what a person sets first; every optional field may stay empty.
    dialog.get_by_text("Run Parameters").wait_for()
    assert re.search(r"Mode\s*\*\s*plan", dialog.inner_text())
    assert trigger_button.is_enabled()
    # An error shows on its field: a required field cleared says so there, and Trigger is blocked.
    dialog.get_by_role("button", name="Project and location").click()
    project = dialog.locator("#element_project")
    project.fill("")
    dialog.get_by_text("This field is required").wait_for()
    assert not trigger_button.is_enabled()
    project.fill(RunSpec().project)
    dialog.get_by_role("button", name="GPU nodes").click()
    assert dialog.locator("#element_machine_type").input_value() in ("", '""')  # optional: blank, no error
    assert dialog.get_by_text("This field is required").count() == 0 and trigger_button.is_enabled()
    screenshot(page, "trigger-form")
    trigger_button.click()
    page.wait_for_url(re.compile(rf"/dags/{DAG_ID}/runs/"))
    run_id = page.url.rsplit("/runs/", 1)[1].split("/")[0]
    from urllib.parse import unquote

    run = wait_run(airflow, unquote(run_id), timeout=180)
    assert run["state"] == "success"
    assert run["conf"]["mode"] == "plan" and run["conf"]["machine_type"] is None
    assert wait_task_state(airflow, unquote(run_id), topology.PLAN, {"success"}, 10) == "success"


def _shown(frame: Any) -> dict[str, Any]:
    """What the view shows, read from one rendered snapshot."""
    return frame.evaluate(
        """() => ({
            points: Number(document.getElementById('steps-parsed').textContent),
            dots: document.querySelectorAll('svg[data-curve="reward"] circle.pt').length,
            lossDots: document.querySelectorAll('svg[data-curve="loss"] circle.pt').length,
            waitState: document.body.dataset.waitState,
            step: document.getElementById('step').textContent,
            error: document.body.dataset.error || '',
        })"""
    )


def _check_the_lead_is_above_the_fold(target: Any, data: dict[str, Any]) -> None:
    """Progress, the reward curve, the cost so far and the budget end above the fold; the free resources are one
    folded line, the costly ones a row each with their USD/h; every budget line has its limit or says none is set."""
    shown = layout(target)
    for name, box in shown["boxes"].items():
        assert box is not None and box["height"] > 0 and box["y"] + box["height"] <= FOLD, (name, box)
    banner = data["banner"]
    assert banner["costly"] and banner["free"], banner
    assert shown["free"]["height"] <= 1.5 * shown["lineHeight"] and not shown["open"], shown
    assert shown["free_text"].startswith(f"{len(banner['free'])} free resources: ")
    rows = training_banner(target)
    assert [r["task_id"] for r in rows if r["shown"]] == [r["task_id"] for r in banner["costly"]]
    assert sorted(r["task_id"] for r in rows if not r["shown"]) == sorted(r["task_id"] for r in banner["free"])
    assert all(r["usd_per_hour"] not in ("0.00", "") for r in rows if r["shown"])
    for key in ("hours", "usd", "gpu_nodes"):
        text = target.locator(f"#budget tr[data-budget={key}]").text_content() or ""
        assert ("no limit set" in text) == (data["budget"][key]["limit"] is None), (key, text)


def test_the_training_view_follows_the_job_the_links_lead_out_and_what_teardown_kept_shows(
    stack: Stack, page: Any
) -> None:
    airflow = stack.airflow
    # Teardown keeps the cluster and storage (the pool at 0 nodes): what a run leaves up shows on the grid and in the
    # view once it ended. One run for both: each whole run through the real scheduler costs minutes of CI.
    conf = {
        **LOCAL_CONF,
        "max_steps": WATCH_STEPS,
        "zero_learning_guard": False,
        "teardown_policy": topology.KEEP_WARM,
        # Steps a second longer (asleep): the job still trains after train.submit's retry adopted it, once train.wait
        # is deferred, and while the restarts happen (30 local steps otherwise end in about 12 s).
        "extra_overrides": [f"sandbox.step_delay_s={STEP_DELAY_S}"],
    }
    # Ray's answer to train.submit's request is held (the job submitted, the answer stuck on its way back through
    # the API server's proxy), and the worker waiting for it is killed meanwhile.
    held = stack.sandbox.add_fault({"method": "POST", "path": "/proxy/api/jobs/$"}, delay_s=HOLD_S)
    run_id = trigger(airflow, conf)
    reached = _kill_the_worker_once_its_submit_reached_ray(stack, run_id, held["id"])
    ended = {"success", "failed", "upstream_failed", "skipped"}
    assert wait_task_state(airflow, run_id, topology.WAIT, {"deferred", *ended}, RUN_TIMEOUT_S) == "deferred"

    # The tab is on the run's page and on train.wait's, as an iframe of the plugin's view.
    page.goto(run_url(airflow, run_id))
    page.get_by_role("link", name="Training").click()
    frame = page.frame_locator("iframe").first
    frame.locator("#run-id").filter(has_text=run_id).wait_for()

    # While train.wait is deferred: every step parsed so far is one point of each curve.
    view = page.context.new_page()
    view.goto(view_url(airflow, run_id))
    # The job's first steps take a while to reach the log (Ray starts the driver): a generous bound, not a timing test.
    view.wait_for_function(
        "() => document.body.dataset.waitState === 'deferred' && Number(document.body.dataset.points) > 2",
        timeout=RUN_TIMEOUT_S * 1000,
    )
    # While the job trains, the scheduler and the triggerer die; what the view shows meanwhile is checked during the
    # outage (the wait stays deferred, its log where the killed trigger left it), before a new trigger takes over.
    _kill_the_scheduler_and_the_triggerer_during_the_wait(stack, run_id)
    shown = _shown(view)
    assert shown["error"] == "", shown["error"]  # a render that threw would leave the curves behind the count
    assert shown["waitState"] == "deferred"
    assert shown["dots"] == shown["lossDots"] == shown["points"] > 0
    assert re.fullmatch(rf"step \d+ of {WATCH_STEPS}", shown["step"])
    # The data and the log are at least as far along as what was drawn from them.
    assert view_data(airflow, run_id)["points"] >= shown["points"]
    assert task_log(airflow, run_id, topology.WAIT).count("Avg Reward") >= shown["points"]
    # What a person watching came for is above the fold of the 1400x1000 window: in Airflow's tab and on the view's
    # own page.
    frame.locator("#reward svg[data-curve='reward'] circle.pt").nth(2).wait_for()
    frame.locator("#free summary").wait_for()
    data = view_data(airflow, run_id)
    for target in (frame, view):
        _check_the_lead_is_above_the_fold(target, data)
    screenshot(page, "training-tab-while-training", full_page=False)
    screenshot(view, "training-view-while-training")
    # Nothing looks at Airflow's run page until the run ended, but its grid refreshes every few seconds and the tab's
    # iframe polls too: minutes of Chromium and API-server CPU on a 2-core CI machine. The checks at the end open it
    # again.
    page.goto("about:blank")
    wait_for(
        "a new trigger to follow the job",
        lambda: task_log(airflow, run_id, topology.WAIT).count(FOLLOWING) >= 2,
        RUN_TIMEOUT_S,
        1.0,
    )

    run = wait_run(airflow, run_id, RUN_TIMEOUT_S)
    assert run["state"] == "success"
    # Exactly one training job across the kill and the restarts: train.submit's first try's, checkpoint.validate's and
    # the model out's (the conversion, the base model's evaluation, this stack's first, and the run's) are the only
    # submissions. The retry adopted the job, and its clock is Ray's start of it (before the kill), not the adoption a
    # retry delay later.
    submitted = [c for c in stack.sandbox.calls() if c["method"] == "POST" and c["path"].endswith("/api/jobs/")]
    assert len(submitted) == 5 and submitted[0]["seq"] == reached["seq"], submitted
    [submit] = [t for t in task_instances(airflow, run_id) if t["task_id"] == topology.SUBMIT]
    adopted = xcom_value(airflow, run_id, topology.SUBMIT)
    assert (submit["try_number"], adopted["action"]) == (2, "adopted"), (submit, adopted)
    assert "already exists" in task_log(airflow, run_id, topology.SUBMIT, try_number=2)
    started = epoch_of(adopted["submitted_at"])
    assert started is not None and abs(started - reached["time"]) < 5, (adopted, reached)
    adopted_at = epoch_of(submit.get("end_date"))
    if adopted_at is not None:  # what the closing notes quote; never asserted (a shared machine's timing)
        print(f"train.submit's worker killed: the retry adopted the job {adopted_at - reached['time']:.1f} s later")
    # The trigger the restarted triggerer ran went on where the killed one had stopped: each step's reward line is
    # in train.wait's log once (both triggers' logs, as the API server serves them).
    # The triggerer writes its file as the lines reach it: on a loaded machine the last steps land after the run
    # ended, so wait for every step to be there, then require each exactly once.
    wait_for(
        "every step's reward line in train.wait's log",
        lambda: len(airflow_restart.step_counts(task_log(airflow, run_id, topology.WAIT))) >= WATCH_STEPS,
        60,
        1.0,
    )
    wait_log = task_log(airflow, run_id, topology.WAIT)
    counts = airflow_restart.step_counts(wait_log)
    followed = [line for line in wait_log.splitlines() if FOLLOWING in line or "task log stopped" in line]
    assert counts == dict.fromkeys(range(1, WATCH_STEPS + 1), 1), (counts, followed)
    # Once the job ended, the view, the data and the log agree exactly.
    view.wait_for_function(
        f"() => document.body.dataset.runState === 'success' && Number(document.body.dataset.points) === {WATCH_STEPS}"
    )
    final = _shown(view)
    data = view_data(airflow, run_id)
    assert final["dots"] == data["points"] == WATCH_STEPS
    assert data["checkpoints"][-1]["exported"] and data["checkpoints"][-1]["step"] == WATCH_STEPS
    assert HF_TOKEN not in view.content() and HF_TOKEN not in str(data)
    _check_what_teardown_kept(airflow, run_id, view, page)

    # The extra links: on the task that made each thing, built from the RunSpec and XCom.
    spec = RunSpec.from_conf({**conf})
    export = data["checkpoints"][-1]["exported"]
    expected = {
        topology.GKE_CLUSTER: {"GKE cluster": links.gke_cluster_url(spec)},
        topology.NODE_POOL: {"GPU node pool": links.node_pool_url(spec)},
        topology.LUSTRE: {"Lustre instance": links.lustre_url(spec)},
        topology.SUBMIT: {
            "Ray dashboard": links.ray_dashboard_url(spec, None),
            "Job logs (Cloud Logging)": links.job_logs_url(spec),
        },
        topology.EXPORT: {"Checkpoint in Cloud Storage": links.gcs_url(export)},
    }
    for task_id, wanted in expected.items():
        shown_links = {name: url for name, url in extra_links(airflow, run_id, task_id).items() if url}
        assert shown_links == wanted, task_id
    assert "/storage/browser/" in links.gcs_url(export) and spec.export_bucket_name in export
    assert {name for name, url in extra_links(airflow, run_id, topology.NET).items() if url} == set()
    # And in the UI: the task instance page shows the button with that URL.
    page.goto(f"{run_url(airflow, run_id)}/tasks/{topology.GKE_CLUSTER}/details")
    button = page.get_by_role("link", name="GKE cluster")
    button.wait_for()
    assert button.get_attribute("href") == links.gke_cluster_url(spec)
    screenshot(page, "extra-links")

    # The worker-slot bench's reading of a run (bench/worker_slots.py) on this real scheduler and triggerer's logs:
    # every wait deferred, so none held a worker slot (the bench's own run starts the same stack, minutes more).
    tries = worker_slots.read_run(airflow.home / "logs", run_id)
    _, _, wall, synchronous = worker_slots.ratio(tries)
    waited = {t.task_id for t in tries if t.waits}
    assert synchronous == [] and wall > 0, [(t.task_id, t.segments) for t in tries]
    assert {topology.NET, topology.GKE_CLUSTER, topology.LUSTRE, topology.RAYCLUSTER, topology.WAIT} <= waited
    worker_slots.report(tries)  # the bench's table, in the test's output


def _kill_the_worker_once_its_submit_reached_ray(stack: Stack, run_id: str, fault_id: str) -> dict[str, Any]:
    """SIGKILL the process running train.submit once its submit request has reached Ray (the sandbox's call log
    has it) while Ray's answer is held, as an OOM kill or a lost worker node would end it. The call."""
    airflow = stack.airflow

    def the_held_call() -> dict[str, Any] | None:
        return next((c for c in stack.sandbox.calls() if c["fault"] == fault_id), None)

    reached = wait_for("train.submit's request to reach Ray", the_held_call, RUN_TIMEOUT_S, 0.2)
    [submit] = [t for t in task_instances(airflow, run_id) if t["task_id"] == topology.SUBMIT]
    pid = task_runner_pid(airflow, submit["id"])
    assert pid is not None, f"no process runs train.submit while its answer is held: {submit}"
    os.kill(pid, signal.SIGKILL)
    return reached


def _kill_the_scheduler_and_the_triggerer_during_the_wait(stack: Stack, run_id: str) -> None:
    """Airflow's own processes die while train.wait is deferred (SIGKILL; the stack's supervisor starts each again a
    second later, as compose's ``restart: unless-stopped`` does): the scheduler, with no task running (one that
    runs dies with its LocalExecutor worker, a case for the heartbeat timeout), and the triggerer. Once the dead
    triggerer's heartbeat is ``triggerer_health_check_threshold`` old, the new one takes the wait over and follows
    the same Ray job (the caller waits for that) and logs only the lines the killed one had not."""
    airflow = stack.airflow

    def only_the_wait_is_unfinished() -> bool:
        states = {t["task_id"]: t["state"] for t in task_instances(airflow, run_id)}
        assert states[topology.WAIT] == "deferred", f"the job ended before the restarts: {states[topology.WAIT]}"
        return not {"running", "queued"} & set(states.values())

    wait_for("train.wait deferred with no task running", only_the_wait_is_unfinished, RUN_TIMEOUT_S, 0.2)
    kill_component(airflow, "scheduler")
    # Killed between two steps' saves: a kill between a step's lines and their save repeats that step's lines
    # (tests/triggers/test_log_position.py proves that bound); this run proves a restart repeats nothing else.
    airflow_restart.kill_the_triggerer_between_steps(airflow, run_id)


def _check_what_teardown_kept(airflow: Any, run_id: str, view: Any, page: Any) -> None:
    """The keep-warm policy's teardown, as a person sees it: the deletes it skipped are skipped on the grid (their
    own colour), the view's banner lists every kept resource and why, the pool at 0 nodes, and its costly ones a row
    each."""
    states = grid_task_states(airflow, run_id)
    # What the policy keeps, as the topology declares it: those deletes end skipped, the others success.
    policy = topology.KEEP_WARM
    deletes = [s for s in topology.teardown_steps() if s.op is topology.Op.DELETE_GCP]
    expected = {s.task_id: "success" if topology.deletes_under(s.deletes[0], policy) else "skipped" for s in deletes}
    assert "skipped" in expected.values() and {k: states[k] for k in expected} == expected, states
    assert states[topology.DELETE_RAYCLUSTER] == "success", states
    made = [r.task_id for r in topology.gcp_resources()]
    view.locator("#running tbody tr").first.wait_for()
    assert "ended" in (view.locator("#banner").get_attribute("class") or "")
    rows = {r["task_id"]: r for r in training_banner(view)}
    assert set(rows) == set(made), sorted(set(rows) ^ set(made))
    assert rows[topology.NODE_POOL]["state"] == "kept warm at 0 nodes" and not rows[topology.NODE_POOL]["shown"]
    others = [r for t, r in rows.items() if t != topology.NODE_POOL]
    assert all(r["state"].startswith("kept (") for r in others), others
    assert rows[topology.LUSTRE]["shown"] and rows[topology.GKE_CLUSTER]["shown"]
    free = [r for r in rows.values() if not r["shown"]]
    line = view.locator("#free summary").text_content() or ""
    assert line.startswith(f"{len(free)} free resources: ") and "kept (" in line, line
    screenshot(view, "training-view-kept-resources")
    # The model card: the run's score beside the base model's (the untrained policy), and the publish decision.
    view.locator("#model-history svg").wait_for()
    score, base = (view.locator(f"#model-{k}").text_content() or "" for k in ("score", "baseline"))
    assert re.fullmatch(r"0\.\d{4}", score) and re.fullmatch(r"0\.\d{4}", base), (score, base)
    assert float(score) > float(base)
    assert view.locator("#model-decision").text_content() in ("promoted", "not-promoted")
    assert (view.locator("#model-hf").text_content() or "").endswith("/hf/")
    view.locator("#model").screenshot(path=str(SCREENSHOTS / "training-view-model.png"))
    page.goto(run_url(airflow, run_id))
    page.get_by_text(topology.DELETE_LUSTRE.rpartition(".")[2]).first.wait_for()
    screenshot(page, "grid-kept-resources")
