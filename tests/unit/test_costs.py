"""One home for prices and "what is still up and what it costs": the report, the view and the alerts agree."""

from __future__ import annotations

import ast
from typing import Any

import pytest

from nemo_rl_gke.observe.alert_messages import LiveFacts, deadline_alert, kept_after_teardown
from nemo_rl_gke.observe.report import RunInputs, TaskTiming, build_report
from nemo_rl_gke.observe.training_view import TaskState, ViewInputs, build_view
from nemo_rl_gke.run import capacity, costs, outcomes
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.budget import run_budget
from nemo_rl_gke.run.conf_schema import CAPACITIES
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.spec import RunSpec, default_conf
from tests.paths import ROOT

NOW = 1_800_000_000.0
PLUGINS = ROOT / "plugins/nemo_rl_gke"


def _run(policy: str, *, price: float = 0.0, gpu_type: str = "b200", replicas: int = 2) -> tuple[RunSpec, dict]:
    conf = {**default_conf(), "teardown_policy": policy, "gpu_hour_price_usd": price, "gpu_type": gpu_type}
    conf["worker_replicas"] = replicas
    return RunSpec.from_conf(conf), conf


def _finished(policy: str) -> tuple[dict[str, str], dict[str, dict], dict[str, str]]:
    """A run that ended with teardown done as the policy says: states, results and teardown actions."""
    states = dict.fromkeys(t.STEPS, "success")
    results: dict[str, dict] = {s: {"action": outcomes.CREATED} for s in t.STEPS if not t.step(s).is_teardown}
    actions = {}
    for step in t.teardown_steps():
        if step.op is t.Op.RELEASE_LEASE:
            continue
        if step.op is t.Op.SCALE_POOL:
            action = outcomes.KEPT_BY_POLICY
            if t.deletes_under(t.NODE_POOL, policy):
                action = outcomes.NOT_NEEDED
            elif t.scales_down_under(t.NODE_POOL, policy):
                action = outcomes.SCALED_TO_ZERO
        else:
            gone = all(t.deletes_under(d, policy) for d in step.deletes)
            action = outcomes.DELETED if gone else outcomes.KEPT_BY_POLICY
        if action in outcomes.KEPT:
            states[step.task_id] = "skipped"  # a kept resource's teardown step ends skipped
        actions[step.task_id] = action
        results[step.task_id] = {"action": action}
    return states, results, actions


def _view_and_report(policy: str, conf: dict) -> tuple[dict[str, str], dict, Any]:
    """A finished run under ``policy`` as the Training view and the run report show it (the report's inputs from
    the conf's RunSpec, as operators/report.py builds them)."""
    spec = RunSpec.from_conf(conf)
    states, results, actions = _finished(policy)
    tasks = {k: TaskState(k, v, NOW - 3600 + n, NOW - 3000 + n) for n, (k, v) in enumerate(states.items())}
    view = build_view(ViewInputs("d", "r", "success", NOW, tasks, results=results, conf=conf))
    timings = [TaskTiming(k, s.state, s.start, s.end) for k, s in tasks.items()]
    inputs = RunInputs(gpu_type=spec.gpu_type, gpus_per_node=spec.gpus_per_node, worker_replicas=spec.worker_replicas,
                       now=NOW, gpu_hour_price_usd=spec.gpu_hour_price_usd, capacity=spec.capacity,
                       teardown_actions=actions)  # fmt: skip
    report = build_report(timings, {k: t.upstream(k) for k in t.STEPS}, inputs)
    return states, view, report


