"""The training view's data, built from a real NeMo RL driver log as the trigger writes it into the task log."""

from __future__ import annotations

import json

from nemo_rl_gke.observe.driver_log import FOLLOWING, JOB_LINE, RESUMED_AT
from nemo_rl_gke.observe.metrics import LogFollower
from nemo_rl_gke.observe.training_view import TaskState, ViewInputs, build_view, parse_attempts
from nemo_rl_gke.run import costs, outcomes, topology
from nemo_rl_gke.run.budget import run_budget
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.spec import RunSpec, default_conf
from tests.paths import ROOT
from tests.ui.snapshots import NOW, attempt_log, task_states


def _task_log() -> list[str]:
    """The fixture's driver log as train.wait's task log has it: the trigger's lines among Airflow's own."""
    follower = LogFollower()
    lines = follower.feed_full_log((ROOT / "tests/fixtures/nemo_rl_grpo.log").read_text()) + follower.flush()
    return ["Task started", *(f"{JOB_LINE}{line}" for line in lines), "Ray job ... SUCCEEDED"]


def test_the_curves_have_one_point_per_step_the_log_completed() -> None:
    lines = _task_log()
    metrics, _ = parse_attempts(lines)
    view = build_view(ViewInputs("d", "r", "running", NOW, task_states(), conf=default_conf(), log_lines=lines))
    done = metrics.completed_steps
    assert len(done) == 4 and view["points"] == 4
    assert view["series"]["reward"] == [[n + 1, s.avg_reward] for n, s in enumerate(done)]
    assert [p[1] for p in view["series"]["loss"]] == [s.loss for s in done]
    assert len(view["series"]["throughput"]) == 4
    assert view["series"]["validation"], "the fixture validates every 2 steps"
    assert view["wandb_url"] == "https://wandb.ai/ml-team/nemo-rl/runs/k3x9q2ab"
    # Lines without the trigger's prefix are Airflow's own and never parsed.
    assert parse_attempts([line.removeprefix(JOB_LINE) for line in lines])[0].steps == []


def test_progress_and_eta_while_the_job_runs() -> None:
    lines = _task_log()
    # Cut the log after step 2's results: step 3 of 4 has started.
    cut = next(n for n, line in enumerate(lines) if "Step 3/4" in line) + 1
    tasks = task_states(**{topology.WAIT: "deferred"})
    conf = {**default_conf(), "max_steps": 4}
    view = build_view(ViewInputs("d", "r", "running", NOW, tasks, conf=conf, log_lines=lines[:cut]))
    p = view["progress"]
    assert (p["step"], p["total_steps"], p["completed"], p["state"]) == (3, 4, 2, "deferred")
    steps = parse_attempts(lines[:cut])[0].completed_steps
    mean = sum(s.total_step_time_s for s in steps) / 2
    assert p["eta_s"] == round(mean * 2) and p["eta_at"].endswith("Z")
    # Once train.wait has ended there is nothing left to wait for.
    ended = build_view(ViewInputs("d", "r", "failed", NOW, task_states(), conf=default_conf(), log_lines=lines[:cut]))
    assert ended["progress"]["eta_s"] is None


def test_checkpoints_say_where_they_went() -> None:
    conf = default_conf()
    export = {"action": outcomes.EXPORTED, "uri": "gs://b/d/r/step_4/", "step": 4}
    view = build_view(
        ViewInputs("d", "r", "success", NOW, task_states(), {topology.EXPORT: export}, conf, None, _task_log())
    )
    assert view["checkpoints"] == [
        {"step": 2, "lustre": f"{conf['checkpoint_dir']}/step_2", "exported": None},
        {"step": 4, "lustre": f"{conf['checkpoint_dir']}/step_4", "exported": "gs://b/d/r/step_4/"},
    ]


def test_the_ray_logs_teardown_copied_are_linked_or_why_not() -> None:
    uri = "gs://b/nemo-rl-gke/ray-logs/d/r/"
    copied = {"uri": uri, "files": 75, "bytes": 3 * 2**20, "truncated": 1, "skipped": 0, "errors": 0, "error": ""}
    failed = {"uri": uri, "files": 0, "bytes": 0, "errors": 1, "error": "no RayCluster default/rc to copy from"}

    def shown(result: object) -> object:
        results = {topology.DELETE_RAYCLUSTER: result}
        return build_view(ViewInputs("d", "r", "failed", NOW, task_states(), results, default_conf()))["ray_logs"]

    assert shown({"action": outcomes.DELETED, "ray_logs": copied}) == {
        "uri": uri,
        "console_url": "https://console.cloud.google.com/storage/browser/b/nemo-rl-gke/ray-logs/d/r/",
        "text": f"{uri} (75 file(s), 3.0 MiB, 1 cut to their tail)",
        "files": 75,
        "truncated": 1,
        "error": None,
    }
    assert shown({"action": outcomes.DELETED, "ray_logs": failed}) == {
        "uri": None,
        "console_url": None,
        "text": "not copied (no RayCluster default/rc to copy from)",
        "files": 0,
        "truncated": None,
        "error": "no RayCluster default/rc to copy from",
    }
    # Before teardown got there, or a RayCluster kept by the policy: nothing to show.
    assert shown(None) is None and shown({"action": outcomes.KEPT_BY_POLICY}) is None


