"""The deployment's bounds: read from [nemo_rl_gke] and the Google connection, and enforced by `validate`.

Each refused conf goes through the CLI as a user would run it, with the deployment given by the same environment
variables Airflow reads; each finding names the setting, the value, the bound and who may change it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nemo_rl_gke.preflight.offline import check_conf
from nemo_rl_gke.run.deployment import Deployment, DeploymentError, connection_project
from nemo_rl_gke.run.ownership import Lease, live_gpu_leases
from tests.paths import ROOT

TUTORIAL = json.loads((ROOT / "include/conf/tutorial.json").read_text())
LOCAL = json.loads((ROOT / "include/conf/local.json").read_text())


def _connection(project: str) -> str:
    return json.dumps({"conn_type": "google_cloud_platform", "extra": {"project": project}})


def validate(conf: dict, **settings: str) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__NEMO_RL_GKE__")}
    env.update({"PYTHONPATH": str(ROOT / "plugins"), "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": _connection("nemo-rl-demo")})
    env.update({f"AIRFLOW__NEMO_RL_GKE__{k.upper()}": v for k, v in settings.items()})
    result = subprocess.run(
        [sys.executable, "-m", "nemo_rl_gke", "validate", "--format", "json"],
        input=json.dumps(conf),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    return result.returncode, json.loads(result.stdout)


def test_the_tutorial_and_the_demo_fit_the_default_bounds() -> None:
    for conf in (TUTORIAL, LOCAL):
        code, body = validate(conf)
        assert (code, body["valid"], body["findings"]) == (0, True, [])


@pytest.mark.parametrize(
    ("patch", "settings", "rule_id", "setting", "value", "bound"),
    [
        ({"project": "someone-elses-proj"}, {}, "deployment.project", "allowed_projects", "someone-elses-proj",
         "nemo-rl-demo"),
        ({"export_bucket": "outsider-drop-box"}, {}, "deployment.export-bucket", "allowed_export_buckets",
         "outsider-drop-box", "nemo-rl-demo-nemo-rl-checkpoints"),
        ({"region": "europe-west4", "zone": "europe-west4-b"}, {}, "deployment.region", "allowed_regions",
         "europe-west4", "us-central1"),
        ({"worker_replicas": 3, "gpu_pool_max_nodes": 3}, {}, "deployment.gpu-nodes", "max_gpu_nodes_per_run", 3,
         "of 2"),
        ({"gpu_pool_max_nodes": 5}, {"max_gpu_nodes_per_run": "8"}, "deployment.gpu-nodes", "max_gpu_nodes_total",
         5, "of 4"),
        ({}, {"allowed_recipes": "qwen2.5-7b-gsm8k-v0.7.0"}, "deployment.recipe", "allowed_recipes",
         "gemma3-27b-gsm8k-v0.5.0", "qwen2.5-7b-gsm8k-v0.7.0"),
        ({"max_run_hours": 100}, {}, "deployment.budget", "max_run_hours", 100, "of 24 h"),
        ({"max_run_usd": 2000}, {"max_run_usd": "1500"}, "deployment.budget", "max_run_usd", 2000, "of 1500 USD"),
        ({"capacity": "spot"}, {"allowed_capacity": "reservation,flex_start"}, "deployment.capacity",
         "allowed_capacity", "spot", "it allows reservation, flex_start"),
        # A ladder may not fall back onto an option the deployment ruled out.
        ({"capacity_ladder": ["reservation:600", "spot"]}, {"allowed_capacity": "reservation flex_start"},
         "deployment.capacity", "allowed_capacity", ["reservation", "spot"], "spot is outside"),
        ({"capacity": "on_demand"}, {"max_gpu_hour_usd": "6"}, "deployment.gpu-price", "max_gpu_hour_usd",
         "on_demand", "on_demand (11 USD) costs more than"),
        # The conf's own price is the conf's word: it cannot talk the bound down.
        ({"capacity_ladder": ["flex_start:600", "on_demand"], "capacity": "flex_start", "gpu_hour_price_usd": 1.0},
         {"max_gpu_hour_usd": "6"}, "deployment.gpu-price", "max_gpu_hour_usd", ["flex_start", "on_demand"],
         "on on_demand (11 USD)"),
    ],
)  # fmt: skip
def test_a_conf_outside_a_bound_is_refused_naming_setting_value_bound_and_who(
    patch: dict, settings: dict, rule_id: str, setting: str, value: object, bound: str
) -> None:
    code, body = validate({**TUTORIAL, **patch}, **settings)
    assert code == 1 and body["valid"] is False
    (finding,) = [f for f in body["findings"] if f["rule_id"] == rule_id]
    assert [f["rule_id"] for f in body["findings"]] == [rule_id], body["findings"]
    assert finding["value"] == value
    assert f"[nemo_rl_gke] {setting} (AIRFLOW__NEMO_RL_GKE__{setting.upper()})" in finding["rule"]
    assert bound in finding["rule"]
    assert "the deployment's operator (an Airflow admin" in finding["fix"]


def test_the_bounds_widen_only_through_the_deployment() -> None:
    wider = {
        "allowed_projects": "team-b-project",
        "allowed_regions": "us-central1,europe-west4",
        "allowed_export_buckets": "{project}-nemo-rl-checkpoints, shared-ckpts-*",
    }
    conf = {**TUTORIAL, "project": "team-b-project", "region": "europe-west4", "zone": "europe-west4-b"}
    assert validate({**conf, "export_bucket": "shared-ckpts-team-b"}, **wider)[0] == 0
    assert validate({**conf, "export_bucket": "team-b-project-nemo-rl-checkpoints"}, **wider)[0] == 0
    # A prefix is a prefix of the name, and {project} is only ever the run's own project.
    assert validate({**conf, "export_bucket": "shared-ckpt"}, **wider)[0] == 1
    assert validate({**conf, "export_bucket": "nemo-rl-demo-nemo-rl-checkpoints"}, **wider)[0] == 1


def test_without_a_connection_project_nothing_is_allowed_until_listed() -> None:
    nothing = Deployment.from_env({})
    assert nothing.projects == ()
    spec, findings = check_conf(TUTORIAL, nothing)
    assert spec is None and [f.rule_id for f in findings] == ["deployment.project"]
    assert "no project is allowed yet" in findings[0].fix
    listed = Deployment.from_env({"AIRFLOW__NEMO_RL_GKE__ALLOWED_PROJECTS": "nemo-rl-demo"})
    assert check_conf(TUTORIAL, listed)[0] is not None


@pytest.mark.parametrize(
    ("value", "project"),
    [
        (_connection("proj-from-json"), "proj-from-json"),
        (json.dumps({"conn_type": "google_cloud_platform", "extra": json.dumps({"project": "proj-str"})}), "proj-str"),
        ("google-cloud-platform://?project=proj-from-uri&key_path=%2Fk.json", "proj-from-uri"),
        ("google-cloud-platform://?extra__google_cloud_platform__project=old-style", "old-style"),
        ("{not json", ""),
        ("", ""),
        (None, ""),
    ],
)
def test_the_connection_project_is_read_offline_from_json_or_uri(value: str | None, project: str) -> None:
    assert connection_project(value) == project


@pytest.mark.parametrize(
    "settings",
    [
        {"allowed_projects": ("Not A Project",)},
        {"allowed_regions": ("us-central1-b",)},
        {"allowed_export_buckets": ("gs://bucket",)},
        {"allowed_export_buckets": ("a*b",)},
        {"max_gpu_nodes_per_run": 0},
        {"max_gpu_nodes_total": True},
        {"allowed_capacity": ("preemptible",)},
        {"allowed_capacity": ()},
        {"max_gpu_hour_usd": -1.0},
    ],
)
def test_malformed_bounds_are_refused_for_the_admin_to_fix(settings: dict) -> None:
    with pytest.raises(DeploymentError, match=next(iter(settings))):
        Deployment(**settings)


def test_a_non_integer_gpu_bound_in_the_environment_is_refused() -> None:
    with pytest.raises(DeploymentError, match="max_gpu_nodes_total must be a whole number"):
        Deployment.from_env({"AIRFLOW__NEMO_RL_GKE__MAX_GPU_NODES_TOTAL": "lots"})


def test_only_this_deployments_other_live_leases_count_and_old_records_count_zero() -> None:
    now = 1000.0
    leases = [
        Lease("g-held", "default", "r1", "held", 0.0, now + 60, gpu_nodes=2),
        Lease("g-expired", "default", "r2", "held", 0.0, now - 1, gpu_nodes=2),
        Lease("g-free", "default", "r3", "free", 0.0, now, now, gpu_nodes=2),
        Lease("g-other", "team-b", "r4", "held", 0.0, now + 60, gpu_nodes=2),
        Lease("g-mine", "default", "r5", "held", 0.0, now + 60, gpu_nodes=2),
    ]
    assert [lease.group for lease in live_gpu_leases(leases, "default", "g-mine", now)] == ["g-held"]
    old = json.loads(leases[0].to_value())
    del old["gpu_nodes"]
    assert Lease.from_value(json.dumps(old)).gpu_nodes == 0
    assert Lease.from_value(json.dumps({**old, "gpu_nodes": -1})) is None


def test_cheap_enough_capacity_within_the_allowed_options_passes_the_capacity_bounds() -> None:
    # B200 at the price table's estimate: flex-start 5.17 and Spot 4.40 USD per GPU-hour, both under 6.
    settings = {"allowed_capacity": "flex_start,spot", "max_gpu_hour_usd": "6"}
    conf = {**TUTORIAL, "capacity": "flex_start", "capacity_ladder": ["flex_start:3600", "spot"]}
    assert validate(conf, **settings)[0] == 0
    # And the plan says the bounds it was judged against.
    deployment = Deployment(allowed_capacity=("flex_start", "spot"), max_gpu_hour_usd=6.0)
    from nemo_rl_gke.plan.build import build_plan

    spec, findings = check_conf(conf, deployment)
    assert spec is not None, findings
    plan = build_plan(spec, deployment=deployment)
    assert plan.bounds["allowed_capacity"] == ["flex_start", "spot"] and plan.bounds["max_gpu_hour_usd"] == 6.0
    assert "capacity options flex_start, spot, at most 6 USD per GPU-hour" in plan.to_text()
