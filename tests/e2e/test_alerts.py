"""Run alerts reach a webhook (a receiver on 127.0.0.1) through an Airflow connection of type http.

One whole-DAG run with real Airflow against the sandbox fails cheaply (a Lustre operation error, the run stopping
after the cluster, the warm policy keeping the cluster and its GPU pool): its report task sends the failure alert.
The deadline alert is the DAG's own ``DeadlineAlert`` callback, serialized as the scheduler stores it and awaited
through Airflow's ``CallbackTrigger`` with the context ``Deadline.handle_miss`` builds from that run.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.dag_factory import build_dag
from nemo_rl_gke.run import costs, outcomes
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.alert_settings import AlertSettings
from nemo_rl_gke.run.costs import DEFAULT_GPU_HOUR_PRICES_USD
from nemo_rl_gke.run.spec import RunSpec
from tests.e2e.harness import DAG_ID, HF_TEST_TOKEN, INFRA_ONLY, WANDB_TEST_KEY, run_in_process
from tests.faults import create_match
from tests.owners import owner_of
from tests.webhook import Receiver, webhook_receiver

pytestmark = pytest.mark.airflow
SPEC = RunSpec()
BASE_URL = "https://airflow.example.test/"  # only written into the message: nothing is sent there
HOOK_PASSWORD = "alert-hook-password-SECRET-0123456789"
HOOK_HEADER_TOKEN = "alert-header-token-SECRET-9876543210"
SECRETS = (HOOK_PASSWORD, HOOK_HEADER_TOKEN, HF_TEST_TOKEN, WANDB_TEST_KEY)


@pytest.fixture(scope="module")
def webhook(env: dict[str, str]) -> Iterator[Receiver]:
    """The receiver, the alert_webhook connection to it (basic auth and a token header) and the deployment's
    alert_conn_ids naming it, set in the environment as a deployment would set them."""
    with webhook_receiver() as receiver, pytest.MonkeyPatch.context() as patch:
        conn = receiver.connection(login="alerts", password=HOOK_PASSWORD, extra={"X-Alert-Token": HOOK_HEADER_TOKEN})
        patch.setenv("AIRFLOW_CONN_ALERT_WEBHOOK", conn)
        patch.setenv("AIRFLOW__NEMO_RL_GKE__ALERT_CONN_IDS", "alert_webhook")
        patch.setenv("AIRFLOW__API__BASE_URL", BASE_URL)
        yield receiver


@pytest.fixture(scope="module")
def failed_run(sandbox: SandboxProcess, dag: Any, webhook: Receiver) -> dict[str, Any]:
    """One failed run: Lustre's create operation ends in error; the warm policy keeps the cluster and GPU pool."""
    from sandbox.demo import latest_run

    from nemo_rl_gke.gcp.resources import resources

    sandbox.reset()
    lustre = resources(SPEC, owner_of(SPEC))[t.LUSTRE]
    sandbox.add_fault(create_match(lustre), operation="error", message="injected: operation failed")
    try:
        result = run_in_process(dag, {**INFRA_ONLY, "teardown_policy": t.KEEP_WARM})
    finally:
        sandbox.clear_faults()
    run = latest_run(DAG_ID)
    yield {"result": result, "run": run, "requests": webhook.wait_for(1)}
    sandbox.reset()


