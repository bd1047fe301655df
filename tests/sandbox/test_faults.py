"""Fault injection: a failed call, an operation that ends in error, an operation that hangs, a held answer."""

from __future__ import annotations

import json
import urllib.request

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1, container_v1, lustre_v1
from googleapiclient.errors import HttpError
from sandbox.testing import auth_headers

from nemo_rl_gke.plan import lustre, networks, peering
from tests.sandbox.conftest import OWNER, PROJECT, SPEC
from tests.sandbox.helpers import (
    FAST_POLLING,
    create_cluster,
    create_networks,
    create_peering,
    insert_compute,
    operation_name,
    project_number,
    raw,
)

NETWORKS = {"method": "POST", "path": "/global/networks$"}


def test_the_nth_matching_call_fails_with_the_status(clients, sandbox):
    fault = sandbox.add_fault(NETWORKS, nth=2, status=503)
    insert_compute(clients, networks.main_network_request(SPEC, OWNER))
    with pytest.raises(exceptions.ServiceUnavailable) as failed:
        insert_compute(clients, networks.gvnic_network_request(SPEC, OWNER))
    assert fault["id"] in failed.value.message
    insert_compute(clients, networks.rdma_network_request(SPEC, OWNER))
    [state] = sandbox.faults()
    assert (state["seen"], state["fired"]) == (3, 1)
    # The failed call changed nothing; the log shows it with its fault.
    assert {i["name"] for i in sandbox.inventory()} == {SPEC.network, SPEC.rdma_network}
    posts = [c for c in sandbox.calls() if c["method"] == "POST"]
    assert [(c["status"], c["fault"]) for c in posts] == [(200, None), (503, fault["id"]), (200, None)]
    assert all(c["time"] > 0 and c["path"].endswith("/global/networks") for c in posts)


def test_a_status_fault_can_hit_the_wait_and_repeat(clients, sandbox):
    operation = insert_compute(clients, networks.main_network_request(SPEC, OWNER))
    sandbox.add_fault({"method": "GET", "path": "/global/operations/"}, status=429, times=2)
    for _ in range(2):
        with pytest.raises(exceptions.TooManyRequests):
            clients.global_operations.get(project=PROJECT, operation=operation.name)
    assert clients.global_operations.get(project=PROJECT, operation=operation.name).status == operation.status
    sandbox.clear_faults()
    sandbox.add_fault({"path": "/global/operations/"}, status=500, times=None, error_status="UNAVAILABLE")
    for _ in range(3):
        status, answer = raw(sandbox.url, "GET", f"/compute/v1/projects/{PROJECT}/global/operations/{operation.name}")
        assert (status, answer["error"]["status"]) == (500, "UNAVAILABLE")


def test_a_compute_operation_ends_in_error(clients, sandbox):
    sandbox.add_fault(NETWORKS, operation="error", message="quota exceeded")
    operation = insert_compute(clients, networks.main_network_request(SPEC, OWNER))
    assert operation.done()
    assert operation.http_error_status_code == 500 and operation.error.errors[0].message == "quota exceeded"
    # The ExtendedOperation raises it (without polling: the operation is already DONE).
    with pytest.raises(exceptions.InternalServerError, match="quota exceeded"):
        operation.result()
    polled = clients.global_operations.get(project=PROJECT, operation=operation.name)
    assert polled.status == compute_v1.Operation.Status.DONE and polled.http_error_status_code == 500
    assert sandbox.inventory() == []  # a failed insert leaves nothing behind
    assert insert_compute(clients, networks.main_network_request(SPEC, OWNER)).done()  # the fault fired once


def test_a_gke_operation_ends_in_error_and_leaves_an_error_cluster(clients, sandbox):
    create_networks(clients)
    sandbox.add_fault({"method": "POST", "path": "/clusters$"}, operation="error", error_status="RESOURCE_EXHAUSTED")
    operation = create_cluster(clients)
    polled = clients.gke.get_operation(name=operation_name(operation.name))
    assert polled.status == container_v1.Operation.Status.DONE and polled.error.code == 8
    assert clients.gke.get_cluster(name=SPEC.cluster_path).status == container_v1.Cluster.Status.ERROR
    assert clients.gke.delete_cluster(name=SPEC.cluster_path).status == container_v1.Operation.Status.DONE
    assert not [i for i in sandbox.inventory() if i["kind"].startswith("container")]


