"""The run report: stage durations, the critical path, GPU node-hours and cost, training result and teardown.

The last task of every DAG run collects its task instances (:class:`TaskTiming`), the DAG's dependencies and a few
run facts (:class:`RunInputs`) and calls :func:`build_report`; this module only computes and renders, so it is pure,
stdlib-only and cheap to import (the DAG file imports it while Airflow parses DAGs).

What is measured:

* **Stages.** A task's stage is its step's stage in :mod:`nemo_rl_gke.run.topology`; a task the topology does not know
  belongs to its task-group prefix, or is its own stage. A stage lasts
  from the first start to the last end of its tasks that ran.
* **Critical path.** The longest chain through the DAG's dependencies, each task weighted by its own duration
  (0 if it did not run): the shortest the run could have been with instant scheduling. The makespan (first start to
  last end) divided by the critical path's total is the *schedule ratio*: 1.0 means the run took exactly its
  dependency bound; above 1 is time spent between tasks (scheduler and executor latency, queueing for worker or pool
  slots, trigger latency of deferred tasks, retry delays: an Airflow task instance keeps only its last try's times).
* **GPU node-hours.** A model, not a bill: the GPU pool's nodes are counted from the end of the node pool step
  until the end of the cluster's teardown step (or until ``now`` if the cluster was kept or not deleted, flagged
  as still running), times ``worker_replicas``. The pool starts empty and autoscales, so this is an upper bound.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.observe.recoveries import recoveries_text
from nemo_rl_gke.run import costs, outcomes, topology
from nemo_rl_gke.run import task_states as ts
from nemo_rl_gke.run.times import epoch_of, shown_or_dash

if TYPE_CHECKING:
    from nemo_rl_gke.run.spec import RunSpec

# What train.wait says about how training ended: shown as sentences, not in the summary's table.
_TRAINING_OUTCOME_KEYS = (
    "converged_at",
    "final_step",
    "stopped_at_budget",
    "stalled",
    "max_steps",
    "recovery_log",
    "deadline_stop",
)
# The training summary's keys in the order they are printed; other keys follow in their own order.
_TRAINING_KEYS = (
    "steps_completed",
    "first_reward",
    "last_reward",
    "best_reward",
    "mean_step_time_s",
    "final_val_accuracy",
    "checkpoints",
    "wandb_url",
)


@dataclass(frozen=True)
class TaskTiming:
    """One task instance of the run: its id (``group.task`` inside a task group), state, times and tries."""

    task_id: str
    state: str
    start: float | None  # epoch seconds; None if the task never started
    end: float | None
    tries: int = 1

    @property
    def ran(self) -> bool:
        """Whether the task has both a start and an end time."""
        return self.start is not None and self.end is not None

    @property
    def duration_s(self) -> float:
        """``end - start`` in seconds, 0 for a task that did not run (clamped at 0 against clock skew)."""
        if self.start is None or self.end is None:
            return 0.0
        return max(0.0, self.end - self.start)


@dataclass(frozen=True, kw_only=True)
class RunInputs:
    """The run facts the report needs besides the task instances (from the run spec and the tasks' XComs)."""

    gpu_type: str
    gpus_per_node: int
    worker_replicas: int
    now: float  # epoch seconds; the end of anything still alive
    gpu_hour_price_usd: float = 0.0  # 0: use costs.DEFAULT_GPU_HOUR_PRICES_USD
    capacity: str = "reservation"  # where the GPU nodes came from: the default price is that capacity's share
    # The capacity ladder's rungs kube.raycluster tried, in order (run/capacity.py rows); () without a ladder.
    capacity_rungs: Sequence[Mapping[str, Any]] = ()
    teardown_policy: str = ""
    training_summary: Mapping[str, Any] | None = None
    checkpoint_uri: str | None = None
    teardown_actions: Mapping[str, str] = field(default_factory=dict)  # task_id -> deleted, absent, kept-...
    # The DAG's earlier checkpoints this run continued (resume=latest), oldest first: run, step, uri, rewards.
    lineage: Sequence[Mapping[str, Any]] = ()
    # Every checkpoint still pending on the run's Lustre instance when teardown kept it: run, step, where, release.
    pending_checkpoints: Sequence[Mapping[str, Any]] = ()
    next_run_at: float | None = None  # epoch seconds of the DAG's next scheduled run (None: not scheduled)
    # When the GPU pool came up (its step's ``ready_at``): where the GPU hours start; None: that step's end.
    pool_ready_at: float | None = None
    # The model out: the Hugging Face export, the evaluation and the publish decision (the steps' results).
    model_out: Mapping[str, Any] | None = None
    # The RunSpec of validate's accepted conf and the steps' return values costs.still_up reads (costs.results_read):
    # what is still up after the run and its price, as the banner and the alerts say it. No spec: it lists nothing.
    spec: RunSpec | None = None
    results: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StageSummary:
    """One stage: its span over the tasks that ran, and how its tasks ended."""

    name: str
    tasks: int
    ran: int  # tasks with a start and an end
    start: float | None
    end: float | None
    duration_s: float | None  # None if no task of the stage ran
    state: str  # the most severe task state: success only if every task succeeded
    states: dict[str, int]  # task count per state
    failed: tuple[str, ...]  # task ids in state failed
    retried: tuple[str, ...]  # task ids that needed more than one try

    def state_text(self) -> str:
        """``success``, ``FAILED: a, b`` or the state counts (``success 3, skipped 1``)."""
        if self.failed:
            return "FAILED: " + ", ".join(self.failed)
        if set(self.states) == {ts.SUCCESS}:
            return ts.SUCCESS
        return ", ".join(f"{state} {count}" for state, count in self.states.items())

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "name": self.name,
            "tasks": self.tasks,
            "ran": self.ran,
            "start": self.start,
            "end": self.end,
            "duration_s": self.duration_s,
            "state": self.state,
            "states": dict(self.states),
            "failed": list(self.failed),
            "retried": list(self.retried),
        }