@pytest.mark.parametrize("price", [0.0, 4.5])
@pytest.mark.parametrize("policy", t.POLICIES)
def test_the_report_the_view_and_the_failure_alert_agree_on_the_gpu_pool(policy: str, price: float) -> None:
    spec, conf = _run(policy, price=price)
    states, view, report = _view_and_report(policy, conf)
    alerted = [r for r in kept_after_teardown(states, report) if r.what.startswith("GPU node pool")]
    pool = [r for r in view["running"] if r["task_id"] == t.NODE_POOL]
    price_per_gpu, _ = costs.gpu_hour_price(spec.gpu_type, spec.gpu_hour_price_usd)
    assert report.gpu.price_per_gpu_hour_usd == view["cost"]["price_per_gpu_hour_usd"] == price_per_gpu
    if t.deletes_under(t.NODE_POOL, policy):
        assert not pool and not alerted and not report.gpu.still_running
    elif t.scales_down_under(t.NODE_POOL, policy):
        assert report.gpu.scaled_to_zero and pool[0]["usd_per_hour"] == alerted[0].usd_per_hour == 0.0
    else:
        full = costs.pool_usd_per_hour(price_per_gpu, spec.gpus_per_node, spec.worker_replicas)
        assert report.gpu.still_running and full
        assert pool[0]["usd_per_hour"] == round(alerted[0].usd_per_hour, 4) == round(full, 4)


@pytest.mark.parametrize("scaled", [False, True])
def test_a_deadline_alert_and_the_view_agree_on_the_pool_of_a_run_in_progress(scaled: bool) -> None:
    """A warm run past teardown.scale-pool (the RayCluster gone, kube objects still going): the view's banner says
    the pool is at 0 nodes and costs nothing; the deadline alert used to price it at its full size."""
    _, conf = _run(t.KEEP_WARM)
    states = {s.task_id: "success" for s in t.provisioning()}
    states.update({t.VALIDATE: "success", t.DELETE_RAYCLUSTER: "success", t.DELETE_KUBE_OBJECTS: "running"})
    results = {t.DELETE_RAYCLUSTER: {"action": outcomes.DELETED}}
    if scaled:
        states[t.SCALE_POOL] = "success"
        results[t.SCALE_POOL] = {"action": outcomes.SCALED_TO_ZERO}
    tasks = {k: TaskState(k, v, NOW - 60, NOW - 30) for k, v in states.items()}
    view = build_view(ViewInputs("d", "r", "running", NOW, tasks, results=results, conf=conf))
    (row,) = [r for r in view["running"] if r["task_id"] == t.NODE_POOL]
    facts = LiveFacts(states=states, conf=conf, actions={k: v["action"] for k, v in results.items()})
    (pool,) = deadline_alert("d", "r", facts=facts, url="u").still_running
    assert pool.usd_per_hour == row["usd_per_hour"]
    assert (pool.state == outcomes.SCALED_TO_ZERO) == scaled == (row["state"] == "kept warm at 0 nodes")


def test_prices_are_written_and_resolved_only_here() -> None:
    """No other module holds a price table or works out a per-GPU-hour price: they call this one."""
    offenders = []
    for path in PLUGINS.rglob("*.py"):
        if path.name == "costs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and "price" in node.name:
                offenders.append(f"{path.name}:{node.lineno}: def {node.name}")
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for target in targets:
                if isinstance(target, ast.Name) and ("PRICE" in target.id or target.id.endswith("_USD")):
                    offenders.append(f"{path.name}:{node.lineno}: {target.id}")
    assert offenders == []


@pytest.mark.parametrize("capacity", ["reservation", "flex_start", "queued", "spot", "on_demand"])
def test_each_capacity_is_priced_at_its_share_of_the_list_price_in_the_report_and_the_view(capacity: str) -> None:
    _, conf = _run(t.KEEP_WARM)
    conf["capacity"] = capacity
    spec = RunSpec.from_conf(conf)
    _, view, report = _view_and_report(t.KEEP_WARM, conf)
    share, source = costs.CAPACITY_PRICE_SHARES[capacity]
    expected = costs.DEFAULT_GPU_HOUR_PRICES_USD["b200"] * share
    assert report.gpu.price_per_gpu_hour_usd == view["cost"]["price_per_gpu_hour_usd"] == pytest.approx(expected)
    assert report.gpu.estimated_cost_usd == pytest.approx(report.gpu.gpu_hours * expected)
    assert source.split(" (")[0] in costs.capacity_price_basis(capacity) and "cloud.google.com" in source
    text = report.to_text()
    if capacity == "reservation":
        assert f"{spec.gpus_per_node} GPUs)" in text  # the report as before
    else:
        assert f"{spec.gpus_per_node} GPUs, {capacity})" in text and f"{share:.2f} x list" in text
    # A conf price may raise the capacity's estimate, never lower it: the USD budget counts at this one price.
    assert costs.gpu_hour_price("b200", expected / 2, capacity) == (pytest.approx(expected), "default")
    assert costs.gpu_hour_price("b200", expected * 2, capacity) == (pytest.approx(expected * 2), "conf")


