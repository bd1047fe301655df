"""One home for prices and "what is still up and what it costs": the report, the view and the alerts agree."""

from __future__ import annotations

import ast
from typing import Any

import pytest

from nemo_rl_gke.observe.alert_messages import LiveFacts, deadline_alert, failure_alert
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


def _four_answers(conf: dict, states: dict[str, str], results: dict[str, dict]) -> dict[str, Any]:
    """What is still up and its total, as the Training view's banner, the failure alert, the deadline alert and the
    run report each give it for one run state. The view reads every result; the others only what
    costs.results_read names (what operators/report.py and the deadline callback read), so agreeing proves that is
    enough."""
    tasks = {k: TaskState(k, v, NOW - 3600 + n, NOW - 3000 + n) for n, (k, v) in enumerate(states.items())}
    view = build_view(ViewInputs("d", "r", "running", NOW, tasks, results=results, conf=conf))
    read = {k: results[k] for k in costs.results_read(states) if k in results}
    failed = failure_alert("d", "r", states, conf=conf, results=read, url="u")
    late = deadline_alert("d", "r", facts=LiveFacts(states=states, conf=conf, results=read), url="u")
    spec = RunSpec.from_conf(conf)
    timings = [TaskTiming(k, s.state, s.start, s.end) for k, s in tasks.items()]
    inputs = RunInputs(gpu_type=spec.gpu_type, gpus_per_node=spec.gpus_per_node, worker_replicas=spec.worker_replicas,
                       now=NOW, capacity=spec.capacity, spec=spec, results=read)  # fmt: skip
    report = build_report(timings, {k: t.upstream(k) for k in t.STEPS}, inputs).to_dict()["still_up"]
    return {
        "banner": (view["running"], view["banner"]["usd_per_hour"]),
        "failure alert": ([r.to_dict() for r in failed.still_running], failed.cost_per_hour_usd),
        "deadline alert": ([r.to_dict() for r in late.still_running], late.cost_per_hour_usd),
        "report": (report["resources"], report["usd_per_hour"]),
    }


def _served_by(rung: str) -> dict[str, Any]:
    """kube.raycluster's result of a ladder run whose nodes came from ``rung`` after the reservation's stock-out."""
    at = "2026-12-04T10:00:00+00:00"
    rows = [capacity.row("reservation", 30.0, started_at=at, ended_at=at, outcome=capacity.STOCKOUT, message="-"),
            capacity.row(rung, 60.0, started_at=at, ended_at=at, outcome=capacity.SERVED, message="ready")]  # fmt: skip
    return {"action": outcomes.CREATED, "capacity": rows}


def _in_training() -> tuple[dict[str, str], dict[str, dict]]:
    states = {s.task_id: "success" for s in t.provisioning()}
    states.update({t.VALIDATE: "success", t.SUBMIT: "success", t.WAIT: "deferred"})
    return states, {s: {"action": outcomes.CREATED} for s in states}


def _case(name: str) -> tuple[dict, dict[str, str], dict[str, dict]]:
    """A named run state: its conf, task states and the steps' results."""
    if name in t.POLICIES:
        _, conf = _run(name, price=4.5)
        return (conf, *_finished(name)[:2])
    _, conf = _run(t.KEEP_WARM)
    if name == "in training":
        return (conf, *_in_training())
    if name == "ladder served by flex_start":
        states, results = _in_training()
        return conf, states, {**results, t.RAYCLUSTER: _served_by("flex_start")}
    states, results, _ = _finished(t.DELETE_ALL)
    if name == "kept Lustre, adopted cluster and pool":
        # Someone's warm cluster was adopted (kept-unowned at teardown); the export failed, so Lustre is kept.
        for made, teardown in ((t.GKE_CLUSTER, t.DELETE_CLUSTER), (t.NODE_POOL, None)):
            results[made] = {"action": outcomes.ADOPTED, "name": made}
            if teardown:
                states[teardown], results[teardown] = "skipped", {"action": outcomes.KEPT_UNOWNED}
        states[t.DELETE_LUSTRE], results[t.DELETE_LUSTRE] = "skipped", {"action": outcomes.KEPT_FOR_CHECKPOINT}
        return conf, states, results
    assert name == "failed deletions"
    states[t.DELETE_CLUSTER], states[t.DELETE_GVNIC_SUB] = "failed", "upstream_failed"
    del results[t.DELETE_CLUSTER], results[t.DELETE_GVNIC_SUB]
    return conf, states, results


