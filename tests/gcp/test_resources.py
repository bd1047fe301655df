"""ensure / delete_resource against the sandbox: real connection lookup, real google-cloud clients, real HTTP.

Each test works in its own project (see conftest). Operations are waited on by polling their GET path, which is
what the operators' trigger does; here a test helper does it synchronously.
"""

from __future__ import annotations

import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud import compute_v1
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.gcp.operations import COMPUTE, CONTAINER, LONGRUNNING
from nemo_rl_gke.gcp.resources import (
    DriftError,
    NotOwnedError,
    NotReadyError,
    ResourceFailedError,
    delete_resource,
    ensure,
    resources,
)
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.gcp.conftest import (
    FAST_RETRY,
    ZONE,
    api_calls,
    dump,
    ensure_done,
    last_seq,
    project_inventory,
    wait_for,
    wait_raw_compute,
)
from tests.owners import owner_of

CREATION_ORDER = [s.task_id for s in t.gcp_resources()]
# The deletions in the topology's teardown order; the node pool goes with its cluster.
TEARDOWN_ORDER = [target for s in t.teardown_steps() for target in s.deletes if target in CREATION_ORDER]
SHAPES = {"compute": COMPUTE, "container": CONTAINER, "lustre": LONGRUNNING, "servicenetworking": LONGRUNNING}


def _seed_reservation(sandbox: SandboxProcess, spec: RunSpec) -> None:
    # The node pool create checks that its reservation exists in the zone, as GKE does.
    sandbox.seed_reservation(spec.project, spec.zone, spec.reservation, spec.effective_machine_type, 4)


def _raw_networks(sandbox: SandboxProcess) -> compute_v1.NetworksClient:
    # Someone else's client: what a person with gcloud would do, without our ownership marker.
    return compute_v1.NetworksClient(credentials=sandbox.credentials(), client_options={"api_endpoint": sandbox.url})


def _cluster_create_fault(sandbox: SandboxProcess, spec: RunSpec, outcome: str) -> None:
    # The cluster's create operation ends in error, or never ends ("hang").
    sandbox.add_fault(
        {"method": "POST", "path": f"/projects/{spec.project}/locations/[^/]+/clusters$"}, operation=outcome
    )


def _provision(hook: GcpHook, spec: RunSpec, keys: list[str]) -> None:
    found = resources(spec, owner_of(spec))
    for key in keys:
        ensure_done(found[key], hook)


def test_the_hook_reaches_the_sandbox_through_the_connection(hook: GcpHook, project: str) -> None:
    # Connection from the env var, the sandbox's service-account key, the discovery client on the endpoint override.
    assert hook.project_id == project
    number = hook.project_number(project)
    assert number.isdigit()
    body = hook.execute(hook.resourcemanager.projects().get(projectId=project), what="projects.get")
    assert body["projectNumber"] == number


# ---------------------------------------------------------------------------------------------------------------------
# The whole run: create, re-ensure, tear down
# ---------------------------------------------------------------------------------------------------------------------
def test_provision_reensure_and_teardown_every_resource(sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec) -> None:
    _seed_reservation(sandbox, spec)
    found = resources(spec, owner_of(spec))
    assert list(found) == CREATION_ORDER

    # 1. Every resource is created, in creation order, each with an operation of its family's shape.
    for key, resource in found.items():
        result = ensure(resource, hook, adopt_existing=False)
        assert result.action == "created", key
        assert result.operation is not None, key
        assert result.operation.shape == SHAPES[result.operation.service], key
        assert result.operation.resource == resource.label
        status = wait_for(hook, result.operation)
        assert status.done and not status.failed, (key, status)
    for key, resource in found.items():
        actual = resource.get(hook)
        assert actual is not None, key
        assert resource.owned(actual), key
        assert resource.ready(actual), (key, resource.state(actual))
        assert resource.drift(actual) == [], key
    ours = project_inventory(sandbox, spec.project)
    names = {item["name"] for item in ours}
    assert {r.name for r in found.values() if r.key != t.PEERING} <= names, dump(ours)

    # 2. A second ensure of everything finds it all: 0 creates, 0 deletes, only reads.
    since = last_seq(sandbox)
    for key, resource in found.items():
        result = ensure(resource, hook, adopt_existing=False)
        assert result.action == "exists", key
        assert result.operation is None, key
    writes = [c for c in sandbox.calls(since) if c["method"] != "GET"]
    assert writes == [], dump(writes)

    # 3. Teardown in FACTS §4 order deletes everything; the node pool goes with its cluster.
    assert set(TEARDOWN_ORDER) == set(CREATION_ORDER) - {t.NODE_POOL}
    for key in TEARDOWN_ORDER:
        result = delete_resource(found[key], hook, used=True)
        assert result.action == "deleted", key
        assert result.operation is not None, key
        status = wait_for(hook, result.operation)
        assert status.done and not status.failed, (key, status)
    assert project_inventory(sandbox, spec.project) == []

    # 4. Deleting again: everything is absent (404 counts as done), nothing is sent.
    since = last_seq(sandbox)
    for key in [*TEARDOWN_ORDER, t.NODE_POOL]:
        assert delete_resource(found[key], hook, used=True).action == "absent", key
    assert [c for c in sandbox.calls(since) if c["method"] != "GET"] == []


