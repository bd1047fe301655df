"""The run report: stage grouping, critical path, makespan, GPU node-hours and cost, and its two renderings.

The synthetic run mimics a real apply run of the DAG: the gate tasks, the network fan-out, Lustre (storage) and the
cluster with its GPU pool side by side, the Kubernetes objects, an hour of training, the checkpoint export and the
teardown, whose Lustre and cluster chains also run side by side. Times are seconds from ``T0`` with a few seconds
of scheduling gap between dependent tasks, as Airflow leaves them.
"""

from __future__ import annotations

import json
import math

import pytest

from nemo_rl_gke.observe import report
from nemo_rl_gke.observe.report import (
    RunInputs,
    TaskTiming,
    build_report,
    critical_path,
    stage_of,
)
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.costs import DEFAULT_GPU_HOUR_PRICES_USD

T0 = 1_750_000_000.0

# task_id -> (start, end) in seconds from T0; None for a task still running.
SCHEDULE: dict[str, tuple[float, float | None]] = {
    "validate": (0, 2),
    "plan": (3, 5),
    "apply_gate": (6, 7),
    "preflight_live": (8, 20),
    t.NET: (22, 52),
    t.GVNIC_NET: (22, 47),
    t.RDMA_NET: (23, 50),
    t.GVNIC_SUB: (49, 64),
    t.GVNIC_FW: (49, 59),
    t.RDMA_SUBS[0]: (51, 66),
    t.PEERING_RANGE: (54, 84),
    t.PEERING: (86, 146),
    t.LUSTRE: (148, 1048),
    t.GKE_CLUSTER: (54, 474),
    t.NODE_POOL: (476, 776),
    t.NCCL_INSTALLER: (778, 788),
    t.NETWORK_MAPPING: (778, 783),
    t.LUSTRE_STORAGE: (1050, 1056),
    t.RAYCLUSTER: (1058, 1238),
    t.SUBMIT: (1240, 1250),
    t.WAIT: (1252, 4852),
    t.CHECK_CHECKPOINT: (4854, 4914),
    t.EXPORT: (4916, 5216),
    t.DELETE_RAYCLUSTER: (5218, 5248),
    t.DELETE_GVNIC_FW: (5218, 5228),
    t.DELETE_KUBE_OBJECTS: (5250, 5260),
    t.DELETE_LUSTRE: (5262, 5862),
    t.DELETE_PEERING: (5864, 5884),
    t.DELETE_PEERING_RANGE: (5886, 5896),
    t.DELETE_CLUSTER: (5262, 5742),
    t.DELETE_GVNIC_SUB: (5744, 5764),
    t.DELETE_RDMA_SUBS[0]: (5744, 5766),
    t.DELETE_GVNIC_NET: (5766, 5786),
    t.DELETE_RDMA_NET: (5768, 5788),
    t.DELETE_NET: (5898, 5928),
    "report": (5930, None),
}

UPSTREAM: dict[str, list[str]] = {
    "plan": ["validate"],
    "apply_gate": ["plan"],
    "preflight_live": ["apply_gate"],
    t.NET: ["preflight_live"],
    t.GVNIC_NET: ["preflight_live"],
    t.RDMA_NET: ["preflight_live"],
    t.GVNIC_SUB: [t.GVNIC_NET],
    t.GVNIC_FW: [t.GVNIC_NET],
    t.RDMA_SUBS[0]: [t.RDMA_NET],
    t.PEERING_RANGE: [t.NET],
    t.PEERING: [t.PEERING_RANGE],
    t.LUSTRE: [t.PEERING],
    t.GKE_CLUSTER: [t.NET],
    t.NODE_POOL: [t.GKE_CLUSTER, t.GVNIC_SUB, t.RDMA_SUBS[0]],
    t.NCCL_INSTALLER: [t.NODE_POOL],
    t.NETWORK_MAPPING: [t.NODE_POOL],
    t.LUSTRE_STORAGE: [t.GKE_CLUSTER, t.LUSTRE],
    t.RAYCLUSTER: [t.NCCL_INSTALLER, t.NETWORK_MAPPING, t.LUSTRE_STORAGE, t.NODE_POOL],
    t.SUBMIT: [t.RAYCLUSTER],
    t.WAIT: [t.SUBMIT],
    t.CHECK_CHECKPOINT: [t.WAIT],
    t.EXPORT: [t.CHECK_CHECKPOINT],
    t.DELETE_RAYCLUSTER: [t.EXPORT, t.WAIT, t.LUSTRE, t.GVNIC_FW],
    t.DELETE_GVNIC_FW: [t.WAIT, t.GVNIC_FW],
    t.DELETE_KUBE_OBJECTS: [t.DELETE_RAYCLUSTER],
    t.DELETE_LUSTRE: [t.DELETE_KUBE_OBJECTS],
    t.DELETE_PEERING: [t.DELETE_LUSTRE],
    t.DELETE_PEERING_RANGE: [t.DELETE_PEERING],
    t.DELETE_CLUSTER: [t.DELETE_KUBE_OBJECTS],
    t.DELETE_GVNIC_SUB: [t.DELETE_CLUSTER],
    t.DELETE_RDMA_SUBS[0]: [t.DELETE_CLUSTER],
    t.DELETE_GVNIC_NET: [t.DELETE_GVNIC_SUB, t.DELETE_GVNIC_FW],
    t.DELETE_RDMA_NET: [t.DELETE_RDMA_SUBS[0]],
    t.DELETE_NET: [t.DELETE_PEERING_RANGE, t.DELETE_CLUSTER],
    "report": [t.DELETE_NET, t.DELETE_GVNIC_NET, t.DELETE_RDMA_NET],
}