def test_stages_span_running_tasks_until_now() -> None:
    tasks = task_states(**{topology.WAIT: "deferred"})
    view = build_view(ViewInputs("d", "r", "running", NOW, tasks, conf=default_conf()))
    train = next(s for s in view["stages"] if s["name"] == topology.TRAIN)
    assert train["state"] == "deferred" and train["end"] == "2027-01-15T08:00:00Z"
    assert [s["name"] for s in view["stages"]] == list(topology.STAGES)


def test_cost_so_far_counts_the_gpu_pool_until_now() -> None:
    spec = RunSpec.from_conf(default_conf())
    tasks = task_states(**{topology.WAIT: "deferred", topology.DELETE_CLUSTER: "none"})
    view = build_view(ViewInputs("d", "r", "running", NOW, tasks, conf=default_conf()))
    up = NOW - tasks[topology.NODE_POOL].end
    node_hours = up / 3600 * spec.worker_replicas
    assert view["cost"]["gpu_node_hours"] == round(node_hours, 3)
    assert view["cost"]["estimated_cost_usd"] == round(
        node_hours * 8 * costs.DEFAULT_GPU_HOUR_PRICES_USD[spec.gpu_type], 2
    )
    assert view["cost"]["pool_still_running"] is True


def test_the_banner_lists_what_is_up_and_drops_what_teardown_deleted() -> None:
    spec = RunSpec.from_conf(default_conf())
    results = {s.task_id: {"name": f"n-{s.task_id}", "action": outcomes.CREATED} for s in topology.gcp_resources()}
    # Mid-run: everything made so far is up, nothing torn down yet.
    tasks = task_states(**{s.task_id: "none" for s in topology.teardown_steps()})
    running = costs.still_running(spec, {t: s.state for t, s in tasks.items()}, results)
    assert sorted(r.task_id for r in running) == sorted(
        [*(s.task_id for s in topology.gcp_resources()), topology.RAYCLUSTER]
    )
    # Most expensive first: the GPU pool, then the cluster, then Lustre; the free ones after them.
    assert [r.task_id for r in running][:3] == [topology.NODE_POOL, topology.GKE_CLUSTER, topology.LUSTRE]
    assert all("." not in r.kind for r in running), "every resource has a kind for people"
    assert {r.state for r in running} == {"up"}
    pool = next(r for r in running if r.task_id == topology.NODE_POOL)
    assert (
        pool.usd_per_hour == 2 * 8 * costs.DEFAULT_GPU_HOUR_PRICES_USD[spec.gpu_type]
        and pool.name == f"n-{topology.NODE_POOL}"
    )
    # After teardown kept Lustre (and what it needs) for its checkpoint and deleted the rest.
    for step in topology.teardown_steps():
        results[step.task_id] = {"action": outcomes.DELETED}
    results[topology.DELETE_LUSTRE] = {"action": outcomes.KEPT_FOR_CHECKPOINT}
    results[topology.DELETE_PEERING] = {"action": outcomes.KEPT_FOR_LUSTRE}
    left = costs.still_running(spec, {t: "success" for t in tasks}, results)
    assert [(r.task_id, r.state) for r in left] == [
        (topology.LUSTRE, f"kept ({outcomes.KEPT_FOR_CHECKPOINT})"),
        (topology.PEERING, f"kept ({outcomes.KEPT_FOR_LUSTRE})"),
    ]
    assert costs.total_per_hour(left) == costs.hourly_cost(topology.LUSTRE, spec)[0] > 0


def test_an_adopted_resource_is_not_this_runs_and_a_failed_create_may_exist() -> None:
    spec = RunSpec()
    states = {topology.NET: "success", topology.LUSTRE: "failed"}
    results = {topology.NET: {"name": "theirs", "action": outcomes.ADOPTED}}
    running = costs.still_running(spec, states, results)
    assert [(r.task_id, r.state, r.name) for r in running] == [
        (topology.LUSTRE, "create failed: may exist", spec.lustre_name)
    ]


