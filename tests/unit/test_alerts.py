"""Run alerts: settings, message content, targets, notifiers by connection type, and the DAG's wiring.

Deliveries go to a webhook receiver on 127.0.0.1 through real Airflow connections of type http (``AIRFLOW_CONN_*``)
and the http provider's notifier; nothing is sent anywhere else (the non-loopback rule is checked without traffic).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import pytest

from nemo_rl_gke import alerts
from nemo_rl_gke.alerts import (
    RunAlertNotifier,
    dag_deadline,
    error_line,
    http_problem,
    record_failure,
    resolve_targets,
    send,
)
from nemo_rl_gke.dag_factory import build_dag
from nemo_rl_gke.observe import alert_messages
from nemo_rl_gke.observe.alert_messages import (
    Alert,
    LiveFacts,
    current_stage,
    deadline_alert,
    failure_alert,
    reward_text,
    run_url,
)
from nemo_rl_gke.observe.report import RunInputs, TaskTiming, build_report
from nemo_rl_gke.run import costs, outcomes
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.alert_settings import AlertSettings, AlertSettingsError
from nemo_rl_gke.run.costs import DEFAULT_GPU_HOUR_PRICES_USD
from nemo_rl_gke.run.deployment import Deployment, DeploymentError
from nemo_rl_gke.run.spec import RunSpec
from tests.webhook import Receiver, webhook_receiver

URL = "https://airflow.example.test/dags/d/runs/r"
SUMMARY = {
    "steps_completed": 12,
    "last_step": "12",
    "first_reward": 0.0,
    "last_reward": 0.5625,
    "best_reward": 0.75,
    "best_reward_step": "11",
}
DEPLOYMENT = Deployment(alert_conn_ids=("alert_webhook",))
SECRET = "sk-alert-test-SECRET-0123456789abcdef"


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 and the ``alert_webhook`` http connection to it (with a secret auth header)."""
    with webhook_receiver() as receiver:
        monkeypatch.setenv("AIRFLOW_CONN_ALERT_WEBHOOK", receiver.connection(extra={"Authorization": SECRET}))
        yield receiver


# ---------------------------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------------------------
def test_alert_settings_default_to_every_deployment_connection_and_no_deadline() -> None:
    settings = AlertSettings()
    assert settings.connections == () and settings.deadline_hours is None
    assert dag_deadline(settings) is None
    assert AlertSettings(["a", "b", "a"], 6).connections == ("a", "b")


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"deadline_hours": 0}, ("alerts.deadline_hours=0", "greater than 0", "Fix:")),
        ({"deadline_hours": -1.5}, ("alerts.deadline_hours=-1.5", "greater than 0", "Fix:")),
        ({"deadline_hours": math.inf}, ("alerts.deadline_hours=inf", "greater than 0")),
        ({"deadline_hours": True}, ("alerts.deadline_hours=True",)),
        ({"deadline_hours": "6"}, ("alerts.deadline_hours='6'",)),
        ({"connections": ("ok", "bad id!")}, ("alerts.connections", "'bad id!'", "alert_conn_ids", "Fix:")),
        ({"connections": "alert_webhook"}, ("alerts.connections='alert_webhook'", "list", "Fix:")),
    ],
)
def test_a_bad_alert_setting_names_the_setting_the_value_the_rule_and_the_fix(
    kwargs: dict[str, Any], names: tuple[str, ...]
) -> None:
    with pytest.raises(AlertSettingsError) as err:
        AlertSettings(**kwargs)
    for name in names:
        assert name in str(err.value)


def test_the_deployment_lists_alert_connections_comma_separated_default_none() -> None:
    assert Deployment().alert_conn_ids == ()
    env = {"AIRFLOW__NEMO_RL_GKE__ALERT_CONN_IDS": "alert_webhook, ops_mail"}
    assert Deployment.from_env(env).alert_conn_ids == ("alert_webhook", "ops_mail")
    with pytest.raises(DeploymentError, match=r"alert_conn_ids has 'no way': each must be a connection id"):
        Deployment(alert_conn_ids=("no way",))


