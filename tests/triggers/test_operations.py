"""OperationTrigger in the Airflow provider style: exact serialize(), round trip, success / failure / error / timeout
events and a still-waiting test.

The trigger runs for real: its async hook makes real HTTP GETs to a scripted aiohttp server on 127.0.0.1 (no mocks of
the hook), with the connection taken from an ``AIRFLOW_CONN_*`` variable as in a deployment.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from nemo_rl_gke.gcp.operations import OperationRef
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.triggers.operations import (
    BACKOFF_CAP_POLLS,
    CLASSPATH,
    OperationTrigger,
    backoff_delay,
)
from tests.owners import owner_of
from tests.paths import ROOT
from tests.triggers.scripted_api import scripted_api

CONN_ID = "nemo_trigger_test"
P = "my-project"
# One operation per shape (and per longrunning service), with its real REST path.
COMPUTE_OP = OperationRef("compute", f"/compute/v1/projects/{P}/global/operations/op-net", "compute", "net nemo-rl-net")
REGION_OP = OperationRef(
    "compute", f"/compute/v1/projects/{P}/regions/us-east5/operations/op-sub", "compute", "gvnic-sub nemo-rl-gvnic-sub"
)
CONTAINER_OP = OperationRef(
    "container", f"/v1/projects/{P}/locations/us-east5/operations/op-cl", "container", "cluster nemo-rl-cluster"
)
LUSTRE_OP = OperationRef(
    "lustre", f"/v1/projects/{P}/locations/us-east5-b/operations/op-lu", "longrunning", "lustre nemo-rl-lustre"
)
PEERING_OP = OperationRef("servicenetworking", "/v1/operations/op-peer", "longrunning", "peering servicenetworking")

RUNNING = {
    "compute": {"kind": "compute#operation", "status": "RUNNING", "progress": 50},
    "container": {"name": "op-cl", "operationType": "CREATE_CLUSTER", "status": "RUNNING"},
    "longrunning": {"name": "op", "done": False, "metadata": {"state": "CREATING"}},
}
PENDING = {
    "compute": {"kind": "compute#operation", "status": "PENDING"},
    "container": {"name": "op-cl", "status": "PENDING"},
    "longrunning": {"name": "op", "done": False},
}
DONE = {
    "compute": {"kind": "compute#operation", "status": "DONE", "progress": 100},
    "container": {"name": "op-cl", "status": "DONE"},
    "longrunning": {"name": "op", "done": True, "response": {"name": "instance"}},
}
FAILED = {
    "compute": {
        "kind": "compute#operation",
        "status": "DONE",
        "error": {"errors": [{"code": "QUOTA_EXCEEDED", "message": "Quota 'NETWORKS' exceeded. Limit: 5.0"}]},
    },
    "container": {"name": "op-cl", "status": "DONE", "error": {"code": 8, "message": "GCE_STOCKOUT in us-east5-b"}},
    "longrunning": {"name": "op", "done": True, "error": {"code": 9, "message": "peering range already in use"}},
}
ALL_OPS = [COMPUTE_OP, REGION_OP, CONTAINER_OP, LUSTRE_OP, PEERING_OP]
FAST = 0.02  # poll interval of the tests, seconds


@pytest.fixture(autouse=True)
def anonymous_conn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A placeholder connection; each test points it at its own server with :func:`use_conn`."""
    use_conn(monkeypatch, {"is_anonymous": True, "api_endpoint": "http://127.0.0.1:9"})


def use_conn(monkeypatch: pytest.MonkeyPatch, extras: dict[str, Any]) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({"conn_type": "google_cloud_platform", "extra": extras})
    )


def trigger_for(op: OperationRef, **kwargs: Any) -> OperationTrigger:
    args: dict[str, Any] = {"gcp_conn_id": CONN_ID, "poll_interval": FAST, "timeout": 10.0}
    args.update(kwargs)
    return OperationTrigger(operation=op.to_dict(), **args)


async def all_events(trigger: OperationTrigger) -> list[dict[str, Any]]:
    """Run the trigger to its end: it must yield exactly one event and then return."""
    return [event.payload async for event in trigger.run()]


def run_against(
    monkeypatch: pytest.MonkeyPatch, scripts: dict[str, list[tuple[int, Any]]], trigger: OperationTrigger
) -> tuple[list[dict[str, Any]], list[str]]:
    """Serve ``scripts``, run ``trigger`` against them; return its events and the paths it requested."""

    async def scenario() -> tuple[list[dict[str, Any]], list[str]]:
        async with scripted_api(scripts) as api:
            use_conn(monkeypatch, {"is_anonymous": True, "api_endpoint": api.url})
            events = await asyncio.wait_for(all_events(trigger), 20)
            return events, [r.path for r in api.requests]

    return asyncio.run(scenario())