def test_a_refused_conf_shows_nothing_running() -> None:
    view = build_view(ViewInputs("d", "r", "failed", NOW, {topology.VALIDATE: TaskState(topology.VALIDATE, "failed")}))
    assert view["spec"] is None and view["running"] == [] and view["points"] == 0
    json.dumps(view, allow_nan=False)  # the page's JSON: no NaN, no objects


def _mid_run() -> tuple[dict[str, TaskState], dict[str, dict[str, str]]]:
    """Everything made and up, the job training, nothing torn down."""
    tasks = task_states(**{topology.WAIT: "deferred", **{s.task_id: "none" for s in topology.teardown_steps()}})
    results = {s.task_id: {"name": f"n-{s.task_id}", "action": outcomes.CREATED} for s in topology.gcp_resources()}
    return tasks, results


def test_free_resources_fold_into_one_line_and_the_costly_stay() -> None:
    tasks, results = _mid_run()
    view = build_view(ViewInputs("d", "r", "running", NOW, tasks, results, default_conf()))
    banner = view["banner"]
    assert [r["task_id"] for r in banner["costly"]] == [topology.NODE_POOL, topology.GKE_CLUSTER, topology.LUSTRE]
    assert all(r["usd_per_hour"] > 0 for r in banner["costly"])
    free = banner["free"]
    assert len(free) == banner["count"] - 3 == len(view["running"]) - 3 > 10
    assert {r["usd_per_hour"] for r in free} == {0.0}
    nets = sum(r["kind"].startswith("VPC network") for r in free)
    subnets = sum(r["kind"].startswith("subnet") for r in free)
    assert banner["free_line"].startswith(f"{len(free)} free resources: {nets} VPC networks, {subnets} subnets, ")
    assert banner["free_line"].endswith(" - all up, 0.00 USD/h")
    assert banner["usd_per_hour"] == view["running_usd_per_hour"] > 0


def test_a_kept_free_resource_still_reads_kept_in_the_folded_line() -> None:
    spec = RunSpec.from_conf(default_conf())
    results: dict = {
        s.task_id: {"name": f"n-{s.task_id}", "action": outcomes.CREATED} for s in topology.gcp_resources()
    }
    for step in topology.teardown_steps():
        results[step.task_id] = {"action": outcomes.DELETED}
    results[topology.DELETE_LUSTRE] = {"action": outcomes.KEPT_FOR_CHECKPOINT}
    for task_id in topology.requires(topology.LUSTRE):  # what Lustre needs stays with it
        results[topology.teardown_of(task_id).task_id] = {"action": outcomes.KEPT_FOR_LUSTRE}
    banner = costs.banner(costs.still_running(spec, dict.fromkeys(topology.STEPS, "success"), results))
    assert [(r["task_id"], r["state"]) for r in banner["costly"]] == [
        (topology.LUSTRE, f"kept ({outcomes.KEPT_FOR_CHECKPOINT})")
    ]
    assert {r["task_id"] for r in banner["free"]} == topology.requires(topology.LUSTRE)
    assert banner["free_line"] == (
        "4 free resources: 1 VPC network, 1 peering range, 1 Service Networking peering, 1 firewall rule"
        f" - all kept ({outcomes.KEPT_FOR_LUSTRE}), 0.00 USD/h"
    )
    # Mixed states are counted, the most common first; nothing free: no line at all.
    mixed = [costs.RunningResource("a", "subnet", "a", "up", 0.0, ""),
             costs.RunningResource("b", "subnet (RDMA)", "b", "up", 0.0, ""),
             costs.RunningResource("c", "VPC network", "c", "being deleted", 0.0, "")]  # fmt: skip
    assert costs.free_line(mixed) == "3 free resources: 2 subnets, 1 VPC network - 2 up, 1 being deleted, 0.00 USD/h"
    assert costs.banner([])["free_line"] is None and costs.banner([])["count"] == 0