# Lustre (30 + 60 + 900 s, then the 6 s PV) outlasts the cluster and its pool (420 + 300 s); in teardown, deleting
# Lustre and the peering (600 + 20 + 10 s) outlasts deleting the cluster and a subnet (480 + 22 + 20 s).
EXPECTED_PATH = [
    ("validate", 2),
    ("plan", 2),
    ("apply_gate", 1),
    ("preflight_live", 12),
    (t.NET, 30),
    (t.PEERING_RANGE, 30),
    (t.PEERING, 60),
    (t.LUSTRE, 900),
    (t.LUSTRE_STORAGE, 6),
    (t.RAYCLUSTER, 180),
    (t.SUBMIT, 10),
    (t.WAIT, 3600),
    (t.CHECK_CHECKPOINT, 60),
    (t.EXPORT, 300),
    (t.DELETE_RAYCLUSTER, 30),
    (t.DELETE_KUBE_OBJECTS, 10),
    (t.DELETE_LUSTRE, 600),
    (t.DELETE_PEERING, 20),
    (t.DELETE_PEERING_RANGE, 10),
    (t.DELETE_NET, 30),
]
EXPECTED_PATH_TOTAL = 5893.0
MAKESPAN = 5928.0  # network teardown ends at +5928; the report task has not ended
POOL_UP_S = 5742 - 776  # end of cluster.node-pool to end of teardown.delete-cluster

TRAINING = {
    "steps_completed": 20,
    "first_reward": 0.3867,
    "last_reward": 0.7125,
    "best_reward": 0.7342,
    "mean_step_time_s": 118.64,
    "final_val_accuracy": 0.655,
    "checkpoints": ["step_10", "step_20"],
    "wandb_url": "https://wandb.ai/ml-team/nemo-rl/runs/k3x9q2ab",
}
CHECKPOINT = "gs://proj-nemo-rl-checkpoints/runs/manual__2025-06-15/step_20"
ALL_DELETED = {task_id: "deleted" for task_id in SCHEDULE if task_id.startswith("teardown.")}


def timings(
    schedule: dict[str, tuple[float, float | None]] | None = None,
    states: dict[str, str] | None = None,
    tries: dict[str, int] | None = None,
) -> list[TaskTiming]:
    """Task instances from a schedule of offsets; every task succeeded unless ``states`` says otherwise."""
    states = states or {}
    tries = tries or {}
    out = []
    for task_id, (start, end) in (schedule or SCHEDULE).items():
        state = states.get(task_id, "running" if end is None else "success")
        out.append(
            TaskTiming(
                task_id=task_id,
                state=state,
                start=None if start is None else T0 + start,
                end=None if end is None else T0 + end,
                tries=tries.get(task_id, 1),
            )
        )
    return out


def inputs(**overrides: object) -> RunInputs:
    fields: dict[str, object] = {
        "gpu_type": "b200",
        "gpus_per_node": 8,
        "worker_replicas": 2,
        "now": T0 + 5931,
        "teardown_policy": "delete_all",
        "training_summary": TRAINING,
        "checkpoint_uri": CHECKPOINT,
        "teardown_actions": ALL_DELETED,
    }
    fields.update(overrides)
    return RunInputs(**fields)  # type: ignore[arg-type]