# --- serialization ----------------------------------------------------------------------------------------------
def test_serialize_is_exact() -> None:
    trigger = OperationTrigger(
        operation=LUSTRE_OP.to_dict(),
        gcp_conn_id="google_cloud_default",
        poll_interval=15.0,
        timeout=7200,
        started_at=1_700_000_000.5,
    )
    assert trigger.serialize() == (
        "nemo_rl_gke.triggers.operations.OperationTrigger",
        {
            "operation": {
                "service": "lustre",
                "path": f"/v1/projects/{P}/locations/us-east5-b/operations/op-lu",
                "shape": "longrunning",
                "resource": "lustre nemo-rl-lustre",
            },
            "gcp_conn_id": "google_cloud_default",
            "poll_interval": 15.0,
            "timeout": 7200.0,
            "started_at": 1_700_000_000.5,
        },
    )
    assert CLASSPATH == "nemo_rl_gke.triggers.operations.OperationTrigger"


def test_serialize_round_trip_keeps_the_deadline() -> None:
    original = OperationTrigger(operation=CONTAINER_OP.to_dict(), poll_interval=2.5, timeout=60)
    classpath, kwargs = original.serialize()
    # started_at defaults to "now" once and is serialized: a triggerer restart keeps the deadline.
    assert abs(kwargs["started_at"] - time.time()) < 5
    rebuilt = OperationTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert rebuilt.deadline == original.deadline