def test_a_ladder_run_is_priced_as_the_rung_that_served_it_and_the_report_names_each_rung() -> None:
    conf = {**default_conf(), "capacity_ladder": ["reservation:30", "flex_start:120"]}
    spec = RunSpec.from_conf(conf)
    rows = [
        capacity.row("reservation", 30.0, started_at="2026-12-04T10:00:00+00:00",
                     ended_at="2026-12-04T10:00:30.400000+00:00", outcome=capacity.STOCKOUT, message="GCE_STOCKOUT"),
        capacity.row("flex_start", 120.0, started_at="2026-12-04T10:00:41+00:00",
                     ended_at="2026-12-04T10:00:53.250000+00:00", outcome=capacity.SERVED, message="ready"),
    ]  # fmt: skip
    states, results, _ = _finished(t.KEEP_WARM)
    results[t.RAYCLUSTER] = {"action": outcomes.CREATED, "capacity": rows}
    tasks = {k: TaskState(k, v, NOW - 3600, NOW - 3000) for k, v in states.items()}
    view = build_view(ViewInputs("d", "r", "success", NOW, tasks, results=results, conf=conf))
    served = capacity.served_capacity(results[t.RAYCLUSTER])
    timings = [TaskTiming(k, s.state, s.start, s.end) for k, s in tasks.items()]
    inputs = RunInputs(gpu_type=spec.gpu_type, gpus_per_node=spec.gpus_per_node, worker_replicas=spec.worker_replicas,
                       now=NOW, gpu_hour_price_usd=0.0, capacity=served, capacity_rungs=rows)  # fmt: skip
    report = build_report(timings, {k: t.upstream(k) for k in t.STEPS}, inputs)
    flex = costs.gpu_hour_price("b200", 0.0, "flex_start")[0]
    assert served == "flex_start" and flex < costs.gpu_hour_price("b200", 0.0, "reservation")[0]
    assert report.gpu.price_per_gpu_hour_usd == view["cost"]["price_per_gpu_hour_usd"] == flex
    assert view["cost"]["capacity"] == "flex_start"
    assert [(r["capacity"], r["outcome"]) for r in view["cost"]["rungs"]] == [
        ("reservation", "stock-out"),
        ("flex_start", "served"),
    ]
    text = report.to_text()
    assert "rung 1 reservation      stock-out after 30.4 s (waits up to 30 s)" in text
    assert "rung 2 flex_start       served after 12.2 s (waits up to 120 s)" in text
    # Before any rung served (the cluster still waiting), the run is priced as its first rung.
    results[t.RAYCLUSTER] = {"action": outcomes.CREATED, "capacity": rows[:1]}
    waiting = build_view(ViewInputs("d", "r", "running", NOW, tasks, results=results, conf=conf))
    assert waiting["cost"]["capacity"] == "reservation"


def test_flex_start_nodes_bound_the_runs_hours_so_training_saves_before_they_go() -> None:
    conf = {**default_conf(), "capacity": "flex_start", "flex_start_max_hours": 20}
    # A deployment with no hours or USD limit of its own (its defaults are 24 h and 5,000 USD).
    unbounded = Deployment(max_run_hours=0, max_run_usd=0)
    assert run_budget(RunSpec.from_conf(conf), unbounded).hours == 20
    # A lower limit still wins; without one set, GKE's 7 days is the bound; other capacities have none.
    assert run_budget(RunSpec.from_conf({**conf, "max_run_hours": 5}), unbounded).hours == 5
    assert run_budget(RunSpec.from_conf({**conf, "flex_start_max_hours": 0}), unbounded).hours == 168
    assert run_budget(RunSpec.from_conf({**default_conf(), "capacity": "spot"}), unbounded).hours is None


def test_every_capacity_has_a_price_share_and_no_other_is_priced() -> None:
    # costs.py stays free of conf_schema's import (the API server imports it): its keys are checked here instead.
    assert set(costs.CAPACITY_PRICE_SHARES) == set(CAPACITIES)