def failed_pool_run() -> list[TaskTiming]:
    """The GPU pool creation fails (stockout); everything needing it is upstream_failed and never starts."""
    schedule: dict[str, tuple[float | None, float | None]] = {
        k: v for k, v in SCHEDULE.items() if not k.startswith(("teardown.", "report"))
    }
    never = [t.NCCL_INSTALLER, t.NETWORK_MAPPING, t.RAYCLUSTER, t.SUBMIT, t.WAIT]
    never += [t.CHECK_CHECKPOINT, t.EXPORT]
    for task_id in never:
        schedule[task_id] = (None, None)
    schedule[t.NODE_POOL] = (476, 1376)
    schedule[t.DELETE_RAYCLUSTER] = (1378, 1380)
    schedule[t.DELETE_CLUSTER] = (1400, 1880)
    states = dict.fromkeys(never, "upstream_failed")
    states[t.NODE_POOL] = "failed"
    return timings(schedule, states)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task_id", "stage"),
    [
        ("validate", "preflight"),
        ("plan", "preflight"),
        ("apply_gate", "preflight"),
        ("preflight_live", "preflight"),
        (t.RDMA_SUBS[0], "network"),
        (t.NODE_POOL, "cluster"),
        (t.DELETE_CLUSTER, "teardown"),
        (t.EXPORT, "checkpoint"),
        ("report", "report"),
        ("a.b.c", "a"),
    ],
)
def test_stage_of(task_id: str, stage: str) -> None:
    assert stage_of(task_id) == stage


def test_stage_grouping_order_and_durations() -> None:
    r = build_report(timings(), UPSTREAM, inputs())
    names = [s.name for s in r.stages]
    assert names == ["preflight", "network", "storage", "cluster", "kube", "train", "checkpoint", "teardown", "report"]
    durations = {s.name: s.duration_s for s in r.stages}
    assert durations == {
        "preflight": 20.0,
        "network": 66.0 - 22.0,
        "storage": 1048.0 - 54.0,
        "cluster": 776.0 - 54.0,
        "kube": 1238.0 - 778.0,
        "train": 4852.0 - 1240.0,
        "checkpoint": 5216.0 - 4854.0,
        "teardown": 5928.0 - 5218.0,
        "report": None,  # started, not ended
    }
    assert r.stage("network").tasks == 6
    assert r.stage("teardown").tasks == 12
    assert r.stage("storage").start == T0 + 54
    assert r.stage("storage").end == T0 + 1048
    assert all(r.stage(n).state == "success" and not r.stage(n).failed for n in names[:-1])
    assert r.stage("report").state == "running"


def test_stage_state_names_the_failed_tasks_and_retries() -> None:
    r = build_report(failed_pool_run(), UPSTREAM, inputs(training_summary=None, checkpoint_uri=None))
    cluster = r.stage("cluster")
    assert cluster.state == "failed"
    assert cluster.failed == (t.NODE_POOL,)
    assert cluster.state_text() == "FAILED: cluster.node-pool"
    assert cluster.duration_s == 1376.0 - 54.0
    # Nothing in train ran: the stage has no span, and its state says why.
    train = r.stage("train")
    assert (train.ran, train.start, train.end, train.duration_s) == (0, None, None, None)
    assert train.state == "upstream_failed"
    assert train.states == {"upstream_failed": 2}
    kube = r.stage("kube")
    assert kube.states == {"upstream_failed": 3, "success": 1}
    assert kube.duration_s == 6.0  # only lustre-storage ran
    assert kube.state_text() == "upstream_failed 3, success 1"

    retried = build_report(timings(tries={t.LUSTRE: 3}), UPSTREAM, inputs())
    assert retried.stage("storage").retried == ("storage.lustre x3",)
    assert "retried: storage.lustre x3" in retried.to_text()


# ---------------------------------------------------------------------------------------------------------------
# Critical path and makespan
# ---------------------------------------------------------------------------------------------------------------


def test_critical_path_follows_the_longer_parallel_chain() -> None:
    path = critical_path(timings(), UPSTREAM)
    assert [(s.task_id, s.duration_s) for s in path.steps] == EXPECTED_PATH
    assert path.total_s == EXPECTED_PATH_TOTAL == sum(d for _, d in EXPECTED_PATH)
    assert path.steps[0].start_offset_s == 0.0
    assert path.steps[7].start_offset_s == 148.0  # storage.lustre
    # The still-running report task (duration 0) is not appended after the last real task.
    assert path.task_ids[-1] == t.DELETE_NET