def test_targets_are_the_deployments_and_a_schedule_may_only_pick_among_them(caplog: pytest.LogCaptureFixture) -> None:
    deployment = Deployment(alert_conn_ids=("alert_webhook", "ops_mail"))
    assert resolve_targets((), deployment) == ["alert_webhook", "ops_mail"]
    assert resolve_targets(("ops_mail",), deployment) == ["ops_mail"]
    with caplog.at_level(logging.ERROR, logger="nemo_rl_gke.alerts"):
        assert resolve_targets(("ops_mail", "someone_elses_hook"), deployment) == ["ops_mail"]
    (record,) = caplog.records
    for piece in ("someone_elses_hook", "alert_conn_ids (alert_webhook, ops_mail)", "Fix:"):
        assert piece in record.getMessage()
    assert resolve_targets(("ops_mail",), Deployment()) == []


# ---------------------------------------------------------------------------------------------------------------
# The message
# ---------------------------------------------------------------------------------------------------------------
# teardown.delete-raycluster's summary of its copy of the Ray logs (run/ray_logs.summarize).
RAY_LOGS_SUMMARY = {
    "uri": "gs://p-ckpt/nemo-rl-gke/ray-logs/nemo_rl_grpo_gke/r/",
    "index": "gs://p-ckpt/nemo-rl-gke/ray-logs/nemo_rl_grpo_gke/r/index.json",
    "nodes": 3,
    "files": 75,
    "bytes": 5 * 2**19,
    "truncated": 1,
    "skipped": 0,
    "errors": 0,
    "error": "",
}


def _failed_training_report() -> tuple[dict[str, str], Any, dict[str, Any]]:
    """A run whose job failed after 12 steps; the warm policy kept the cluster (its GPU pool) and Lustre. Its
    states, its report, and the alert's conf and results (what operators/report.py reads)."""
    spec = RunSpec()
    states = {s.task_id: "success" for s in t.STEPS.values()}
    states.update({t.WAIT: "failed", t.CHECK_CHECKPOINT: "upstream_failed", t.EXPORT: "upstream_failed"})
    states.update({t.DELETE_CLUSTER: "skipped", t.DELETE_LUSTRE: "skipped"})
    del states[t.RUN_REPORT]
    timings = [TaskTiming(task_id, state, 0.0, 10.0) for task_id, state in states.items()]
    kept = {t.DELETE_CLUSTER: outcomes.KEPT_BY_POLICY, t.DELETE_LUSTRE: outcomes.KEPT_FOR_CHECKPOINT}
    deleted = {s.task_id: outcomes.DELETED for s in t.teardown_steps() if s.deletes and s.task_id not in kept}
    actions = {**deleted, **kept}
    results: dict[str, Any] = {s: {"action": outcomes.CREATED} for s in t.STEPS if not t.step(s).is_teardown}
    results.update({k: {"action": v} for k, v in actions.items()})
    read = {k: results[k] for k in costs.results_read(states) if k in results}
    inputs = RunInputs(
        gpu_type=spec.gpu_type,
        gpus_per_node=spec.gpus_per_node,
        worker_replicas=spec.worker_replicas,
        now=3600.0,
        teardown_policy=t.KEEP_WARM,
        training_summary=SUMMARY,
        teardown_actions=actions,
        spec=spec,
        results=read,
    )
    return states, build_report(timings, {}, inputs), {"conf": spec.to_conf(), "results": read}