@dataclass(frozen=True)
class PathStep:
    """One task on the critical path, with its duration and its start relative to the run's first start."""

    task_id: str
    duration_s: float
    start_offset_s: float | None


@dataclass(frozen=True)
class CriticalPath:
    """The longest dependency chain by task duration, first task first."""

    steps: tuple[PathStep, ...]
    total_s: float

    @property
    def task_ids(self) -> list[str]:
        """The path's task ids in order."""
        return [step.task_id for step in self.steps]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "total_s": self.total_s,
            "steps": [
                {"task_id": s.task_id, "duration_s": s.duration_s, "start_offset_s": s.start_offset_s}
                for s in self.steps
            ],
        }


@dataclass(frozen=True)
class GpuUsage:
    """GPU pool node-hours, GPU-hours and the estimated cost (see the module docstring for the model)."""

    gpu_type: str
    gpus_per_node: int
    worker_replicas: int
    came_up: bool  # cluster.node-pool succeeded in this run
    up_at: float | None
    down_at: float | None  # end of teardown.delete-cluster; None if never up or still running
    still_running: bool  # up and not deleted: counted until `now`
    counted_until: float | None  # down_at, or `now` when still running
    hours: float  # wall-clock hours the pool was up
    node_hours: float
    gpu_hours: float
    price_per_gpu_hour_usd: float | None  # None: unknown GPU type and no price in the conf
    price_source: str  # conf, default or unknown
    estimated_cost_usd: float | None
    scaled_to_zero: bool = False  # the cluster was kept warm and its pool taken to 0 nodes by teardown
    nodes_left_up: int = 0  # GPU nodes still up after the run: they bill until the next run (0 is the target)
    next_run_at: float | None = None  # the DAG's next scheduled run (None: no schedule)
    capacity: str = "reservation"  # where the nodes came from (reservation, flex_start, queued, spot, on_demand)
    rungs: tuple[Mapping[str, Any], ...] = ()  # the capacity ladder's rungs tried
    adopted: bool = False  # the pool was someone else's (costs.ADOPTED_RULE): counted while used, never left up

    @property
    def hours_to_next_run(self) -> float | None:
        """Hours from the end of this run (``now``) to the next scheduled one; None without a schedule."""
        if self.next_run_at is None or self.counted_until is None:
            return None
        return max(0.0, self.next_run_at - self.counted_until) / 3600.0

    @property
    def node_hours_to_next_run(self) -> float | None:
        """GPU node-hours billed between this run and the next scheduled one (the nodes left up, for that long)."""
        hours = self.hours_to_next_run
        return None if hours is None else self.nodes_left_up * hours

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "gpu_type": self.gpu_type,
            "gpus_per_node": self.gpus_per_node,
            "worker_replicas": self.worker_replicas,
            "came_up": self.came_up,
            "up_at": self.up_at,
            "down_at": self.down_at,
            "still_running": self.still_running,
            "counted_until": self.counted_until,
            "hours": self.hours,
            "node_hours": self.node_hours,
            "gpu_hours": self.gpu_hours,
            "price_per_gpu_hour_usd": self.price_per_gpu_hour_usd,
            "price_source": self.price_source,
            "scaled_to_zero": self.scaled_to_zero,
            "adopted": self.adopted,
            "nodes_left_up": self.nodes_left_up,
            "next_run_at": self.next_run_at,
            "node_hours_to_next_run": self.node_hours_to_next_run,
            "estimated_cost_usd": self.estimated_cost_usd,
        }


