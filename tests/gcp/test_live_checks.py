"""preflight_live's checks against the sandbox: every problem at once, each naming param, value, rule and fix."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.cloud import compute_v1
from sandbox.testing import SandboxProcess, request_json

from nemo_rl_gke.findings import Finding
from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.gcp.live_checks import REQUIRED_SERVICES, gpu_quota_findings, live_findings
from nemo_rl_gke.spec import RunSpec
from tests.gcp.conftest import ZONE


def _rules(findings: list[Finding]) -> list[str]:
    return sorted(f.rule_id for f in findings)


def _complete(finding: Finding) -> None:
    assert finding.params and finding.param
    assert finding.rule and finding.fix
    assert str(finding).startswith(f"[{finding.rule_id}] {finding.param}=")


@pytest.fixture
def disabled_lustre_api(sandbox: SandboxProcess) -> Iterator[str]:
    """Lustre's API disabled for the duration of one test (the sandbox's enabled list is global)."""
    service = "lustre.googleapis.com"
    request_json(f"{sandbox.url}/sandbox/services", "POST", {"service": service, "enabled": False})
    try:
        yield service
    finally:
        request_json(f"{sandbox.url}/sandbox/services", "POST", {"service": service, "enabled": True})


def test_a_good_project_has_no_findings(sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec) -> None:
    sandbox.seed_reservation(spec.project, ZONE, spec.reservation, spec.effective_machine_type, spec.worker_replicas)
    assert live_findings(spec, hook) == []


def test_missing_reservation_and_missing_roce_profile_are_reported_together(
    sandbox: SandboxProcess, hook: GcpHook, project: str
) -> None:
    # us-west1-a offers no RoCE profile in the sandbox's world, and nobody reserved anything there.
    spec = RunSpec.from_conf({"project": project, "region": "us-west1", "zone": "us-west1-a"})
    findings = live_findings(spec, hook)
    assert _rules(findings) == ["live.network-profile", "live.reservation"]
    by_rule = {f.rule_id: f for f in findings}
    reservation = by_rule["live.reservation"]
    assert reservation.param == "reservation"
    assert reservation.value == spec.reservation
    assert "us-west1-a" in reservation.rule
    assert "gcloud compute reservations create nemo-rl-reservation" in reservation.fix
    assert "--machine-type=a4-highgpu-8g" in reservation.fix
    profile = by_rule["live.network-profile"]
    assert profile.param == "zone" and profile.value == "us-west1-a"
    assert "us-west1-a-vpc-roce" in profile.rule
    for finding in findings:
        _complete(finding)


def test_wrong_machine_type_and_too_small_reservation_are_reported_together(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    # An H200 reservation of one machine, for a B200 run of two workers.
    sandbox.seed_reservation(spec.project, ZONE, spec.reservation, "a3-ultragpu-8g", 1)
    findings = live_findings(spec, hook)
    assert _rules(findings) == ["live.reservation-capacity", "live.reservation-machine-type"]
    by_rule = {f.rule_id: f for f in findings}
    machine = by_rule["live.reservation-machine-type"]
    assert machine.value == "a3-ultragpu-8g"
    assert "a4-highgpu-8g" in machine.rule
    capacity = by_rule["live.reservation-capacity"]
    assert capacity.params == ("reservation", "worker_replicas")
    assert capacity.value == {"count": 1, "in_use": 0, "free": 1}
    assert "worker_replicas" in capacity.fix
    for finding in findings:
        _complete(finding)


def test_machines_in_use_do_not_count_as_free(sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec) -> None:
    sandbox.seed_reservation(spec.project, ZONE, spec.reservation, spec.effective_machine_type, 3, in_use_count=2)
    findings = live_findings(spec, hook)
    assert _rules(findings) == ["live.reservation-capacity"]
    assert findings[0].value == {"count": 3, "in_use": 2, "free": 1}


def test_h200_run_matches_an_h200_reservation(sandbox: SandboxProcess, hook: GcpHook, project: str) -> None:
    spec = RunSpec.from_conf({"project": project, "zone": ZONE, "gpu_type": "h200"})
    sandbox.seed_reservation(project, ZONE, spec.reservation, "a3-ultragpu-8g", 2)
    assert live_findings(spec, hook) == []


def test_a_disabled_api_is_reported_with_the_enable_command(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec, disabled_lustre_api: str
) -> None:
    sandbox.seed_reservation(spec.project, ZONE, spec.reservation, spec.effective_machine_type, 2)
    findings = live_findings(spec, hook)
    assert _rules(findings) == ["live.api-enabled"]
    assert disabled_lustre_api in findings[0].rule
    assert findings[0].fix == f"gcloud services enable {disabled_lustre_api} --project={spec.project}"
    assert disabled_lustre_api in REQUIRED_SERVICES


def test_gpu_quota_unknown_is_not_a_finding(hook: GcpHook, spec: RunSpec) -> None:
    # The sandbox does not serve regions.get: the quota is unknown, which is logged, not reported.
    assert gpu_quota_findings(spec, hook) == []


class _Regions:
    """Test stand-in for RegionsClient (the sandbox does not serve regions.get)."""

    def __init__(self, quotas: list[compute_v1.Quota]) -> None:
        self.quotas = quotas

    def get(self, **kwargs: object) -> compute_v1.Region:
        return compute_v1.Region(name="us-central1", quotas=self.quotas)


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(8.0, ["live.gpu-quota"]), (16.0, []), (64.0, [])],
)
def test_gpu_quota_below_the_runs_gpus_is_reported(
    hook: GcpHook, spec: RunSpec, limit: float, expected: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    quotas = [
        compute_v1.Quota(metric="CPUS", limit=1000, usage=10),
        compute_v1.Quota(metric="NVIDIA_B200_GPUS", limit=limit, usage=16),  # usage is the reservation's own share
    ]
    monkeypatch.setitem(hook._compute, "regions", _Regions(quotas))
    findings = gpu_quota_findings(spec, hook)
    assert _rules(findings) == expected
    if findings:
        assert findings[0].value == {"metric": "NVIDIA_B200_GPUS", "limit": limit, "needed": 16}
        _complete(findings[0])


def test_h200_quota_is_found_under_googles_short_metric_name(
    hook: GcpHook, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = RunSpec.from_conf({"project": project, "zone": ZONE, "gpu_type": "h200"})
    monkeypatch.setitem(hook._compute, "regions", _Regions([compute_v1.Quota(metric="NVIDIA_H200_GPUS", limit=0)]))
    findings = gpu_quota_findings(spec, hook)
    assert _rules(findings) == ["live.gpu-quota"]
    assert "NVIDIA_H200_GPUS" in findings[0].fix