def test_the_failure_alert_says_what_failed_the_reward_what_still_runs_its_cost_and_the_link() -> None:
    spec = RunSpec()
    states, report, read = _failed_training_report()
    logs = RAY_LOGS_SUMMARY
    alert = failure_alert(
        "nemo_rl_grpo_gke",
        "r",
        states,
        errors={t.WAIT: "job FAILED: exit 1"},
        training=SUMMARY,
        report=report,
        url=URL,
        ray_logs=logs,
        **read,
    )
    pool_usd = DEFAULT_GPU_HOUR_PRICES_USD[spec.gpu_type] * spec.gpus_per_node * spec.worker_replicas
    cluster_usd = costs.hourly_cost(t.GKE_CLUSTER, spec)[0]
    lustre_usd = costs.hourly_cost(t.LUSTRE, spec)[0]
    total = round(pool_usd + cluster_usd + lustre_usd, 2)
    # Each kept resource that costs, at its price, and the same total as the view's banner and the report.
    assert alert.text() == (
        "[nemo_rl_grpo_gke] run r failed\n"
        "Failed: train.wait: job FAILED: exit 1; 2 task(s) upstream_failed\n"
        "Reward so far: 12 step(s), avg reward first 0.0000, last 0.5625, best 0.7500 (step 11)\n"
        f"Still running: {t.NODE_POOL}: kept (kept-by-policy), ~${pool_usd:,.2f}/h; {t.GKE_CLUSTER}: kept "
        f"(kept-by-policy), ~${cluster_usd:,.2f}/h; {t.LUSTRE}: kept (kept-for-checkpoint), ~${lustre_usd:,.2f}/h. "
        f"Total: ~${total:,.2f}/h estimated\n"
        f"Ray logs: {logs['uri']} (75 file(s), 2.5 MiB, 1 cut to their tail) "
        "https://console.cloud.google.com/storage/browser/p-ckpt/nemo-rl-gke/ray-logs/nemo_rl_grpo_gke/r/\n"
        f"Run: {URL}"
    )
    payload = alert.payload()
    assert payload == {
        "text": alert.text(),
        "kind": "failed",
        "dag_id": "nemo_rl_grpo_gke",
        "run_id": "r",
        "url": URL,
        "failed": [{"task_id": t.WAIT, "error": "job FAILED: exit 1"}],
        "upstream_failed": 2,
        "reward": {"steps": 12, "first": 0.0, "last": 0.5625, "best": 0.75, "best_step": "11"},
        "still_running": {
            f"kept ({outcomes.KEPT_BY_POLICY})": [t.NODE_POOL, t.GKE_CLUSTER],
            f"kept ({outcomes.KEPT_FOR_CHECKPOINT})": [t.LUSTRE],
        },
        "resources": [r.to_dict() for r in alert.still_running],
        "cost_per_hour_usd": total,
        "stage": None,
        "deadline": None,
        "ray_logs": {
            "uri": logs["uri"],
            "console_url": "https://console.cloud.google.com/storage/browser/p-ckpt/nemo-rl-gke/ray-logs/nemo_rl_grpo_gke/r/",
            **{k: logs[k] for k in ("index", "files", "bytes", "truncated", "skipped", "errors", "error")},
        },
    }
    json.dumps(payload)


def test_a_failed_deletion_is_reported_as_maybe_still_there_and_the_pool_still_billing() -> None:
    states, _, read = _failed_training_report()
    states[t.DELETE_CLUSTER] = "failed"
    states[t.DELETE_GVNIC_SUB] = "upstream_failed"
    results = {k: v for k, v in read["results"].items() if k not in (t.DELETE_CLUSTER, t.DELETE_GVNIC_SUB)}
    alert = failure_alert("d", "r", states, url=URL, conf=read["conf"], results=results)
    running = alert.payload()["still_running"]
    # The pool goes with its cluster: the failed deletion leaves both, the pool at its full price.
    assert running["deletion failed: may still exist"] == [t.NODE_POOL, t.GKE_CLUSTER]
    assert running["not deleted: an earlier deletion failed"] == [t.GVNIC_SUB]
    assert f"{t.NODE_POOL}: deletion failed: may still exist, ~$" in alert.text()


def test_without_a_report_the_alert_still_says_what_failed() -> None:
    alert = failure_alert("d", "r", {t.NET: "failed", t.LUSTRE: "upstream_failed"}, url=URL)
    assert "Failed: network.net; 1 task(s) upstream_failed" in alert.text()
    assert "costs unknown" in alert.text() and alert.cost_per_hour_usd is None
    assert "Still running: unknown (no accepted conf to read it by)" in alert.text()