@dataclass(frozen=True)
class TeardownItem:
    """What one teardown task did with its resource (the action it reported)."""

    task_id: str
    action: str


@dataclass(frozen=True)
class RunReport:
    """The whole run report; :meth:`to_dict` for the XCom, :meth:`to_text` for the task log."""

    stages: tuple[StageSummary, ...]
    critical_path: CriticalPath
    run_start: float | None
    run_end: float | None
    makespan_s: float | None  # last end - first start over all tasks; None if nothing ran
    schedule_ratio: float | None  # makespan / critical path total; None if either is missing or 0
    gpu: GpuUsage
    teardown_policy: str
    training_summary: dict[str, Any] | None
    checkpoint_uri: str | None
    deleted: tuple[TeardownItem, ...]
    absent: tuple[TeardownItem, ...]  # nothing to delete (never created, or deleted by an earlier try)
    kept: tuple[TeardownItem, ...]  # the action is the reason: kept-by-policy, kept-unowned, ...
    lineage: tuple[dict[str, Any], ...] = ()  # earlier checkpoints of this DAG this run continued, oldest first
    pending_checkpoints: tuple[dict[str, Any], ...] = ()  # what keeps the Lustre instance, any run's
    model: dict[str, Any] | None = None  # the model out, with the conversion's and the evaluation's GPU cost
    still_up: tuple[costs.RunningResource, ...] = ()  # costs.still_up: what the run left up, and its price

    def stage(self, name: str) -> StageSummary:
        """The stage called ``name`` (KeyError if the run has no such stage)."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``json.dumps`` works on it; non-finite floats become None)."""
        return _jsonable(
            {
                "stages": [s.to_dict() for s in self.stages],
                "critical_path": self.critical_path.to_dict(),
                "run_start": self.run_start,
                "run_end": self.run_end,
                "makespan_s": self.makespan_s,
                "schedule_ratio": self.schedule_ratio,
                "gpu": self.gpu.to_dict(),
                "teardown_policy": self.teardown_policy,
                "training_summary": self.training_summary,
                "checkpoint_uri": self.checkpoint_uri,
                "teardown": {
                    "deleted": [{"task_id": i.task_id, "action": i.action} for i in self.deleted],
                    "absent": [{"task_id": i.task_id, "action": i.action} for i in self.absent],
                    "kept": [{"task_id": i.task_id, "action": i.action} for i in self.kept],
                },
                "lineage": list(self.lineage),
                "pending_checkpoints": list(self.pending_checkpoints),
                "model": self.model,
                "still_up": {
                    "resources": [r.to_dict() for r in self.still_up],
                    "usd_per_hour": round(costs.total_per_hour(list(self.still_up)), 2),
                },
            }
        )

    def to_text(self) -> str:
        """A fixed-width, multi-section plain-text table for the Airflow task log."""
        lines: list[str] = ["NeMo RL GRPO run report", "=" * 23, ""]
        lines += self._stages_text()
        lines += self._critical_path_text()
        lines += self._gpu_text()
        lines += self._training_text()
        lines += ["Checkpoint", f"  {self.checkpoint_uri or 'none: not exported'}", ""]
        lines += model_text(self.model)
        lines += self._pending_text()
        lines += self._lineage_text()
        lines += self._teardown_text()
        lines += self._still_up_text()
        return "\n".join(lines).rstrip() + "\n"

    def _still_up_text(self) -> list[str]:
        """What the run left up, as the training view's banner shows it: each resource that costs (or has no known
        price) on its own line, the free ones folded into one, and the summed estimate."""
        banner = costs.banner(list(self.still_up))
        lines = [f"Still up ({banner['count']}; {banner['usd_per_hour']:,.2f} USD/h estimated)"]
        if not self.still_up:
            return [*lines, "  nothing", ""]
        for r in banner["costly"]:
            usd = "price unknown" if r["usd_per_hour"] is None else f"{r['usd_per_hour']:,.2f} USD/h"
            lines.append(f"  {r['task_id']:<22} {r['name']}: {r['state']}, {usd} ({r['basis']})")
        if banner["free_line"]:
            lines.append(f"  {banner['free_line']}")
        return [*lines, ""]

    def _offset(self, at: float | None) -> str:
        if at is None or self.run_start is None:
            return "-"
        return f"+{at - self.run_start:.1f}"

    def _stages_text(self) -> list[str]:
        width = max([len("stage"), *(len(s.name) for s in self.stages)])
        lines = [
            f"Stages (run start {shown_or_dash(self.run_start)}; start/end in s from it)",
            f"  {'stage':<{width}}  {'start':>9}  {'end':>9}  {'duration_s':>10}  {'tasks':>5}  state",
        ]
        for s in self.stages:
            duration = "-" if s.duration_s is None else f"{s.duration_s:.1f}"
            state = s.state_text()
            if s.retried:
                state += "; retried: " + ", ".join(s.retried)
            lines.append(
                f"  {s.name:<{width}}  {self._offset(s.start):>9}  {self._offset(s.end):>9}  {duration:>10}  "
                f"{s.tasks:>5}  {state}"
            )
        return [*lines, ""]

    def _critical_path_text(self) -> list[str]:
        steps = self.critical_path.steps
        width = max([len("task"), len("total"), *(len(s.task_id) for s in steps)])
        lines = [
            "Critical path (longest dependency chain, weighted by task duration)",
            f"  {'#':>3}  {'task':<{width}}  {'start':>9}  {'duration_s':>10}",
        ]
        for number, step in enumerate(steps, 1):
            start = "-" if step.start_offset_s is None else f"+{step.start_offset_s:.1f}"
            lines.append(f"  {number:>3}  {step.task_id:<{width}}  {start:>9}  {step.duration_s:>10.1f}")
        lines.append(f"  {'':>3}  {'total':<{width}}  {'':>9}  {self.critical_path.total_s:>10.1f}")
        makespan = "-" if self.makespan_s is None else f"{self.makespan_s:.1f} s"
        if self.schedule_ratio is None:
            ratio = "-"
        else:
            overhead = (self.schedule_ratio - 1.0) * 100.0
            ratio = f"{self.schedule_ratio:.3f} ({overhead:+.1f}% beyond the dependency bound: scheduling/queueing)"
        return [*lines, f"  makespan                {makespan}", f"  makespan / crit. path   {ratio}", ""]

    def _gpu_text(self) -> list[str]:
        g = self.gpu
        # The capacity is named when it is not the reservation (the tutorial's, and the report's form before it).
        where = "" if g.capacity == "reservation" else f", {g.capacity}"
        header = f"GPU usage ({g.gpu_type}, {g.worker_replicas} nodes x {g.gpus_per_node} GPUs{where})"
        if not g.came_up:
            up, down = f"never ({topology.NODE_POOL} did not succeed)", "-"
        else:
            up = f"{shown_or_dash(g.up_at)} (end of {topology.NODE_POOL})"
            if g.still_running:
                down = f"not deleted: counted until now, {shown_or_dash(g.counted_until)}"
            elif g.adopted and g.down_at is None:
                down = f"adopted, not this run's to delete: counted until now, {shown_or_dash(g.counted_until)}"
            elif g.scaled_to_zero:
                scaled = f"pool scaled to 0 nodes by {topology.SCALE_POOL}; the cluster is kept warm"
                down = f"{shown_or_dash(g.down_at)} ({scaled})"
            else:
                down = f"{shown_or_dash(g.down_at)} (end of {topology.deleted_by(topology.NODE_POOL).task_id})"
        if g.price_per_gpu_hour_usd is None:
            price = "unknown (no default for this GPU type; set gpu_hour_price_usd)"
        else:
            source = "conf" if g.price_source == "conf" else "default list-price estimate"
            if g.price_source != "conf" and g.capacity != "reservation":
                source = f"default estimate, {costs.capacity_price_basis(g.capacity)}"
            price = f"{g.price_per_gpu_hour_usd:.2f} ({source})"
        cost = "-" if g.estimated_cost_usd is None else f"{g.estimated_cost_usd:.2f}"
        if g.still_running:
            cost += " (still running!)"
        lines = [
            header,
            f"  nodes up                {up}",
            f"  nodes down              {down}",
            f"  pool hours              {g.hours:.3f}",
            f"  GPU node-hours          {g.node_hours:.3f}",
            f"  GPU-hours               {g.gpu_hours:.2f}",
            f"  price/GPU-h (USD)       {price}",
            f"  estimated cost (USD)    {cost}",
            f"  GPU nodes left up       {g.nodes_left_up} ({g.nodes_left_up:g} GPU node-hours per hour until the "
            "next run)",
        ]
        if g.node_hours_to_next_run is not None:
            lines.append(
                f"  until the next run      {g.node_hours_to_next_run:.3f} GPU node-hours ({g.nodes_left_up} nodes x "
                f"{g.hours_to_next_run:.1f} h to {shown_or_dash(g.next_run_at)})"
            )
        if g.still_running:
            lines.append("  the cluster was kept: its GPU nodes bill until the pool scales to 0 or it is deleted")
        lines += _rung_lines(g.rungs)
        return [*lines, ""]

    def _training_text(self) -> list[str]:
        if self.training_summary is None:
            return ["Training", "  no training ran", ""]
        summary = {k: v for k, v in self.training_summary.items() if k not in _TRAINING_OUTCOME_KEYS}
        keys = [k for k in _TRAINING_KEYS if k in summary]
        keys += [k for k in summary if k not in _TRAINING_KEYS]
        width = max([0, *(len(k) for k in keys)])
        lines = ["Training"]
        converged = self.training_summary.get("converged_at")
        if converged:
            final = self.training_summary.get("final_step")
            lines.append(f"  converged at step {converged}: the job was stopped after saving step {final}")
        if self.training_summary.get("stopped_at_budget"):
            lines.append(f"  {self.budget_stop_text()}; checkpoint step {self.training_summary.get('final_step')}")
        stop = self.training_summary.get("deadline_stop") or {}
        if stop.get("overrun_s"):
            lines.append(f"  ran {float(stop['overrun_s']):.0f}s past {stop.get('what')} to finish its deadline save")
        if stop.get("lost"):
            lost = stop["lost"]
            lines.append(
                f"  lost at the stop: {lost.get('steps')} step(s), {float(lost.get('gpu_hours') or 0):.2f} GPU-hours: "
                f"{lost.get('why')}"
            )
        stalled = self.training_summary.get("stalled")
        if stalled:
            lines.append(f"  {str(stalled).splitlines()[0]}")
        recoveries = self.training_summary.get("recovery_log") or []
        lines += [f"  {line}" for line in recoveries_text(recoveries).splitlines()]
        lines += [f"  {k:<{width}}  {_value_text(summary[k])}" for k in keys]
        return [*lines, ""]

    def budget_stop_text(self) -> str:
        """ "stopped at budget: N of M steps, X USD": the USD the trigger counted at the stop, at the run's one price
        (the report's own estimate, which runs on to teardown, when the stop recorded none)."""
        summary = self.training_summary or {}
        done = int(summary.get("steps_completed") or 0)
        stop = summary.get("deadline_stop") or {}
        usd = stop.get("usd") if stop.get("usd") is not None else self.gpu.estimated_cost_usd
        return budget_stop_text(done, int(summary.get("max_steps") or done), usd, stop.get("limit"))

    def _pending_text(self) -> list[str]:
        """Every checkpoint on the kept Lustre instance that no export has copied, whoever's run made it."""
        if not self.pending_checkpoints:
            return []
        lines = [f"Pending checkpoints on the kept Lustre instance ({len(self.pending_checkpoints)}; each keeps it "
                 "until exported, or released by a later run's conf)"]  # fmt: skip
        for item in self.pending_checkpoints:
            lines.append(f"  run {item.get('run')}, step {item.get('step')}, {item.get('where')}")
            lines.append(f"    release: {item.get('release')}")
        return [*lines, ""]

    def _lineage_text(self) -> list[str]:
        """The checkpoints this run continued, then this run: steps and rewards from the first night to tonight."""
        if not self.lineage:
            return []
        summary = self.training_summary or {}
        tonight = {
            "run": "this run",
            "step": summary.get("final_step") or summary.get("last_step"),
            "first_reward": summary.get("first_reward"),
            "last_reward": summary.get("last_reward"),
            "uri": self.checkpoint_uri,
        }
        lines = ["Lineage (this DAG's checkpoints, oldest first: reward at the start and end of each run)"]
        for item in (*self.lineage, tonight):
            rewards = f"{_reward(item.get('first_reward'))} -> {_reward(item.get('last_reward'))}"
            lines.append(
                f"  step {item.get('step')!s:>6}  reward {rewards}  {item.get('run')}  {item.get('uri') or '-'}"
            )
        return [*lines, ""]

    def _teardown_text(self) -> list[str]:
        lines = [f"Teardown (policy {self.teardown_policy or '-'})"]
        if not (self.deleted or self.absent or self.kept):
            return [*lines, "  no teardown actions recorded", ""]
        items = [*self.deleted, *self.absent, *self.kept]
        width = max(len(i.task_id) for i in items)
        for label, group in (("deleted", self.deleted), ("absent", self.absent), ("kept", self.kept)):
            lines.append(f"  {label}: {len(group)}")
            lines += [f"    {i.task_id:<{width}}  {i.action}" for i in group]
        return [*lines, ""]