def test_critical_path_switches_chain_when_the_cluster_is_slower() -> None:
    # A slow GPU pool (1200 s instead of 300 s) makes the cluster chain the longer one; later tasks shift along.
    schedule = dict(SCHEDULE)
    schedule[t.NODE_POOL] = (476, 1676)
    path = critical_path(timings(schedule), UPSTREAM)
    ids = path.task_ids
    # The pool is followed by the longer of its two kube children (the NCCL installer: 10 s, the mapping: 5 s).
    assert ids[4:9] == [t.NET, t.GKE_CLUSTER, t.NODE_POOL, t.NCCL_INSTALLER, t.RAYCLUSTER]
    assert not any(t.startswith("storage.") for t in ids[:12])
    assert path.total_s == EXPECTED_PATH_TOTAL - (30 + 60 + 900 + 6) + (420 + 1200 + 10)


def test_makespan_and_schedule_ratio() -> None:
    r = build_report(timings(), UPSTREAM, inputs())
    assert r.run_start == T0
    assert r.run_end == T0 + MAKESPAN
    assert r.makespan_s == MAKESPAN
    assert r.schedule_ratio == pytest.approx(MAKESPAN / EXPECTED_PATH_TOTAL)
    assert r.schedule_ratio >= 1.0


def test_critical_path_counts_tasks_that_never_ran_as_zero() -> None:
    path = critical_path(failed_pool_run(), UPSTREAM)
    durations = dict((s.task_id, s.duration_s) for s in path.steps)
    # The failed pool still took 900 s: cluster + pool (1320 s) outlast the Lustre chain (996 s).
    assert list(durations)[4:7] == [t.NET, t.GKE_CLUSTER, t.NODE_POOL]
    assert durations[t.NODE_POOL] == 900.0
    assert all(d == 0.0 for t, d in durations.items() if t.startswith(("train.", "checkpoint.")))
    assert math.isfinite(path.total_s)


def test_critical_path_handles_tasks_missing_from_either_input() -> None:
    # "extra" has no upstream entry; "ghost" is only named as an upstream and has no task instance.
    ts = [TaskTiming("a", "success", T0, T0 + 5), TaskTiming("b", "success", T0 + 6, T0 + 8)]
    ts.append(TaskTiming("extra", "success", T0, T0 + 20))
    path = critical_path(ts, {"b": ["a", "ghost"]})
    assert path.task_ids == ["extra"]
    assert path.total_s == 20.0
    assert critical_path([], {}).steps == ()


def test_critical_path_rejects_a_cycle() -> None:
    ts = [TaskTiming("a", "success", T0, T0 + 1), TaskTiming("b", "success", T0 + 1, T0 + 2)]
    with pytest.raises(ValueError, match="cycle"):
        critical_path(ts, {"a": ["b"], "b": ["a"]})


# ---------------------------------------------------------------------------------------------------------------
# GPU node-hours and cost
# ---------------------------------------------------------------------------------------------------------------


def test_node_hours_from_pool_up_to_cluster_deleted_with_default_price() -> None:
    g = build_report(timings(), UPSTREAM, inputs()).gpu
    hours = POOL_UP_S / 3600
    assert g.came_up and not g.still_running
    assert (g.up_at, g.down_at, g.counted_until) == (T0 + 776, T0 + 5742, T0 + 5742)
    assert g.hours == pytest.approx(hours)
    assert g.node_hours == pytest.approx(hours * 2)
    assert g.gpu_hours == pytest.approx(hours * 2 * 8)
    assert g.price_source == "default"
    assert g.price_per_gpu_hour_usd == DEFAULT_GPU_HOUR_PRICES_USD["b200"]
    assert g.estimated_cost_usd == pytest.approx(hours * 16 * DEFAULT_GPU_HOUR_PRICES_USD["b200"])
    assert g.estimated_cost_usd == pytest.approx(242.78, abs=0.01)


