"""What a run alert says: the failed, refused, budget and deadline messages (headline, text, JSON payload), built
from the run's task states, its training summary and what is still up and what it costs (the one answer,
:func:`nemo_rl_gke.run.costs.still_up`, that the training view's banner and the run report read too). Pure: sending
them is :mod:`nemo_rl_gke.alerts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from nemo_rl_gke.observe.report import budget_stop_text, stage_of
from nemo_rl_gke.run import costs, ray_logs, topology
from nemo_rl_gke.run import publish as publishing
from nemo_rl_gke.run import task_states as ts
from nemo_rl_gke.run.console import gcs_url
from nemo_rl_gke.run.costs import RunningResource
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.times import shown_value

if TYPE_CHECKING:
    from nemo_rl_gke.observe.report import RunReport

FAILED = "failed"
REFUSED = "refused"
DEADLINE = "deadline"
# A run its budget stopped: it succeeded with an earlier checkpoint than asked for, which someone should know.
BUDGET = "budget"
# A run that succeeded but whose model scored too low to be published: exported, not the lineage's model.
NOT_PROMOTED = publishing.NOT_PROMOTED

# Airflow's own fallback when [api] base_url is unset (RuntimeTaskInstance.log_url).
DEFAULT_BASE_URL = "http://localhost:8080/"
RUNNING_NAMES = 3  # the text names this many resources per state (the payload lists them all)


@dataclass(frozen=True)
class FailedTask:
    """A task whose final try failed, with the first line of its error ('' when none was recorded)."""

    task_id: str
    error: str = ""


@dataclass(frozen=True)
class Alert:
    """One alert: what happened to which run, the reward so far, what is still up and its cost, and the link."""

    kind: str  # failed, refused, deadline or budget
    dag_id: str
    run_id: str
    url: str
    failed: tuple[FailedTask, ...] = ()
    upstream_failed: int = 0
    reward: Mapping[str, Any] | None = None  # the train.wait summary (None: no training ran)
    still_running: tuple[RunningResource, ...] = ()  # costs.still_up's list, in its order
    stage: str | None = None  # deadline alerts: where the run is
    active: tuple[str, ...] = ()  # deadline alerts: the tasks running now
    deadline: str | None = None  # deadline alerts: when it passed (ISO 8601)
    deadline_hours: float | None = None
    readable: bool = True  # False: what is still up is unknown (the run's tasks or its conf could not be read)
    notes: tuple[str, ...] = field(default=())
    outcome: str = ""  # budget alerts: "stopped at budget: N of M steps, X USD"
    # Where teardown copied the Ray session logs (teardown.delete-raycluster's summary; None: no copy was tried).
    ray_logs: Mapping[str, Any] | None = None

    @property
    def cost_per_hour_usd(self) -> float | None:
        """The estimated USD per hour of what is still up, as the banner sums it (unpriced items count 0); None when
        the run could not be read."""
        return round(costs.total_per_hour(list(self.still_running)), 2) if self.readable else None

    def headline(self) -> str:
        """One line: which run, and what happened."""
        run = f"[{self.dag_id}] run {self.run_id}"
        if self.kind == DEADLINE:
            hours = f", {self.deadline_hours:g} h after it was queued" if self.deadline_hours else ""
            return f"{run} is not done by its deadline ({self.deadline or 'time unknown'}{hours})"
        if self.kind == REFUSED:
            return f"{run} failed: its conf was refused, nothing was created"
        if self.kind in (BUDGET, NOT_PROMOTED):
            return f"{run} {self.outcome}"
        return f"{run} failed"

    def text(self) -> str:
        """The message for people: a few short lines."""
        lines = [self.headline()]
        if self.kind == DEADLINE:
            active = f" (running: {', '.join(self.active)})" if self.active else ""
            lines.append(f"Stage: {self.stage or 'unknown'}{active}")
        if self.failed or self.upstream_failed:
            parts = [f"{f.task_id}: {f.error}" if f.error else f.task_id for f in self.failed]
            if self.upstream_failed:
                parts.append(f"{self.upstream_failed} task(s) upstream_failed")
            lines.append("Failed: " + "; ".join(parts))
        if self.kind == REFUSED:
            pass
        elif self.kind == DEADLINE and not self.readable:
            lines.append("Reward so far, still running: unknown (the run's tasks could not be read from here)")
        else:
            lines.append("Reward so far: " + self._reward_text())
            running = self._running_text() if self.readable else "unknown (no accepted conf to read it by)"
            lines.append("Still running: " + running)
        lines += list(self.notes)
        if self.ray_logs:
            lines.append(ray_logs_line(self.ray_logs))
        lines.append(f"Run: {self.url}")
        return "\n".join(lines)

    def _reward_text(self) -> str:
        if self.reward is None and self.kind == DEADLINE:
            if topology.WAIT in self.active:
                return "training in progress (the train.wait log shows every step; figures here when it ends)"
            return "no training yet"
        return reward_text(self.reward)

    def _running_by_state(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for r in self.still_running:
            groups.setdefault(r.state, []).append(r.task_id)
        return groups

    def _running_text(self) -> str:
        """What costs (or has no known price) one by one, as the banner's rows; the free rest named per state (a few
        task ids, then a count); the banner's total: a short line."""
        if not self.still_running:
            return "nothing"
        parts = []
        groups: dict[str, list[str]] = {}
        for r in self.still_running:
            if r.usd_per_hour is None:
                parts.append(f"{r.task_id}: {r.state}, price unknown")
            elif r.usd_per_hour:
                parts.append(f"{r.task_id}: {r.state}, ~${r.usd_per_hour:,.2f}/h")
            else:
                groups.setdefault(r.state, []).append(r.task_id)
        for state, names in groups.items():
            more = f" and {len(names) - RUNNING_NAMES} more" if len(names) > RUNNING_NAMES else ""
            parts.append(f"{state}: {', '.join(names[:RUNNING_NAMES])}{more}")
        return "; ".join(parts) + f". Total: ~${self.cost_per_hour_usd or 0.0:,.2f}/h estimated"

    def payload(self) -> dict[str, Any]:
        """The JSON body a webhook gets: the text, and the same facts as fields."""
        return {
            "text": self.text(),
            "kind": self.kind,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "url": self.url,
            "failed": [{"task_id": f.task_id, "error": f.error} for f in self.failed],
            "upstream_failed": self.upstream_failed,
            "reward": _reward_fields(self.reward),
            # Task ids by state, costly ones first; null (not {}) when a deadline alert could not read the run.
            "still_running": self._running_by_state() if self.readable else None,
            # The same resources with their names and prices, as the training view's banner has them.
            "resources": [r.to_dict() for r in self.still_running] if self.readable else None,
            "cost_per_hour_usd": self.cost_per_hour_usd,
            "stage": self.stage,
            "deadline": self.deadline,
            "ray_logs": ray_logs_fields(self.ray_logs),
        }


