"""Run alerts: a failed run, a refused conf, and a scheduled run not done by its deadline, sent through Airflow's
notifiers to the connections the deployment allows.

Where each alert is sent from, and why there:

* **failed**: by the ``report`` task (:class:`~nemo_rl_gke.operators.report.RunReportOperator`), not by a DAG
  ``on_failure_callback``. The report runs after teardown whenever the conf was valid and already holds what the
  message needs: every task's state, the training summary, what teardown kept and the GPU pool's cost. A DAG
  callback runs in the DAG processor with a context that has none of that (and no task-SDK access to XCom).
* **refused**: by ``validate``'s ``on_failure_callback`` (:class:`RunAlertNotifier`), since a refused conf is the
  one failure after which the report does not run.
* **deadline**: :func:`notify_deadline`, the ``AsyncCallback`` of the DAG's ``DeadlineAlert`` (a schedule sets it
  with :attr:`AlertSettings.deadline_hours`), awaited in the triggerer with ``context={"dag_run", "deadline"}``.

Every step records the first line of its final error (:func:`record_failure`, XCom ``error``), redacted by
Airflow's secrets masker in the process that raised it, so the alert can quote it.

Targets are Airflow connection ids: the deployment's ``[nemo_rl_gke] alert_conn_ids``, read when the alert is sent
(never at parse time); a schedule may name a subset. A connection's type picks the notifier: ``http`` ->
``HttpNotifier`` (the JSON payload, POSTed), ``slackwebhook``/``slack`` -> the Slack provider's notifiers, ``smtp``
-> ``SmtpNotifier``; a provider that is not installed or any other type is a logged warning. Without targets the
alert is only logged. A delivery problem is logged, never raised: an alert never changes a run's outcome.

Imported while Airflow parses DAG files: stdlib and the package's pure modules at module level; Airflow's
hooks, notifiers and config are imported when an alert is built or sent.
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseNotifier

from nemo_rl_gke.observe.report import budget_stop_text, stage_of
from nemo_rl_gke.run import costs, outcomes, topology
from nemo_rl_gke.run import task_states as ts
from nemo_rl_gke.run.alert_settings import AlertSettings
from nemo_rl_gke.run.deployment import ENV_PREFIX, SECTION, is_loopback_url, load_deployment
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.topology import Cost

if TYPE_CHECKING:
    from airflow.sdk import Connection, Context, DeadlineAlert

    from nemo_rl_gke.observe.report import RunReport
    from nemo_rl_gke.run.deployment import Deployment

log = logging.getLogger(__name__)

FAILED = "failed"
REFUSED = "refused"
DEADLINE = "deadline"
# A run its budget stopped: it succeeded with an earlier checkpoint than asked for, which someone should know.
BUDGET = "budget"
# Airflow's own fallback when [api] base_url is unset (RuntimeTaskInstance.log_url).
DEFAULT_BASE_URL = "http://localhost:8080/"
# One delivery may take this long; a slow receiver must not hold the report task or the triggerer.
SEND_TIMEOUT_S = 30.0
ERROR_CHARS = 300  # an error line is cut here: the alert links to the log for the rest
RUNNING_NAMES = 3  # the text names this many resources per state (the payload lists them all)
SLACK_CONN_TYPES = ("slackwebhook", "slack")


def dag_deadline(settings: AlertSettings) -> DeadlineAlert | None:
    """The DAG's ``DeadlineAlert`` (None without ``deadline_hours``): :func:`notify_deadline` in the triggerer,
    ``deadline_hours`` after the run was queued. Only ids and numbers go in its kwargs: they are stored."""
    if settings.deadline_hours is None:
        return None
    from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference

    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(hours=settings.deadline_hours),
        callback=AsyncCallback(
            notify_deadline,
            kwargs={"connections": list(settings.connections), "deadline_hours": float(settings.deadline_hours)},
        ),
    )


# ---------------------------------------------------------------------------------------------------------------
# The message
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FailedTask:
    """A task whose final try failed, with the first line of its error ('' when none was recorded)."""

    task_id: str
    error: str = ""


@dataclass(frozen=True)
class StillRunning:
    """Something of the run that is (or may be) still up after it, and its estimated USD per hour (None: unpriced)."""

    what: str
    state: str
    usd_per_hour: float | None = None


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
    still_running: tuple[StillRunning, ...] = ()
    stage: str | None = None  # deadline alerts: where the run is
    active: tuple[str, ...] = ()  # deadline alerts: the tasks running now
    deadline: str | None = None  # deadline alerts: when it passed (ISO 8601)
    deadline_hours: float | None = None
    readable: bool = True  # deadline alerts: False when the run's tasks could not be read
    notes: tuple[str, ...] = field(default=())
    outcome: str = ""  # budget alerts: "stopped at budget: N of M steps, X USD"

    @property
    def cost_per_hour_usd(self) -> float | None:
        """The estimated USD per hour of what is still running (None when none of it has a price)."""
        prices = [r.usd_per_hour for r in self.still_running if r.usd_per_hour is not None]
        return round(sum(prices), 2) if prices else None

    def headline(self) -> str:
        """One line: which run, and what happened."""
        run = f"[{self.dag_id}] run {self.run_id}"
        if self.kind == DEADLINE:
            hours = f", {self.deadline_hours:g} h after it was queued" if self.deadline_hours else ""
            return f"{run} is not done by its deadline ({self.deadline or 'time unknown'}{hours})"
        if self.kind == REFUSED:
            return f"{run} failed: its conf was refused, nothing was created"
        if self.kind == BUDGET:
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
            lines.append("Still running: " + self._running_text())
        lines += list(self.notes)
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
        for r in sorted(self.still_running, key=_costly_first):
            groups.setdefault(r.state, []).append(r.what)
        return groups

    def _running_text(self) -> str:
        """Priced items one by one, the rest named per state (a few names, then a count): a short line."""
        if not self.still_running:
            return "nothing"
        parts = [f"{r.what}: {r.state}, ~${r.usd_per_hour:,.2f}/h" for r in self.still_running if r.usd_per_hour]
        groups: dict[str, list[str]] = {}
        for r in sorted(self.still_running, key=_costly_first):
            if not r.usd_per_hour:
                groups.setdefault(r.state, []).append(r.what)
        for state, names in groups.items():
            more = f" and {len(names) - RUNNING_NAMES} more" if len(names) > RUNNING_NAMES else ""
            parts.append(f"{state}: {', '.join(names[:RUNNING_NAMES])}{more}")
        cost = self.cost_per_hour_usd
        total = "cost unknown" if cost is None else f"~${cost:,.2f}/h estimated (GPU nodes; the rest is not priced)"
        return "; ".join(parts) + f". Total: {total}"

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
            # Names by state, costly ones first; null (not {}) when a deadline alert could not read the run.
            "still_running": self._running_by_state() if self.readable else None,
            "cost_per_hour_usd": self.cost_per_hour_usd,
            "stage": self.stage,
            "deadline": self.deadline,
        }


def _costly_first(item: StillRunning) -> tuple[bool, int]:
    """Sort key: priced items, then what costs while it stays (by its step's cost kind: cluster, Lustre,
    RayCluster), then the free rest."""
    kinds = list(Cost)
    step = topology.STEPS.get(item.what)
    cost = None if step is None else step.cost
    rank = kinds.index(cost) if cost is not None and cost is not Cost.FREE else len(kinds)
    return item.usd_per_hour is None, rank


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


def error_line(error: BaseException | str | None) -> str:
    """The first line of an error, for an alert: with the next line when the first only announces a list, cut at
    :data:`ERROR_CHARS`, and passed through Airflow's secrets masker (secrets this process read come out ``***``)."""
    if error is None:
        return ""
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    line = lines[0]
    if line.endswith(":") and len(lines) > 1:
        line = f"{line} {lines[1]}"
    if len(line) > ERROR_CHARS:
        line = line[: ERROR_CHARS - 3] + "..."
    return _redact(line)