def test_cost_uses_the_conf_price_and_the_h200_default() -> None:
    hours = POOL_UP_S / 3600
    conf = build_report(timings(), UPSTREAM, inputs(gpu_hour_price_usd=14.25, worker_replicas=4)).gpu
    assert (conf.price_source, conf.price_per_gpu_hour_usd) == ("conf", 14.25)
    assert conf.node_hours == pytest.approx(hours * 4)
    assert conf.estimated_cost_usd == pytest.approx(hours * 4 * 8 * 14.25)
    # A conf price below the estimate does not lower it: the USD budget counts at the same one price.
    lower = build_report(timings(), UPSTREAM, inputs(gpu_hour_price_usd=4.25)).gpu
    assert (lower.price_source, lower.price_per_gpu_hour_usd) == ("default", DEFAULT_GPU_HOUR_PRICES_USD["b200"])
    h200 = build_report(timings(), UPSTREAM, inputs(gpu_type="h200")).gpu
    assert h200.price_per_gpu_hour_usd == DEFAULT_GPU_HOUR_PRICES_USD["h200"] != DEFAULT_GPU_HOUR_PRICES_USD["b200"]
    assert h200.estimated_cost_usd == pytest.approx(hours * 16 * DEFAULT_GPU_HOUR_PRICES_USD["h200"])
    unknown = build_report(timings(), UPSTREAM, inputs(gpu_type="x100")).gpu
    assert (unknown.price_per_gpu_hour_usd, unknown.price_source, unknown.estimated_cost_usd) == (None, "unknown", None)
    assert unknown.gpu_hours == pytest.approx(hours * 16)


@pytest.mark.parametrize("action", ["kept-by-policy", "kept-unowned", "kept-for-checkpoint", None])
def test_kept_cluster_counts_until_now_and_is_flagged(action: str | None) -> None:
    actions = dict(ALL_DELETED)
    if action is None:
        del actions[t.DELETE_CLUSTER]  # the teardown task reported nothing (failed or skipped)
    else:
        actions[t.DELETE_CLUSTER] = action
    now = T0 + 776 + 7200
    r = build_report(timings(), UPSTREAM, inputs(teardown_actions=actions, now=now))
    g = r.gpu
    assert g.still_running
    assert g.down_at is None
    assert g.counted_until == now
    assert g.hours == pytest.approx(2.0)
    assert g.gpu_hours == pytest.approx(2.0 * 2 * 8)
    assert g.estimated_cost_usd == pytest.approx(32 * 11.0)
    text = r.to_text()
    assert "352.00 (still running!)" in text
    if action is not None:
        assert [(i.task_id, i.action) for i in r.kept] == [(t.DELETE_CLUSTER, action)]


def test_absent_cluster_counts_as_gone() -> None:
    # A retried delete whose first try already deleted the cluster reports "absent": the nodes are gone.
    actions = {**ALL_DELETED, t.DELETE_CLUSTER: "absent"}
    r = build_report(timings(), UPSTREAM, inputs(teardown_actions=actions, now=T0 + 99_999))
    assert not r.gpu.still_running
    assert r.gpu.hours == pytest.approx(POOL_UP_S / 3600)
    assert [i.task_id for i in r.absent] == [t.DELETE_CLUSTER]
    assert "still running" not in r.to_text()


def test_deleted_action_without_an_end_time_is_still_running() -> None:
    schedule = {**SCHEDULE, t.DELETE_CLUSTER: (5262, None)}
    g = build_report(timings(schedule), UPSTREAM, inputs(now=T0 + 6000)).gpu
    assert g.still_running
    assert g.hours == pytest.approx((6000 - 776) / 3600)


def test_pool_that_never_came_up_costs_nothing() -> None:
    r = build_report(failed_pool_run(), UPSTREAM, inputs(teardown_actions={}, now=T0 + 50_000))
    g = r.gpu
    assert not g.came_up and not g.still_running
    assert (g.up_at, g.down_at, g.counted_until) == (None, None, None)
    assert (g.hours, g.node_hours, g.gpu_hours, g.estimated_cost_usd) == (0.0, 0.0, 0.0, 0.0)
    # The pool task missing altogether (a validate-only run) is the same.
    only_gate = [t for t in timings() if stage_of(t.task_id) == "preflight"]
    assert build_report(only_gate, UPSTREAM, inputs()).gpu.gpu_hours == 0.0


# ---------------------------------------------------------------------------------------------------------------
# Training, checkpoint, teardown and the renderings
# ---------------------------------------------------------------------------------------------------------------


