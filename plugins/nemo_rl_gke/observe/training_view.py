"""The training view's data: one JSON snapshot of a run, from what Airflow already has.

Inputs are the run's task-instance states and times, its tasks' XComs (the validated conf, the job's submission and
summary, the budget, the export, every teardown action) and the job's step metrics per attempt, from the step store
the RayJobTrigger keeps in ``train.wait``'s XCom (:mod:`nemo_rl_gke.observe.step_store`), so the curves show every
step so far (at most one behind the log), also while the task is deferred. A run followed before the store existed
is read from the ``[ray job] ...`` lines of its task log, parsed by the same
:class:`~nemo_rl_gke.observe.metrics.RunMetrics` the trigger uses. The curves are bounded and sent as what changed
(:mod:`nemo_rl_gke.observe.curves`).

Pure and stdlib-only (the API server builds it on each poll of the page): :mod:`nemo_rl_gke.view_app` reads the
inputs from the metadata DB; this module only computes. Nothing here reads a credential, and the app masks the job's
secrets in the finished snapshot once more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_rl_gke.observe import driver_log
from nemo_rl_gke.observe.curves import CURVES, RunCurves
from nemo_rl_gke.observe.metrics import RunMetrics, StepMetrics
from nemo_rl_gke.observe.recoveries import merge_attempts
from nemo_rl_gke.observe.report import (
    RunInputs,
    TaskTiming,
    budget_stop_text,
    gpu_usage,
    summarize_stages,
)
from nemo_rl_gke.run import capacity, costs, ray_logs, topology
from nemo_rl_gke.run import task_states as ts
from nemo_rl_gke.run.budget import run_budget
from nemo_rl_gke.run.console import gcs_url
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.times import epoch_of, shown

# ETA from the mean of the last steps: early steps (compilation, warm-up) say little about the rest.
ETA_WINDOW = 10
# The XCom train.wait publishes its budget under: {"hours_limit", "usd_limit", "gpu_nodes", "gpu_nodes_limit",
# "stopped_at_budget"}.
BUDGET_XCOM = "budget"
# Where the limits come from when train.wait has not published them: the deployment's settings of these names.
BUDGET_SETTINGS = ("max_run_hours", "max_run_usd", "max_gpu_nodes_per_run")


@dataclass(frozen=True)
class TaskState:
    """One task instance of the run, as the view needs it (epoch seconds)."""

    task_id: str
    state: str
    start: float | None = None
    end: float | None = None
    try_number: int = 0


@dataclass(frozen=True)
class ViewInputs:
    """Everything one snapshot is built from.

    :param results: each task's return-value XCom, by task id.
    :param conf: the conf ``validate`` accepted (its return value), None before it ran or when it refused.
    :param job_summary: ``train.wait``'s summary XCom (set when the job ended).
    :param log_lines: the ``train.wait`` task log's messages, in order (only ``[ray job] `` lines are read): only
        for a run without a step store (followed before it existed).
    :param attempts: the job's metrics per attempt from the step store, oldest first.
    :param budget: ``train.wait``'s budget XCom (:data:`BUDGET_XCOM`), None until it published one.
    :param limits: the deployment's budget settings (:data:`BUDGET_SETTINGS`) that exist, for a run without a
        published budget.
    :param recoveries: ``train.wait``'s recoveries XCom (one record per node-loss recovery, with ``resumed_from``).
    :param history: ``checkpoint.publish``'s results of this DAG's runs (``run_id`` added), oldest first.
    """

    dag_id: str
    run_id: str
    run_state: str
    now: float
    tasks: Mapping[str, TaskState]
    results: Mapping[str, Any] = field(default_factory=dict)
    conf: Mapping[str, Any] | None = None
    job_summary: Mapping[str, Any] | None = None
    log_lines: Sequence[str] = ()
    budget: Mapping[str, Any] | None = None
    limits: Mapping[str, Any] = field(default_factory=dict)
    recoveries: Sequence[Mapping[str, Any]] = ()
    # This DAG's runs' publish results, oldest first, each with its run_id: the score night by night.
    history: Sequence[Mapping[str, Any]] = ()
    # The job's attempts from the step store (observe/step_store.py), oldest first; empty: read ``log_lines``.
    attempts: Sequence[RunMetrics] = ()


def parse_attempts(
    lines: Iterable[str], recoveries: Sequence[Mapping[str, Any]] = ()
) -> tuple[RunMetrics, list[dict[str, Any]]]:
    """The job's metrics so far across its attempts, from the task log's ``[ray job] `` lines (other lines are
    Airflow's own), and where each attempt after the first starts.

    Each attempt's driver-log lines follow the trigger's ``Following Ray job <id>`` line; a new id starts the next
    attempt, the same id again is a restarted trigger that logs that job's log again from its start, or, with
    ``from log character N``, goes on where the one before stopped. Every attempt
    after a recovery trains again the steps after the save it resumed from (``resumed_from`` in ``recoveries``):
    those rows of the attempt before are dropped, so each step is one point.
    The marks are ``{"attempt", "at", "resumed_from", "rule"}``, ``at`` the curves' x of the attempt's first step.
    """
    attempts, current = [RunMetrics()], None
    for line in lines:
        if not isinstance(line, str):
            continue
        text = driver_log.driver_text(line)
        if text is not None:
            attempts[-1].parse_line(text)
        elif (marker := driver_log.followed(line)) is not None:
            submission, resumed = marker
            if submission == current and resumed:
                continue  # a restarted triggerer's trigger goes on where the one before stopped
            if submission == current:
                # A restarted triggerer's trigger logs the same job's log again from its start: read it once.
                attempts[-1] = RunMetrics()
            elif current is not None:
                attempts.append(RunMetrics())
            current = submission
    return merge_attempt_metrics(attempts, recoveries)


def merge_attempt_metrics(
    attempts: Sequence[RunMetrics], recoveries: Sequence[Mapping[str, Any]] = ()
) -> tuple[RunMetrics, list[dict[str, Any]]]:
    """The job's metrics across its attempts (oldest first: from the step store, or parsed from the task log) and
    the marks where each attempt after the first starts (:func:`parse_attempts`)."""
    attempts = list(attempts) or [RunMetrics()]
    if len(attempts) == 1:
        return attempts[0], []
    records = {r.get("attempt"): r for r in recoveries if isinstance(r, Mapping)}
    cuts = [_int_or_none((records.get(i) or {}).get("resumed_from")) for i in range(1, len(attempts))]
    rows = merge_attempts([a.steps for a in attempts], cuts)
    # The last attempt's own state (its W&B run, its step in progress) with the merged steps before it.
    merged = attempts[-1]
    running = [s for s in merged.steps if not s.completed]
    saves = {c for a, cut in zip(attempts, cuts, strict=False) for c in a.checkpoints if cut is not None and c <= cut}
    merged.checkpoints = sorted(saves | set(merged.checkpoints))
    merged.wandb_url = merged.wandb_url or next((a.wandb_url for a in attempts if a.wandb_url), None)
    merged.steps = [StepMetrics.from_dict(row) for row in rows] + running
    marks = []
    for attempt in range(1, len(attempts)):
        before = sum(1 for row in rows if row["attempt"] < attempt)
        record = records.get(attempt) or {}
        marks.append({"attempt": attempt, "at": before + 1, "resumed_from": cuts[attempt - 1],
                      "rule": record.get("rule")})  # fmt: skip
    return merged, marks


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _round(value: float | None, digits: int = 4) -> float | None:
    if value is None or math.isnan(value):  # JSON has no NaN, and a curve cannot draw it
        return None
    return round(float(value), digits)


def progress(
    metrics: RunMetrics, wait: TaskState | None, now: float, max_steps: int | None = None, resumed_from: int = 0
) -> dict[str, Any]:
    """Step N of M (the run's own count, across NeMo RL's epochs, whose ``Step k/K`` restarts each epoch), the mean
    step time of the last steps and the ETA they give. ``max_steps`` is the step the job trains to and
    ``resumed_from`` the step it started at (a continued lineage); without ``max_steps``, the header's ``K``."""
    done = metrics.completed_steps
    current = metrics.current
    finished = resumed_from + len(done)
    total = max_steps if max_steps else (current.total_steps if current else None)
    recent = [s.total_step_time_s for s in done[-ETA_WINDOW:] if s.total_step_time_s is not None]
    mean = sum(recent) / len(recent) if recent else None
    running = wait is not None and wait.state not in ts.ENDED
    remaining = max(0, total - finished) if total else None
    eta = mean * remaining if running and mean is not None and remaining is not None else None
    in_flight = current is not None and not current.completed
    step = (finished + 1 if in_flight else finished) if max_steps else (current.step if current else None)
    return {
        "state": wait.state if wait else "none",
        "step": step if current else None,
        "total_steps": total,
        "completed": finished,
        "epoch": current.epoch if current else None,
        "percent": _round(min(100.0, 100.0 * finished / total), 1) if total else None,
        "mean_step_time_s": _round(mean, 2),
        "eta_s": _round(eta, 0),
        "eta_at": shown(now + eta) if eta is not None else None,
        "running_for_s": _round(now - wait.start, 0) if running and wait and wait.start else None,
    }


def stages(tasks: Mapping[str, TaskState], now: float) -> list[dict[str, Any]]:
    """The stage timeline: each stage's span (a running task counts until now), state and task counts."""
    timings = [
        TaskTiming(t.task_id, t.state, t.start, t.end if t.end is not None or t.start is None else now)
        for t in tasks.values()
    ]
    run_start = min((t.start for t in tasks.values() if t.start is not None), default=None)
    out = []
    for summary in summarize_stages(timings):
        out.append(
            {
                "name": summary.name,
                "state": summary.state,
                "states": summary.states,
                "tasks": summary.tasks,
                "start": shown(summary.start),
                "end": shown(summary.end),
                "offset_s": _round(summary.start - run_start, 1) if summary.start and run_start else None,
                "duration_s": _round(summary.duration_s, 1),
            }
        )
    return out


def checkpoints(spec_conf: Mapping[str, Any] | None, metrics: RunMetrics, exported: Any) -> list[dict[str, Any]]:
    """Each checkpoint the job saved: its step, its directory on Lustre and, once exported, its gs:// URI."""
    steps = list(dict.fromkeys(metrics.checkpoints))
    export = exported if isinstance(exported, Mapping) else {}
    if export.get("step") is not None and export["step"] not in steps:
        steps.append(export["step"])
    base = str((spec_conf or {}).get("checkpoint_dir") or "").rstrip("/")
    return [
        {
            "step": step,
            "lustre": f"{base}/step_{step}" if base else None,
            "exported": export.get("uri") if export.get("step") == step else None,
        }
        for step in steps
    ]


def pending_checkpoints(kept: Any) -> list[dict[str, Any]]:
    """Every checkpoint pending on the run's Lustre instance when its teardown kept it (any run's), with the conf
    that releases it; empty while teardown has not decided, or when nothing is pending."""
    rows = kept.get("pending") if isinstance(kept, Mapping) else None
    if not isinstance(rows, list):
        return []
    keys = ("run", "step", "where", "release")
    return [{k: row.get(k) for k in keys} for row in rows if isinstance(row, Mapping)]


def ray_logs_view(deleted: Any) -> dict[str, Any] | None:
    """Where teardown copied the run's Ray logs before it deleted the RayCluster: the gs:// URI, its console page and
    the figures (or why nothing was copied); None until teardown got there, or when the policy kept the RayCluster."""
    summary = ray_logs.summary_of(deleted)
    if summary is None:
        return None
    copied = bool(summary.get("files"))
    uri = str(summary.get("uri") or "")
    return {
        "uri": uri if copied else None,
        "console_url": gcs_url(uri) if copied else None,
        "text": ray_logs.describe(summary),
        "files": summary.get("files"),
        "truncated": summary.get("truncated"),
        "error": summary.get("error") or None,
    }


def _teardown_actions(results: Mapping[str, Any]) -> dict[str, str]:
    actions = {}
    for step in topology.teardown_steps():
        result = results.get(step.task_id)
        if isinstance(result, Mapping) and result.get("action"):
            actions[step.task_id] = str(result["action"])
    return actions


def cost(spec: Any, tasks: Mapping[str, TaskState], results: Mapping[str, Any], now: float) -> dict[str, Any]:
    """GPU node-hours and their estimated cost so far (the run report's model, counted until now), priced as the
    capacity that served the run (a ladder's served rung; until one has, the first)."""
    timings = [TaskTiming(t.task_id, t.state, t.start, t.end) for t in tasks.values()]
    raycluster = results.get(topology.RAYCLUSTER)
    served = capacity.served_capacity(raycluster) or spec.capacity
    rungs = raycluster.get("capacity") if isinstance(raycluster, Mapping) else None
    usage = gpu_usage(
        timings,
        RunInputs(
            gpu_type=spec.gpu_type,
            gpus_per_node=spec.gpus_per_node,
            worker_replicas=spec.worker_replicas,
            now=now,
            gpu_hour_price_usd=spec.gpu_hour_price_usd,
            capacity=served,
            teardown_policy=spec.teardown_policy,
            teardown_actions=_teardown_actions(results),
            pool_ready_at=epoch_of(_ready_at(results.get(topology.NODE_POOL))),
            results=results,
        ),
    )
    return {
        "gpu_type": usage.gpu_type,
        "gpu_node_hours": _round(usage.node_hours, 3),
        "gpu_hours": _round(usage.gpu_hours, 3),
        "price_per_gpu_hour_usd": usage.price_per_gpu_hour_usd,
        "price_source": usage.price_source,
        "estimated_cost_usd": _round(usage.estimated_cost_usd, 2),
        "pool_hours": _round(usage.hours, 4),
        "pool_up": usage.came_up,
        "pool_still_running": usage.still_running,
        "capacity": served,
        "rungs": [
            {k: row.get(k) for k in ("capacity", "outcome", "started_at", "ended_at")}
            for row in rungs or []
            if isinstance(row, Mapping)
        ],
    }


def _ready_at(result: Any) -> str | None:
    """An ensure step's ``ready_at`` (None: not recorded)."""
    found = result.get("ready_at") if isinstance(result, Mapping) else None
    return found if isinstance(found, str) else None


def _limit(*candidates: Any) -> float | None:
    """The tightest positive limit among ``candidates`` (None, 0 and non-numbers mean "no limit")."""
    found = [float(c) for c in candidates if isinstance(c, int | float) and not isinstance(c, bool) and c > 0]
    return min(found) if found else None


def _line(used: float | None, limit: float | None, digits: int) -> dict[str, Any]:
    left = None if limit is None or used is None else max(0.0, limit - used)
    return {
        "used": _round(used, digits),
        "limit": _round(limit, digits),
        "left": _round(left, digits),
        "percent": _round(min(100.0, 100.0 * used / limit), 1) if limit and used is not None else None,
        "over": bool(limit is not None and used is not None and used >= limit),
    }


def budget(
    published: Mapping[str, Any] | None,
    spec: Any,
    limits: Mapping[str, Any],
    spent: Mapping[str, Any],
    progress_now: Mapping[str, Any],
) -> dict[str, Any]:
    """The budget used and left, in hours, USD and GPU nodes.

    The limits are the ones train.wait published (``published``); before it did, the run's budget under the
    deployment's settings (``limits``) as :func:`~nemo_rl_gke.run.budget.run_budget` computes it; a limit nobody set
    is None ("no limit set"). Hours and USD used are the cost-so-far model's: the hours the GPU pool has been up, and
    its cost.
    """
    if published:
        hours_limit, usd_limit = _limit(published.get("hours_limit")), _limit(published.get("usd_limit"))
        nodes_limit = _limit(published.get("gpu_nodes_limit"))
        nodes = published.get("gpu_nodes")
        source = topology.WAIT
    else:
        planned = run_budget(
            spec, Deployment(**{k: limits[k] for k in ("max_run_hours", "max_run_usd") if k in limits})
        )
        hours_limit, usd_limit = _limit(planned.hours), _limit(planned.usd)
        nodes_limit = _limit(limits.get("max_gpu_nodes_per_run"))
        nodes = None
        source = "settings" if any(x is not None for x in (hours_limit, usd_limit, nodes_limit)) else "none"
    nodes = int(nodes) if isinstance(nodes, int | float) and not isinstance(nodes, bool) else spec.worker_replicas
    usd = spent.get("estimated_cost_usd")
    stopped = bool((published or {}).get("stopped_at_budget"))
    gpu = _line(float(nodes), nodes_limit, 0)
    out = {
        "source": source,
        "hours": _line(spent.get("pool_hours") or 0.0, hours_limit, 3),
        "usd": _line(usd, usd_limit, 2),
        "gpu_nodes": {**gpu, **{k: None if gpu[k] is None else int(gpu[k]) for k in ("used", "limit", "left")}},
        "stopped_at_budget": stopped,
        "stopped_line": None,
    }
    if stopped:
        stop = (published or {}).get("stop") or {}
        spent = stop.get("usd") if stop.get("usd") is not None else usd
        done = int(progress_now.get("completed") or 0)
        total = int(progress_now.get("total_steps") or done)
        out["stopped_line"] = budget_stop_text(done, total, spent, stop.get("limit"))
        lost = stop.get("lost")
        if lost:
            gpu_hours = float(lost.get("gpu_hours") or 0)
            out["stopped_line"] += f"; lost {lost.get('steps')} step(s), {gpu_hours:.2f} GPU-hours"
    return out


def build_view(inputs: ViewInputs, curves: RunCurves | None = None, since: str = "") -> dict[str, Any]:
    """The snapshot the page draws: stages, progress, curves, cost and budget, checkpoints and what is still running
    (``banner``: the costly resources one by one, the free ones folded into one line).

    ``curves``: the run's curves kept from its last poll (:class:`~nemo_rl_gke.observe.curves.RunCurves`; a new one
    when None); ``since``: the token the page got with the curves it holds, so only what changed is sent
    (``series_window``)."""
    if inputs.attempts:
        metrics, attempts = merge_attempt_metrics(inputs.attempts, inputs.recoveries)
    else:
        # A run followed before the step store: its task log's lines.
        metrics, attempts = parse_attempts(inputs.log_lines, inputs.recoveries)
    curves = curves if curves is not None else RunCurves()
    completed, tentative = curves.update(metrics, (len(attempts) + 1, tuple(m.get("at") for m in attempts)))
    series, window = curves.window(completed, tentative, since)
    if not metrics.steps and inputs.job_summary:
        metrics.checkpoints = list(inputs.job_summary.get("checkpoints") or [])
    wait = inputs.tasks.get(topology.WAIT)
    view: dict[str, Any] = {
        "dag_id": inputs.dag_id,
        "run_id": inputs.run_id,
        "run_state": inputs.run_state,
        "generated_at": shown(inputs.now),
        "stages": stages(inputs.tasks, inputs.now),
        "progress": progress(metrics, wait, inputs.now, *_step_range(inputs)),
        "series": series,
        "series_window": {"from": window["from"], "token": window["token"]},
        "attempts": attempts,
        "curves": [{"key": key, "title": title, "unit": unit} for key, title, unit in CURVES],
        "wandb_url": metrics.wandb_url or (inputs.job_summary or {}).get("wandb_url"),
        "spec": None,
        "cost": None,
        "budget": None,
        "checkpoints": checkpoints(inputs.conf, metrics, inputs.results.get(topology.EXPORT)),
        "pending_checkpoints": pending_checkpoints(inputs.results.get(topology.DELETE_LUSTRE)),
        "ray_logs": ray_logs_view(inputs.results.get(topology.DELETE_RAYCLUSTER)),
        "running": [],
        "running_usd_per_hour": 0.0,
        "banner": costs.banner([]),
    }
    view["points"] = len(curves.points["reward"]) + len(tentative["reward"])
    view["shown"] = window["shown"]
    if not inputs.conf:
        return view  # validate has not accepted a conf (yet): nothing was created, nothing costs
    spec = RunSpec.from_conf(inputs.conf)
    running = costs.still_up(spec, {t.task_id: t.state for t in inputs.tasks.values()}, inputs.results)
    view["spec"] = {
        "mode": spec.mode,
        "recipe": spec.recipe,
        "gpu": f"{spec.worker_replicas} x {spec.gpu.machine_type} ({spec.gpus_per_node} x {spec.gpu_type})",
        "max_steps": spec.max_steps,
        "teardown_policy": spec.teardown_policy,
        "project": spec.project,
        "zone": spec.zone,
    }
    view["cost"] = cost(spec, inputs.tasks, inputs.results, inputs.now)
    view["running"] = [r.to_dict() for r in running]
    view["running_usd_per_hour"] = _round(costs.total_per_hour(running), 2)
    view["banner"] = costs.banner(running)
    view["budget"] = budget(inputs.budget, spec, inputs.limits, view["cost"], view["progress"])
    view["model"] = model(inputs.results, inputs.history)
    return view


def _step_range(inputs: ViewInputs) -> tuple[int | None, int]:
    """The step the job trains to and the one it started at: the resume step's (a continued lineage), else the
    conf's ``max_steps`` from 0."""
    resume = inputs.results.get(topology.RESUME)
    resume = resume if isinstance(resume, Mapping) else {}
    start = _int_or_none((resume.get("resumed_from") or {}).get("step")) or 0
    target = _int_or_none(resume.get("max_steps")) or _int_or_none((inputs.conf or {}).get("max_steps"))
    return target, start


def model(results: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The model that came out: its Hugging Face export, its score beside the base model's and the last published
    one's, the publish decision, and this DAG's score run by run (None before the export step ran)."""
    converted, evaluated, decided = (
        results.get(step) if isinstance(results.get(step), Mapping) else {}
        for step in (topology.CONVERT, topology.EVALUATE, topology.PUBLISH)
    )
    if not (converted or evaluated or decided or history):
        return None
    result = evaluated.get("result") or {}
    return {
        "hf": decided.get("hf_uri") or converted.get("hf_path"),
        "benchmark": result.get("dataset") or decided.get("benchmark"),
        "metric": f"{result.get('metric')}@{result.get('k')}" if result else None,
        "problems": result.get("problems"),
        "score": _round(evaluated.get("score"), 4),
        "baseline": _round(evaluated.get("baseline"), 4),
        "published": _round(decided.get("published"), 4),
        "decision": decided.get("outcome"),
        "reason": decided.get("reason"),
        "history": [
            {"run_id": h.get("run_id"), "score": _round(h.get("score"), 4), "outcome": h.get("outcome")}
            for h in history
            if isinstance(h.get("score"), int | float)
        ],
    }