def test_a_failed_run_alerts_the_webhook_with_what_failed_what_runs_its_cost_and_the_link(
    failed_run: dict[str, Any],
) -> None:
    result, run, requests = failed_run["result"], failed_run["run"], failed_run["requests"]
    assert result.state == "failed" and result.tasks[t.LUSTRE] == "failed"
    # The report ran after teardown and fails the run for the failure upstream of train.wait.
    assert result.tasks[t.NODE_POOL] == "success" and result.tasks[t.RUN_REPORT] == "failed"
    assert run["xcom"][(t.RUN_REPORT, t.ERROR)].startswith(f"the run fails: {t.LUSTRE} failed")
    # One alert: the report's (validate succeeded, so its own alert did not fire).
    assert len(requests) == 1, requests
    (request,) = requests
    assert request.method == "POST" and request.headers["content-type"] == "application/json"
    # The connection's credentials went as headers, as the http provider sends them, never in the body.
    assert request.headers["authorization"] == "Basic " + base64.b64encode(f"alerts:{HOOK_PASSWORD}".encode()).decode()
    assert request.headers["x-alert-token"] == HOOK_HEADER_TOKEN
    assert not [s for s in SECRETS if s in request.body.decode()]

    body = request.json
    run_id = run["run_id"]
    spec = RunSpec.from_conf(run["xcom"][(t.VALIDATE, t.RETURN)])
    pool_usd_per_hour = DEFAULT_GPU_HOUR_PRICES_USD[spec.gpu_type] * spec.gpus_per_node * spec.worker_replicas
    url = f"{BASE_URL.rstrip('/')}/dags/{DAG_ID}/runs/{quote(run_id)}"
    assert (body["kind"], body["dag_id"], body["run_id"], body["url"]) == ("failed", DAG_ID, run_id, url)
    # What failed, with the first line of its error (recorded by the failed task itself).
    assert body["failed"] == [{"task_id": t.LUSTRE, "error": run["xcom"][(t.LUSTRE, t.ERROR)]}]
    assert "injected: operation failed" in body["failed"][0]["error"]
    assert body["upstream_failed"] == sum(1 for s in result.tasks.values() if s == "upstream_failed") > 0
    assert body["reward"] is None  # the run stopped before training
    # What the warm policy kept, costliest first: the cluster and the Lustre whose create failed (it may exist), at
    # their prices; its GPU pool went to 0 nodes (teardown.scale-pool), so it costs nothing an hour.
    kept = body["still_running"][f"kept ({outcomes.KEPT_BY_POLICY})"]
    assert kept[:2] == [t.GKE_CLUSTER, t.LUSTRE] and t.NET in kept
    assert body["still_running"]["kept warm at 0 nodes"] == [t.NODE_POOL]
    assert set(body["still_running"]) == {f"kept ({outcomes.KEPT_BY_POLICY})", "kept warm at 0 nodes"}
    priced = {t.GKE_CLUSTER: costs.hourly_cost(t.GKE_CLUSTER, spec)[0], t.LUSTRE: costs.hourly_cost(t.LUSTRE, spec)[0]}
    assert {r["task_id"]: r["usd_per_hour"] for r in body["resources"] if r["usd_per_hour"]} == {
        k: round(v, 4) for k, v in priced.items()
    }
    total = round(sum(priced.values()), 2)
    assert body["cost_per_hour_usd"] == total and pool_usd_per_hour > 0
    # The run report says the same of what is still up (costs.still_up, the training view's banner too).
    report = run["xcom"][(t.RUN_REPORT, t.REPORT_TEXT)]
    assert f"Still up ({len(body['resources'])}; {total:,.2f} USD/h estimated)" in report, report
    text = body["text"]
    for piece in (run_id, t.LUSTRE, "injected: operation failed", "no training ran", t.GKE_CLUSTER, url):
        assert piece in text, piece
    assert f"~${total:,.2f}/h estimated" in text
    print("failure alert body:\n" + json.dumps(body, indent=2))


def _handle_miss_context(run_id: str, deadline_time: datetime) -> dict[str, Any]:
    """The context Deadline.handle_miss gives the callback (models/deadline.py), from the run in the DB."""
    from airflow.api_fastapi.core_api.datamodels.dag_run import DAGRunResponse
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        dagrun = session.query(DagRun).filter(DagRun.dag_id == DAG_ID, DagRun.run_id == run_id).one()
        dag_run = DAGRunResponse.model_validate(dagrun).model_dump(mode="json")
    return {"dag_run": dag_run, "deadline": {"id": str(uuid.uuid4()), "deadline_time": deadline_time}}


def test_a_missed_deadline_alerts_the_webhook_through_airflows_callback_trigger(
    failed_run: dict[str, Any], webhook: Receiver
) -> None:
    from airflow.models.trigger import Trigger
    from airflow.serialization.decoders import decode_deadline_alert
    from airflow.serialization.encoders import encode_deadline_alert
    from airflow.triggers.callback import CallbackTrigger

    dag = build_dag(DAG_ID, description="d", doc_md="d", alerts=AlertSettings(("alert_webhook",), deadline_hours=2))
    # As the scheduler has it: the DAG's alert serialized and read back (only the callback's path and kwargs).
    callback = decode_deadline_alert(json.loads(json.dumps(encode_deadline_alert(dag.deadline[0])))).callback
    data = callback.serialize()
    deadline_time = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
    kwargs = {**data["kwargs"], "context": _handle_miss_context(failed_run["run"]["run_id"], deadline_time)}
    # As TriggererCallback.queue stores it (a Trigger row's kwargs) and the triggerer rebuilds and runs it.
    row = Trigger.from_object(CallbackTrigger(callback_path=data["path"], callback_kwargs=kwargs))
    trigger = CallbackTrigger(**row.kwargs)

    async def events() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    before = len(webhook.received)
    payloads = asyncio.run(asyncio.wait_for(events(), 60))
    assert [p["state"] for p in payloads] == ["running", "success"], payloads
    run_id = failed_run["run"]["run_id"]
    assert payloads[-1]["body"] == f"deadline alert for {DAG_ID}/{run_id}: sent to alert_webhook"

    requests = webhook.wait_for(before + 1)[before:]
    assert len(requests) == 1
    body = requests[0].json
    assert (body["kind"], body["dag_id"], body["run_id"]) == ("deadline", DAG_ID, run_id)
    assert body["deadline"] == "2026-12-01T06:00:00Z"
    assert body["url"] == f"{BASE_URL.rstrip('/')}/dags/{DAG_ID}/runs/{quote(run_id)}"
    assert body["text"].startswith(f"[{DAG_ID}] run {run_id} is not done by its deadline (2026-12-01T06:00:00Z, 2 h")
    assert not [s for s in SECRETS if s in requests[0].body.decode()]
    print("deadline alert body:\n" + json.dumps(body, indent=2))
