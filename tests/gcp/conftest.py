"""Fixtures for the GCP actions against the local sandbox: real connection lookup, real clients, real HTTP.

One sandbox per test module (started by PID, stopped by PID). Every test works in a project of its own, so tests
share the sandbox without seeing each other's resources; the sandbox accepts any valid project ID.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sandbox.testing import SandboxProcess, request_json, start_sandbox

from nemo_rl_gke.gcp.hooks import GcpHook, RetryPolicy
from nemo_rl_gke.gcp.operations import OperationRef, OperationStatus, operation_status
from nemo_rl_gke.gcp.resources import ActionResult, Resource, ensure, resources
from nemo_rl_gke.run.spec import RunSpec
from tests.owners import owner_of

# Operations take 1/1000 of their modelled time: Lustre 0.6 s, a cluster 0.4 s. Enough to be seen running.
LATENCY_SCALE = 0.001
# Transient retries in tests: the same policy shape, milliseconds instead of seconds.
FAST_RETRY = RetryPolicy(attempts=4, initial_s=0.01, maximum_s=0.05)
ZONE = "us-central1-b"  # a RoCE zone of the sandbox's default world
_projects = itertools.count(1)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    """A sandbox for this module, with operations fast but not instant."""
    with start_sandbox(tmp_path_factory.mktemp("gcp-sandbox"), latency_scale=LATENCY_SCALE) as running:
        yield running


@pytest.fixture
def project(request: pytest.FixtureRequest) -> str:
    """A project ID of this test's own (6-30 characters: lowercase letters, digits, hyphens)."""
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:18].strip("-")
    return f"t{next(_projects)}-{os.getpid() % 1000}-{stem}".strip("-")[:30].rstrip("-")


@pytest.fixture
def spec(project: str) -> RunSpec:
    """The tutorial's run (RunSpec defaults) in the test's project, validated like a trigger conf."""
    return RunSpec.from_conf({"project": project, "region": "us-central1", "zone": ZONE})


@pytest.fixture
def hook(sandbox: SandboxProcess, project: str, monkeypatch: pytest.MonkeyPatch) -> GcpHook:
    """A GcpHook built from google_cloud_default, given as an env var connection pointing at the sandbox with its
    service-account key (google-auth's real token flow)."""
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", sandbox.connection_json(project))
    return GcpHook(retry_policy=FAST_RETRY)


def wait_for(hook: GcpHook, operation: OperationRef, timeout_s: float = 30.0) -> OperationStatus:
    """Poll an operation's GET path (the endpoint of its service) until it is done; its final status."""
    base = hook.endpoint(operation.service)
    assert base, f"no endpoint for {operation.service}"
    deadline = time.monotonic() + timeout_s
    while True:
        status = operation_status(operation.shape, request_json(base + operation.path))
        if status.done:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"{operation.resource}: still {status.state} after {timeout_s}s")
        time.sleep(0.02)


def ensure_done(resource: Resource, hook: GcpHook, adopt_existing: bool = False) -> ActionResult:
    """Ensure, then wait on the operation it hands back (what the operator's deferral does); fail on its error."""
    result = ensure(resource, hook, adopt_existing)
    if result.operation is not None:
        status = wait_for(hook, result.operation)
        assert not status.failed, f"{resource.label}: {status.error}"
    return result


def ensure_cluster_with_gpu_pool(spec: RunSpec, hook: GcpHook) -> None:
    """Every GCP resource of ``spec`` made and ready, its GPU pool on on-demand capacity (no reservation needed):
    a RayCluster's workers get nodes only from a GPU pool, as on GKE."""
    from nemo_rl_gke.run import capacity
    from nemo_rl_gke.run.conf_schema import ON_DEMAND

    pool_spec = capacity.on_rung(spec, ON_DEMAND)
    for resource in resources(pool_spec, owner_of(pool_spec)).values():
        ensure_done(resource, hook)


def project_inventory(sandbox: SandboxProcess, project: str) -> list[dict[str, Any]]:
    """The sandbox's live resources of one project (connections are named by project number)."""
    return [r for r in sandbox.inventory() if f"projects/{project}/" in r["path"] or r.get("project") == project]


def api_calls(sandbox: SandboxProcess, project: str, since: int = 0) -> list[dict[str, Any]]:
    """The API calls of one project (by path) logged after sequence number ``since``."""
    return [c for c in sandbox.calls(since) if f"/projects/{project}" in c["path"]]


def last_seq(sandbox: SandboxProcess) -> int:
    """The sequence number of the newest logged call (0 when none)."""
    logged = sandbox.calls()
    return logged[-1]["seq"] if logged else 0


def dump(value: Any) -> str:
    """Pretty JSON, for assertion messages."""
    return json.dumps(value, indent=1, default=str)


def wait_raw_compute(sandbox: SandboxProcess, project: str, operation: Any, region: str | None = None) -> None:
    """Wait for a compute operation started with a raw client's ``*_unary`` call.

    Not ``ExtendedOperation.result()``: google-cloud-compute builds that poller without the client's
    ``client_options``, so it polls compute.googleapis.com whatever the endpoint override says.
    """
    scope = f"regions/{region}" if region else "global"
    path = f"/compute/v1/projects/{project}/{scope}/operations/{operation.name}"
    ref = OperationRef("compute", path, "compute", operation.name)
    deadline = time.monotonic() + 30
    while not operation_status(ref.shape, request_json(sandbox.url + path)).done:
        assert time.monotonic() < deadline, f"{path} never finished"
        time.sleep(0.02)


def raycluster_trigger(spec: RunSpec, wait_for: str = "ready", timeout: float = 120.0) -> Any:
    """The RayCluster wait's trigger for ``spec``'s RayCluster, polling every 0.2 s."""
    from nemo_rl_gke.triggers.raycluster import RayClusterTrigger

    return RayClusterTrigger(
        cluster_path=spec.cluster_path,
        namespace=spec.namespace,
        name=spec.raycluster_name,
        wait_for=wait_for,
        poll_interval=0.2,
        timeout=timeout,
    )


async def first_event(trigger: Any, timeout: float = 150.0) -> dict[str, Any]:
    """A trigger's first event's payload, failing after ``timeout`` seconds."""
    import asyncio

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return await asyncio.wait_for(first(), timeout)
