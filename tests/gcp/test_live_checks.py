"""preflight_live's checks against the sandbox: every problem at once, each naming param, value, rule and fix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions as api_exceptions
from sandbox.testing import SandboxProcess, request_json

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.gcp.iam import role_permissions
from nemo_rl_gke.gcp.live_checks import (
    GPU_FAMILY_METRIC,
    PREEMPTIBLE_GPU_FAMILY_METRIC,
    REQUIRED_SERVICES,
    bucket_findings,
    cpu_quota_findings,
    gke_version_findings,
    gpu_quota_findings,
    iam_findings,
    live_findings,
    reservation_findings,
)
from nemo_rl_gke.run.findings import Finding
from nemo_rl_gke.run.spec import RunSpec
from tests.gcp.conftest import ZONE, api_calls, last_seq

LUSTRE_WRITER = "roles/storage.objectUser"


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


def _bucket(sandbox: SandboxProcess, spec: RunSpec, role: str | None = LUSTRE_WRITER) -> None:
    record: dict[str, Any] = {"project": spec.project, "name": spec.export_bucket_name}
    if role:
        record["lustre_agent_role"] = role
    sandbox.seed({"buckets": [record]})


@pytest.fixture
def good(sandbox: SandboxProcess, spec: RunSpec) -> RunSpec:
    """The test's project with everything the run needs: the reservation and the export bucket, writable by Lustre."""
    sandbox.seed_reservation(spec.project, ZONE, spec.reservation, spec.effective_machine_type, spec.worker_replicas)
    _bucket(sandbox, spec)
    return spec


@pytest.fixture
def quotas(sandbox: SandboxProcess) -> Iterator[SandboxProcess]:
    """Seed quota limits for one test (they are global to the sandbox) and put the defaults back afterwards."""
    yield sandbox
    sandbox.seed(
        {
            "quotas": {"N2_CPUS": 600, "CPUS": 2400},
            "gpu_family_quotas": {"NVIDIA_B200": 64, "NVIDIA_H200": 64},
            "preemptible_gpu_family_quotas": {"NVIDIA_B200": 64, "NVIDIA_H200": 64},
        }
    )


def test_a_good_project_has_no_findings(hook: GcpHook, good: RunSpec) -> None:
    assert live_findings(good, hook) == []


# --- IAM -------------------------------------------------------------------------------------------------------
def test_every_missing_permission_is_named_with_a_role_that_grants_it_in_one_call(
    sandbox: SandboxProcess, hook: GcpHook, good: RunSpec
) -> None:
    denied = ["compute.projects.setCommonInstanceMetadata", "storage.buckets.getIamPolicy", "lustre.instances.create"]
    sandbox.seed({"iam_denied": {good.project: denied}})
    since = last_seq(sandbox)
    findings = iam_findings(good, hook)
    assert [f.value for f in findings] == sorted(denied, key=role_permissions().index)
    by_permission = {f.value: f for f in findings}
    lease = by_permission["compute.projects.setCommonInstanceMetadata"]
    assert lease.rule_id == "live.iam" and lease.param == "project"
    assert "roles/compute.instanceAdmin.v1" in lease.fix
    assert "include/iam/nemo-rl-gke-role.yaml" in lease.fix
    assert "roles/storage.admin" in by_permission["storage.buckets.getIamPolicy"].fix
    assert "roles/lustre.admin" in by_permission["lustre.instances.create"].fix
    for finding in findings:
        _complete(finding)
    # One testIamPermissions call carries the whole role file.
    tests = [c for c in api_calls(sandbox, good.project, since) if c["path"].endswith(":testIamPermissions")]
    assert len(tests) == 1


def test_reads_refused_for_a_missing_permission_leave_the_iam_findings_and_the_other_checks(
    sandbox: SandboxProcess, hook: GcpHook, good: RunSpec
) -> None:
    denied = ["compute.reservations.get", "storage.buckets.get"]
    sandbox.seed({"iam_denied": {good.project: denied}})
    findings = live_findings(good, hook)
    assert [(f.rule_id, f.value) for f in findings] == [("live.iam", p) for p in denied]


