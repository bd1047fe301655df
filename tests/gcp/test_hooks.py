"""GcpHook: connection extras -> endpoints and credentials; the transient-error policy."""

from __future__ import annotations

import json
import re

import httplib2
import pytest
from google.api_core import exceptions as api_exceptions
from google.auth.credentials import AnonymousCredentials
from googleapiclient.errors import HttpError
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.hooks import GcpHook, RetryPolicy, is_transient, retry_transient
from nemo_rl_gke.gcp.resources import ensure, resources
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.gcp.conftest import FAST_RETRY, ensure_done
from tests.owners import owner_of


def _connection(monkeypatch: pytest.MonkeyPatch, **extra: object) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )


def _http_error(status: int) -> HttpError:
    return HttpError(httplib2.Response({"status": status}), b'{"error": {"message": "x"}}')


def test_endpoints_come_from_the_connection_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    _connection(
        monkeypatch,
        is_anonymous=True,
        project="conn-project",
        api_endpoint="http://127.0.0.1:9999/",
        endpoints={"container": "http://127.0.0.1:7777"},
    )
    hook = GcpHook()
    assert isinstance(hook.get_credentials(), AnonymousCredentials)
    assert hook.project_id == "conn-project"
    assert hook.endpoint("compute") == "http://127.0.0.1:9999"
    assert hook.endpoint("container") == "http://127.0.0.1:7777"  # the per-service override wins
    assert hook.networks_client.api_endpoint == "http://127.0.0.1:9999"
    assert hook.container_client.api_endpoint == "http://127.0.0.1:7777"
    assert hook.lustre_client.api_endpoint == "http://127.0.0.1:9999"
    assert hook.container_client.transport.kind == "rest"
    assert hook.lustre_client.transport.kind == "rest"
    assert hook.servicenetworking._baseUrl == "http://127.0.0.1:9999/"
    # Cached: one client per kind for the hook's lifetime.
    assert hook.networks_client is hook.networks_client
    assert hook.servicenetworking is hook.servicenetworking


def test_without_overrides_the_clients_use_googles_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    _connection(monkeypatch, is_anonymous=True, project="conn-project")
    hook = GcpHook()
    assert hook.endpoint("compute") is None
    assert hook.networks_client.api_endpoint == "compute.googleapis.com"
    assert hook.container_client.api_endpoint == "container.googleapis.com"
    assert hook.servicenetworking._baseUrl == "https://servicenetworking.googleapis.com/"


@pytest.mark.parametrize(
    "exc",
    [
        api_exceptions.TooManyRequests("x"),
        api_exceptions.InternalServerError("x"),
        api_exceptions.BadGateway("x"),
        api_exceptions.ServiceUnavailable("x"),
        api_exceptions.GatewayTimeout("x"),
        api_exceptions.DeadlineExceeded("x"),
        _http_error(429),
        _http_error(500),
        _http_error(502),
        _http_error(503),
        _http_error(504),
        ConnectionResetError(),
    ],
    ids=repr,
)
def test_transient_errors(exc: Exception) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        api_exceptions.BadRequest("x"),
        api_exceptions.Forbidden("x"),
        api_exceptions.NotFound("x"),
        api_exceptions.Conflict("x"),
        api_exceptions.AlreadyExists("x"),
        _http_error(400),
        _http_error(403),
        _http_error(404),
        _http_error(409),
        ValueError("x"),
    ],
    ids=repr,
)
def test_permanent_errors(exc: Exception) -> None:
    assert not is_transient(exc)