def test_teardown_lists_and_pass_through_fields() -> None:
    actions = {
        t.DELETE_RAYCLUSTER: "deleted",
        t.DELETE_KUBE_OBJECTS: "absent",
        t.DELETE_LUSTRE: "kept-for-checkpoint",
        t.DELETE_CLUSTER: "kept-by-policy",
        t.DELETE_NET: "kept-unowned",
    }
    r = build_report(timings(), UPSTREAM, inputs(teardown_actions=actions, teardown_policy="keep_cluster_and_storage"))
    assert [(i.task_id, i.action) for i in r.deleted] == [(t.DELETE_RAYCLUSTER, "deleted")]
    assert [i.task_id for i in r.absent] == [t.DELETE_KUBE_OBJECTS]
    assert [(i.task_id, i.action) for i in r.kept] == [
        (t.DELETE_CLUSTER, "kept-by-policy"),
        (t.DELETE_LUSTRE, "kept-for-checkpoint"),
        (t.DELETE_NET, "kept-unowned"),
    ]
    assert r.training_summary == TRAINING
    assert r.training_summary is not TRAINING  # a copy: the report is not tied to the caller's dict
    assert r.checkpoint_uri == CHECKPOINT
    text = r.to_text()
    assert "Teardown (policy keep_cluster_and_storage)" in text
    assert t.DELETE_LUSTRE in text and "kept-for-checkpoint" in text


def test_to_dict_is_json_serializable() -> None:
    summary = {**TRAINING, "final_val_accuracy": float("nan")}
    r = build_report(timings(), UPSTREAM, inputs(training_summary=summary))
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert d["makespan_s"] == MAKESPAN
    assert d["critical_path"]["total_s"] == EXPECTED_PATH_TOTAL
    assert [s["task_id"] for s in d["critical_path"]["steps"]] == [t for t, _ in EXPECTED_PATH]
    assert d["gpu"]["still_running"] is False
    assert d["gpu"]["gpu_hours"] == pytest.approx(POOL_UP_S / 3600 * 16)
    assert d["training_summary"]["final_val_accuracy"] is None
    assert d["training_summary"]["checkpoints"] == ["step_10", "step_20"]
    assert d["stages"][0] == {
        "name": "preflight",
        "tasks": 4,
        "ran": 4,
        "start": T0,
        "end": T0 + 20,
        "duration_s": 20.0,
        "state": "success",
        "states": {"success": 4},
        "failed": [],
        "retried": [],
    }
    assert len(d["teardown"]["deleted"]) == len(ALL_DELETED)
    failed = build_report(failed_pool_run(), UPSTREAM, inputs(training_summary=None, checkpoint_uri=None))
    json.dumps(failed.to_dict(), allow_nan=False)


def test_to_text_shows_the_key_numbers() -> None:
    text = build_report(timings(), UPSTREAM, inputs()).to_text()
    assert text.isascii()  # no emojis in the task log
    for expected in [
        "Stages",
        "Critical path",
        t.LUSTRE,
        "5893.0",  # critical path total
        "makespan                5928.0 s",
        f"makespan / crit. path   {MAKESPAN / EXPECTED_PATH_TOTAL:.3f} (+0.6% beyond",
        "GPU usage (b200, 2 nodes x 8 GPUs)",
        f"GPU node-hours          {POOL_UP_S / 3600 * 2:.3f}",
        f"GPU-hours               {POOL_UP_S / 3600 * 16:.2f}",
        "11.00 (default list-price estimate)",
        "estimated cost (USD)    242.78",
        "steps_completed     20",
        "https://wandb.ai/ml-team/nemo-rl/runs/k3x9q2ab",
        "step_10, step_20",
        CHECKPOINT,
        "deleted: 12",
    ]:
        assert expected in text, expected
    assert "still running" not in text
    # Fixed width: the stage rows' columns line up whatever the numbers' widths.
    rows = [line for line in text.splitlines() if line.startswith(("  preflight ", "  teardown "))]
    assert len(rows) == 2
    assert rows[0].index(" 20.0 ") + 5 == rows[1].index(" 710.0 ") + 6
    assert rows[0].index("success") == rows[1].index("success")


def test_to_text_without_training_checkpoint_or_teardown() -> None:
    r = build_report(
        failed_pool_run(), UPSTREAM, inputs(training_summary=None, checkpoint_uri=None, teardown_actions={})
    )
    text = r.to_text()
    assert "no training ran" in text
    assert "none: not exported" in text
    assert "no teardown actions recorded" in text
    assert "FAILED: cluster.node-pool" in text
    assert "never (cluster.node-pool did not succeed)" in text
    assert "estimated cost (USD)    0.00" in text


