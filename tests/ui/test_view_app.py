"""The training view mounted in Airflow's real API server app: login required, data read from a real run, no secret.

A plan-mode run made with ``dag.test`` in the session's private metadata DB gives real task instances and
XComs; the API server app is Airflow's own (``create_app``), which loads the plugin from plugins/ as a deployment does.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import pytest

from nemo_rl_gke import plugin
from nemo_rl_gke.run import topology
from tests.paths import ROOT

pytestmark = pytest.mark.airflow
DAG_ID = "nemo_rl_grpo_gke"
HF_TOKEN = "hf_VIEWTESTTOKEN_never_shown_4b1d"


@pytest.fixture(scope="module")
def run_id(airflow_db: None) -> str:
    """A finished plan-mode run of the tutorial conf (the form's defaults), run in this process (``dag.test``)."""
    from tests.e2e.harness import load_dag, run_in_process

    conf = json.loads((ROOT / "include/conf/tutorial.json").read_text())
    # The deployment's Google connection names the tutorial's project (the default bound); a closed loopback port,
    # so a plan that called Google by mistake fails here.
    google = {
        "conn_type": "google_cloud_platform",
        "extra": {"project": conf["project"], "api_endpoint": "http://127.0.0.1:9"},
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(google))
        done = run_in_process(load_dag(), conf, base=None)
    assert done.state == "success", done.tasks
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.dag_id == DAG_ID).order_by(DagRun.id.desc()).first()
        return run.run_id


@pytest.fixture(scope="module")
def client(airflow_db: None) -> Any:
    from airflow.api_fastapi.app import create_app, purge_cached_app
    from fastapi.testclient import TestClient

    purge_cached_app()
    with TestClient(create_app(apps="core"), base_url="http://127.0.0.1") as test_client:
        yield test_client


@pytest.fixture(scope="module")
def token(client: Any) -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))


def _paths(run_id: str) -> list[str]:
    query = urlencode({"dag_id": DAG_ID, "run_id": run_id})
    return [f"{plugin.URL_PREFIX}/training?{query}", f"{plugin.URL_PREFIX}/training/data?{query}",
            f"{plugin.URL_PREFIX}/training/static/training_view.js"]  # fmt: skip


def test_every_route_needs_a_logged_in_user(client: Any, run_id: str) -> None:
    for path in _paths(run_id):
        assert client.get(path).status_code == 401, path
        assert client.get(path, headers={"Authorization": "Bearer not-a-jwt"}).status_code in (401, 403), path


def test_a_logged_in_user_gets_the_page_and_the_data(client: Any, token: str, run_id: str) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    page, data, script = (client.get(path, headers=auth) for path in _paths(run_id))
    assert page.status_code == data.status_code == script.status_code == 200
    assert "training/static/training_view.js" in page.text
    view = data.json()
    assert (view["dag_id"], view["run_id"], view["run_state"]) == (DAG_ID, run_id, "success")
    assert view["spec"]["mode"] == "plan" and view["running"] == [] and view["points"] == 0
    states = {s["name"]: s["state"] for s in view["stages"]}
    assert states[topology.PREFLIGHT] == "skipped"  # apply_gate ends a plan run: the most severe state is shown
    # No train.wait ran: the budget's limits are the settings' (or none), its GPU nodes the conf's.
    conf = json.loads((ROOT / "include/conf/tutorial.json").read_text())
    assert view["budget"]["source"] in ("settings", "none")
    assert view["budget"]["gpu_nodes"]["used"] == conf.get("worker_replicas", 2)
    assert view["banner"] == {"count": 0, "usd_per_hour": 0.0, "costly": [], "free": [], "free_line": None}
    # The UI's own cookie works as well (the page's fetch from the iframe sends it).
    client.cookies.set("_token", token)
    try:
        assert client.get(_paths(run_id)[1]).status_code == 200
    finally:
        client.cookies.clear()
    assert client.get(f"{plugin.URL_PREFIX}/training/data?dag_id={DAG_ID}&run_id=nope", headers=auth).status_code == 404


def test_the_plugin_and_its_tabs_are_registered(client: Any, token: str) -> None:
    answer = client.get("/api/v2/plugins", headers={"Authorization": f"Bearer {token}"}).json()
    (ours,) = [p for p in answer["plugins"] if p["name"] == plugin.PLUGIN_NAME]
    views = {v["destination"]: v for v in ours["external_views"]}
    assert views["dag_run"]["url_route"] and views["task_instance"]["url_route"]
    assert views["task_instance"]["href"].endswith("task_id={TASK_ID}")
    assert answer.get("import_errors", []) == [] or not any("nemo_rl_gke" in str(e) for e in answer["import_errors"])