def test_a_lustre_and_a_peering_operation_end_in_error(clients, sandbox):
    create_networks(clients)
    assert insert_compute(clients, peering.peering_range_request(SPEC, OWNER)).done()
    sandbox.add_fault({"path": "/connections$", "method": "POST"}, operation="error")
    number = project_number(clients)
    connections = clients.discovery("servicenetworking").services().connections()
    body = peering.connection_create_request(SPEC, number).body
    assert connections.create(parent=peering.SERVICE_PARENT, body=body).execute()["error"]["code"] == 13
    assert not [i for i in sandbox.inventory() if i["kind"] == "servicenetworking.connection"]
    create_peering_ok = connections.create(
        parent=peering.SERVICE_PARENT, body=peering.connection_create_request(SPEC, number).body
    ).execute()
    assert "error" not in create_peering_ok
    sandbox.add_fault({"path": "/instances$"}, operation="error")
    operation = clients.lustre.create_instance(
        parent=SPEC.lustre_parent,
        instance_id=SPEC.lustre_name,
        instance=lustre.lustre_create_request(SPEC, OWNER).message,
    )
    with pytest.raises(exceptions.InternalServerError):
        operation.result(timeout=10, polling=FAST_POLLING)
    assert not [i for i in sandbox.inventory() if i["kind"] == "lustre.instance"]


def test_a_hanging_operation_never_finishes_until_a_delete_supersedes_it(clients, sandbox):
    create_networks(clients)
    create_peering(clients)
    sandbox.add_fault({"path": "/instances$"}, operation="hang")
    operation = clients.lustre.create_instance(
        parent=SPEC.lustre_parent,
        instance_id=SPEC.lustre_name,
        instance=lustre.lustre_create_request(SPEC, OWNER).message,
    )
    with pytest.raises(TimeoutError):
        operation.result(timeout=0.3, polling=FAST_POLLING)
    assert clients.lustre.get_instance(name=SPEC.lustre_path).state == lustre_v1.Instance.State.CREATING
    [hung] = [o for o in sandbox.operations() if o["outcome"] == "hang"]
    assert (hung["status"], hung["end"]) == ("RUNNING", None)
    # Teardown can still clean up: the delete ends the hanging create, and the instance is gone (404 = done).
    with pytest.raises(exceptions.NotFound):
        clients.lustre.delete_instance(name=SPEC.lustre_path)
    with pytest.raises(exceptions.Aborted):
        operation.result(timeout=5, polling=FAST_POLLING)
    assert not [i for i in sandbox.inventory() if i["kind"] == "lustre.instance"]


def test_a_hanging_cluster_create_turns_error_when_deleted(clients, sandbox):
    create_networks(clients)
    sandbox.add_fault({"path": "/clusters$"}, operation="hang")
    create_cluster(clients)
    assert clients.gke.get_cluster(name=SPEC.cluster_path).status == container_v1.Cluster.Status.PROVISIONING
    delete = clients.gke.delete_cluster(name=SPEC.cluster_path)
    assert delete.status == container_v1.Operation.Status.DONE
    assert not [i for i in sandbox.inventory() if i["kind"].startswith("container")]


def test_operation_faults_count_only_calls_that_start_an_operation(clients, sandbox):
    insert_compute(clients, networks.main_network_request(SPEC, OWNER))
    sandbox.add_fault(NETWORKS, operation="error")
    with pytest.raises(exceptions.Conflict):
        insert_compute(clients, networks.main_network_request(SPEC, OWNER))  # 409: no operation, the fault waits
    assert insert_compute(clients, networks.gvnic_network_request(SPEC, OWNER)).error_code == 500