def _redact(text: str) -> str:
    try:
        from airflow.sdk.log import redact
    except ImportError:  # outside Airflow there is no masker, and no secret was read through it
        return text
    return str(redact(text))


def record_failure(context: Context) -> None:
    """``on_failure_callback`` of every step: the first line of the final error into XCom ``error``, for the alert."""
    line = error_line(context.get("exception"))
    if line:
        context["ti"].xcom_push(key=topology.ERROR, value=line)


# ---------------------------------------------------------------------------------------------------------------
# What the alerts say about a run
# ---------------------------------------------------------------------------------------------------------------
def run_failed(states: Mapping[str, str]) -> bool:
    """Whether a task of the run (other than the report) ended failed or upstream_failed: teardown failures count,
    since what they should have deleted may still bill."""
    return any(state in ts.FAILED_STATES for task_id, state in states.items() if task_id != topology.RUN_REPORT)


def _failed(states: Mapping[str, str], errors: Mapping[str, str]) -> tuple[tuple[FailedTask, ...], int]:
    failed = tuple(
        FailedTask(task_id, errors.get(task_id, "")) for task_id in _in_order(states) if states[task_id] == ts.FAILED
    )
    return failed, sum(1 for state in states.values() if state == ts.UPSTREAM_FAILED)


def _in_order(states: Mapping[str, str]) -> list[str]:
    """Task ids in topology order (unknown ones last, by name)."""
    order = {task_id: i for i, task_id in enumerate(topology.STEPS)}
    return sorted(states, key=lambda t: (order.get(t, len(order)), t))