@pytest.mark.parametrize(
    ("summary", "text"),
    [
        (None, "no training ran"),
        ({"steps_completed": 0}, "no training step completed"),
        ({"steps_completed": 3, "last_reward": 0.25}, "3 step(s), avg reward last 0.2500"),
        ({"steps_completed": 3}, "3 step(s), avg reward not logged"),
        (SUMMARY, "12 step(s), avg reward first 0.0000, last 0.5625, best 0.7500 (step 11)"),
    ],
)
def test_the_reward_so_far_in_words(summary: dict[str, Any] | None, text: str) -> None:
    assert reward_text(summary) == text


def test_the_stage_of_a_run_in_progress() -> None:
    assert current_stage({}) == (None, ())
    assert current_stage({t.VALIDATE: "success", t.WAIT: "deferred", t.SUBMIT: "success"}) == ("train", (t.WAIT,))
    # Storage and cluster run side by side.
    side_by_side = {t.NET: "success", t.LUSTRE: "deferred", t.GKE_CLUSTER: "running", t.NODE_POOL: "none"}
    assert current_stage(side_by_side) == ("storage + cluster", (t.LUSTRE, t.GKE_CLUSTER))
    # Nothing active (between tasks): the latest stage that ended; skipped steps do not count.
    assert current_stage({t.NET: "success", t.RAYCLUSTER: "skipped", t.NODE_POOL: "success"}) == ("cluster", ())


def test_the_deadline_alert_says_where_the_run_is_what_runs_and_its_cost() -> None:
    spec = RunSpec()
    states = {t.VALIDATE: "success", t.NODE_POOL: "success", t.SUBMIT: "success", t.WAIT: "deferred"}
    results = {k: {"action": outcomes.CREATED} for k in (t.NODE_POOL,)}
    facts = LiveFacts(states=states, conf=spec.to_conf(), results=results)
    deadline = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
    alert = deadline_alert("d", "r", deadline=deadline, deadline_hours=6, facts=facts, url=URL)
    pool_usd = DEFAULT_GPU_HOUR_PRICES_USD[spec.gpu_type] * spec.gpus_per_node * spec.worker_replicas
    text = alert.text()
    assert text.splitlines()[:3] == [
        "[d] run r is not done by its deadline (2026-12-01T06:00:00Z, 6 h after it was queued)",
        "Stage: train (running: train.wait)",
        "Reward so far: training in progress (the train.wait log shows every step; figures here when it ends)",
    ]
    assert f"~${pool_usd:,.2f}/h" in text and text.endswith(f"Run: {URL}")
    assert alert.payload()["stage"] == "train" and alert.payload()["deadline"] == "2026-12-01T06:00:00Z"
    assert alert.cost_per_hour_usd == pool_usd
    # Once the cluster is deleted its pool is not counted.
    deleted = {**results, t.DELETE_CLUSTER: {"action": outcomes.DELETED}}
    gone = LiveFacts(states={**states, t.DELETE_CLUSTER: "success"}, conf=spec.to_conf(), results=deleted)
    assert deadline_alert("d", "r", facts=gone, url=URL).still_running == ()


def test_a_deadline_alert_that_cannot_read_the_run_says_so_rather_than_guess() -> None:
    alert = deadline_alert("d", "r", deadline="2026-12-01T06:00:00+00:00", url=URL)
    assert "Stage: unknown" in alert.text()
    assert "Reward so far, still running: unknown" in alert.text()
    payload = alert.payload()
    assert payload["still_running"] is None and payload["cost_per_hour_usd"] is None
    assert payload["deadline"] == "2026-12-01T06:00:00Z"


def test_the_run_link_uses_the_api_base_url_and_quotes_the_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = "scheduled__2026-12-01T02:00:00+00:00"
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    assert run_url("dag", run_id) == f"http://localhost:8080/dags/dag/runs/{quote(run_id)}"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.test/base/")
    assert (
        run_url("dag", run_id)
        == "https://airflow.example.test/base/dags/dag/runs/scheduled__2026-12-01T02%3A00%3A00%2B00%3A00"
    )


