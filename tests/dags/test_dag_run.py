"""The DAG run for real with `airflow dags test` (metadata DB in the session's private AIRFLOW_HOME)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox.demo import latest_run

from tests.paths import ROOT

pytestmark = pytest.mark.airflow
DAG_ID = "nemo_rl_grpo_gke"
AIRFLOW = str(Path(sys.executable).parent / "airflow")


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


@pytest.fixture(scope="module", autouse=True)
def _metadata_db(airflow_db: None) -> None:
    """Every test here runs the DAG against the migrated DB."""


def dags_test(conf: dict, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AIRFLOW, "dags", "test", DAG_ID, "-c", json.dumps(conf)],
        env=env or _env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def _run_count() -> int:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.query(DagRun).filter(DagRun.dag_id == DAG_ID).count()


def test_tutorial_conf_validates_and_plans() -> None:
    result = dags_test(json.loads((ROOT / "include/conf/tutorial.json").read_text()))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = latest_run(DAG_ID)
    assert run["state"] == "success"
    states = {t: s for t, s, _ in run["tasks"]}
    assert (states.pop("validate"), states.pop("plan"), states.pop("apply_gate")) == ("success", "success", "skipped")
    # mode=plan: nothing downstream of the gate runs, teardown included (its setup never ran); the report runs.
    assert states.pop("report") == "success"
    assert states and set(states.values()) == {"skipped"}
    plan = run["xcom"][("plan", "return_value")]
    assert plan["gcp_requests"][0]["method"] == "networks.insert"
    assert plan["ray_job"]["submission_id"].startswith("nemo-rl-manual__")
    assert "1. Google Cloud requests (20)" in run["xcom"][("plan", "plan_text")]
    # The plan appears in the task log that `airflow dags test` prints.
    assert "Plan for this run (nothing has been created):" in result.stdout


def test_type_error_is_refused_by_airflow_before_any_run_exists() -> None:
    before = _run_count()
    result = dags_test({"worker_replicas": "two"})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "ParamValidationError" in output
    assert "Invalid input for param worker_replicas" in output
    assert _run_count() == before


def test_semantic_errors_fail_validate_with_every_finding_and_nothing_else_runs() -> None:
    result = dags_test({"zone": "europe-west4-b", "lustre_capacity_gib": 20000, "zonee": "x"})
    assert result.returncode != 0
    run = latest_run(DAG_ID)
    assert run["state"] == "failed"
    states = {t: s for t, s, _ in run["tasks"]}
    assert states.pop("validate") == "failed"
    assert set(states.values()) == {"upstream_failed"}
    findings = run["xcom"][("validate", "findings")]
    assert [f["rule_id"] for f in findings] == ["conf.unknown-key", "location.zone-in-region", "lustre.capacity"]
    assert "3 problem(s) in the run conf; nothing was created:" in result.stdout + result.stderr


HF_TOKEN = "hf_TESTTOKEN_do_not_leak_7f3a91"
WANDB_KEY = "wandbTESTKEY_do_not_leak_91c2e4"


def _everything_airflow_kept() -> str:
    """Every log file, XCom value and rendered template field in the session's Airflow home, as one string."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    home = Path(os.environ["AIRFLOW_HOME"])
    parts = [p.read_text(errors="replace") for p in home.rglob("*.log") if p.is_file()]
    parts += [p.read_text(errors="replace") for p in (home / "logs").rglob("*") if p.is_file()]
    with create_session() as session:
        parts += [json.dumps(XComModel.deserialize_value(x), default=str) for x in session.query(XComModel)]
        parts += [json.dumps(r.rendered_fields, default=str) for r in session.query(RenderedTaskInstanceFields)]
    return "\n".join(parts)


def test_tokens_never_reach_logs_xcom_or_rendered_fields() -> None:
    env = {
        **_env(),
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT": json.dumps({"conn_type": "generic", "password": HF_TOKEN}),
        "AIRFLOW_CONN_WANDB_DEFAULT": json.dumps({"conn_type": "generic", "password": WANDB_KEY}),
    }
    good = dags_test(json.loads((ROOT / "include/conf/tutorial.json").read_text()), env)
    assert good.returncode == 0
    # A token pasted into the conf is refused without being echoed.
    pasted = dags_test({"hf_token": HF_TOKEN}, env)
    assert pasted.returncode != 0
    finding = latest_run(DAG_ID)["xcom"][("validate", "findings")][0]
    assert (finding["rule_id"], finding["param"], finding["value"]) == ("conf.secret-in-conf", "hf_token", "<redacted>")
    haystack = good.stdout + good.stderr + pasted.stdout + pasted.stderr + _everything_airflow_kept()
    assert "secrets are not accepted in the conf" in haystack  # the haystack does hold the task logs
    assert HF_TOKEN not in haystack
    assert WANDB_KEY not in haystack