def test_delete_of_missing_resources_is_absent(sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec) -> None:
    for key, resource in resources(spec, owner_of(spec)).items():
        assert delete_resource(resource, hook, used=True).action == "absent", key
        # The raw delete of a missing resource answers 404, which counts as done.
        if key != t.PEERING:
            assert resource.delete(hook) is None, key


# ---------------------------------------------------------------------------------------------------------------------
# Ownership and drift
# ---------------------------------------------------------------------------------------------------------------------
def test_unowned_network_is_refused_adopted_on_request_and_never_deleted(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    raw = _raw_networks(sandbox)
    # What `gcloud compute networks create NET --subnet-mode=auto` makes: no description, Google's defaults.
    theirs = compute_v1.Network(name=spec.network, auto_create_subnetworks=True)
    wait_raw_compute(sandbox, spec.project, raw.insert_unary(project=spec.project, network_resource=theirs))
    net = resources(spec, owner_of(spec))[t.NET]

    since = last_seq(sandbox)
    with pytest.raises(NotOwnedError) as refused:
        ensure(net, hook, adopt_existing=False)
    message = str(refused.value)
    assert f"network {spec.network}" in message
    assert "adopt_existing=true" in message
    assert "no owner record of this package in its description" in message
    assert not refused.value.retryable
    assert [c for c in api_calls(sandbox, spec.project, since) if c["method"] != "GET"] == []

    adopted = ensure(net, hook, adopt_existing=True)
    assert adopted.action == "adopted"
    assert adopted.operation is None

    assert delete_resource(net, hook, used=True).action == "kept-unowned"
    assert raw.get(project=spec.project, network=spec.network).name == spec.network
    assert [c for c in api_calls(sandbox, spec.project, since) if c["method"] == "DELETE"] == []


def test_drift_is_refused_with_the_field_named_and_never_retried(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    _provision(hook, spec, [t.GVNIC_NET])
    subnet = resources(spec, owner_of(spec))[t.GVNIC_SUB]
    # Our own subnet from an earlier run with another range: owned, but not what this conf asks for.
    other = compute_v1.Subnetwork(subnet.request.message)
    other.ip_cidr_range = "10.10.0.0/24"
    client = compute_v1.SubnetworksClient(
        credentials=sandbox.credentials(), client_options={"api_endpoint": sandbox.url}
    )
    operation = client.insert_unary(project=spec.project, region=spec.region, subnetwork_resource=other)
    wait_raw_compute(sandbox, spec.project, operation, spec.region)

    since = last_seq(sandbox)
    with pytest.raises(DriftError) as drifted:
        ensure(subnet, hook, adopt_existing=False)
    assert drifted.value.diff == ['ipCidrRange: expected "192.168.0.0/24", found "10.10.0.0/24"']
    assert "ipCidrRange" in str(drifted.value)
    assert f"subnet {spec.gvnic_subnet}" in str(drifted.value)
    # One read, no write, no retry.
    calls = api_calls(sandbox, spec.project, since)
    assert [(c["method"], c["status"]) for c in calls] == [("GET", 200)], dump(calls)


def test_unowned_and_drifted_subnet_is_refused_as_unowned_then_as_drift(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    _provision(hook, spec, [t.RDMA_NET])
    subnet = resources(spec, owner_of(spec))[t.RDMA_SUBS[3]]
    theirs = compute_v1.Subnetwork(subnet.request.message)
    theirs.description = ""
    theirs.ip_cidr_range = "10.20.0.0/24"
    client = compute_v1.SubnetworksClient(
        credentials=sandbox.credentials(), client_options={"api_endpoint": sandbox.url}
    )
    operation = client.insert_unary(project=spec.project, region=spec.region, subnetwork_resource=theirs)
    wait_raw_compute(sandbox, spec.project, operation, spec.region)
    with pytest.raises(NotOwnedError):
        ensure(subnet, hook, adopt_existing=False)
    with pytest.raises(DriftError, match="ipCidrRange"):
        ensure(subnet, hook, adopt_existing=True)


# ---------------------------------------------------------------------------------------------------------------------
# Transient and permanent errors
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_transient_error_on_create_is_retried(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec, status: int
) -> None:
    path = f"/projects/{spec.project}/global/networks$"
    sandbox.add_fault({"method": "POST", "path": path}, status=status)
    result = ensure_done(resources(spec, owner_of(spec))[t.NET], hook)
    assert result.action == "created"
    posts = [c for c in api_calls(sandbox, spec.project) if c["method"] == "POST"]
    assert [c["status"] for c in posts] == [status, 200], dump(posts)
    assert posts[0]["fault"]


def test_transient_error_of_a_discovery_api_is_retried(sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec) -> None:
    # Resource Manager (googleapiclient, HttpError) under the same policy as the google-cloud clients.
    sandbox.add_fault({"method": "GET", "path": f"^/v1/projects/{spec.project}$"}, status=503, times=2)
    assert hook.project_number(spec.project).isdigit()
    gets = [c for c in api_calls(sandbox, spec.project) if c["path"] == f"/v1/projects/{spec.project}"]
    assert [c["status"] for c in gets] == [503, 503, 200]


def test_transient_errors_are_retried_a_bounded_number_of_times(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    sandbox.add_fault({"method": "POST", "path": f"/projects/{spec.project}/global/networks$"}, status=503, times=None)
    with pytest.raises(api_exceptions.ServiceUnavailable):
        ensure(resources(spec, owner_of(spec))[t.NET], hook, adopt_existing=False)
    posts = [c for c in api_calls(sandbox, spec.project) if c["method"] == "POST"]
    assert len(posts) == FAST_RETRY.attempts


@pytest.mark.parametrize(("status", "error"), [(400, api_exceptions.BadRequest), (403, api_exceptions.Forbidden)])
def test_permanent_error_is_not_retried(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec, status: int, error: type[Exception]
) -> None:
    sandbox.add_fault({"method": "POST", "path": f"/projects/{spec.project}/global/networks$"}, status=status)
    with pytest.raises(error):
        ensure(resources(spec, owner_of(spec))[t.NET], hook, adopt_existing=False)
    posts = [c for c in api_calls(sandbox, spec.project) if c["method"] == "POST"]
    assert [c["status"] for c in posts] == [status]


def test_a_create_answered_409_is_read_back_as_ours(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A concurrent run (or a create that went through before a dropped connection) made it between our get and
    # our create: the create answers 409, ensure reads it back, and it carries our marker.
    net = resources(spec, owner_of(spec))[t.NET]
    ensure_done(net, hook)
    real_get = type(net).get
    reads: list[str] = []

    def get_missing_once(self: object, h: GcpHook) -> dict | None:
        reads.append("get")
        return None if len(reads) == 1 else real_get(net, h)

    monkeypatch.setattr(type(net), "get", get_missing_once)
    result = ensure(net, hook, adopt_existing=False)
    assert result.action == "created"
    posts = [c for c in api_calls(sandbox, spec.project) if c["method"] == "POST"]
    assert [c["status"] for c in posts] == [200, 409]
    assert reads == ["get", "get"]


def test_failed_operation_leaves_a_failed_resource_that_ensure_refuses(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    _provision(hook, spec, [t.NET])
    sandbox.add_fault(
        {"method": "POST", "path": f"/projects/{spec.project}/locations/[^/]+/clusters$"}, operation="error"
    )
    cluster = resources(spec, owner_of(spec))[t.GKE_CLUSTER]
    result = ensure(cluster, hook, adopt_existing=False)
    assert result.operation is not None
    assert wait_for(hook, result.operation).failed
    actual = cluster.get(hook)
    assert actual is not None and cluster.state(actual) == "ERROR"
    with pytest.raises(ResourceFailedError, match="ERROR"):
        ensure(cluster, hook, adopt_existing=False)
    # Teardown still removes it: it is ours.
    deleted = delete_resource(cluster, hook, used=True)
    assert deleted.action == "deleted"
    assert not wait_for(hook, deleted.operation).failed  # type: ignore[arg-type]
    assert cluster.get(hook) is None


# ---------------------------------------------------------------------------------------------------------------------
# A resource found mid-create
# ---------------------------------------------------------------------------------------------------------------------
def test_cluster_still_provisioning_is_waited_on_through_its_listed_operation(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    _provision(hook, spec, [t.NET])
    sandbox.add_fault(
        {"method": "POST", "path": f"/projects/{spec.project}/locations/[^/]+/clusters$"}, operation="hang"
    )
    cluster = resources(spec, owner_of(spec))[t.GKE_CLUSTER]
    first = ensure(cluster, hook, adopt_existing=False)
    assert first.action == "created" and first.operation is not None
    actual = cluster.get(hook)
    assert actual is not None and cluster.state(actual) == "PROVISIONING"

    # GKE's operations.list names the project by number in targetLink; the match must not depend on it.
    again = ensure(cluster, hook, adopt_existing=False)
    assert again.action == "exists"
    assert again.operation == first.operation  # the same GET path: the trigger waits on the running create


def test_still_provisioning_without_a_listed_operation_is_not_ready(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    _provision(hook, spec, [t.NET])
    sandbox.add_fault(
        {"method": "POST", "path": f"/projects/{spec.project}/locations/[^/]+/clusters$"}, operation="hang"
    )
    cluster = resources(spec, owner_of(spec))[t.GKE_CLUSTER]
    ensure(cluster, hook, adopt_existing=False)

    def not_served(**kwargs: object) -> None:
        raise api_exceptions.NotFound("operations.list is not served here")

    monkeypatch.setattr(hook.container_client, "list_operations", not_served, raising=False)
    with pytest.raises(NotReadyError, match="PROVISIONING") as not_ready:
        ensure(cluster, hook, adopt_existing=False)
    assert not_ready.value.retryable


def test_lustre_still_creating_is_waited_on_through_its_listed_operation(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    _provision(hook, spec, [t.NET, t.PEERING_RANGE, t.PEERING])
    sandbox.add_fault(
        {"method": "POST", "path": f"/projects/{spec.project}/locations/{ZONE}/instances$"}, operation="hang"
    )
    lustre = resources(spec, owner_of(spec))[t.LUSTRE]
    first = ensure(lustre, hook, adopt_existing=False)
    assert first.operation is not None
    actual = lustre.get(hook)
    assert actual is not None and lustre.state(actual) == "CREATING"

    again = ensure(lustre, hook, adopt_existing=False)
    assert again.action == "exists"
    assert again.operation == first.operation


def test_the_lustre_firewall_takes_the_range_google_picked_and_goes_before_the_network(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    # Google's GKE Managed Lustre guide: tcp 988 and 6988 from the private-services range, on the main network.
    _provision(hook, spec, [t.NET, t.PEERING_RANGE, t.LUSTRE_FW])
    found = resources(spec, owner_of(spec))
    address = found[t.PEERING_RANGE].get(hook)
    rule = found[t.LUSTRE_FW].get(hook)
    assert address is not None and rule is not None
    assert rule["sourceRanges"] == [f"{address['address']}/{address['prefixLength']}"]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["988", "6988"]}]
    assert rule["network"].endswith(f"/global/networks/{spec.network}")
    assert found[t.LUSTRE_FW].drift(rule) == []
    assert ensure(found[t.LUSTRE_FW], hook, adopt_existing=False).action == "exists"
    for key in (t.LUSTRE_FW, t.PEERING_RANGE, t.NET):
        result = delete_resource(found[key], hook, used=True)
        assert result.action == "deleted" and result.operation is not None, key
        assert wait_for(hook, result.operation).error == "", key
    assert found[t.NET].get(hook) is None