def test_retry_is_bounded_and_backs_off_exponentially(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("nemo_rl_gke.gcp.hooks.time.sleep", sleeps.append)
    monkeypatch.setattr("nemo_rl_gke.gcp.hooks.random.uniform", lambda low, high: high)  # the jitter's ceiling
    calls: list[int] = []

    def always_unavailable() -> None:
        calls.append(1)
        raise api_exceptions.ServiceUnavailable("down")

    policy = RetryPolicy(attempts=5, initial_s=1.0, maximum_s=4.0, multiplier=2.0)
    with pytest.raises(api_exceptions.ServiceUnavailable):
        retry_transient(always_unavailable, what="test", policy=policy)
    assert len(calls) == 5
    assert sleeps == [1.0, 2.0, 4.0, 4.0]


def test_retry_gives_up_at_once_on_a_permanent_error() -> None:
    calls: list[int] = []

    def bad_request() -> None:
        calls.append(1)
        raise api_exceptions.BadRequest("no")

    with pytest.raises(api_exceptions.BadRequest):
        retry_transient(bad_request, what="test", policy=RetryPolicy(initial_s=0.0))
    assert calls == [1]


# --- retries by reason, against the sandbox's real error bodies (issue 17 item 4) ---------------------------------
FAST_BUSY = RetryPolicy(attempts=40, initial_s=0.02, maximum_s=0.1)


def _calls(sandbox: SandboxProcess, path: str, since: int) -> list[int]:
    return [c["status"] for c in sandbox.calls(since) if re.search(path, c["path"])]


def test_rate_limited_403_429_and_503_are_retried_a_permission_403_is_not(
    sandbox: SandboxProcess, hook: GcpHook, project: str
) -> None:
    networks = f"/projects/{project}/global/networks$"
    since = len(sandbox.calls())
    sandbox.add_fault({"method": "GET", "path": networks}, status=403, reason="rateLimitExceeded", times=1)
    sandbox.add_fault({"method": "GET", "path": networks}, status=403, reason="userRateLimitExceeded", nth=2)
    sandbox.add_fault({"method": "GET", "path": networks}, status=429, nth=3)
    sandbox.add_fault({"method": "GET", "path": networks}, status=503, nth=4)
    hook = GcpHook(retry_policy=RetryPolicy(attempts=6, initial_s=0.01, maximum_s=0.02))
    listed = hook.call(hook.networks_client.list, project=project, what="list networks")
    assert list(listed) == []
    assert _calls(sandbox, networks, since) == [403, 403, 429, 503, 200]

    # The same through the discovery client (googleapiclient's HttpError).
    number = f"^/v1/projects/{project}$"
    since = len(sandbox.calls())
    sandbox.add_fault({"path": number}, status=403, reason="rateLimitExceeded")
    assert hook.execute(hook.resourcemanager.projects().get(projectId=project), what="projects.get")["projectId"]
    assert _calls(sandbox, number, since) == [403, 200]

    # A 403 without a rate reason is a missing permission: it fails at once.
    since = len(sandbox.calls())
    sandbox.add_fault({"method": "GET", "path": networks}, status=403, message="Required 'compute.networks.list'")
    with pytest.raises(api_exceptions.Forbidden):
        hook.call(hook.networks_client.list, project=project, what="list networks")
    assert _calls(sandbox, networks, since) == [403]


def test_node_pool_create_is_retried_through_the_cluster_s_running_create(
    sandbox: SandboxProcess, hook: GcpHook, spec: RunSpec
) -> None:
    # Real GKE refuses a node pool create while the cluster's own operation runs: 400 FAILED_PRECONDITION
    # "Cluster is running incompatible operation". Retried for minutes by reason, not failed as a permanent 400.
    found = resources(spec, owner_of(spec))
    for key in (t.NET, t.GVNIC_NET, t.GVNIC_SUB, t.RDMA_NET, *t.RDMA_SUBS):
        ensure_done(found[key], hook)
    sandbox.seed_reservation(spec.project, spec.zone, spec.reservation, spec.effective_machine_type, 2)
    busy = GcpHook(retry_policy=FAST_RETRY, busy_policy=FAST_BUSY)
    cluster = ensure(found[t.GKE_CLUSTER], busy, adopt_existing=False)
    assert cluster.operation is not None
    since = len(sandbox.calls())
    pool = ensure(found[t.NODE_POOL], busy, adopt_existing=False)
    assert pool.action == "created" and pool.operation is not None
    posts = [c for c in sandbox.calls(since) if c["method"] == "POST" and c["path"].endswith("/nodePools")]
    assert [c["status"] for c in posts][-1] == 200
    assert 400 in [c["status"] for c in posts], "the sandbox should have refused the create while the cluster ran"


def test_a_busy_refusal_is_bounded_and_a_permanent_400_fails_at_once(
    sandbox: SandboxProcess, hook: GcpHook, project: str
) -> None:
    networks = f"/projects/{project}/global/networks$"
    sandbox.add_fault(
        {"method": "GET", "path": networks},
        status=400,
        message="There is a peering operation in progress on the local or peer network. Try again later.",
        times=None,
    )
    busy = GcpHook(retry_policy=FAST_RETRY, busy_policy=RetryPolicy(attempts=3, initial_s=0.01, maximum_s=0.01))
    since = len(sandbox.calls())
    with pytest.raises(api_exceptions.BadRequest, match="peering operation in progress"):
        busy.call(busy.networks_client.list, project=project, what="list networks")
    assert _calls(sandbox, networks, since) == [400, 400, 400]
    sandbox.clear_faults()
    sandbox.add_fault({"method": "GET", "path": networks}, status=400, message="Invalid value for field 'x'")
    since = len(sandbox.calls())
    with pytest.raises(api_exceptions.BadRequest):
        busy.call(busy.networks_client.list, project=project, what="list networks")
    assert _calls(sandbox, networks, since) == [400]