def test_classpath_imports_like_the_real_triggerer(tmp_path: Path) -> None:
    """A fresh process with only Airflow's plugins folder on its path resolves the classpath (as the triggerer does)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
    code = (
        "from airflow._shared.module_loading import import_string; "
        f"cls = import_string({CLASSPATH!r}); print(cls.__module__, cls.__qualname__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["nemo_rl_gke.triggers.operations", "OperationTrigger"]


# --- events ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ALL_OPS, ids=lambda o: o.path.rsplit("/", 1)[-1])
def test_success_after_polling(monkeypatch: pytest.MonkeyPatch, op: OperationRef) -> None:
    scripts = {op.path: [(200, PENDING[op.shape]), (200, RUNNING[op.shape]), (200, DONE[op.shape])]}
    events, paths = run_against(monkeypatch, scripts, trigger_for(op))
    assert events == [
        {
            "status": "success",
            "message": f"operation {op.path} on {op.resource} finished",
            "operation": op.to_dict(),
            "state": "DONE",
        }
    ]
    assert paths == [op.path] * 3


@pytest.mark.parametrize("op", ALL_OPS, ids=lambda o: o.path.rsplit("/", 1)[-1])
def test_failure_when_operation_ends_in_error(monkeypatch: pytest.MonkeyPatch, op: OperationRef) -> None:
    events, _ = run_against(
        monkeypatch, {op.path: [(200, RUNNING[op.shape]), (200, FAILED[op.shape])]}, trigger_for(op)
    )
    assert len(events) == 1
    event = events[0]
    assert (event["status"], event["state"], event["operation"]) == ("error", "DONE", op.to_dict())
    assert op.resource in event["message"]
    expected = {"compute": "QUOTA_EXCEEDED", "container": "GCE_STOCKOUT", "longrunning": "already in use"}[op.shape]
    assert expected in event["message"]


@pytest.mark.parametrize("status", [400, 403, 404])
def test_error_on_permanent_http_status_is_not_retried(monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    body = {"error": {"code": status, "message": "caller lacks permission", "status": "PERMISSION_DENIED"}}
    events, paths = run_against(monkeypatch, {COMPUTE_OP.path: [(status, body)]}, trigger_for(COMPUTE_OP))
    assert len(events) == 1
    assert events[0]["status"] == "error"
    assert events[0]["state"] == "UNKNOWN"
    assert f"HTTP {status}" in events[0]["message"]
    assert "caller lacks permission" in events[0]["message"]
    assert paths == [COMPUTE_OP.path]  # one GET: a permanent error is never retried


def test_error_keeps_the_last_state_when_polling_fails_midway(monkeypatch: pytest.MonkeyPatch) -> None:
    scripts = {CONTAINER_OP.path: [(200, RUNNING["container"]), (403, {"error": {"message": "revoked"}})]}
    events, _ = run_against(monkeypatch, scripts, trigger_for(CONTAINER_OP))
    assert [(e["status"], e["state"]) for e in events] == [("error", "RUNNING")]


def test_transient_errors_are_retried_then_success(monkeypatch: pytest.MonkeyPatch) -> None:
    unavailable = {"error": {"code": 503, "message": "backend unavailable", "status": "UNAVAILABLE"}}
    scripts = {
        LUSTRE_OP.path: [
            (503, unavailable),
            (429, {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}),
            (200, RUNNING["longrunning"]),
            (502, "<html>bad gateway</html>"),
            (200, DONE["longrunning"]),
        ]
    }
    events, paths = run_against(monkeypatch, scripts, trigger_for(LUSTRE_OP))
    assert [(e["status"], e["state"]) for e in events] == [("success", "DONE")]
    assert len(paths) == 5


def test_a_rate_limited_403_is_retried_a_permission_403_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    # Compute's rate quota answers 403 with errors[].reason rateLimitExceeded (ErrorInfo RATE_LIMIT_EXCEEDED).
    rate = {
        "error": {
            "code": 403,
            "message": "Quota exceeded for quota metric 'Queries'",
            "status": "PERMISSION_DENIED",
            "errors": [{"message": "Quota exceeded", "domain": "usageLimits", "reason": "rateLimitExceeded"}],
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED"}],
        }
    }
    scripts = {COMPUTE_OP.path: [(403, rate), (200, DONE["compute"])]}
    events, paths = run_against(monkeypatch, scripts, trigger_for(COMPUTE_OP))
    assert [(e["status"], e["state"]) for e in events] == [("success", "DONE")]
    assert len(paths) == 2


def test_timeout_names_the_resource_and_its_last_state(monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.time()
    # Wide enough for three polls on a busy machine (0.3 s once gave one, in CI under whole-DAG load).
    trigger = trigger_for(CONTAINER_OP, timeout=2.0, started_at=started)
    events, paths = run_against(monkeypatch, {CONTAINER_OP.path: [(200, RUNNING["container"])]}, trigger)
    elapsed = time.time() - started
    assert len(events) == 1
    event = events[0]
    assert (event["status"], event["state"]) == ("timeout", "RUNNING")
    assert "cluster nemo-rl-cluster" in event["message"]
    assert "last state RUNNING" in event["message"]
    # Never early (a slow machine only adds time, so this bound cannot flake); no upper bound on a shared machine.
    assert elapsed >= 2.0
    assert len(paths) >= 3


def test_timeout_counts_from_started_at_across_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    # A triggerer that picks the trigger up after the deadline polls once (the op may have finished) and stops.
    trigger = trigger_for(COMPUTE_OP, timeout=60, started_at=time.time() - 61)
    events, paths = run_against(monkeypatch, {COMPUTE_OP.path: [(200, RUNNING["compute"])]}, trigger)
    assert [(e["status"], e["state"]) for e in events] == [("timeout", "RUNNING")]
    assert paths == [COMPUTE_OP.path]
    finished = trigger_for(COMPUTE_OP, timeout=60, started_at=time.time() - 61)
    events, _ = run_against(monkeypatch, {COMPUTE_OP.path: [(200, DONE["compute"])]}, finished)
    assert events[0]["status"] == "success"


def test_transient_errors_count_toward_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    scripts = {LUSTRE_OP.path: [(200, RUNNING["longrunning"]), (503, {"error": {"message": "backend down"}})]}
    # Long enough for the 503s to come after RUNNING on a busy machine (0.5 s once ended before the second poll).
    events, paths = run_against(monkeypatch, scripts, trigger_for(LUSTRE_OP, timeout=2.0))
    assert len(events) == 1
    event = events[0]
    assert (event["status"], event["state"]) == ("timeout", "CREATING")
    assert "last poll error" in event["message"]
    assert "HTTP 503" in event["message"]
    assert "backend down" in event["message"]
    assert len(paths) >= 3


def test_connection_refused_is_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    use_conn(monkeypatch, {"is_anonymous": True, "api_endpoint": dead})
    events = asyncio.run(all_events(trigger_for(COMPUTE_OP, timeout=0.3)))
    assert [e["status"] for e in events] == ["timeout"]
    assert "last poll error" in events[0]["message"]
    assert "ClientConnectorError" in events[0]["message"]


def test_still_waiting_while_the_operation_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        async with scripted_api({CONTAINER_OP.path: [(200, RUNNING["container"])]}) as api:
            use_conn(monkeypatch, {"is_anonymous": True, "api_endpoint": api.url})
            task = asyncio.create_task(anext(trigger_for(CONTAINER_OP).run()))
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), 3.0)  # 0.5 s once saw no poll under CI load
            # Polled several times, yielded nothing, still running: the task stays deferred.
            assert not task.done()
            assert api.count(CONTAINER_OP.path) >= 3
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())


def test_unexpected_exceptions_become_one_error_event(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = {"service": "compute", "path": "/x", "shape": "carrier-pigeon", "resource": "net nemo-rl-net"}
    events = asyncio.run(all_events(OperationTrigger(operation=broken, gcp_conn_id=CONN_ID, poll_interval=FAST)))
    assert len(events) == 1
    assert events[0]["status"] == "error"
    assert "ValueError" in events[0]["message"]
    assert "carrier-pigeon" in events[0]["message"]
    assert events[0]["operation"] == broken

    missing_conn = OperationTrigger(operation=COMPUTE_OP.to_dict(), gcp_conn_id="no_such_conn", poll_interval=FAST)
    events = asyncio.run(all_events(missing_conn))
    assert [e["status"] for e in events] == ["error"]
    assert "no_such_conn" in events[0]["message"]


def test_a_body_that_is_not_json_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    events, _ = run_against(
        monkeypatch, {COMPUTE_OP.path: [(200, "<html>captive portal</html>")]}, trigger_for(COMPUTE_OP)
    )
    assert [e["status"] for e in events] == ["error"]
    assert "not JSON" in events[0]["message"]


# --- endpoints and auth -----------------------------------------------------------------------------------------
def test_per_service_endpoint_wins_over_api_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> list[dict[str, Any]]:
        async with scripted_api({CONTAINER_OP.path: [(200, DONE["container"])]}) as api:
            # api_endpoint points nowhere: only the per-service override can reach the server.
            use_conn(
                monkeypatch,
                {"is_anonymous": True, "api_endpoint": "http://127.0.0.1:9", "endpoints": {"container": api.url}},
            )
            events = await all_events(trigger_for(CONTAINER_OP, timeout=2))
            assert "Authorization" not in api.requests[0].headers  # anonymous: no token at all
            return events

    assert [e["status"] for e in asyncio.run(scenario())] == ["success"]


def _private_key_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _service_account_key(pem: str, token_uri: str) -> dict[str, str]:
    return {
        "type": "service_account",
        "project_id": P,
        "private_key_id": "test-key",
        "private_key": pem,
        "client_email": f"airflow@{P}.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }


def test_bearer_token_from_the_connection_credentials(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A service-account key in the connection: the token comes from its token_uri, and nothing blocks the loop.

    The token endpoint is served by the same event loop as the trigger and answers slowly. Were the credentials
    built or refreshed synchronously on the loop, the endpoint could never answer (the test would time out), and
    asyncio's debug mode would report the blocked callback.
    """
    token_requests: list[str] = []
    pem = _private_key_pem()  # slow, so made before the loop runs

    async def token(request: web.Request) -> web.Response:
        token_requests.append(str((await request.post()).get("grant_type", "")))
        await asyncio.sleep(0.3)
        return web.json_response({"access_token": "ya29.test-token", "expires_in": 3600, "token_type": "Bearer"})

    async def scenario() -> tuple[list[dict[str, Any]], list[str | None]]:
        # Generous: on a 2-vCPU machine busy with whole-DAG runs, 0.5 s tripped while the process was descheduled. A
        # sync HTTP call to the token endpoint is caught anyway: it never returns.
        asyncio.get_running_loop().slow_callback_duration = 1.5
        scripts = {COMPUTE_OP.path: [(200, RUNNING["compute"]), (200, DONE["compute"])]}
        async with scripted_api(scripts, routes={"/token": token}) as api:
            key = _service_account_key(pem, f"{api.url}/token")
            use_conn(monkeypatch, {"api_endpoint": api.url, "keyfile_dict": json.dumps(key), "project": P})
            events = await asyncio.wait_for(all_events(trigger_for(COMPUTE_OP, timeout=10)), 20)
            auth = [r.headers.get("Authorization") for r in api.requests if r.path == COMPUTE_OP.path]
            return events, auth

    gc.collect()
    gc.disable()  # a full collection after the heavy tests before this one can pause the loop by itself
    try:
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            events, auth = asyncio.run(scenario(), debug=True)
    finally:
        gc.enable()
    assert [e["status"] for e in events] == ["success"]
    assert auth == ["Bearer ya29.test-token", "Bearer ya29.test-token"]
    assert token_requests == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]  # fetched once, then cached
    blocked = [r.getMessage() for r in caplog.records if r.name == "asyncio" and "took" in r.getMessage()]
    assert blocked == []


