"""GcpHook: connection extras -> endpoints and credentials; the transient-error policy."""

from __future__ import annotations

import json

import httplib2
import pytest
from google.api_core import exceptions as api_exceptions
from google.auth.credentials import AnonymousCredentials
from googleapiclient.errors import HttpError

from nemo_rl_gke.gcp.hooks import GcpHook, RetryPolicy, is_transient, retry_transient


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