def _pool(gpu_type: str, gpus_per_node: int, nodes: int, state: str, usd: float | None) -> StillRunning:
    return StillRunning(f"GPU node pool ({nodes} x {gpus_per_node} {gpu_type})", state, usd)


def kept_after_teardown(states: Mapping[str, str], report: RunReport | None) -> tuple[StillRunning, ...]:
    """What a finished run left up: what teardown kept (and why), what a failed deletion may have left, and the GPU
    pool when its cluster was not deleted, priced by the report's GPU-hour price."""
    found: list[StillRunning] = []
    kept = {item.task_id: item.action for item in report.kept} if report is not None else {}
    for step in topology.teardown_steps():
        created = [d for d in step.deletes if states.get(d) in ts.MADE]  # a failed create can leave one behind
        if not created:
            continue
        state = states.get(step.task_id, "none")
        if step.task_id in kept:
            why = kept[step.task_id]
        elif state in ts.FAILED_STATES:
            failed = state == ts.FAILED
            why = "deletion failed: may still exist" if failed else "not deleted: an earlier deletion failed"
        else:
            continue
        found += [StillRunning(d, why) for d in created]
    if report is not None and report.gpu.came_up and report.gpu.still_running:
        g = report.gpu
        usd = costs.pool_usd_per_hour(g.price_per_gpu_hour_usd, g.gpus_per_node, g.worker_replicas)
        reason = kept.get(topology.deleted_by(topology.NODE_POOL).task_id) or "cluster not deleted"
        found.append(_pool(g.gpu_type, g.gpus_per_node, g.worker_replicas, reason, usd))
    elif report is not None and report.gpu.scaled_to_zero:
        # The warm cluster's pool is there at 0 nodes: say so, at what it costs now.
        g = report.gpu
        found.append(_scaled_pool(g.gpu_type, g.gpus_per_node, g.worker_replicas))
    return tuple(found)


def _scaled_pool(gpu_type: str, gpus_per_node: int, nodes: int) -> StillRunning:
    what = f"GPU node pool (0 nodes; {nodes} x {gpus_per_node} {gpu_type} when in use)"
    return StillRunning(what, outcomes.SCALED_TO_ZERO, 0.0)


def failure_alert(
    dag_id: str,
    run_id: str,
    states: Mapping[str, str],
    *,
    errors: Mapping[str, str] | None = None,
    training: Mapping[str, Any] | None = None,
    report: RunReport | None = None,
    url: str | None = None,
) -> Alert:
    """The alert of a failed run, from its task states, the recorded errors, the training summary and the report; or
    of a run its budget stopped (nothing failed): a budget alert. A stalled job's message is a line of its own."""
    failed, upstream = _failed(states, errors or {})
    stalled = str((training or {}).get("stalled") or "")
    budget = bool((training or {}).get("stopped_at_budget"))
    outcome = ""
    if budget:
        outcome = _budget_text(training or {}, None if report is None else report.gpu.estimated_cost_usd)
    notes = [stalled.splitlines()[0]] if stalled else []
    if budget and (failed or upstream):
        notes.append(outcome)
    if report is None:
        notes.append("(the run report could not be built: costs unknown)")
    return Alert(
        kind=BUDGET if budget and not (failed or upstream or stalled) else FAILED,
        dag_id=dag_id,
        run_id=run_id,
        url=url or run_url(dag_id, run_id),
        failed=failed,
        upstream_failed=upstream,
        reward=training,
        still_running=kept_after_teardown(states, report),
        notes=tuple(notes),
        outcome=outcome,
    )


