"""Production hooks with a non-anonymous connection (the sandbox's service-account key) against the strict sandbox:
google-auth's JWT grant and self-signed JWTs, refresh across token expiry, and the Kubernetes clients' bearer token."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.async_hooks import GcpAsyncHook
from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.kube.async_client import AsyncKubeHook
from nemo_rl_gke.kube.client import KubeHook
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.gcp.conftest import ensure_done, last_seq
from tests.owners import owner_of

# Shorter than google-auth's refresh margin (225 s) and the kube hook's (300 s): every use renews the access token,
# and a self-signed JWT (an hour by google-auth's clock) is refused once this has passed since its iat.
SHORT_LIFETIME_S = 2


@pytest.fixture
def short_tokens(sandbox: SandboxProcess) -> Iterator[None]:
    """Tokens (and self-signed JWTs) valid for two seconds, for this test only."""
    sandbox.set_token_lifetime(SHORT_LIFETIME_S)
    yield
    sandbox.set_token_lifetime(3600)


@pytest.fixture
def cluster_spec(spec: RunSpec, hook: GcpHook) -> RunSpec:
    """A running GKE cluster (its network first) in the test's project."""
    found = resources(spec, owner_of(spec))
    for key in (t.NET, t.GKE_CLUSTER):
        ensure_done(found[key], hook)
    return spec


def _google_calls(hook: GcpHook, spec: RunSpec) -> None:
    """One call per client family: compute and GKE (GAPIC REST), Resource Manager (discovery)."""
    list(hook.call(hook.networks_client.list, project=spec.project, what="networks.list"))
    hook.call(hook.container_client.list_clusters, parent=spec.cluster_parent, what="clusters.list")
    hook.execute(hook.resourcemanager.projects().get(projectId=spec.project), what="projects.get")


def _verdicts(sandbox: SandboxProcess, since: int) -> list[tuple[str, str]]:
    return [(c["service"] or c["path"], c["auth"]) for c in sandbox.calls(since)]


def test_gcp_hook_keeps_working_across_token_expiry(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec, short_tokens: None
) -> None:
    issued = sandbox.auth_status()["tokens_issued"]
    seq = last_seq(sandbox)
    _google_calls(hook, spec)
    assert all(verdict == "valid" for _, verdict in _verdicts(sandbox, seq)), _verdicts(sandbox, seq)
    time.sleep(SHORT_LIFETIME_S + 0.5)
    seq = last_seq(sandbox)
    _google_calls(hook, spec)
    after = sandbox.calls(seq)
    # The GAPIC clients' self-signed JWTs are refused once past the lifetime; AuthorizedSession makes a new one and
    # retries once. The discovery client renews its access token by the JWT grant before it expires.
    compute = [c["auth"] for c in after if c["service"] == "compute"]
    container = [c["auth"] for c in after if c["service"] == "container"]
    assert compute == ["expired", "valid"] and container == ["expired", "valid"], after
    assert [c["auth"] for c in after if c["path"] == f"/v1/projects/{spec.project}"] == ["valid"]
    assert all(c["status"] == 200 for c in after if c["auth"] == "valid")
    assert sandbox.auth_status()["tokens_issued"] >= issued + 2


def test_the_sync_kube_hook_sends_a_bearer_token_and_renews_it(
    sandbox: SandboxProcess, cluster_spec: RunSpec, hook: GcpHook, short_tokens: None
) -> None:
    kube = KubeHook(cluster_spec, hook)
    seq = last_seq(sandbox)
    assert kube.request("GET", "/api/v1/namespaces")["kind"] == "NamespaceList"
    time.sleep(SHORT_LIFETIME_S + 0.5)
    assert kube.request("GET", "/api/v1/namespaces")["kind"] == "NamespaceList"
    kube_calls = [c for c in sandbox.calls(seq) if c["service"] == "kubernetes"]
    assert [(c["status"], c["auth"]) for c in kube_calls] == [(200, "valid"), (200, "valid")]


def test_the_kube_client_configuration_really_carries_the_header(cluster_spec: RunSpec, hook: GcpHook) -> None:
    # kubernetes 36 adds the header only for an api_key it already holds under 'BearerToken' (FACTS §19).
    config: kubernetes.client.Configuration = KubeHook(cluster_spec, hook).api_client.configuration
    header = config.auth_settings()["BearerToken"]
    assert header["key"] == "authorization" and header["value"].startswith("Bearer ya29.")


def test_async_hooks_send_the_token_and_renew_it(
    sandbox: SandboxProcess, cluster_spec: RunSpec, short_tokens: None
) -> None:
    async def twice() -> list[Any]:
        answers = []
        async with GcpAsyncHook() as gcp, AsyncKubeHook("google_cloud_default", cluster_spec.cluster_path) as kube:
            for _ in range(2):
                answers.append(await gcp.get_json("container", f"/v1/{cluster_spec.cluster_path}"))
                answers.append(await kube.get("/api/v1/namespaces/default"))
                await asyncio.sleep(SHORT_LIFETIME_S + 0.5)
        return answers

    seq = last_seq(sandbox)
    answers = asyncio.run(twice())
    clusters, namespaces = answers[0::2], answers[1::2]
    assert [c["status"] for c in clusters] == ["RUNNING"] * 2
    assert [n["kind"] for n in namespaces] == ["Namespace"] * 2
    logged = sandbox.calls(seq)
    assert logged and all(c["auth"] == "valid" and c["status"] == 200 for c in logged), logged