def test_an_error_line_is_the_first_line_cut_short_and_masked() -> None:
    from airflow.sdk.log import mask_secret

    assert error_line(None) == "" and error_line(ValueError()) == "ValueError"
    assert error_line(RuntimeError("boom\nTraceback: more")) == "boom"
    assert error_line("2 problem(s) in the run conf; nothing was created:\n  1. [R1] x=1: bad") == (
        "2 problem(s) in the run conf; nothing was created: 1. [R1] x=1: bad"
    )
    assert len(error_line("x" * 1000)) == alerts.ERROR_CHARS
    mask_secret(SECRET)
    assert error_line(f"401 for token {SECRET}") == "401 for token ***"


def test_every_step_records_the_first_line_of_its_final_error() -> None:
    pushed: dict[str, Any] = {}
    ti = SimpleNamespace(xcom_push=lambda key, value: pushed.update({key: value}))
    record_failure({"ti": ti, "exception": RuntimeError("create failed: 409\ndetails")})
    assert pushed == {t.ERROR: "create failed: 409"}
    assert t.ERROR in t.step(t.NET).produces and t.ERROR in t.step(t.WAIT).produces


# ---------------------------------------------------------------------------------------------------------------
# Delivery
# ---------------------------------------------------------------------------------------------------------------
def _alert(error: str = "boom") -> Alert:
    return failure_alert("d", "r", {t.NET: "failed"}, errors={t.NET: error}, url=URL)