def _budget_text(training: Mapping[str, Any], usd: float | None) -> str:
    done = int(training.get("steps_completed") or 0)
    return budget_stop_text(done, int(training.get("max_steps") or done), usd)


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
    actions: Mapping[str, str] = field(default_factory=dict)  # what the pool's teardown steps did, by task id


def running_now(facts: LiveFacts) -> tuple[StillRunning, ...]:
    """The GPU pool of a run in progress, if it is up (its step succeeded and the cluster is not yet deleted): at its
    full size's price, or at 0 nodes and 0 USD/h once teardown scaled it down (as the view's banner says)."""
    if facts.states.get(topology.NODE_POOL) != ts.SUCCESS or not facts.conf:
        return ()
    if facts.states.get(topology.deleted_by(topology.NODE_POOL).task_id) == ts.SUCCESS:
        return ()

    spec = RunSpec.from_conf(dict(facts.conf))
    if costs.pool_after_teardown(facts.actions) == costs.POOL_SCALED_TO_ZERO:
        return (_scaled_pool(spec.gpu_type, spec.gpus_per_node, spec.worker_replicas),)
    usd, _ = costs.hourly_cost(topology.NODE_POOL, spec)
    return (_pool(spec.gpu_type, spec.gpus_per_node, spec.worker_replicas, "up", usd),)


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
        still_running=running_now(facts),
        stage=stage,
        active=active,
        deadline=_iso(deadline),
        deadline_hours=deadline_hours,
        readable=bool(facts.states),
    )


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        at = value if value.tzinfo else value.replace(tzinfo=UTC)
        return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        return _iso(datetime.fromisoformat(str(value)))
    except ValueError:
        return str(value)[:40]


# ---------------------------------------------------------------------------------------------------------------
# Targets and delivery
# ---------------------------------------------------------------------------------------------------------------
def resolve_targets(requested: Sequence[str], deployment: Deployment) -> list[str]:
    """The connections to alert: the requested ones the deployment allows (all of them when none is requested).

    A requested id the deployment does not list is dropped with an error naming the setting, the rule and the fix.
    """
    allowed = deployment.alert_conn_ids
    if not requested:
        return list(allowed)
    refused = [c for c in requested if c not in allowed]
    if refused:
        log.error(
            "Alert connection(s) %s dropped: a DAG's alerts may only use the deployment's [%s] alert_conn_ids (%s). "
            "Fix: add them to alert_conn_ids (%sALERT_CONN_IDS) or remove them from the schedule's alerts",
            ", ".join(refused),
            SECTION,
            ", ".join(allowed) or "empty",
            ENV_PREFIX,
        )
    return [c for c in requested if c in allowed]


def http_problem(conn: Connection) -> str:
    """Why an http connection may not receive alerts ('' when it may): https, or plain http only to loopback.

    A webhook URL is often itself the credential (and the connection may add auth headers): never in the clear.
    """
    host = conn.host or ""
    # As HttpHook builds its base URL: a host with a scheme is the URL, else schema (default http), host and port.
    port = f":{conn.port}" if conn.port else ""
    url = host if "://" in host else f"{conn.schema or 'http'}://{host}{port}"
    scheme, _, rest = url.partition("://")
    if not re.match(r"[^/?#\s]", rest):
        return "it has no host"
    if scheme.lower() == "https" or (scheme.lower() == "http" and is_loopback_url(url)):
        return ""
    return f"it is {scheme.lower() or 'no'} scheme to a non-loopback host: use https (plain http only to loopback)"


def notifier_for(conn: Connection, alert: Alert) -> BaseNotifier | None:
    """The provider notifier for one alert connection, by its type (None, with a warning, when there is none)."""
    conn_type = (conn.conn_type or "").lower()
    if conn_type == "http":
        problem = http_problem(conn)
        if problem:
            log.warning("Alert connection %s skipped: %s", conn.conn_id, problem)
            return None
        from airflow.providers.http.notifications.http import HttpNotifier

        # The URL comes from the connection (host, schema, port); its extra becomes request headers.
        return HttpNotifier(http_conn_id=conn.conn_id, json=alert.payload(), extra_options={"timeout": SEND_TIMEOUT_S})
    if conn_type in SLACK_CONN_TYPES:
        return _slack_notifier(conn, alert)
    if conn_type == "smtp":
        return _smtp_notifier(conn, alert)
    log.warning(
        "Alert connection %s skipped: its type %r has no notifier here (use http, slackwebhook, slack or smtp)",
        conn.conn_id,
        conn.conn_type,
    )
    return None


