"""Google's limits a project shares among every run in it, as the sandbox enforces them and the package meets them:
the size of the project's common instance metadata (where the leases live) and the per-project API rate quotas."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.hooks import GcpHook, is_transient
from nemo_rl_gke.gcp.lease import METADATA_LIMIT_BYTES, MetadataFullError, acquire, read_lease
from nemo_rl_gke.run.ownership import Owner


def _set_metadata(hook: GcpHook, project: str, items: dict[str, str]) -> None:
    client = hook.compute("projects")
    found = client.get(project=project).common_instance_metadata
    metadata = compute_v1.Metadata(
        fingerprint=found.fingerprint, items=[compute_v1.Items(key=k, value=v) for k, v in items.items()]
    )
    client.set_common_instance_metadata(project=project, metadata_resource=metadata).result(timeout=30)


def test_metadata_past_its_size_limit_is_refused_as_compute_refuses_it(hook: GcpHook, project: str) -> None:
    with pytest.raises(exceptions.BadRequest) as refused:
        _set_metadata(hook, project, {"a": "x" * 262_144, "b": "y" * 262_144, "c": "z"})
    assert "Metadata size exceeds the limit" in str(refused.value) and "524288" in str(refused.value)
    with pytest.raises(exceptions.BadRequest, match=r"metadata.items\[0\].value' is too large"):
        _set_metadata(hook, project, {"big": "x" * 262_145})
    _set_metadata(hook, project, {"a": "x" * 262_144, "b": "y" * 200_000})  # under the limit: written


def test_a_run_that_meets_the_limit_fails_before_anything_saying_what_to_clean(hook: GcpHook, project: str) -> None:
    # Someone's keys leave less room than one lease record needs.
    junk = {"ssh-keys": "k" * 262_100, "startup-blob": "s" * (METADATA_LIMIT_BYTES - 262_100 - 60)}
    _set_metadata(hook, project, junk)
    owner = Owner("default", "nemo-rl-cluster-abcdef12", "nemo_rl_grpo_gke/manual__1")
    with pytest.raises(MetadataFullError) as full:
        acquire(hook, project, owner, 600, names={"cluster_name": "c"})
    said = str(full.value)
    assert f"project {project}'s common instance metadata would be" in said
    assert "over Compute's limit of 524,288 bytes" in said and "nothing was started" in said
    assert "the largest: startup-blob (262,140 B), ssh-keys (262,108 B)." in said, said
    assert "run the nemo_rl_gke_sweeper DAG" in said
    assert f"gcloud compute project-info remove-metadata --project {project} --keys=KEY,..." in said
    assert read_lease(hook, project, owner.group) is None


@pytest.fixture
def small_quotas(sandbox: SandboxProcess) -> Iterator[None]:
    """Rate quotas of a few requests, put back to Google's defaults after the test."""
    sandbox.reset()
    sandbox.seed({"rate_quotas": {"compute.read": 5, "container.requests": 3}})
    yield
    sandbox.seed({"rate_quotas": {"compute.read": 1500, "container.requests": 5000}})
    sandbox.reset()


@pytest.mark.usefixtures("small_quotas")
def test_a_project_past_its_compute_read_quota_gets_403_rate_limit_exceeded(hook: GcpHook, project: str) -> None:
    client = hook.compute("projects")
    for _ in range(5):
        client.get(project=project)
    with pytest.raises(exceptions.Forbidden) as limited:
        client.get(project=project)
    assert "Quota exceeded for quota metric 'compute.googleapis.com/read_requests'" in str(limited.value)
    assert [e["reason"] for e in limited.value.errors] == ["rateLimitExceeded"]
    # The hooks wait and retry it: it is a rate quota, not a permission.
    assert is_transient(limited.value)
    # The mutation methods are another group: still allowed.
    _ = hook.compute("global_operations")


@pytest.mark.usefixtures("small_quotas")
def test_a_project_past_its_gke_quota_gets_429(hook: GcpHook, project: str, sandbox: SandboxProcess) -> None:
    import urllib.request

    path = f"{sandbox.url}/v1/projects/{project}/locations/us-central1-b/clusters"
    statuses = []
    for _ in range(4):
        request = urllib.request.Request(path, headers=sandbox.auth_headers())
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                statuses.append(answer.status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)
            body = exc.read().decode()
    assert statuses == [200, 200, 200, 429]
    assert '"status":"RESOURCE_EXHAUSTED"' in body and '"reason":"RATE_LIMIT_EXCEEDED"' in body
    # Another project has its own quota.
    other = f"{sandbox.url}/v1/projects/{project}-b/locations/us-central1-b/clusters"
    with urllib.request.urlopen(urllib.request.Request(other, headers=sandbox.auth_headers()), timeout=30) as answer:
        assert answer.status == 200