def test_the_budget_published_by_train_wait_shows_used_and_left() -> None:
    tasks, results = _mid_run()
    published = {
        "hours_limit": 4.0,
        "usd_limit": 500.0,
        "gpu_nodes": 1,
        "gpu_nodes_limit": 2,
        "stopped_at_budget": False,
    }
    view = build_view(ViewInputs("d", "r", "running", NOW, tasks, results, default_conf(), budget=published))
    budget, cost = view["budget"], view["cost"]
    assert budget["source"] == "train.wait" and budget["stopped_at_budget"] is False and budget["stopped_line"] is None
    up_h = (NOW - tasks[topology.NODE_POOL].end) / 3600
    assert budget["hours"] == {"used": round(up_h, 3), "limit": 4.0, "left": round(4.0 - up_h, 3),
                               "percent": round(100 * up_h / 4.0, 1), "over": False}  # fmt: skip
    assert budget["usd"]["used"] == cost["estimated_cost_usd"]
    assert budget["usd"]["left"] == round(500.0 - cost["estimated_cost_usd"], 2)
    assert budget["gpu_nodes"] == {"used": 1, "limit": 2, "left": 1, "percent": 50.0, "over": False}
    # Past a limit: nothing left, and flagged.
    tight = build_view(ViewInputs("d", "r", "running", NOW, tasks, results, default_conf(),
                                  budget={**published, "usd_limit": 1.0}))  # fmt: skip
    assert tight["budget"]["usd"]["left"] == 0.0 and tight["budget"]["usd"]["over"] is True


def test_a_budget_stop_is_said_plainly() -> None:
    lines = _task_log()
    published = {"hours_limit": None, "usd_limit": 50.0, "gpu_nodes": 2, "gpu_nodes_limit": None,
                 "stopped_at_budget": True}  # fmt: skip
    view = build_view(ViewInputs("d", "r", "success", NOW, task_states(), {}, default_conf(), None, lines, published))
    budget = view["budget"]
    usd = view["cost"]["estimated_cost_usd"]
    assert budget["stopped_at_budget"] is True
    assert budget["stopped_line"] == f"stopped at budget: 4 of 10 steps, {usd} USD"  # the conf's max_steps
    assert budget["hours"]["limit"] is None and budget["hours"]["left"] is None  # "no limit set"
    assert budget["gpu_nodes"]["limit"] is None and budget["gpu_nodes"]["used"] == 2


def test_without_a_published_budget_the_limits_come_from_the_settings_or_are_unset() -> None:
    tasks, results = _mid_run()
    spec = RunSpec.from_conf(default_conf())
    settings = {"max_run_hours": 12, "max_run_usd": 0, "max_gpu_nodes_per_run": 8}
    view = build_view(ViewInputs("d", "r", "running", NOW, tasks, results, default_conf(), limits=settings))
    budget = view["budget"]
    assert budget["source"] == "settings"
    planned = run_budget(spec, Deployment(max_run_hours=12, max_run_usd=0))
    assert budget["hours"]["limit"] == planned.hours == 12.0
    assert budget["usd"]["limit"] == planned.usd  # 0 in the settings: no limit of its own
    assert budget["gpu_nodes"] == {"used": spec.worker_replicas, "limit": 8, "left": 8 - spec.worker_replicas,
                                   "percent": round(100 * spec.worker_replicas / 8, 1), "over": False}  # fmt: skip
    # Nothing set anywhere: each limit reads "no limit set" (the RunSpec's own budget, once it has one, still counts).
    bare = build_view(ViewInputs("d", "r", "running", NOW, tasks, results, default_conf()))["budget"]
    defaults = run_budget(spec, Deployment())
    own = [defaults.hours, defaults.usd, None]
    assert [bare[k]["limit"] for k in ("hours", "usd", "gpu_nodes")] == own
    assert bare["source"] == ("none" if own == [None, None, None] else "settings")
    json.dumps(view, allow_nan=False)


def test_a_recovered_run_is_one_curve_with_each_step_once_and_a_mark_where_each_attempt_starts() -> None:
    # Attempt 0 saved 5 and 10 and died in step 12; attempt 1 resumed from 10 and died in 17 (after saving 15);
    # attempt 2 resumed from 15 and is at step 20. A restarted triggerer's trigger names the same job again and logs
    # its log again from the start: no new attempt, and no step twice.
    lines = [
        *attempt_log("job", range(1, 8), 30, (5,), 0),
        *attempt_log("job", range(1, 13), 30, (5, 10), 0),
        *attempt_log("job-r1", range(11, 18), 30, (15,), 1),
        *attempt_log("job-r2", range(16, 21), 30, (), 2),
    ]
    recoveries = [
        {"attempt": 1, "resumed_from": 10, "rule": "actor-died", "failed_job": "job"},
        {"attempt": 2, "resumed_from": 15, "rule": "node-died", "failed_job": "job-r1"},
    ]
    view = build_view(ViewInputs("d", "r", "running", NOW, task_states(**{topology.WAIT: "deferred"}),
                                 conf=default_conf(), log_lines=lines, recoveries=recoveries))  # fmt: skip
    rewards = view["series"]["reward"]
    assert [n for n, _ in rewards] == list(range(1, 21)) and view["points"] == 20
    # Steps 11-12 of attempt 0 and 16-17 of attempt 1 were trained again: the curve shows the later attempt's.
    attempt = [0] * 10 + [1] * 5 + [2] * 5
    assert [value for _, value in view["series"]["loss"]] == [
        round(a + step / 100, 6) for a, step in zip(attempt, range(1, 21), strict=True)
    ]
    assert view["attempts"] == [
        {"attempt": 1, "at": 11, "resumed_from": 10, "rule": "actor-died"},
        {"attempt": 2, "at": 16, "resumed_from": 15, "rule": "node-died"},
    ]
    assert [c["step"] for c in view["checkpoints"]] == [5, 10, 15]
    # Without a recovery there is nothing to mark.
    assert (
        build_view(ViewInputs("d", "r", "running", NOW, task_states(), conf=default_conf(), log_lines=lines[:40]))[
            "attempts"
        ]
        == []
    )