def test_module_is_cheap_to_import() -> None:
    # Imported while Airflow parses the DAG: stdlib and the pure topology, costs and task states only, no Airflow.
    source = report.__file__
    with open(source, encoding="utf-8") as f:
        imports = [line for line in f if line.startswith(("import ", "from "))]
    assert not any("airflow" in line for line in imports), imports
    assert [line for line in imports if "nemo_rl_gke" in line] == [
        "from nemo_rl_gke.observe.recoveries import recoveries_text\n",
        "from nemo_rl_gke.run import costs, outcomes, topology\n",
        "from nemo_rl_gke.run import task_states as ts\n",
        "from nemo_rl_gke.run.times import epoch_of, shown_or_dash\n",
    ]


def test_a_warm_cluster_whose_pool_went_to_zero_bills_no_gpu_node_until_the_next_run() -> None:
    # keep_cluster_and_storage: the cluster is kept, teardown.scale-pool took its pool to 0 nodes.
    schedule = {**SCHEDULE, t.SCALE_POOL: (5250, 5280)}
    actions = {**ALL_DELETED, t.DELETE_CLUSTER: "kept-by-policy", t.SCALE_POOL: "scaled-to-zero"}
    r = build_report(timings(schedule), UPSTREAM, inputs(teardown_actions=actions, now=T0 + 99_999))
    g = r.gpu
    assert g.scaled_to_zero and not g.still_running and g.nodes_left_up == 0
    assert g.down_at == T0 + 5280 and g.hours == pytest.approx((5280 - 776) / 3600)
    text = r.to_text()
    assert "pool scaled to 0 nodes by teardown.scale-pool; the cluster is kept warm" in text
    assert "GPU nodes left up       0 (0 GPU node-hours per hour until the next run)" in text
    assert "until the next run" not in text.replace("per hour until the next run", "")  # not scheduled: no line
    # The resize is not a kept resource; the kept cluster is.
    assert [(i.task_id, i.action) for i in r.kept] == [(t.DELETE_CLUSTER, "kept-by-policy")]
    # Without the resize the same kept cluster keeps its nodes up.
    del actions[t.SCALE_POOL]
    kept_up = build_report(timings(schedule), UPSTREAM, inputs(teardown_actions=actions, now=T0 + 99_999)).gpu
    assert kept_up.still_running and kept_up.nodes_left_up == 2


def test_a_scheduled_run_states_the_gpu_node_hours_until_its_next_run() -> None:
    schedule = {**SCHEDULE, t.SCALE_POOL: (5250, 5280)}
    warm = {**ALL_DELETED, t.DELETE_CLUSTER: "kept-by-policy", t.SCALE_POOL: "scaled-to-zero"}
    now, next_run = T0 + 6000, T0 + 6000 + 20 * 3600
    r = build_report(timings(schedule), UPSTREAM, inputs(teardown_actions=warm, now=now, next_run_at=next_run))
    assert r.gpu.next_run_at == next_run and r.gpu.node_hours_to_next_run == 0.0
    assert r.to_dict()["gpu"]["node_hours_to_next_run"] == 0.0
    assert "until the next run      0.000 GPU node-hours (0 nodes x 20.2 h to " in r.to_text()
    # Kept up without the resize: its 2 nodes bill from the end of teardown to the next run.
    kept = {**ALL_DELETED, t.DELETE_CLUSTER: "kept-by-policy"}
    r = build_report(timings(schedule), UPSTREAM, inputs(teardown_actions=kept, now=now, next_run_at=next_run))
    assert r.gpu.node_hours_to_next_run == pytest.approx(2 * 20.0)
    assert "until the next run      40.000 GPU node-hours (2 nodes x 20.0 h to " in r.to_text()