def ray_logs_line(summary: Mapping[str, Any]) -> str:
    """The alert's line on the Ray logs: where teardown copied them (gs:// and the console page), or why it did not."""
    said = ray_logs.describe(summary)
    console = gcs_url(str(summary.get("uri") or "")) if summary.get("files") else ""
    return f"Ray logs: {said}" + (f" {console}" if console else "")


def ray_logs_fields(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The payload's ``ray_logs``: the archive's gs:// URI, its index, its console page and its figures."""
    if not summary:
        return None
    copied = bool(summary.get("files"))
    keys = ("index", "files", "bytes", "truncated", "skipped", "errors", "error")
    return {
        "uri": summary.get("uri") if copied else None,
        "console_url": gcs_url(str(summary.get("uri") or "")) if copied else None,
        **{k: summary.get(k) for k in keys},
    }


def _reward_fields(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not summary:
        return None
    return {
        "steps": summary.get("steps_completed"),
        "first": summary.get("first_reward"),
        "last": summary.get("last_reward"),
        "best": summary.get("best_reward"),
        "best_step": summary.get("best_reward_step"),
    }


def reward_text(summary: Mapping[str, Any] | None) -> str:
    """The reward so far in words: steps, first, last and best average reward."""
    if summary is None:
        return "no training ran"
    fields = _reward_fields(summary) or {}
    if not fields.get("steps"):
        return "no training step completed"
    figures = [f"{k} {fields[k]:.4f}" for k in ("first", "last", "best") if isinstance(fields.get(k), (int, float))]
    if figures and fields.get("best_step") is not None:
        figures[-1] += f" (step {fields['best_step']})"
    return f"{fields['steps']} step(s), avg reward " + (", ".join(figures) or "not logged")


def run_url(dag_id: str, run_id: str, base_url: str | None = None) -> str:
    """The run in the Airflow UI: ``[api] base_url`` + ``/dags/<dag_id>/runs/<run_id>`` (as Airflow's log links)."""
    if base_url is None:
        from airflow.configuration import conf

        base_url = conf.get("api", "base_url", fallback=None) or DEFAULT_BASE_URL
    return f"{base_url.rstrip('/')}/dags/{quote(dag_id)}/runs/{quote(run_id)}"


def run_failed(states: Mapping[str, str]) -> bool:
    """Whether a task of the run (other than the report) ended failed or upstream_failed: teardown failures count,
    since what they should have deleted may still bill."""
    return any(state in ts.FAILED_STATES for task_id, state in states.items() if task_id != topology.RUN_REPORT)


def _spec(conf: Mapping[str, Any] | None) -> RunSpec | None:
    """The RunSpec of validate's accepted conf (None: there is none)."""
    return RunSpec.from_conf(dict(conf)) if conf else None


def _failed(states: Mapping[str, str], errors: Mapping[str, str]) -> tuple[tuple[FailedTask, ...], int]:
    failed = tuple(
        FailedTask(task_id, errors.get(task_id, "")) for task_id in _in_order(states) if states[task_id] == ts.FAILED
    )
    return failed, sum(1 for state in states.values() if state == ts.UPSTREAM_FAILED)


def _in_order(states: Mapping[str, str]) -> list[str]:
    """Task ids in topology order (unknown ones last, by name)."""
    order = {task_id: i for i, task_id in enumerate(topology.STEPS)}
    return sorted(states, key=lambda t: (order.get(t, len(order)), t))


def failure_alert(
    dag_id: str,
    run_id: str,
    states: Mapping[str, str],
    *,
    errors: Mapping[str, str] | None = None,
    training: Mapping[str, Any] | None = None,
    report: RunReport | None = None,
    url: str | None = None,
    publish: Mapping[str, Any] | None = None,
    ray_logs: Mapping[str, Any] | None = None,
    conf: Mapping[str, Any] | None = None,
    results: Mapping[str, Any] | None = None,
) -> Alert:
    """The alert of a failed run, from its task states, the recorded errors, the training summary and the report; or
    of a run its budget stopped (nothing failed): a budget alert. A stalled job's message is a line of its own;
    ``ray_logs`` (teardown's copy of the Ray logs) a link of its own. What is still up is :func:`costs.still_up` of
    validate's accepted ``conf``, the states and the steps' return values ``results``."""
    failed, upstream = _failed(states, errors or {})
    stalled = str((training or {}).get("stalled") or "")
    budget = bool((training or {}).get("stopped_at_budget"))
    outcome = ""
    if budget:
        outcome = _budget_text(training or {}, None if report is None else report.gpu.estimated_cost_usd)
    notes = [stalled.splitlines()[0]] if stalled else []
    if budget and (failed or upstream):
        notes.append(outcome)
    lost = ((training or {}).get("deadline_stop") or {}).get("lost")
    if lost:
        # A stop that threw training away says what and why, whatever else the run did.
        notes.append(
            f"Lost at the deadline stop: {lost.get('steps')} step(s), {float(lost.get('gpu_hours') or 0):.2f} "
            f"GPU-hours: {lost.get('why')}"
        )
    if report is None:
        notes.append("(the run report could not be built: costs unknown)")
    kind = BUDGET if budget and not (failed or upstream or stalled) else FAILED
    if (publish or {}).get("outcome") == publishing.NOT_PROMOTED:
        # Its checkpoint is exported; the lineage's published model stays the one before.
        said = f"finished, but its model was not promoted: {publish.get('reason')}"
        if kind == FAILED and (failed or upstream or stalled):
            notes.append(said)
        else:
            kind, outcome = NOT_PROMOTED, said if not budget else f"{outcome}; {said}"
    return Alert(
        kind=kind,
        dag_id=dag_id,
        run_id=run_id,
        url=url or run_url(dag_id, run_id),
        failed=failed,
        upstream_failed=upstream,
        reward=training,
        still_running=tuple(costs.still_up(_spec(conf), states, results or {})),
        readable=conf is not None,
        notes=tuple(notes),
        outcome=outcome,
        ray_logs=ray_logs,
    )


def _budget_text(training: Mapping[str, Any], usd: float | None) -> str:
    """The stop's words, with the USD the trigger counted at the stop (the one price; ``usd`` when it has none)."""
    done = int(training.get("steps_completed") or 0)
    stop = training.get("deadline_stop") or {}
    spent = stop.get("usd") if stop.get("usd") is not None else usd
    return budget_stop_text(done, int(training.get("max_steps") or done), spent, stop.get("limit"))


def current_stage(states: Mapping[str, str]) -> tuple[str | None, tuple[str, ...]]:
    """Where a run in progress is: the stages of its active tasks in run order (storage and cluster run side by side,
    so "storage + cluster"), and those tasks; with none active, the stage of the latest task that ended; (None, ())
    without states."""

    def rank(stage: str) -> int:
        return topology.STAGES.index(stage) if stage in topology.STAGES else len(topology.STAGES)

    active = tuple(t for t in _in_order(states) if states[t] in ts.ACTIVE)
    if active:
        return " + ".join(sorted({stage_of(t) for t in active}, key=rank)), active
    ended = [stage_of(t) for t in states if states[t] not in ts.NOT_RUN]
    if not ended:
        return None, ()
    return max(ended, key=rank), ()


@dataclass(frozen=True)
class LiveFacts:
    """What the triggerer can read about a run in progress (empty when it cannot read anything)."""

    states: Mapping[str, str] = field(default_factory=dict)
    conf: Mapping[str, Any] | None = None  # validate's accepted conf
    training: Mapping[str, Any] | None = None
    # The return values costs.still_up reads, by task id (costs.results_read says which).
    results: Mapping[str, Any] = field(default_factory=dict)


def deadline_alert(
    dag_id: str,
    run_id: str,
    *,
    deadline: Any = None,
    deadline_hours: float | None = None,
    facts: LiveFacts | None = None,
    url: str | None = None,
) -> Alert:
    """The alert of a run not done by its deadline: the stage it is in and what runs, when the run can be read."""
    facts = facts or LiveFacts()
    stage, active = current_stage(facts.states)
    failed, upstream = _failed(facts.states, {})
    return Alert(
        kind=DEADLINE,
        dag_id=dag_id,
        run_id=run_id,
        url=url or run_url(dag_id, run_id),
        failed=failed,
        upstream_failed=upstream,
        reward=facts.training,
        still_running=tuple(costs.still_up(_spec(facts.conf), facts.states, facts.results)),
        stage=stage,
        active=active,
        deadline=shown_value(deadline),
        deadline_hours=deadline_hours,
        readable=bool(facts.states),
    )