def stage_of(task_id: str) -> str:
    """The stage of a task: its step's, else its task-group prefix, else the task id itself."""
    if task_id in topology.STEPS:
        return topology.STEPS[task_id].stage
    group, dot, _ = task_id.partition(".")
    return group if dot else task_id


def summarize_stages(timings: Iterable[TaskTiming]) -> tuple[StageSummary, ...]:
    """Group the task instances by stage and summarise each: span, duration, state counts, failures, retries."""
    by_stage: dict[str, list[TaskTiming]] = {}
    for t in timings:
        by_stage.setdefault(stage_of(t.task_id), []).append(t)
    summaries = []
    for name, tasks in by_stage.items():
        ran = [t for t in tasks if t.ran]
        start = min((t.start for t in ran if t.start is not None), default=None)
        end = max((t.end for t in ran if t.end is not None), default=None)
        states: dict[str, int] = {}
        for t in tasks:
            states[t.state] = states.get(t.state, 0) + 1
        summaries.append(
            StageSummary(
                name=name,
                tasks=len(tasks),
                ran=len(ran),
                start=start,
                end=end,
                duration_s=None if start is None or end is None else max(0.0, end - start),
                state=min(states, key=ts.severity),
                states=dict(sorted(states.items(), key=lambda kv: (ts.severity(kv[0]), kv[0]))),
                failed=tuple(t.task_id for t in tasks if t.state == ts.FAILED),
                retried=tuple(f"{t.task_id} x{t.tries}" for t in tasks if t.tries > 1),
            )
        )
    # Known stages in run order, then the others by when they started (never-started last).
    summaries.sort(
        key=lambda s: (
            topology.STAGES.index(s.name) if s.name in topology.STAGES else len(topology.STAGES),
            math.inf if s.start is None else s.start,
            s.name,
        )
    )
    return tuple(summaries)