def _slack_notifier(conn: Connection, alert: Alert) -> BaseNotifier | None:
    try:
        if conn.conn_type == "slackwebhook":
            from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

            return SlackWebhookNotifier(slack_webhook_conn_id=conn.conn_id, text=alert.text())
        from airflow.providers.slack.notifications.slack import SlackNotifier
    except ImportError:
        log.warning(
            "Alert connection %s skipped: its type is %s but apache-airflow-providers-slack is not installed",
            conn.conn_id,
            conn.conn_type,
        )
        return None
    channel = str(conn.extra_dejson.get("channel") or "")
    if not channel:
        log.warning("Alert connection %s skipped: a slack connection needs the extra 'channel'", conn.conn_id)
        return None
    return SlackNotifier(slack_conn_id=conn.conn_id, text=alert.text(), channel=channel)


def _smtp_notifier(conn: Connection, alert: Alert) -> BaseNotifier | None:
    try:
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier
    except ImportError:
        log.warning("Alert connection %s skipped: apache-airflow-providers-smtp is not installed", conn.conn_id)
        return None
    to = conn.extra_dejson.get("to")
    if not to:
        log.warning("Alert connection %s skipped: an smtp connection needs the extra 'to' (recipients)", conn.conn_id)
        return None
    return SmtpNotifier(
        to=to,
        smtp_conn_id=conn.conn_id,
        subject=alert.headline(),
        html_content=f"<pre>{html.escape(alert.text())}</pre>",
    )


def _safe_error(exc: BaseException) -> str:
    """A delivery error without the target's URL (a webhook's path can be its secret): type and, for an HTTP
    status error, the status the hook reports."""
    name = type(exc).__name__
    text = str(exc)
    return f"{name}: {text[:120]}" if re.match(r"^\d{3}\b", text) else name


def _targets(requested: Sequence[str], deployment: Deployment | None) -> list[str]:
    """The targets, with the deployment's settings read now unless given (tests pass their own)."""
    if deployment is None:
        deployment = load_deployment()
    return resolve_targets(requested, deployment)


def _log_alert(alert: Alert, targets: Sequence[str]) -> None:
    where = ", ".join(targets) if targets else f"no target: [{SECTION}] alert_conn_ids is empty, logged only"
    log.warning("Run alert (%s) -> %s\n%s", alert.kind, where, alert.text())


def send(
    alert: Alert,
    requested: Sequence[str] = (),
    *,
    context: Mapping[str, Any] | None = None,
    deployment: Deployment | None = None,
) -> list[str]:
    """Log the alert and send it to every allowed target, now (a worker). Returns the connections it reached."""
    from airflow.sdk import BaseHook

    targets = _targets(requested, deployment)
    _log_alert(alert, targets)
    sent = []
    for conn_id in targets:
        try:
            notifier = notifier_for(BaseHook.get_connection(conn_id), alert)
            if notifier is None:
                continue
            # notify(), not the notifier's __call__: that would render the message as a Jinja template, and an error
            # line may hold "{{ ... }}" from the conf or a log (template injection into the alert).
            notifier.notify(dict(context or {}))
        except Exception as exc:
            log.warning("Alert to connection %s was not delivered: %s", conn_id, _safe_error(exc))
            continue
        log.info("Alert sent to connection %s", conn_id)
        sent.append(conn_id)
    return sent


async def asend(
    alert: Alert,
    requested: Sequence[str] = (),
    *,
    context: Mapping[str, Any] | None = None,
    deployment: Deployment | None = None,
) -> list[str]:
    """:func:`send` for the triggerer: async notifiers are awaited, sync-only ones run in a thread; each bounded."""
    from airflow.sdk import BaseHook

    # Reading the config and importing a provider's notifier are sync: off the loop (the triggerer's is shared).
    targets = await asyncio.to_thread(_targets, requested, deployment)
    _log_alert(alert, targets)
    sent = []
    for conn_id in targets:
        try:
            notifier = await asyncio.to_thread(notifier_for, await BaseHook.aget_connection(conn_id), alert)
            if notifier is None:
                continue
            ctx = dict(context or {})
            if type(notifier).async_notify is not BaseNotifier.async_notify:
                await asyncio.wait_for(notifier.async_notify(ctx), SEND_TIMEOUT_S)
            else:
                await asyncio.wait_for(asyncio.to_thread(notifier.notify, ctx), SEND_TIMEOUT_S)
        except Exception as exc:
            log.warning("Alert to connection %s was not delivered: %s", conn_id, _safe_error(exc))
            continue
        log.info("Alert sent to connection %s", conn_id)
        sent.append(conn_id)
    return sent