def test_by_default_an_alert_is_only_logged(webhook: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    # The webhook connection exists, but the deployment names no alert connection: nothing is sent.
    with caplog.at_level(logging.WARNING, logger="nemo_rl_gke.alerts"):
        assert send(_alert(), deployment=Deployment()) == []
    (record,) = caplog.records
    assert "alert_conn_ids is empty, logged only" in record.getMessage()
    assert "[d] run r failed" in record.getMessage() and URL in record.getMessage()
    assert webhook.wait_for(1, timeout=0.5) == []


def test_an_alert_reaches_the_webhook_as_json_with_its_auth_header_out_of_the_body(webhook: Receiver) -> None:
    alert = _alert(error="{{ conn.alert_webhook.password }} and {{ var.value.anything }}")
    assert send(alert, deployment=DEPLOYMENT) == ["alert_webhook"]
    (request,) = webhook.wait_for(1)
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == SECRET and SECRET not in request.body.decode()
    assert request.json == alert.payload()
    # The message is data, never a template: Jinja in an error line is sent as written.
    assert request.json["failed"][0]["error"] == "{{ conn.alert_webhook.password }} and {{ var.value.anything }}"


def test_the_async_path_delivers_the_same_payload(webhook: Receiver) -> None:
    alert = _alert()
    assert asyncio.run(alerts.asend(alert, ("alert_webhook",), deployment=DEPLOYMENT)) == ["alert_webhook"]
    (request,) = webhook.wait_for(1)
    assert request.json == alert.payload()


def test_a_failed_delivery_is_logged_not_raised(webhook: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    webhook.answer_with(500)
    with caplog.at_level(logging.WARNING, logger="nemo_rl_gke.alerts"):
        assert send(_alert(), deployment=DEPLOYMENT) == []
    assert len(webhook.wait_for(1)) == 1
    assert any("alert_webhook was not delivered" in r.getMessage() and "500" in r.getMessage() for r in caplog.records)


def test_an_smtp_connection_mails_the_text_to_its_recipients(monkeypatch: pytest.MonkeyPatch) -> None:
    import base64
    import email
    import threading

    smtpd = pytest.importorskip("smtpd")  # Python 3.11's SMTP server (removed in 3.12): a receiver on 127.0.0.1
    import asyncore

    mails: list[tuple[str, list[str], bytes]] = []

    class Server(smtpd.SMTPServer):
        def process_message(self, peer: Any, mailfrom: str, rcpttos: list[str], data: bytes, **_: Any) -> None:
            mails.append((mailfrom, rcpttos, data))

    server = Server(("127.0.0.1", 0), None)
    thread = threading.Thread(target=asyncore.loop, kwargs={"timeout": 0.05}, daemon=True)
    thread.start()
    try:
        extra = {"disable_tls": True, "disable_ssl": True, "from_email": "bot@example.test"}
        extra["to"] = "oncall@example.test"
        conn = {"conn_type": "smtp", "host": "127.0.0.1", "port": server.socket.getsockname()[1], "extra": extra}
        monkeypatch.setenv("AIRFLOW_CONN_ALERT_MAIL", json.dumps(conn))
        alert = _alert(error="quota <exceeded> & {{ not a template }}")
        assert send(alert, deployment=Deployment(alert_conn_ids=("alert_mail",))) == ["alert_mail"]
    finally:
        server.close()
    ((sender, recipients, data),) = mails
    assert (sender, recipients) == ("bot@example.test", ["oncall@example.test"])
    message = email.message_from_bytes(data)
    assert message["Subject"] == alert.headline()
    (part,) = message.get_payload()
    html = base64.b64decode(part.get_payload()).decode()
    assert "quota &lt;exceeded&gt; &amp; {{ not a template }}" in html and URL in html


@pytest.mark.parametrize(
    ("conn", "warning"),
    [
        ({"conn_type": "postgres", "host": "127.0.0.1"}, "type 'postgres' has no notifier here"),
        ({"conn_type": "smtp", "host": "127.0.0.1"}, "an smtp connection needs the extra 'to'"),
        ({"conn_type": "http", "host": "http://alerts.example.test/hook"}, "use https (plain http only to loopback)"),
    ],
    ids=["unknown-type", "smtp-without-recipients", "plain-http-off-loopback"],
)
def test_a_connection_that_cannot_take_alerts_is_a_warning_and_nothing_is_sent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, conn: dict[str, Any], warning: str
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_ALERT_OTHER", json.dumps(conn))
    with caplog.at_level(logging.WARNING, logger="nemo_rl_gke.alerts"):
        assert send(_alert(), deployment=Deployment(alert_conn_ids=("alert_other",))) == []
    assert any("alert_other skipped" in r.getMessage() and warning in r.getMessage() for r in caplog.records)


def test_slack_without_its_provider_is_a_clear_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        import airflow.providers.slack  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("the slack provider is installed here")
    monkeypatch.setenv("AIRFLOW_CONN_ALERT_SLACK", json.dumps({"conn_type": "slackwebhook", "password": "T/B/x"}))
    with caplog.at_level(logging.WARNING, logger="nemo_rl_gke.alerts"):
        assert send(_alert(), deployment=Deployment(alert_conn_ids=("alert_slack",))) == []
    assert any("apache-airflow-providers-slack is not installed" in r.getMessage() for r in caplog.records)


def test_webhook_urls_must_be_https_or_loopback() -> None:
    from airflow.sdk import Connection

    def problem(**kwargs: Any) -> str:
        return http_problem(Connection(conn_id="c", conn_type="http", **kwargs))

    assert problem(host="127.0.0.1", port=9999) == ""
    assert problem(host="localhost", schema="http") == ""
    assert problem(host="https://hooks.example.test/services/T0/B0/x") == ""
    assert problem(host="hooks.example.test", schema="https") == ""
    assert "non-loopback" in problem(host="hooks.example.test")
    assert "non-loopback" in problem(host="http://10.0.0.8:8080/hook")
    assert problem(host="") == "it has no host"


def test_a_refused_conf_alerts_from_validates_failure_callback(
    webhook: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk import DAG

    from nemo_rl_gke.airflow_compat import AirflowFailException
    from nemo_rl_gke.operators.preflight import ValidateConfOperator

    monkeypatch.setenv("AIRFLOW__NEMO_RL_GKE__ALERT_CONN_IDS", "alert_webhook")
    # The deployment's connection names the conf's project, so the only finding is the bad cluster name.
    google = {"conn_type": "google_cloud_platform", "extra": {"project": "nemo-rl-demo"}}
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(google))
    pushed: dict[str, Any] = {}
    ti = SimpleNamespace(task_id=t.VALIDATE, xcom_push=lambda key, value: pushed.update({key: value}))
    context: dict[str, Any] = {"params": {"cluster_name": "Not_A_Name"}, "ti": ti, "run_id": "manual__x"}
    with pytest.raises(AirflowFailException) as failure:
        ValidateConfOperator(step=t.VALIDATE).execute(context)
    context.update(dag=DAG(dag_id="nemo_rl_grpo_gke"), exception=failure.value)
    RunAlertNotifier(("alert_webhook",))(context)  # as Airflow calls an on_failure_callback notifier
    (request,) = webhook.wait_for(1)
    body = request.json
    assert body["kind"] == "refused" and body["run_id"] == "manual__x"
    assert body["failed"][0]["task_id"] == t.VALIDATE and "cluster_name" in body["failed"][0]["error"]
    assert body["text"].startswith("[nemo_rl_grpo_gke] run manual__x failed: its conf was refused, nothing was created")
    print("refused-conf alert body:\n" + json.dumps(body, indent=2))


# ---------------------------------------------------------------------------------------------------------------
# The DAG
# ---------------------------------------------------------------------------------------------------------------
def test_build_dag_wires_the_alerts_and_the_deadline_airflow_stores() -> None:
    from tests.airflow_compat import serialized_dag, stored_deadline

    dag = build_dag("d", description="d", doc_md="d", alerts=AlertSettings(("alert_webhook",), deadline_hours=6))
    (deadline,) = dag.deadline
    # By name: airflow.sdk exports the classes from 3.2 only.
    assert type(deadline.reference).__name__ == "DagRunQueuedAtDeadline" and deadline.interval == timedelta(hours=6)
    assert type(deadline.callback).__name__ == "AsyncCallback"
    assert deadline.callback.path == "nemo_rl_gke.alerts.notify_deadline"
    assert deadline.callback.kwargs == {"connections": ["alert_webhook"], "deadline_hours": 6.0}
    stored = stored_deadline(deadline)
    assert stored.callback.serialize() == deadline.callback.serialize()
    assert serialized_dag(dag)  # the whole DAG still serializes
    assert dag.get_task(t.RUN_REPORT).alert_connections == ("alert_webhook",)
    callbacks = dag.get_task(t.VALIDATE).on_failure_callback
    assert callbacks[0] is record_failure and callbacks[1].connections == ("alert_webhook",)
    assert all(record_failure in (task.on_failure_callback or []) for task in dag.tasks)


def test_the_manual_dag_alerts_every_deployment_connection_and_has_no_deadline() -> None:
    dag = build_dag("d", description="d", doc_md="d")
    assert not dag.deadline
    assert dag.get_task(t.RUN_REPORT).alert_connections == ()


def test_a_budget_stop_is_an_alert_of_its_own_and_a_stall_a_line_of_the_failure() -> None:
    states, report, _ = _failed_training_report()
    fine = {k: "success" for k in states}
    training = {**SUMMARY, "stopped_at_budget": True, "max_steps": 40, "final_step": 10}
    alert = failure_alert("d", "r", fine, training=training, report=report, url=URL)
    assert alert.kind == alert_messages.BUDGET
    usd = report.gpu.estimated_cost_usd
    assert usd is not None
    assert alert.headline() == f"[d] run r stopped at budget: {SUMMARY['steps_completed']} of 40 steps, {usd:,.2f} USD"
    stalled = {**SUMMARY, "stalled": "stalled at step 12/40: no new step in the log for 901s\nLast lines: ..."}
    alert = failure_alert("d", "r", fine, training=stalled, report=report, url=URL)
    assert alert.kind == alert_messages.FAILED and alert.headline() == "[d] run r failed"
    assert "stalled at step 12/40: no new step in the log for 901s" in alert.text().splitlines()