def critical_path(timings: Iterable[TaskTiming], upstream: Mapping[str, Sequence[str]]) -> CriticalPath:
    """The longest path through the DAG, each task weighted by its duration (0 if it did not run).

    The graph is every task in ``timings`` or ``upstream``. Ties go to the task earlier in topological order, so
    zero-duration tasks after the path's last real task (e.g. the still-running report task) are not appended.
    Raises ValueError if ``upstream`` has a cycle.
    """
    by_id = {t.task_id: t for t in timings}
    order = _topological_order(set(by_id) | set(upstream) | {u for ups in upstream.values() for u in ups}, upstream)
    if not order:
        return CriticalPath((), 0.0)
    rank = {task_id: i for i, task_id in enumerate(order)}
    weight = {task_id: by_id[task_id].duration_s if task_id in by_id else 0.0 for task_id in order}
    finish: dict[str, float] = {}  # longest path length ending with (and including) the task
    previous: dict[str, str | None] = {}
    for task_id in order:
        ups = list(dict.fromkeys(upstream.get(task_id, ())))
        best = max(ups, key=lambda u: (finish[u], -rank[u]), default=None)
        finish[task_id] = weight[task_id] + (finish[best] if best is not None else 0.0)
        previous[task_id] = best
    last: str | None = max(order, key=lambda t: (finish[t], -rank[t]))
    path: list[str] = []
    while last is not None:
        path.append(last)
        last = previous[last]
    path.reverse()
    run_start = min((t.start for t in by_id.values() if t.start is not None), default=None)
    steps = []
    for task_id in path:
        start = by_id[task_id].start if task_id in by_id else None
        offset = None if start is None or run_start is None else start - run_start
        steps.append(PathStep(task_id, weight[task_id], offset))
    return CriticalPath(tuple(steps), sum(s.duration_s for s in steps))