def test_the_lease_write_without_its_permission_is_refused_with_computes_403(
    sandbox: SandboxProcess, hook: GcpHook, project: str
) -> None:
    sandbox.seed({"iam_denied": {project: ["compute.projects.setCommonInstanceMetadata"]}})
    client = hook.compute("projects")
    fingerprint = client.get(project=project).common_instance_metadata.fingerprint
    with pytest.raises(api_exceptions.Forbidden) as refused:
        client.set_common_instance_metadata_unary(
            project=project, metadata_resource={"fingerprint": fingerprint, "items": []}
        )
    assert f"Required 'compute.projects.setCommonInstanceMetadata' permission for 'projects/{project}'" in str(
        refused.value
    )


# --- the export bucket -----------------------------------------------------------------------------------------
def test_a_missing_export_bucket_is_reported_with_the_create_and_grant_commands(hook: GcpHook, spec: RunSpec) -> None:
    findings = bucket_findings(spec, hook)
    assert _rules(findings) == ["live.export-bucket"]
    finding = findings[0]
    assert finding.value == spec.export_bucket_name
    assert f"gcloud storage buckets create gs://{spec.export_bucket_name} --project={spec.project}" in finding.fix
    _complete(finding)


@pytest.mark.parametrize("role", [None, "roles/storage.objectViewer"])
def test_a_bucket_the_lustre_agent_cannot_write_gives_the_exact_grant(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec, role: str | None
) -> None:
    _bucket(sandbox, spec, role)
    findings = bucket_findings(spec, hook)
    assert _rules(findings) == ["live.export-bucket-access"]
    agent = f"service-{hook.project_number(spec.project)}@gcp-sa-lustre.iam.gserviceaccount.com"
    assert agent in findings[0].rule
    assert findings[0].fix == (
        f"gcloud storage buckets add-iam-policy-binding gs://{spec.export_bucket_name} "
        f"--member serviceAccount:{agent} --role roles/storage.objectUser"
    )


@pytest.mark.parametrize("role", ["roles/storage.objectUser", "roles/storage.objectAdmin", "roles/storage.admin"])
def test_a_bucket_the_lustre_agent_can_write_passes(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec, role: str
) -> None:
    _bucket(sandbox, spec, role)
    assert bucket_findings(spec, hook) == []


def test_missing_reservation_and_missing_roce_profile_are_reported_together(
    sandbox: SandboxProcess, hook: GcpHook, project: str
) -> None:
    # us-west1-a offers no RoCE profile in the sandbox's world, and nobody reserved anything there.
    spec = RunSpec.from_conf({"project": project, "region": "us-west1", "zone": "us-west1-a"})
    findings = live_findings(spec, hook)
    # us-west1 has no A4 zone: no B200 quota is listed there either, and nobody made the bucket.
    assert _rules(findings) == ["live.export-bucket", "live.gpu-quota", "live.network-profile", "live.reservation"]
    by_rule = {f.rule_id: f for f in findings}
    reservation = by_rule["live.reservation"]
    assert reservation.param == "reservation"
    assert reservation.value == spec.reservation
    assert "us-west1-a" in reservation.rule
    assert "gcloud compute reservations create nemo-rl-reservation --project=" in reservation.fix
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
    findings = reservation_findings(spec, hook)
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
    findings = reservation_findings(spec, hook)
    assert _rules(findings) == ["live.reservation-capacity"]
    assert findings[0].value == {"count": 3, "in_use": 2, "free": 1}
    # On a ladder a busy reservation is no refusal: the run tries it, then falls to the next rung.
    ladder = RunSpec.from_conf({**spec.to_conf(), "capacity_ladder": ["reservation:60", "flex_start"]})
    assert reservation_findings(ladder, hook) == []