def test_a_secret_never_reaches_the_view(client: Any, token: str, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even if a job's log line carried the HF token unmasked, the view's JSON would not."""
    from nemo_rl_gke import view_app

    monkeypatch.setenv("AIRFLOW_CONN_HUGGINGFACE_DEFAULT", json.dumps({"conn_type": "generic", "password": HF_TOKEN}))
    leaked = [f"[ray job] wandb: 🚀 View run at https://wandb.ai/t/p/runs/{HF_TOKEN}", "[ray job] ===== Step 1/2 ====="]
    monkeypatch.setattr(view_app, "_log_lines", lambda ti: leaked)
    # train.wait was skipped in plan mode; the view reads its log whatever its state.
    text = client.get(_paths(run_id)[1], headers={"Authorization": f"Bearer {token}"}).text
    assert HF_TOKEN not in text
    assert "https://wandb.ai/t/p/runs/***" in text and '"step":1' in text.replace(" ", "")


def test_the_budget_train_wait_published_is_what_the_view_shows(client: Any, token: str, run_id: str) -> None:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from nemo_rl_gke.observe.training_view import BUDGET_XCOM

    published = {
        "hours_limit": 6.0,
        "usd_limit": 900.0,
        "gpu_nodes": 2,
        "gpu_nodes_limit": 4,
        "stopped_at_budget": True,
    }
    where = {"dag_id": DAG_ID, "task_id": topology.WAIT, "run_id": run_id}
    with create_session() as session:
        XComModel.set(BUDGET_XCOM, published, **where, session=session)
    try:
        view = client.get(_paths(run_id)[1], headers={"Authorization": f"Bearer {token}"}).json()
    finally:
        with create_session() as session:
            XComModel.clear(**where, session=session)
    budget = view["budget"]
    assert budget["source"] == "train.wait" and budget["stopped_at_budget"] is True
    assert (budget["hours"]["limit"], budget["usd"]["limit"], budget["gpu_nodes"]["limit"]) == (6.0, 900.0, 4)
    assert budget["gpu_nodes"]["left"] == 2 and budget["stopped_line"].startswith("stopped at budget: ")


def test_the_model_card_shows_the_scores_the_decision_and_the_score_run_by_run(
    client: Any, token: str, run_id: str
) -> None:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    decision = {"outcome": "not-promoted", "reason": "score 0.5000 is below the published model's 0.6000 + margin 0",
                "score": 0.5, "baseline": 0.01, "published": 0.6, "hf_uri": "gs://b/d/r/step_3/hf/",
                "benchmark": "gsm8k"}  # fmt: skip
    evaluated = {"score": 0.5, "baseline": 0.01,
                 "result": {"dataset": "gsm8k", "metric": "pass", "k": 1, "problems": 256, "score": 0.5}}  # fmt: skip
    rows = [(topology.PUBLISH, decision), (topology.EVALUATE, evaluated), (topology.CONVERT, {"hf_path": "/x/hf"})]
    with create_session() as session:
        for task_id, value in rows:
            XComModel.set(topology.RETURN, value, dag_id=DAG_ID, task_id=task_id, run_id=run_id, session=session)
    try:
        view = client.get(_paths(run_id)[1], headers={"Authorization": f"Bearer {token}"}).json()
    finally:
        with create_session() as session:
            for task_id, _ in rows:
                XComModel.clear(dag_id=DAG_ID, task_id=task_id, run_id=run_id, session=session)
    model = view["model"]
    assert (model["score"], model["baseline"], model["published"]) == (0.5, 0.01, 0.6)
    assert model["decision"] == "not-promoted" and model["reason"].startswith("score 0.5000 is below")
    assert model["hf"] == "gs://b/d/r/step_3/hf/" and (model["benchmark"], model["metric"]) == ("gsm8k", "pass@1")
    # The DAG's runs, read from their publish results: this one is the newest.
    assert model["history"][-1] == {"run_id": run_id, "score": 0.5, "outcome": "not-promoted"}


def test_a_poll_at_step_10000_reads_the_store_and_only_the_chunks_it_has_not_read(
    client: Any, token: str, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from nemo_rl_gke import view_app
    from nemo_rl_gke.observe import step_store
    from nemo_rl_gke.observe.metrics import RunMetrics, StepMetrics

    def no_log(ti: Any) -> list[str]:
        raise AssertionError("a run with a step store is never read from its task log")

    monkeypatch.setattr(view_app, "_log_lines", no_log)
    monkeypatch.setattr(view_app, "STORE_CACHE", view_app.StoreCache())
    where = {"dag_id": DAG_ID, "task_id": topology.WAIT, "run_id": run_id}
    metrics = RunMetrics()

    def save(steps: int, saved: int) -> None:
        while len(metrics.steps) < steps:
            n = len(metrics.steps) + 1
            metrics.steps.append(StepMetrics(step=n, total_steps=20_000, loss=0.5, avg_reward=(n % 10) / 10))
        head, chunks = step_store.snapshot(
            metrics, submission_id="nemo-rl-job", offset=steps * 400, lines=steps * 6, tail=[], saved_rows=saved
        )
        with create_session() as session:
            for key, rows in chunks.items():
                XComModel.set(key, rows, **where, session=session)
            XComModel.set(step_store.head_key(0), head, **where, session=session)

    def poll() -> dict[str, Any]:
        return client.get(_paths(run_id)[1], headers={"Authorization": f"Bearer {token}"}).json()

    try:
        save(10_000, 0)
        first = poll()
        assert first["points"] == 10_000 and len(first["series"]["reward"]) <= 2000
        assert view_app.STORE_CACHE.fetched == 100  # every chunk once
        # Two more steps: the next poll reads only the newest chunk (and the head), not the 99 closed ones.
        save(10_002, 10_000)
        second = poll()
        assert second["points"] == 10_002 and view_app.STORE_CACHE.fetched == 100 + 2
        assert second["progress"]["completed"] == 10_002
    finally:
        with create_session() as session:
            session.query(XComModel).filter(
                XComModel.dag_id == DAG_ID, XComModel.run_id == run_id, XComModel.key.like("metrics_%")
            ).delete(synchronize_session=False)
