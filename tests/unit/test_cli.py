"""The command line, run as a user would: `python -m nemo_rl_gke validate|plan|params|rules`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.paths import ROOT

# The CLI judges a conf's project by the Google connection's project extra, as the DAG's validate task does.
CONNECTION = json.dumps({"conn_type": "google_cloud_platform", "extra": {"project": "nemo-rl-demo"}})
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "plugins"), "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": CONNECTION}


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nemo_rl_gke", *args], input=stdin, capture_output=True, text=True, env=ENV, check=False
    )


def test_validate_tutorial_conf() -> None:
    result = cli("validate", "--conf", str(ROOT / "include/conf/tutorial.json"))
    assert result.returncode == 0
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "OK: conf is valid (gemma3-27b-gsm8k-v0.5.0, 2 x b200 nodes, mode plan)"
    # Its Ray (2.49.2) predates token auth: said, not refused.
    assert lines[1].startswith("Notice: recipe gemma3-27b-gsm8k-v0.5.0 pins NeMo RL v0.5.0 with Ray 2.49.2")
    assert "predates Ray token authentication" in lines[1] and "docs/security.md" in lines[1]


def test_validate_has_no_notice_for_a_ray_with_token_auth() -> None:
    conf = '{"recipe": "qwen2.5-7b-gsm8k-v0.7.0", "dtensor_tp": 4, "vllm_tp": 4}'
    data = json.loads(cli("validate", "--format", "json", stdin=conf).stdout)
    assert data["valid"] is True and data["notices"] == []
    data = json.loads(cli("validate", "--format", "json", "--conf", str(ROOT / "include/conf/tutorial.json")).stdout)
    assert data["valid"] is True and len(data["notices"]) == 1


def test_validate_reports_every_problem_and_exits_1(tmp_path) -> None:
    conf = tmp_path / "bad.json"
    conf.write_text(json.dumps({"gpu_type": "h200", "machine_type": "a4-highgpu-8g", "zonee": "x", "dtensor_tp": 3}))
    result = cli("validate", "--conf", str(conf))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "4 problem(s) in the run conf; nothing was created:"
    assert any("[conf.unknown-key] zonee=" in line for line in lines)
    assert any("[gpu.machine-type] machine_type=" in line for line in lines)
    assert any("[nemo.dtensor-tp-divides] dtensor_tp=3" in line for line in lines)
    assert any("[nemo.tp-divides-heads] dtensor_tp=3" in line for line in lines)


def test_validate_json_from_stdin() -> None:
    result = cli("validate", "--format", "json", stdin='{"lustre_capacity_gib": 20000}')
    data = json.loads(result.stdout)
    assert result.returncode == 1 and data["valid"] is False
    assert data["findings"][0]["rule_id"] == "lustre.capacity" and data["findings"][0]["value"] == 20000


def test_plan_json_and_refusal() -> None:
    result = cli("plan", "--format", "json", "--conf", str(ROOT / "include/conf/tutorial.json"))
    assert result.returncode == 0
    assert json.loads(result.stdout)["gcp_requests"][0]["method"] == "networks.insert"
    refused = cli("plan", stdin='{"project": "X"}')
    assert refused.returncode == 1 and "[name.project]" in refused.stderr and refused.stdout == ""


def test_params_and_rules_listings() -> None:
    params = json.loads(cli("params", "--format", "json").stdout)
    assert params[0]["name"] == "mode" and {"name", "type", "default", "section", "description"} <= set(params[0])
    rules = cli("rules").stdout
    assert rules.startswith("| rule | category |") and "`lustre.capacity`" in rules


def test_docs_rule_table_is_up_to_date() -> None:
    doc = (ROOT / "docs/preflight-rules.md").read_text()
    assert cli("rules").stdout in doc, "regenerate with: make docs"


def test_docs_conf_reference_is_up_to_date() -> None:
    doc = (ROOT / "docs/conf-reference.md").read_text()
    table = cli("params", "--format", "markdown").stdout
    assert "| `teardown_policy` | string (delete_all, keep_cluster_and_storage, keep_all) |" in table
    assert table in doc, "regenerate with: make docs"


def test_docs_deployment_settings_are_up_to_date() -> None:
    doc = (ROOT / "docs/conf-reference.md").read_text()
    table = cli("settings", "--format", "markdown").stdout
    assert "| `hf_conn_ids` | `AIRFLOW__NEMO_RL_GKE__HF_CONN_IDS` |" in table
    assert table in doc, "regenerate with: make docs"


def test_validate_judges_connections_by_the_deployment_in_the_environment(tmp_path) -> None:
    conf = tmp_path / "conf.json"
    conf.write_text(json.dumps({"hf_conn_id": "hf_team"}))
    refused = cli("validate", "--conf", str(conf))
    assert refused.returncode == 1 and "[secrets.connections] hf_conn_id=" in refused.stdout
    allowed = subprocess.run(
        [sys.executable, "-m", "nemo_rl_gke", "validate", "--conf", str(conf)],
        capture_output=True,
        text=True,
        env={**ENV, "AIRFLOW__NEMO_RL_GKE__HF_CONN_IDS": "huggingface_default,hf_team"},
        check=False,
    )
    assert allowed.returncode == 0, allowed.stdout