def test_a_restarted_trigger_that_goes_on_where_the_one_before_stopped_continues_the_curve() -> None:
    # Steps 1-7 logged by the first trigger; the triggerer restarts and the next one logs steps 8-12 only, after a
    # line that says where in the job's log it went on.
    resumed = [
        f"{FOLLOWING}job{RESUMED_AT}4242" if line.startswith(FOLLOWING) else line
        for line in attempt_log("job", range(8, 13), 30, (10,), 0)
    ]
    lines = [*attempt_log("job", range(1, 8), 30, (5,), 0), *resumed]
    view = build_view(ViewInputs("d", "r", "running", NOW, task_states(**{topology.WAIT: "deferred"}),
                                 conf=default_conf(), log_lines=lines))  # fmt: skip
    assert [loss for _, loss in view["series"]["loss"]] == [round(step / 100, 6) for step in range(1, 13)]
    assert view["points"] == 12 and [c["step"] for c in view["checkpoints"]] == [5, 10] and view["attempts"] == []
    # Without the position, the same id again is a trigger that logs the job from its start: read once, from there.
    again = [line.split(RESUMED_AT)[0] if RESUMED_AT in line else line for line in lines]
    restarted = build_view(ViewInputs("d", "r", "running", NOW, task_states(), conf=default_conf(), log_lines=again))
    assert [loss for _, loss in restarted["series"]["loss"]] == [round(step / 100, 6) for step in range(8, 13)]


def _epochs_log(epochs: int, per_epoch: int, last: int) -> list[str]:
    """Steps over NeMo RL's epochs: each epoch's ``Step k/K`` starts again at 1 (K the steps per epoch)."""
    lines = []
    for epoch in range(1, epochs + 1):
        lines.append(f"{'=' * 25} Epoch {epoch}/{epochs} {'=' * 25}")
        for k in range(1, (per_epoch if epoch < epochs else last) + 1):
            lines += [f"{'=' * 25} Step {k}/{per_epoch} {'=' * 25}", "📊 Training Results:", "  • Loss: 0.1",
                      f"  • Avg Reward: {k / per_epoch}", "⏱️  Timing:", "  • Total step time: 2.00s"]  # fmt: skip
    # The next step has started.
    lines.append(f"{'=' * 25} Step {last + 1}/{per_epoch} {'=' * 25}")
    return [f"{JOB_LINE}{line}" for line in lines]


def test_a_run_longer_than_an_epoch_counts_its_steps_against_max_steps() -> None:
    # 200 steps over 128-step epochs: 72 steps into the second epoch, 200 done is 100 %, not "72 of 128, 156 %".
    tasks = task_states(**{topology.WAIT: "deferred"})
    conf = {**default_conf(), "max_steps": 250}
    view = build_view(ViewInputs("d", "r", "running", NOW, tasks, conf=conf, log_lines=_epochs_log(2, 128, 72)))
    p = view["progress"]
    assert (p["step"], p["total_steps"], p["completed"], p["percent"], p["epoch"]) == (201, 250, 200, 80.0, 2)
    assert p["eta_s"] == 2.0 * 50
    # A continued lineage counts from the step it resumed at: steps 101..200 of max_steps 250.
    resume = {topology.RESUME: {"resumed_from": {"step": 100}, "max_steps": 250}}
    view = build_view(ViewInputs("d", "r", "running", NOW, tasks, resume, conf, log_lines=_epochs_log(1, 128, 100)))
    p = view["progress"]
    assert (p["step"], p["total_steps"], p["completed"], p["percent"]) == (201, 250, 200, 80.0)