CASES = [*t.POLICIES, "in training", "ladder served by flex_start", "kept Lustre, adopted cluster and pool",
         "failed deletions"]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_the_banner_both_alerts_and_the_report_list_the_same_resources_at_the_same_total(case: str) -> None:
    conf, states, results = _case(case)
    answers = _four_answers(conf, states, results)
    (listed, total), *others = answers.values()
    assert all(answer == (listed, total) for answer in others), answers
    rows = {r["task_id"]: r for r in listed}
    assert total == round(sum(r["usd_per_hour"] or 0.0 for r in listed), 2)
    spec = RunSpec.from_conf(conf)
    full_pool = costs.hourly_cost(t.NODE_POOL, spec)[0]
    if case == "kept Lustre, adopted cluster and pool":
        # ADOPTED_RULE: someone else's cluster and pool are nobody's line here; the kept Lustre is, at its price.
        assert t.NODE_POOL not in rows and t.GKE_CLUSTER not in rows
        lustre = rows[t.LUSTRE]
        assert lustre["state"] == f"kept ({outcomes.KEPT_FOR_CHECKPOINT})" and lustre["usd_per_hour"] > 0
        assert total == round(rows[t.LUSTRE]["usd_per_hour"], 2)
    elif case == "failed deletions":
        assert rows[t.GKE_CLUSTER]["state"] == costs.DELETION_FAILED and rows[t.NODE_POOL]["usd_per_hour"] > 0
        assert rows[t.GVNIC_SUB]["state"] == costs.NOT_DELETED
    elif case == "ladder served by flex_start":
        # Priced as the rung that served it, on every surface (the banner used to price the conf's first rung).
        flex = costs.hourly_cost(t.NODE_POOL, capacity.on_rung(spec, "flex_start"))[0]
        assert rows[t.NODE_POOL]["usd_per_hour"] == round(flex, 4) and flex < full_pool
    elif case == "in training":
        assert rows[t.NODE_POOL]["state"] == "up" and rows[t.NODE_POOL]["usd_per_hour"] == round(full_pool, 4)
        assert t.NET in rows and rows[t.NET]["usd_per_hour"] == 0.0
    elif t.deletes_under(t.NODE_POOL, case):
        assert t.NODE_POOL not in rows
    elif t.scales_down_under(t.NODE_POOL, case):
        assert rows[t.NODE_POOL]["state"] == "kept warm at 0 nodes" and rows[t.NODE_POOL]["usd_per_hour"] == 0.0
    else:
        assert rows[t.NODE_POOL]["usd_per_hour"] == round(full_pool, 4) > 0


def test_an_adopted_pool_counts_its_hours_in_the_report_but_is_never_left_up_by_this_run() -> None:
    conf, states, results = _case("kept Lustre, adopted cluster and pool")
    tasks = [TaskTiming(k, v, NOW - 3600, NOW - 3000) for k, v in states.items()]
    spec = RunSpec.from_conf(conf)
    actions = {k: v["action"] for k, v in results.items() if t.step(k).is_teardown}
    inputs = RunInputs(gpu_type=spec.gpu_type, gpus_per_node=spec.gpus_per_node, worker_replicas=spec.worker_replicas,
                       now=NOW, spec=spec, results=results, teardown_actions=actions)  # fmt: skip
    report = build_report(tasks, {}, inputs)
    assert report.gpu.adopted and report.gpu.hours > 0 and not report.gpu.still_running
    assert report.gpu.nodes_left_up == 0
    text = report.to_text()
    assert "adopted, not this run's to delete" in text and "still running!" not in text
    assert f"  {t.LUSTRE:<22} {spec.lustre_name}: kept ({outcomes.KEPT_FOR_CHECKPOINT})" in text


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