def test_h200_run_matches_an_h200_reservation(sandbox: SandboxProcess, hook: GcpHook, project: str) -> None:
    spec = RunSpec.from_conf({"project": project, "zone": ZONE, "gpu_type": "h200"})
    sandbox.seed_reservation(project, ZONE, spec.reservation, "a3-ultragpu-8g", 2)
    _bucket(sandbox, spec)
    assert live_findings(spec, hook) == []


def test_a_disabled_api_is_reported_with_the_enable_command(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec, disabled_lustre_api: str
) -> None:
    sandbox.seed_reservation(spec.project, ZONE, spec.reservation, spec.effective_machine_type, 2)
    _bucket(sandbox, spec)
    findings = live_findings(spec, hook)
    assert _rules(findings) == ["live.api-enabled"]
    assert disabled_lustre_api in findings[0].rule
    assert findings[0].fix == f"gcloud services enable {disabled_lustre_api} --project={spec.project}"
    assert disabled_lustre_api in REQUIRED_SERVICES


# --- reservations ----------------------------------------------------------------------------------------------
def test_a_shared_reservation_is_looked_up_in_its_owner_project(
    sandbox: SandboxProcess, hook: GcpHook, project: str
) -> None:
    owner = f"{project[:22]}-owner"
    spec = RunSpec.from_conf({"project": project, "zone": ZONE, "reservation": f"projects/{owner}/reservations/shared"})
    findings = reservation_findings(spec, hook)
    assert _rules(findings) == ["live.reservation"]
    assert f"project {owner}" in findings[0].rule
    assert f"--project={owner}" in findings[0].fix
    sandbox.seed_reservation(owner, ZONE, "shared", spec.effective_machine_type, spec.worker_replicas)
    assert reservation_findings(spec, hook) == []
    # Its GPUs count against the owner's quota, not this project's (which lists none in us-west1, say).
    elsewhere = RunSpec.from_conf({**spec.to_conf(), "region": "us-west1", "zone": "us-west1-a"})
    assert gpu_quota_findings(elsewhere, hook) == []


def test_a_shared_reservation_the_project_cannot_read_is_not_a_finding(
    sandbox: SandboxProcess, hook: GcpHook, project: str
) -> None:
    owner = f"{project[:22]}-owner"
    spec = RunSpec.from_conf({"project": project, "zone": ZONE, "reservation": f"projects/{owner}/reservations/shared"})
    sandbox.seed({"iam_denied": {owner: ["compute.reservations.get"]}})
    with pytest.raises(api_exceptions.Forbidden, match=r"Required 'compute\.reservations\.get' permission"):
        hook.reservations_client.get(project=owner, zone=ZONE, reservation="shared")
    assert reservation_findings(spec, hook) == []


def test_a_reservation_block_is_checked_through_its_reservation(
    sandbox: SandboxProcess, hook: GcpHook, project: str
) -> None:
    spec = RunSpec.from_conf({"project": project, "zone": ZONE, "reservation": "res/reservationBlocks/block-1"})
    sandbox.seed_reservation(project, ZONE, "res", spec.effective_machine_type, 1)
    findings = reservation_findings(spec, hook)
    assert _rules(findings) == ["live.reservation-capacity"]
    assert "reservation res/reservationBlocks/block-1 has 1 free" in findings[0].rule


