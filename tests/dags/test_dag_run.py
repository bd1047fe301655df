"""The DAG run for real with `airflow dags test` (metadata DB in the session's private AIRFLOW_HOME)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_rl_gke.demo import _latest_run
from tests.paths import ROOT

pytestmark = pytest.mark.airflow
DAG_ID = "nemo_rl_grpo_gke"
AIRFLOW = str(Path(sys.executable).parent / "airflow")


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


@pytest.fixture(scope="module", autouse=True)
def metadata_db() -> None:
    subprocess.run([AIRFLOW, "db", "migrate"], env=_env(), check=True, capture_output=True)


def dags_test(conf: dict) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AIRFLOW, "dags", "test", DAG_ID, "-c", json.dumps(conf)],
        env=_env(),
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
    run = _latest_run(DAG_ID)
    assert run["state"] == "success"
    assert [(t, s) for t, s, _ in run["tasks"]] == [("plan", "success"), ("validate", "success")]
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
    run = _latest_run(DAG_ID)
    assert run["state"] == "failed"
    assert dict((t, s) for t, s, _ in run["tasks"]) == {"validate": "failed", "plan": "upstream_failed"}
    findings = run["xcom"][("validate", "findings")]
    assert [f["rule_id"] for f in findings] == ["conf.unknown-key", "location.zone-in-region", "lustre.capacity"]
    assert "3 problem(s) in the run conf; nothing was created:" in result.stdout + result.stderr


def test_apply_is_refused_until_the_apply_tasks_exist() -> None:
    result = dags_test({"mode": "apply"})
    assert result.returncode != 0
    run = _latest_run(DAG_ID)
    assert [f["rule_id"] for f in run["xcom"][("validate", "findings")]] == ["mode.apply-available"]