@pytest.mark.parametrize(
    "spec",
    [
        {"match": {"path": "x"}},
        {"match": {"path": "x"}, "status": 200},
        {"match": {"path": "x"}, "operation": "explode"},
        {"match": {"path": "("}, "status": 503},
        {"match": {"verb": "GET"}, "status": 503},
        {"match": {"path": "x"}, "status": 503, "nth": 0},
        {"match": {"path": "x"}, "status": 503, "operation": "error"},
        {"match": {"path": "x"}, "status": 403, "reason": ""},
        {"match": {"path": "x"}, "delay_s": 0},
        {"match": {"path": "x"}, "delay_s": "5"},
        {"match": {"path": "x"}, "delay_s": True},
        {"match": {"path": "x"}, "delay_s": 601},
        {"match": {"path": "x"}, "delay_s": 5, "status": 503},
    ],
)
def test_bad_fault_specs_are_refused(sandbox, spec):
    status, answer = raw(sandbox.url, "POST", "/sandbox/faults", spec)
    assert status == 400 and answer["error"]["message"].startswith("fault:")
    assert sandbox.faults() == []


def test_a_held_answer_loses_the_client_but_the_call_took_effect(sandbox):
    # A client that gives up (or dies) while its answer is held never learns the insert worked: the retry that
    # follows must find the resource, not create it again.
    fault = sandbox.add_fault(NETWORKS, delay_s=3)
    body = json.dumps({"name": SPEC.network, "autoCreateSubnetworks": False}).encode()
    request = urllib.request.Request(
        f"{sandbox.url}/compute/v1/projects/{PROJECT}/global/networks",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", **auth_headers(sandbox.url)},
    )
    with pytest.raises(TimeoutError):
        urllib.request.urlopen(request, timeout=0.5)
    assert [i["name"] for i in sandbox.inventory()] == [SPEC.network]
    [post] = [c for c in sandbox.calls() if c["method"] == "POST"]
    assert (post["status"], post["fault"]) == (200, fault["id"])
    # Only the first matching call is held.
    second = {"name": "second", "autoCreateSubnetworks": False}
    status, _ = raw(sandbox.url, "POST", f"/compute/v1/projects/{PROJECT}/global/networks", second)
    assert status == 200
    [state] = sandbox.faults()
    assert (state["seen"], state["fired"], state["delay_s"]) == (2, 1, 3.0)


def test_faults_can_be_listed_and_removed(sandbox):
    first = sandbox.add_fault(NETWORKS, status=503)
    sandbox.add_fault(NETWORKS, operation="hang")
    assert [f["id"] for f in sandbox.faults()] == [first["id"], sandbox.faults()[1]["id"]]
    assert raw(sandbox.url, "DELETE", f"/sandbox/faults/{first['id']}")[0] == 200
    assert [f["operation"] for f in sandbox.faults()] == ["hang"]
    sandbox.clear_faults()
    assert sandbox.faults() == []


def test_servicenetworking_status_fault_reaches_the_discovery_client(clients, sandbox):
    sandbox.add_fault({"path": "^/v1/projects/[^/]+$"}, status=503)
    with pytest.raises(HttpError) as failed:
        project_number(clients)
    assert failed.value.resp.status == 503


def test_a_rate_limit_fault_answers_with_compute_s_real_403_body(clients, sandbox):
    # Compute's rate quota: 403 with errors[].reason rateLimitExceeded (domain usageLimits) and ErrorInfo
    # RATE_LIMIT_EXCEEDED; a permission 403 says forbidden.
    sandbox.add_fault(NETWORKS, status=403, reason="rateLimitExceeded", message="Quota exceeded for quota metric")
    status, answer = raw(sandbox.url, "POST", f"/compute/v1/projects/{PROJECT}/global/networks", {"name": "n"})
    assert status == 403
    error = answer["error"]
    assert error["errors"] == [
        {"message": "Quota exceeded for quota metric", "domain": "usageLimits", "reason": "rateLimitExceeded"}
    ]
    assert error["status"] == "PERMISSION_DENIED"
    assert error["details"][0]["reason"] == "RATE_LIMIT_EXCEEDED"