def test_the_report_lists_every_pending_checkpoint_on_the_kept_instance_and_how_to_release_it() -> None:
    pending = [
        {"run": "nemo_rl_grpo_gke/manual__1", "step": 10, "where": "/data/exp_a/step_10",
         "release": "release_checkpoint_of_run='nemo_rl_grpo_gke/manual__1'"},
        {"run": "nemo_rl_grpo_gke/manual__3", "step": 5, "where": "/data/exp_c/step_5",
         "release": "release_checkpoint_of_run='nemo_rl_grpo_gke/manual__3'"},
    ]  # fmt: skip
    r = build_report(timings(), UPSTREAM, inputs(pending_checkpoints=pending))
    text = r.to_text()
    assert (
        "Pending checkpoints on the kept Lustre instance (2; each keeps it until exported, or released by a later "
        "run's conf)\n"
        "  run nemo_rl_grpo_gke/manual__1, step 10, /data/exp_a/step_10\n"
        "    release: release_checkpoint_of_run='nemo_rl_grpo_gke/manual__1'\n"
        "  run nemo_rl_grpo_gke/manual__3, step 5, /data/exp_c/step_5\n"
        "    release: release_checkpoint_of_run='nemo_rl_grpo_gke/manual__3'\n"
    ) in text
    assert r.to_dict()["pending_checkpoints"] == pending
    assert "Pending checkpoints" not in build_report(timings(), UPSTREAM, inputs()).to_text()


def test_a_budget_stop_and_a_stall_are_said_in_the_training_section() -> None:
    stopped = {**TRAINING, "stopped_at_budget": True, "final_step": 10, "max_steps": 20}
    r = build_report(timings(), UPSTREAM, inputs(training_summary=stopped))
    cost = r.gpu.estimated_cost_usd
    assert cost is not None
    line = f"  stopped at budget: {TRAINING['steps_completed']} of 20 steps, {cost:,.2f} USD; checkpoint step 10"
    assert line in r.to_text().splitlines()
    assert "stopped_at_budget" not in r.to_text() and "max_steps" not in r.to_text()
    stalled = {**TRAINING, "stalled": "stalled at step 3/20: no new step\nLast lines of the driver log:\n..."}
    text = build_report(timings(), UPSTREAM, inputs(training_summary=stalled)).to_text()
    assert "  stalled at step 3/20: no new step" in text.splitlines() and "Last lines" not in text


MODEL_OUT = {
    "convert": {"hf_path": "/data/ckpt/step_40/hf"},
    "evaluate": {
        "score": 0.61,
        "baseline": 0.48,
        "result": {
            "dataset": "gsm8k",
            "score": 0.61,
            "metric": "pass",
            "k": 1,
            "num_tests_per_prompt": 1,
            "problems": 1319,
        },
    },
    "publish": {
        "outcome": "not-promoted",
        "reason": "score 0.6100 is below the published model's 0.6500 + margin 0",
        "published": 0.65,
        "hf_uri": "gs://b/d/r/data/ckpt/step_40/hf/",
    },
}


def test_the_conversion_and_the_evaluation_are_priced_apart_from_training() -> None:
    # Conversion 120 s and evaluation 600 s after the export, the pool (2 nodes x 8 GPUs) up meanwhile.
    schedule = {**SCHEDULE, t.CONVERT: (4916, 5036), t.EVALUATE: (5036, 5636)}
    built = build_report(timings(schedule), UPSTREAM, inputs(model_out=MODEL_OUT))
    model, gpu = built.model, built.gpu
    assert model is not None
    assert model["conversion_gpu_hours"] == pytest.approx(120 / 3600 * 16, abs=1e-4)
    assert model["evaluation_gpu_hours"] == pytest.approx(600 / 3600 * 16, abs=1e-4)
    price = DEFAULT_GPU_HOUR_PRICES_USD["b200"]
    assert model["evaluation_usd"] == pytest.approx(600 / 3600 * 16 * price, abs=0.01)
    share = (120 + 600) * 16 / 3600 / gpu.gpu_hours
    assert model["share_of_gpu_hours"] == pytest.approx(share, abs=1e-4)
    text = built.to_text()
    assert "Model\n  Hugging Face export    gs://b/d/r/data/ckpt/step_40/hf/\n" in text
    assert "  evaluation             gsm8k: score 0.6100 (pass@1, 1 sample(s) of 1319 problems)\n" in text
    assert "  base model             0.4800\n  last published         0.6500\n" in text
    assert "  decision               not-promoted: score 0.6100 is below the published model's 0.6500" in text
    assert f"  share of the run's GPU-hours  {share:.1%}" in text
    assert json.loads(json.dumps(built.to_dict()))["model"]["evaluate"]["score"] == 0.61


def test_a_run_without_the_model_steps_has_no_model_section() -> None:
    built = build_report(timings(), UPSTREAM, inputs())
    assert built.model is None and "Model\n" not in built.to_text()