# How a deadline stop names the limit that set it (run.deadline's kinds).
_STOPPED_AT = {
    "max_run_hours": "budget (max_run_hours)",
    "max_run_usd": "budget (max_run_usd)",
    "capacity_end": "the capacity's end (flex_start_max_hours)",
    "job_timeout_s": "the job timeout (job_timeout_s)",
}


def budget_stop_text(steps_done: int, max_steps: int, usd: float | None, limit: str | None = None) -> str:
    """The run's last word when its deadline stopped it (``usd``: what its GPUs had cost at the stop, at the run's
    one price; None when unpriced; ``limit``: the deadline's kind, None for a plain budget)."""
    spent = "cost unknown" if usd is None else f"{usd:,.2f} USD"
    return f"stopped at {_STOPPED_AT.get(limit or '', 'budget')}: {steps_done} of {max_steps} steps, {spent}"


def _reward(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.4f}"


def model_costs(timings: Iterable[TaskTiming], gpu: GpuUsage, model_out: Mapping[str, Any] | None) -> dict[str, Any]:
    """The model out with what its steps cost: the GPU pool's hours while the conversion and the evaluation ran
    (the conversion uses no GPU, but the pool stays up), at the run's one price, apart from training's."""
    out: dict[str, Any] = dict(model_out or {})
    by_id = {t.task_id: t for t in timings}
    gpus = gpu.gpus_per_node * gpu.worker_replicas
    for key, task_id in (("conversion", topology.CONVERT), ("evaluation", topology.EVALUATE)):
        timing = by_id.get(task_id)
        hours = timing.duration_s / 3600.0 * gpus if timing is not None and timing.ran else 0.0
        price = gpu.price_per_gpu_hour_usd
        out[f"{key}_gpu_hours"] = round(hours, 4)
        out[f"{key}_usd"] = None if price is None else round(hours * price, 2)
    total = gpu.gpu_hours
    spent = out["conversion_gpu_hours"] + out["evaluation_gpu_hours"]
    out["share_of_gpu_hours"] = round(spent / total, 4) if total else None
    return out