# --- quota -----------------------------------------------------------------------------------------------------
def test_the_default_pools_n2_cpus_are_checked_against_the_regions_quota(
    quotas: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    # n2-highmem-80, one node in each of the region's three zones: 240 N2 vCPUs at cluster create.
    assert (spec.system_machine_type, spec.system_initial_nodes) == ("n2-highmem-80", 1)
    quotas.seed({"quotas": {"N2_CPUS": 200}})
    findings = cpu_quota_findings(spec, hook)
    assert _rules(findings) == ["live.cpu-quota"]
    assert findings[0].value == {"metric": "N2_CPUS", "free": 200.0, "needed": 240}
    assert "3 zones" in findings[0].rule
    _complete(findings[0])
    quotas.seed({"quotas": {"N2_CPUS": 240}})
    assert cpu_quota_findings(spec, hook) == []


def test_a_family_without_its_own_cpu_quota_counts_in_cpus(quotas: SandboxProcess, hook: GcpHook, project: str) -> None:
    spec = RunSpec.from_conf({"project": project, "zone": ZONE, "system_machine_type": "e2-standard-8"})
    quotas.seed({"quotas": {"CPUS": 16}})
    findings = cpu_quota_findings(spec, hook)
    assert findings[0].value == {"metric": "CPUS", "free": 16.0, "needed": 24}


@pytest.mark.parametrize(("limit", "expected"), [(8, ["live.gpu-quota"]), (16, []), (64, [])])
def test_the_b200_quota_is_read_from_the_gpu_family_metric(
    quotas: SandboxProcess, hook: GcpHook, spec: RunSpec, limit: int, expected: list[str]
) -> None:
    # regions.get lists no B200 metric (as on Google): the old check always ended "unknown" and passed.
    quotas.seed({"gpu_family_quotas": {"NVIDIA_B200": limit}})
    findings = gpu_quota_findings(spec, hook)
    assert _rules(findings) == expected
    if findings:
        assert findings[0].value == {"gpu_family": "NVIDIA_B200", "limit": float(limit), "needed": 16}
        assert GPU_FAMILY_METRIC in findings[0].rule
        assert "gpu_family=NVIDIA_B200" in findings[0].fix
        _complete(findings[0])


@pytest.mark.parametrize("capacity", ["spot", "flex_start"])
def test_spot_and_flex_start_are_checked_against_the_preemptible_gpu_quota(
    quotas: SandboxProcess, hook: GcpHook, spec: RunSpec, capacity: str
) -> None:
    # Plenty of on-demand quota, none preemptible: a Spot or flex-start run would get no node.
    quotas.seed({"gpu_family_quotas": {"NVIDIA_B200": 64}, "preemptible_gpu_family_quotas": {"NVIDIA_B200": 0}})
    other = RunSpec.from_conf({**spec.to_conf(), "capacity": capacity})
    findings = gpu_quota_findings(other, hook)
    assert _rules(findings) == ["live.gpu-quota"]
    assert PREEMPTIBLE_GPU_FAMILY_METRIC in findings[0].rule and "capacity" in findings[0].params
    assert "capacity=on_demand" in findings[0].fix
    _complete(findings[0])
    # The same quotas serve an on-demand run, and a reservation run as before.
    assert gpu_quota_findings(RunSpec.from_conf({**spec.to_conf(), "capacity": "on_demand"}), hook) == []
    assert gpu_quota_findings(spec, hook) == []


def test_every_rung_of_the_ladder_is_checked_against_its_own_gpu_quota(
    quotas: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    # The reservation rung has its on-demand quota; the Spot rung below it would get no node.
    quotas.seed({"gpu_family_quotas": {"NVIDIA_B200": 64}, "preemptible_gpu_family_quotas": {"NVIDIA_B200": 0}})
    ladder = RunSpec.from_conf({**spec.to_conf(), "capacity_ladder": ["reservation:900", "on_demand", "spot"]})
    findings = gpu_quota_findings(ladder, hook)
    assert _rules(findings) == ["live.gpu-quota"]
    assert "for capacity=spot)" in findings[0].rule and "capacity_ladder" in findings[0].params
    assert findings[0].fix.startswith("request at least 16 of ") and "take spot off capacity_ladder" in findings[0].fix
    _complete(findings[0])
    quotas.seed({"preemptible_gpu_family_quotas": {"NVIDIA_B200": 16}})
    assert gpu_quota_findings(ladder, hook) == []


def test_a_run_without_a_reservation_does_not_check_one(hook: GcpHook, spec: RunSpec) -> None:
    # No reservation seeded: the reservation run is refused, a Spot run needs none.
    assert _rules(reservation_findings(spec, hook)) == ["live.reservation"]
    assert reservation_findings(RunSpec.from_conf({**spec.to_conf(), "capacity": "spot"}), hook) == []


def test_the_h200_quota_is_its_family_without_the_memory_suffix(
    quotas: SandboxProcess, hook: GcpHook, project: str
) -> None:
    spec = RunSpec.from_conf({"project": project, "zone": ZONE, "gpu_type": "h200"})
    quotas.seed({"gpu_family_quotas": {"NVIDIA_H200": 0}})
    findings = gpu_quota_findings(spec, hook)
    assert findings[0].value["gpu_family"] == "NVIDIA_H200" and findings[0].value["limit"] == 0


def test_a_gpu_quota_not_listed_for_the_region_is_said_plainly(hook: GcpHook, project: str) -> None:
    spec = RunSpec.from_conf({"project": project, "region": "us-west1", "zone": "us-west1-a"})
    findings = gpu_quota_findings(spec, hook)
    assert _rules(findings) == ["live.gpu-quota"]
    assert findings[0].rule.startswith(f"project {project} has no NVIDIA_B200 GPU quota listed in region us-west1")
    assert "unknown" not in findings[0].rule


# --- GKE version ------------------------------------------------------------------------------------------------


@pytest.fixture
def old_default(sandbox: SandboxProcess) -> Iterator[SandboxProcess]:
    """GKE's default version in the sandbox set before flex-start GPU pools, for one test."""
    sandbox.seed({"gke_default_version": "1.31.6-gke.1020000"})
    yield sandbox
    sandbox.seed({"gke_default_version": "1.33.5-gke.1201000"})


def test_flex_start_on_gkes_default_version_is_checked_against_what_getserverconfig_says(
    old_default: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    # The offline rule passes an empty gke_version: only the live API knows the default it stands for.
    ladder = RunSpec.from_conf({**spec.to_conf(), "capacity_ladder": ["reservation:600", "flex_start"]})
    since = last_seq(old_default)
    [finding] = gke_version_findings(ladder, hook)
    assert finding.rule_id == "live.gke-version" and finding.value == "1.31.6-gke.1020000"
    assert f"GKE's default version in {spec.region} is 1.31.6-gke.1020000" in finding.rule
    assert finding.fix.startswith("set gke_version to 1.33.5-gke.1201000 or later") and "flex_start" in finding.fix
    _complete(finding)
    served = [c for c in api_calls(old_default, spec.project, since) if c["path"].endswith("/serverConfig")]
    assert served and served[0]["method"] == "GET" and served[0]["status"] == 200
    # A version that has flex-start passes; a run without flex-start does not ask at all.
    newer = RunSpec.from_conf({**ladder.to_conf(), "gke_version": "1.32"})
    assert gke_version_findings(newer, hook) == []
    since = last_seq(old_default)
    assert gke_version_findings(spec, hook) == []
    assert [c for c in api_calls(old_default, spec.project, since) if c["path"].endswith("/serverConfig")] == []


def test_a_gke_version_gke_does_not_offer_is_refused_before_the_networks_exist(hook: GcpHook, spec: RunSpec) -> None:
    # Well formed, so validate passes it; the cluster create would refuse it after the networks and subnets exist.
    unknown = RunSpec.from_conf({**spec.to_conf(), "gke_version": "1.30"})
    [finding] = gke_version_findings(unknown, hook)
    assert finding.rule_id == "live.gke-version" and finding.param == "gke_version" and finding.value == "1.30"
    assert "GKE does not offer 1.30 in us-central1" in finding.rule and "1.33.5-gke.1201000" in finding.rule
    assert "gcloud container get-server-config --location=us-central1" in finding.fix
    _complete(finding)
    assert gke_version_findings(RunSpec.from_conf({**spec.to_conf(), "gke_version": "1.33"}), hook) == []
