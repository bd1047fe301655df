"""The DAG run for real with `airflow dags test` (metadata DB in the session's private AIRFLOW_HOME)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sandbox.demo import latest_run

from nemo_rl_gke.run import topology
from tests.paths import ROOT

pytestmark = pytest.mark.airflow
DAG_ID = "nemo_rl_grpo_gke"
AIRFLOW = str(Path(sys.executable).parent / "airflow")


# The deployment's Google connection names the tutorial's project, the one its conf may use. A plan-mode run calls
# nothing; the endpoint is a closed loopback port, so a call would fail here instead of reaching Google.
GOOGLE_CONNECTION = json.dumps(
    {"conn_type": "google_cloud_platform", "extra": {"project": "nemo-rl-demo", "api_endpoint": "http://127.0.0.1:9"}}
)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": GOOGLE_CONNECTION,
    }


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


HF_TOKEN = "hf_TESTTOKEN_do_not_leak_7f3a91"
WANDB_KEY = "wandbTESTKEY_do_not_leak_91c2e4"


@pytest.fixture(scope="module")
def token_env() -> dict[str, str]:
    """The job's secret connections hold test tokens: they must never show up anywhere Airflow keeps things."""
    return {
        **_env(),
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT": json.dumps({"conn_type": "generic", "password": HF_TOKEN}),
        "AIRFLOW_CONN_WANDB_DEFAULT": json.dumps({"conn_type": "generic", "password": WANDB_KEY}),
    }


@pytest.fixture(scope="module")
def plan_run(token_env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The tutorial's conf in plan mode, with the test tokens in the secret connections."""
    result = dags_test(json.loads((ROOT / "include/conf/tutorial.json").read_text()), token_env)
    return result, latest_run(DAG_ID)


@pytest.fixture(scope="module")
def refused_run(token_env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """A conf with three mistakes and a token pasted into it."""
    conf = {"zone": "europe-west4-b", "lustre_capacity_gib": 20000, "zonee": "x", "hf_token": HF_TOKEN}
    result = dags_test(conf, token_env)
    return result, latest_run(DAG_ID)


def test_tutorial_conf_validates_and_plans(plan_run: tuple[Any, dict[str, Any]]) -> None:
    result, run = plan_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert run["state"] == "success"
    states = {t: s for t, s, _ in run["tasks"]}
    popped = (states.pop(topology.VALIDATE), states.pop(topology.PLAN), states.pop(topology.APPLY_GATE))
    assert popped == ("success", "success", "skipped")
    # mode=plan: nothing downstream of the gate runs, teardown included (its setup never ran); the report runs.
    assert states.pop(topology.RUN_REPORT) == "success"
    assert states and set(states.values()) == {"skipped"}
    plan = run["xcom"][(topology.PLAN, topology.RETURN)]
    assert plan["gcp_requests"][0]["method"] == "networks.insert"
    assert plan["ray_job"]["submission_id"].startswith("nemo-rl-manual__")
    assert "1. Google Cloud requests (22)" in run["xcom"][(topology.PLAN, topology.PLAN_TEXT)]
    # The plan appears in the task log that `airflow dags test` prints.
    assert "Plan for this run (nothing has been created):" in result.stdout
    assert HF_TOKEN not in result.stdout + result.stderr and WANDB_KEY not in result.stdout + result.stderr


def test_type_error_is_refused_by_airflow_before_any_run_exists() -> None:
    before = _run_count()
    result = dags_test({"worker_replicas": "two"})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "ParamValidationError" in output
    assert "Invalid input for param worker_replicas" in output
    assert _run_count() == before


def test_a_bad_conf_fails_validate_with_every_finding_never_echoing_a_pasted_token(
    refused_run: tuple[Any, dict[str, Any]],
) -> None:
    result, run = refused_run
    assert result.returncode != 0
    assert run["state"] == "failed"
    states = {t: s for t, s, _ in run["tasks"]}
    assert states.pop(topology.VALIDATE) == "failed"
    assert set(states.values()) == {"upstream_failed"}
    findings = run["xcom"][(topology.VALIDATE, topology.FINDINGS)]
    assert [f["rule_id"] for f in findings] == [
        "conf.unknown-key",
        "conf.secret-in-conf",
        "location.zone-in-region",
        "lustre.capacity",
    ]
    # A token pasted into the conf is refused without being echoed.
    pasted = findings[1]
    assert (pasted["param"], pasted["value"]) == ("hf_token", "<redacted>")
    assert "4 problem(s) in the run conf; nothing was created:" in result.stdout + result.stderr


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


def test_tokens_never_reach_logs_xcom_or_rendered_fields(
    plan_run: tuple[Any, dict[str, Any]], refused_run: tuple[Any, dict[str, Any]]
) -> None:
    # Everything Airflow kept of both runs, every log file, XCom and rendered field, and what it printed.
    printed = "".join(r.stdout + r.stderr for r, _ in (plan_run, refused_run))
    haystack = _everything_airflow_kept() + printed
    assert "secrets are not accepted in the conf" in haystack  # the haystack does hold the task logs
    assert "Plan for this run" in haystack
    assert HF_TOKEN not in haystack
    assert WANDB_KEY not in haystack