def model_text(model: Mapping[str, Any] | None) -> list[str]:
    """The report's Model section: the Hugging Face export, the scores, the decision, and what they cost."""
    if not model or not (model.get("convert") or model.get("evaluate") or model.get("publish")):
        return []
    converted, evaluated, decision = model.get("convert") or {}, model.get("evaluate") or {}, model.get("publish") or {}
    lines = ["Model"]
    hf = decision.get("hf_uri") or converted.get("hf_path")
    lines.append(f"  Hugging Face export    {hf or 'none'}")
    result = evaluated.get("result") or {}
    if result:
        lines.append(
            f"  evaluation             {result.get('dataset')}: score {_score(result.get('score'))} "
            f"({result.get('metric')}@{result.get('k')}, {result.get('num_tests_per_prompt')} sample(s) of "
            f"{result.get('problems')} problems)"
        )
        lines.append(f"  base model             {_score(evaluated.get('baseline'))}")
    if decision:
        lines.append(f"  last published         {_score(decision.get('published'))}")
        lines.append(f"  decision               {decision.get('outcome')}: {decision.get('reason')}")
    for key in ("conversion", "evaluation"):
        usd = model.get(f"{key}_usd")
        shown = "" if usd is None else f", {usd:,.2f} USD"
        lines.append(f"  {key + ' GPU-hours':<22} {model.get(f'{key}_gpu_hours', 0):.3f}{shown}")
    share = model.get("share_of_gpu_hours")
    if share is not None:
        lines.append(f"  share of the run's GPU-hours  {share:.1%}")
    return [*lines, ""]


def _score(value: Any) -> str:
    return "-" if not isinstance(value, int | float) or isinstance(value, bool) else f"{value:.4f}"


def gpu_usage(timings: Iterable[TaskTiming], inputs: RunInputs) -> GpuUsage:
    """GPU pool hours from the end of the node pool step to the end of the cluster's teardown step (or ``now``).

    The pool counts as up only if its step succeeded with an end time. It counts as gone at the end of the cluster's
    teardown step when that task reported ``deleted`` (or ``absent``: an earlier try deleted it);
    any other action, or no action at all, means the cluster is still there: counted until ``inputs.now`` and
    flagged ``still_running``.
    """
    by_id = {t.task_id: t for t in timings}
    price, source = costs.gpu_hour_price(inputs.gpu_type, inputs.gpu_hour_price_usd, inputs.capacity)

    pool = by_id.get(topology.NODE_POOL)
    up_at = pool.end if pool is not None and pool.state == ts.SUCCESS else None
    if up_at is not None and inputs.pool_ready_at is not None:
        up_at = inputs.pool_ready_at  # the moment the budget's USD clock starts too
    down_at: float | None = None
    still_running = scaled_to_zero = False
    adopted = _adopted(inputs.results.get(topology.NODE_POOL))
    if up_at is None:
        counted_until = None
        hours = 0.0
    else:
        ended = {t.task_id: t.end for t in by_id.values() if t.end is not None}
        left = costs.pool_after_teardown(inputs.teardown_actions, ended)
        if left == costs.POOL_GONE:
            down_at = ended[topology.deleted_by(topology.NODE_POOL).task_id]
        elif left == costs.POOL_SCALED_TO_ZERO:
            down_at, scaled_to_zero = ended[topology.SCALE_POOL], True
        else:
            # An adopted pool's hours count while this run used it, never as this run's left up (ADOPTED_RULE).
            still_running = not adopted
        counted_until = down_at if down_at is not None else inputs.now
        hours = max(0.0, counted_until - up_at) / 3600.0
    node_hours = hours * inputs.worker_replicas
    gpu_hours = node_hours * inputs.gpus_per_node
    return GpuUsage(
        gpu_type=inputs.gpu_type,
        gpus_per_node=inputs.gpus_per_node,
        worker_replicas=inputs.worker_replicas,
        came_up=up_at is not None,
        up_at=up_at,
        down_at=down_at,
        still_running=still_running,
        counted_until=counted_until,
        hours=hours,
        node_hours=node_hours,
        gpu_hours=gpu_hours,
        price_per_gpu_hour_usd=price,
        price_source=source,
        capacity=inputs.capacity,
        rungs=tuple(inputs.capacity_rungs),
        estimated_cost_usd=None if price is None else gpu_hours * price,
        scaled_to_zero=scaled_to_zero,
        nodes_left_up=inputs.worker_replicas if still_running else 0,
        adopted=adopted,
        next_run_at=inputs.next_run_at,
    )