# ---------------------------------------------------------------------------------------------------------------
# The entry points Airflow calls
# ---------------------------------------------------------------------------------------------------------------
class RunAlertNotifier(BaseNotifier):
    """``on_failure_callback`` of ``validate``: a refused conf (the one failure the report does not follow) alerts
    the same targets, with the first problem found.

    :param connections: the DAG's alert connections (empty: all of the deployment's).
    """

    def __init__(self, connections: Sequence[str] = ()) -> None:
        super().__init__()
        self.connections = tuple(connections)

    def notify(self, context: Context) -> None:
        """Send the refused-conf alert of this task's run."""
        dag_id, run_id = context["dag"].dag_id, context["run_id"]
        task_id = context["ti"].task_id
        alert = Alert(
            kind=REFUSED,
            dag_id=dag_id,
            run_id=run_id,
            url=run_url(dag_id, run_id),
            failed=(FailedTask(task_id, error_line(context.get("exception"))),),
        )
        send(alert, self.connections, context=context)


def _live_facts(dag_id: str, run_id: str) -> LiveFacts:
    """The run's task states, accepted conf and training summary, through the triggerer's link to the API server;
    empty where there is none (the alert then says so)."""
    try:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
        from airflow.sdk.execution_time.xcom import XCom

        raw = RuntimeTaskInstance.get_task_states(dag_id=dag_id, run_ids=[run_id]).get(run_id) or {}
        states = {k: str(v or "none") for k, v in raw.items()}
        # Only XComs that exist by now: a missing one is logged as an error by the SDK client.
        conf = training = None
        if states.get(topology.VALIDATE) == ts.SUCCESS:
            conf = XCom.get_one(key=topology.RETURN, dag_id=dag_id, task_id=topology.VALIDATE, run_id=run_id)
        if states.get(topology.WAIT) in (ts.SUCCESS, ts.FAILED):
            training = XCom.get_one(key=topology.JOB_SUMMARY, dag_id=dag_id, task_id=topology.WAIT, run_id=run_id)
        actions = {}
        for step in (topology.deleted_by(topology.NODE_POOL), topology.step(topology.SCALE_POOL)):
            if step is not None and states.get(step.task_id) == ts.SUCCESS:
                done = XCom.get_one(key=topology.RETURN, dag_id=dag_id, task_id=step.task_id, run_id=run_id)
                actions[step.task_id] = str(done.get("action") or "") if isinstance(done, Mapping) else ""
    except Exception as exc:  # best effort: the alert goes out with what the context says
        log.info("The run's task states are not readable here (%s): the deadline alert says less", type(exc).__name__)
        return LiveFacts()
    return LiveFacts(
        states=states,
        conf=conf if isinstance(conf, Mapping) else None,
        training=training if isinstance(training, Mapping) else None,
        actions=actions,
    )


async def notify_deadline(
    *,
    connections: Sequence[str] = (),
    deadline_hours: float | None = None,
    context: Mapping[str, Any] | None = None,
) -> str:
    """The deadline's ``AsyncCallback``, awaited in the triggerer: alert that the run is not done by its deadline.

    ``context`` is what Airflow passes: ``{"dag_run": <DAGRunResponse as JSON>, "deadline": {"id", "deadline_time"}}``.
    Returns a one-line outcome (Airflow stores it as the callback's output).
    """
    context = context or {}
    dag_run = context.get("dag_run") or {}
    dag_id = str(dag_run.get("dag_id") or "unknown-dag")
    run_id = str(dag_run.get("dag_run_id") or dag_run.get("run_id") or "unknown-run")

    def build() -> Alert:
        # Sync reads (the run's states through the triggerer's supervisor, the config): off the triggerer's loop.
        deadline = (context.get("deadline") or {}).get("deadline_time")
        facts = _live_facts(dag_id, run_id)
        return deadline_alert(dag_id, run_id, deadline=deadline, deadline_hours=deadline_hours, facts=facts)

    alert = await asyncio.to_thread(build)
    sent = await asend(alert, list(connections), context=context)
    return f"deadline alert for {dag_id}/{run_id}: " + (f"sent to {', '.join(sent)}" if sent else "logged only")
