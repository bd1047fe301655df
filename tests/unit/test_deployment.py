"""The deployment's settings: read at run time from [nemo_rl_gke], defaults outside Airflow, refused when malformed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nemo_rl_gke.preflight.offline import check_conf
from nemo_rl_gke.run.deployment import (
    DEFAULT_DEPLOYMENT_ID,
    TUTORIAL_INSTALLER_URLS,
    ConnectionNotAllowedError,
    Deployment,
    DeploymentError,
    installer_url_problem,
    is_loopback_url,
    load_deployment,
)
from tests.paths import ROOT


def test_defaults_are_the_tutorials_and_safe() -> None:
    deployment = Deployment()
    assert deployment.deployment_id == DEFAULT_DEPLOYMENT_ID == "default"
    assert (deployment.hf_conn_ids, deployment.wandb_conn_ids) == (("huggingface_default",), ("wandb_default",))
    assert deployment.ray_dashboard_url == ""
    assert deployment.nccl_installer_allowlist == TUTORIAL_INSTALLER_URLS
    assert all(url.startswith("https://raw.githubusercontent.com/") for url in TUTORIAL_INSTALLER_URLS)


def test_settings_come_from_the_environment_outside_airflow() -> None:
    env = {
        "AIRFLOW__NEMO_RL_GKE__DEPLOYMENT_ID": "team-a",
        "AIRFLOW__NEMO_RL_GKE__HF_CONN_IDS": "hf_prod, hf_dev",
        "AIRFLOW__NEMO_RL_GKE__WANDB_CONN_IDS": "",
        "AIRFLOW__NEMO_RL_GKE__RAY_DASHBOARD_URL": "https://ray.internal.example:8265",
        "AIRFLOW__NEMO_RL_GKE__NCCL_INSTALLER_ALLOWLIST": "https://mirror.example/nccl/\nhttps://x.example/a.yaml",
    }
    deployment = Deployment.from_env(env)
    assert deployment.deployment_id == "team-a"
    assert deployment.hf_conn_ids == ("hf_prod", "hf_dev")
    assert deployment.wandb_conn_ids == ("wandb_default",), "an empty setting keeps the default"
    assert deployment.ray_dashboard_url == "https://ray.internal.example:8265"
    assert deployment.nccl_installer_allowlist == ("https://mirror.example/nccl/", "https://x.example/a.yaml")
    # Without a Google connection no project is allowed beyond the listed ones (none by default).
    assert Deployment.from_env({}) == Deployment(gcp_project="")


def test_load_deployment_reads_the_airflow_config_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_deployment() == Deployment(gcp_project="")
    monkeypatch.setenv("AIRFLOW__NEMO_RL_GKE__HF_CONN_IDS", "hf_from_airflow")
    assert load_deployment().hf_conn_ids == ("hf_from_airflow",)


@pytest.mark.parametrize(
    "settings",
    [
        {"deployment_id": "Team A"},
        {"deployment_id": "x" * 64},
        {"hf_conn_ids": ()},
        {"hf_conn_ids": ("bad id",)},
        {"wandb_conn_ids": ("a/b",)},
        {"ray_dashboard_url": "ftp://ray.example"},
        {"ray_dashboard_url": "https://user:pw@ray.example"},
        {"ray_dashboard_url": "http://10.0.0.7:8265"},
        {"nccl_installer_allowlist": ("http://mirror.example/",)},
        {"nccl_installer_allowlist": ("https://mirror.example/a/../",)},
        {"nccl_installer_allowlist": ("https://mirror.example/x.yaml?token=1",)},
    ],
)
def test_malformed_settings_are_refused_with_the_admins_fix(settings: dict) -> None:
    with pytest.raises(DeploymentError, match=r"\[nemo_rl_gke\] settings are not valid"):
        Deployment(**settings)


@pytest.mark.parametrize("raw", ["lots", "-1", "inf", "nan"])
def test_a_run_budget_setting_that_is_no_number_from_zero_up_is_refused_naming_it(raw: str) -> None:
    for name in ("max_run_hours", "max_run_usd"):
        with pytest.raises(DeploymentError, match=rf"{name} must be a number >= 0 \(0: no limit\), got '{raw}"):
            Deployment.from_env({f"AIRFLOW__NEMO_RL_GKE__{name.upper()}": raw})
    assert Deployment.from_env({"AIRFLOW__NEMO_RL_GKE__MAX_RUN_HOURS": "0"}).max_run_hours == 0.0


def test_a_loopback_http_dashboard_is_left_to_the_submit_time_check() -> None:
    # Allowed only while the Google connection is loopback too (the sandbox), which only the submit can tell.
    assert Deployment(ray_dashboard_url="http://127.0.0.1:8265").ray_dashboard_url == "http://127.0.0.1:8265"


def test_connection_choice_is_among_the_allowed_ids_only() -> None:
    deployment = Deployment(hf_conn_ids=("hf_prod", "hf_dev"))
    assert deployment.hf_conn_id("") == "hf_prod"
    assert deployment.hf_conn_id("hf_dev") == "hf_dev"
    with pytest.raises(ConnectionNotAllowedError, match="allows only hf_prod, hf_dev"):
        deployment.hf_conn_id("google_cloud_default")
    # validate judges the conf against the deployment it is given.
    assert check_conf({"hf_conn_id": "hf_dev"}, deployment)[0] is not None
    assert check_conf({"hf_conn_id": "hf_dev"})[0] is None


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://mirror.example/nccl/installer.yaml", True),
        ("https://mirror.example/nccl/sub/installer.yaml", True),
        ("https://mirror.example/nccl-evil/installer.yaml", False),
        ("https://mirror.example/nccl/../evil.yaml", False),
        ("https://mirror.example/nccl/%2e%2e/evil.yaml", False),
        ("https://mirror.example/nccl/a\\..\\b.yaml", False),
        ("https://mirror.example@evil.example/nccl/x.yaml", False),
        ("http://mirror.example/nccl/installer.yaml", False),
        ("https://mirror.example.evil/nccl/installer.yaml", False),
        ("https://x.example/a.yaml", True),
        ("https://x.example/a.yaml.evil", False),
        ("https://x.example/a.yaml#frag", False),
    ],
)
def test_installer_allowlist_prefixes_end_at_a_slash(url: str, allowed: bool) -> None:
    allowlist = ("https://mirror.example/nccl/", "https://x.example/a.yaml")
    assert (installer_url_problem(url, allowlist) == "") is allowed


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8080", True),
        ("http://127.8.9.10", True),
        ("http://[::1]:80", True),
        ("http://localhost:1", True),
        ("http://10.0.0.1", False),
        ("http://127.0.0.1.evil.example", False),
        ("", False),
        (None, False),
    ],
)
def test_loopback_means_the_loopback_addresses(url: str | None, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


def test_the_cli_shows_the_settings_in_effect() -> None:
    env = {"PYTHONPATH": str(ROOT / "plugins"), "AIRFLOW__NEMO_RL_GKE__HF_CONN_IDS": "hf_cli"}
    out = subprocess.run(
        [sys.executable, "-m", "nemo_rl_gke", "settings"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "hf_conn_ids = hf_cli" in out and "deployment_id = default" in out