def test_a_401_gets_one_new_token_and_one_more_try(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token refused before its expiry (revoked, or the server's clock): renewed once, as AuthorizedSession does."""
    pem = _private_key_pem()
    issued = iter(["ya29.first", "ya29.second"])

    async def token(request: web.Request) -> web.Response:
        return web.json_response({"access_token": next(issued), "expires_in": 3600, "token_type": "Bearer"})

    async def scenario() -> tuple[list[dict[str, Any]], list[str | None]]:
        scripts = {
            COMPUTE_OP.path: [(401, {"error": {"code": 401, "status": "UNAUTHENTICATED"}}), (200, DONE["compute"])]
        }
        async with scripted_api(scripts, routes={"/token": token}) as api:
            key = _service_account_key(pem, f"{api.url}/token")
            use_conn(monkeypatch, {"api_endpoint": api.url, "keyfile_dict": json.dumps(key), "project": P})
            events = await asyncio.wait_for(all_events(trigger_for(COMPUTE_OP, timeout=10)), 20)
            return events, [r.headers.get("Authorization") for r in api.requests if r.path == COMPUTE_OP.path]

    events, auth = asyncio.run(scenario())
    assert [e["status"] for e in events] == ["success"], events
    assert auth == ["Bearer ya29.first", "Bearer ya29.second"]


# --- backoff ----------------------------------------------------------------------------------------------------
def test_backoff_grows_and_is_capped() -> None:
    import random

    rng = random.Random(7)
    delays = [backoff_delay(n, 15.0, rng) for n in range(1, 12)]
    assert 0.5 <= delays[0] <= 1.0  # first retry within a second
    assert all(d <= 15.0 * BACKOFF_CAP_POLLS for d in delays)
    assert delays[-1] >= 15.0 * BACKOFF_CAP_POLLS / 2  # reached the cap (equal jitter keeps at least half)
    assert backoff_delay(3, 0.05, rng) <= 0.05 * BACKOFF_CAP_POLLS


# --- against the sandbox ----------------------------------------------------------------------------------------
def test_waits_on_the_sandboxs_real_operations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Operations started by the real clients on the sandbox, with latency: compute, container and longrunning."""
    from sandbox.testing import start_sandbox

    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.gcp.resources import ensure, resources
    from nemo_rl_gke.preflight.offline import check_conf
    from nemo_rl_gke.run.deployment import Deployment

    spec, findings = check_conf(
        {"project": "trigger-test", "region": "us-central1", "zone": "us-central1-b", "reservation": "res"},
        Deployment(gcp_project="trigger-test"),
    )
    assert spec is not None, findings
    # Lustre 600 s -> 0.6 s, cluster 420 s -> 0.42 s: long enough to be seen running, short enough for a test.
    with start_sandbox(tmp_path / "sandbox", latency_scale=0.001) as sandbox:
        use_conn(monkeypatch, sandbox.connection_extra("trigger-test"))
        # The peering's 60 s would be 0.06 s: less than the trigger's first token grant, so it would be done at once.
        sandbox.set_latency(seconds={"servicenetworking.connections.create": 600.0})
        hook = GcpHook(gcp_conn_id=CONN_ID)
        found = resources(spec, owner_of(spec))
        shapes = set()
        for key in (t.NET, t.GKE_CLUSTER, t.PEERING_RANGE, t.PEERING, t.LUSTRE):
            operation = ensure(found[key], hook, adopt_existing=False).operation
            assert operation is not None
            shapes.add((operation.service, operation.shape))
            events = asyncio.run(all_events(OperationTrigger(operation.to_dict(), CONN_ID, FAST, 30)))
            assert [(e["status"], e["state"]) for e in events] == [("success", "DONE")], events
            polls = [c for c in sandbox.calls() if c["method"] == "GET" and c["path"] == operation.path]
            if key in (t.GKE_CLUSTER, t.LUSTRE, t.PEERING):
                assert len(polls) > 1, key  # seen unfinished first, then done
            assert found[key].ready(found[key].get(hook))
        # The trigger's polls and the hook's calls all carried a token the sandbox issued.
        assert sandbox.unauthenticated_calls() == []
    assert shapes == {
        ("compute", "compute"),
        ("container", "container"),
        ("servicenetworking", "longrunning"),
        ("lustre", "longrunning"),
    }