def _adopted(result: Any) -> bool:
    return isinstance(result, Mapping) and result.get("action") == outcomes.ADOPTED


def build_report(timings: Iterable[TaskTiming], upstream: Mapping[str, Sequence[str]], inputs: RunInputs) -> RunReport:
    """Compute the run report from the run's task instances, the DAG's direct upstreams and the run facts."""
    timings = list(timings)
    path = critical_path(timings, upstream)
    run_start = min((t.start for t in timings if t.start is not None), default=None)
    run_end = max((t.end for t in timings if t.end is not None), default=None)
    makespan = None if run_start is None or run_end is None else max(0.0, run_end - run_start)
    ratio = makespan / path.total_s if makespan is not None and path.total_s > 0 else None
    gpu = gpu_usage(timings, inputs)
    deleted, absent, kept = [], [], []
    for task_id, action in sorted(inputs.teardown_actions.items()):
        item = TeardownItem(task_id, action)
        if action == outcomes.DELETED:
            deleted.append(item)
        elif action == outcomes.ABSENT:
            absent.append(item)
        elif action in outcomes.KEPT:
            kept.append(item)
        # Anything else changed nothing that stays (the pool scaled to 0 is in the GPU section).
    return RunReport(
        stages=summarize_stages(timings),
        critical_path=path,
        run_start=run_start,
        run_end=run_end,
        makespan_s=makespan,
        schedule_ratio=ratio,
        gpu=gpu,
        teardown_policy=inputs.teardown_policy,
        training_summary=None if inputs.training_summary is None else dict(inputs.training_summary),
        checkpoint_uri=inputs.checkpoint_uri or None,
        deleted=tuple(deleted),
        absent=tuple(absent),
        kept=tuple(kept),
        lineage=tuple(dict(item) for item in inputs.lineage),
        pending_checkpoints=tuple(dict(item) for item in inputs.pending_checkpoints),
        model=model_costs(timings, gpu, inputs.model_out) if inputs.model_out is not None else None,
        still_up=tuple(costs.still_up(inputs.spec, {t.task_id: t.state for t in timings}, inputs.results)),
    )


def _topological_order(nodes: set[str], upstream: Mapping[str, Sequence[str]]) -> list[str]:
    """Kahn's algorithm; ready tasks are taken in name order so the result (and every tie-break) is stable."""
    downstream: dict[str, list[str]] = {n: [] for n in nodes}
    pending = {n: 0 for n in nodes}
    for task_id, ups in upstream.items():
        for u in dict.fromkeys(ups):
            downstream[u].append(task_id)
            pending[task_id] += 1
    ready = [n for n, count in pending.items() if count == 0]
    heapify(ready)
    order: list[str] = []
    while ready:
        n = heappop(ready)
        order.append(n)
        for d in downstream[n]:
            pending[d] -= 1
            if pending[d] == 0:
                heappush(ready, d)
    if len(order) != len(nodes):
        stuck = sorted(n for n, count in pending.items() if count > 0)
        raise ValueError(f"upstream has a cycle through {', '.join(stuck[:5])}")
    return order


def _rung_lines(rungs: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per capacity rung tried: its option, how it ended and after how long (of the wait it had)."""
    lines = []
    for number, rung in enumerate(rungs, 1):
        started, ended = epoch_of(rung.get("started_at")), epoch_of(rung.get("ended_at"))
        took = "-" if started is None or ended is None else f"{max(0.0, ended - started):.1f} s"
        name = f"rung {number} {rung.get('capacity')}"
        lines.append(
            f"  {name:<23} {rung.get('outcome')} after {took} (waits up to {float(rung.get('wait_s', 0)):.0f} s)"
        )
    return lines


def _value_text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_value_text(v) for v in value) or "-"
    if isinstance(value, Mapping):
        return json.dumps(_jsonable(value), sort_keys=True)
    return str(value)


def _jsonable(value: Any) -> Any:
    """Plain JSON types: mappings to dicts, sequences to lists, NaN and infinities to None, others to str."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)
