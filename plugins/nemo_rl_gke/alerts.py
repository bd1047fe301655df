"""Run alerts: a failed run, a refused conf, and a scheduled run not done by its deadline, sent through Airflow's
notifiers to the connections the deployment allows (what each alert says is built by
:mod:`nemo_rl_gke.observe.alert_messages`).

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

Imported while Airflow parses DAG files: stdlib and the package's settings and topology at module level; the
messages (:mod:`nemo_rl_gke.observe.alert_messages`) and Airflow's hooks, notifiers and config are imported when an
alert is built or sent.
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseNotifier

from nemo_rl_gke.airflow_compat import deadline_alert, get_async_connection, redact
from nemo_rl_gke.run import task_states as ts
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.airflow_settings import ENV_PREFIX, SECTION
from nemo_rl_gke.run.alert_settings import AlertSettings

if TYPE_CHECKING:
    from airflow.sdk import Connection, Context

    from nemo_rl_gke.airflow_compat import DeadlineAlert
    from nemo_rl_gke.observe.alert_messages import Alert, LiveFacts
    from nemo_rl_gke.run.deployment import Deployment

log = logging.getLogger(__name__)

# One delivery may take this long; a slow receiver must not hold the report task or the triggerer.
SEND_TIMEOUT_S = 30.0
ERROR_CHARS = 300  # an error line is cut here: the alert links to the log for the rest
SLACK_CONN_TYPES = ("slackwebhook", "slack")


def dag_deadline(settings: AlertSettings) -> DeadlineAlert | None:
    """The DAG's ``DeadlineAlert`` (None without ``deadline_hours``): :func:`notify_deadline` in the triggerer,
    ``deadline_hours`` after the run was queued. Only ids and numbers go in its kwargs: they are stored."""
    if settings.deadline_hours is None:
        return None
    return deadline_alert(
        notify_deadline,
        after=timedelta(hours=settings.deadline_hours),
        kwargs={"connections": list(settings.connections), "deadline_hours": float(settings.deadline_hours)},
    )


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
    return redact(line)


def record_failure(context: Context) -> None:
    """``on_failure_callback`` of every step: the first line of the final error into XCom ``error``, for the alert."""
    line = error_line(context.get("exception"))
    if line:
        context["ti"].xcom_push(key=topology.ERROR, value=line)


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
    from nemo_rl_gke.run.deployment import is_loopback_url  # lazy: the deployment's rules load when an alert is sent

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
        # lazy: the deployment's settings load when an alert is sent, not while the DAG file is parsed
        from nemo_rl_gke.run.deployment import load_deployment

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
    # Reading the config and importing a provider's notifier are sync: off the loop (the triggerer's is shared).
    targets = await asyncio.to_thread(_targets, requested, deployment)
    _log_alert(alert, targets)
    sent = []
    for conn_id in targets:
        try:
            notifier = await asyncio.to_thread(notifier_for, await get_async_connection(conn_id), alert)
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
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.observe.alert_messages import REFUSED, Alert, FailedTask, run_url

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
    # lazy: execution-only, kept out of DAG parsing
    from nemo_rl_gke.observe.alert_messages import LiveFacts
    from nemo_rl_gke.run import costs

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
        results = {
            task_id: XCom.get_one(key=topology.RETURN, dag_id=dag_id, task_id=task_id, run_id=run_id)
            for task_id in costs.results_read(states)
        }
    except Exception as exc:  # best effort: the alert goes out with what the context says
        log.info("The run's task states are not readable here (%s): the deadline alert says less", type(exc).__name__)
        return LiveFacts()
    return LiveFacts(
        states=states,
        conf=conf if isinstance(conf, Mapping) else None,
        training=training if isinstance(training, Mapping) else None,
        results=results,
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
        # lazy: execution-only, kept out of DAG parsing
        from nemo_rl_gke.observe.alert_messages import deadline_alert

        # Sync reads (the run's states through the triggerer's supervisor, the config): off the triggerer's loop.
        deadline = (context.get("deadline") or {}).get("deadline_time")
        facts = _live_facts(dag_id, run_id)
        return deadline_alert(dag_id, run_id, deadline=deadline, deadline_hours=deadline_hours, facts=facts)

    alert = await asyncio.to_thread(build)
    sent = await asend(alert, list(connections), context=context)
    return f"deadline alert for {dag_id}/{run_id}: " + (f"sent to {', '.join(sent)}" if sent else "logged only")
