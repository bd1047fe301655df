"""Compute v1 on the sandbox, driven by the real compute_v1 clients with the production builders' requests."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1

from nemo_rl_gke.plan import networks, peering
from tests.sandbox.conftest import (
    OWNER,
    PROJECT,
    REGION,
    RESERVATION,
    SPEC,
    ZONE,
    network_delete_requests,
    network_requests,
)
from tests.sandbox.helpers import create_cluster, create_networks, create_node_pool, insert_compute, raw

P = f"/compute/v1/projects/{PROJECT}"


def test_every_network_request_of_the_plan_succeeds(clients, sandbox):
    for request in network_requests(SPEC):
        operation = insert_compute(clients, request)
        assert operation.done() and not operation.error_code, request.resource
    assert insert_compute(clients, peering.peering_range_request(SPEC, OWNER)).done()

    rdma = clients.networks.get(project=PROJECT, network=SPEC.rdma_network)
    assert rdma.network_profile.endswith(f"/global/networkProfiles/{ZONE}-vpc-roce")
    assert rdma.auto_create_subnetworks is False
    assert len(rdma.subnetworks) == 8
    main = clients.networks.get(project=PROJECT, network=SPEC.network)
    assert (main.mtu, main.routing_config.routing_mode) == (SPEC.net_mtu, "REGIONAL")
    subnet = clients.subnetworks.get(project=PROJECT, region=REGION, subnetwork=SPEC.rdma_subnets[3])
    assert subnet.ip_cidr_range == "192.168.4.0/24"
    assert (
        subnet.network
        == f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/networks/{SPEC.rdma_network}"
    )
    firewall = clients.firewalls.get(project=PROJECT, firewall=SPEC.gvnic_firewall)
    assert [a.I_p_protocol for a in firewall.allowed] == ["tcp", "udp", "icmp"]
    assert firewall.priority == 1000
    address = clients.addresses.get(project=PROJECT, address=SPEC.peering_range)
    assert (address.purpose, address.prefix_length, address.status) == ("VPC_PEERING", 20, "RESERVED")
    assert dict(address.labels) == {}  # an address takes labels only through setLabels (FACTS §15)
    names = {n.name for n in clients.networks.list(project=PROJECT)}
    assert names == {SPEC.network, SPEC.gvnic_network, SPEC.rdma_network}
    assert {i["description"] for i in sandbox.inventory()} == {OWNER.description}


def test_responses_parse_strictly_into_the_message_types(clients, sandbox):
    """Everything the sandbox answers is valid for the real message type, unknown fields rejected."""
    create_networks(clients)
    insert_compute(clients, peering.peering_range_request(SPEC, OWNER))
    paths = {
        compute_v1.Network: f"{P}/global/networks/{SPEC.network}",
        compute_v1.Subnetwork: f"{P}/regions/{REGION}/subnetworks/{SPEC.gvnic_subnet}",
        compute_v1.Firewall: f"{P}/global/firewalls/{SPEC.gvnic_firewall}",
        compute_v1.Address: f"{P}/global/addresses/{SPEC.peering_range}",
        compute_v1.NetworkProfile: f"{P}/global/networkProfiles/{ZONE}-vpc-roce",
        compute_v1.Reservation: f"{P}/zones/{ZONE}/reservations/{RESERVATION}",
        compute_v1.NetworkList: f"{P}/global/networks",
    }
    for message_type, path in paths.items():
        status, body = raw(sandbox.url, "GET", path)
        assert status == 200, body
        message_type.from_json(json.dumps(body), ignore_unknown_fields=False)
    status, body = raw(sandbox.url, "DELETE", f"{P}/global/firewalls/{SPEC.gvnic_firewall}")
    compute_v1.Operation.from_json(json.dumps(body), ignore_unknown_fields=False)


def test_repeat_insert_is_409_and_missing_is_404(clients, sandbox):
    request = networks.main_network_request(SPEC, OWNER)
    insert_compute(clients, request)
    with pytest.raises(exceptions.Conflict) as conflict:
        insert_compute(clients, request)
    assert conflict.value.errors[0]["reason"] == "alreadyExists"
    with pytest.raises(exceptions.NotFound):
        clients.networks.get(project=PROJECT, network="no-such-net")
    with pytest.raises(exceptions.NotFound):
        clients.networks.delete(project=PROJECT, network="no-such-net")
    with pytest.raises(exceptions.NotFound):
        clients.subnetworks.get(project=PROJECT, region=REGION, subnetwork="no-such-sub")


def test_misspelt_field_is_400_invalid_argument(sandbox):
    body = {"name": "typo-net", "autoCreateSubnetwork": True}
    status, answer = raw(sandbox.url, "POST", f"{P}/global/networks", body)
    assert status == 400
    error = answer["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert 'Unknown name "autoCreateSubnetwork"' in error["message"]
    assert error["errors"][0]["reason"] == "invalid"
    nested = {"name": "x", "network": "global/networks/n", "allowed": [{"IPprotocol": "tcp"}]}
    status, answer = raw(sandbox.url, "POST", f"{P}/global/firewalls", nested)
    assert status == 400 and '"IPprotocol"' in answer["error"]["message"]
    assert sandbox.inventory() == []


@pytest.mark.parametrize(
    "body",
    [
        {"name": "Bad_Name", "autoCreateSubnetworks": True},
        {"name": "x" * 64, "autoCreateSubnetworks": True},
        {"name": "no-mode"},
        {"name": "big-mtu", "autoCreateSubnetworks": True, "mtu": 9000},
        {"name": "roce", "autoCreateSubnetworks": False, "networkProfile": "global/networkProfiles/mars-1a-vpc-roce"},
    ],
)
def test_invalid_networks_are_400(sandbox, body):
    status, answer = raw(sandbox.url, "POST", f"{P}/global/networks", body)
    assert status == 400, answer
    assert answer["error"]["status"] == "INVALID_ARGUMENT"


def test_subnet_rules(clients, sandbox):
    create_networks(clients)
    url = f"{P}/regions/{REGION}/subnetworks"
    network = f"global/networks/{SPEC.gvnic_network}"
    overlap = {"name": "overlap", "network": network, "ipCidrRange": "192.168.0.128/25"}
    assert raw(sandbox.url, "POST", url, overlap)[0] == 400
    host_bits = {"name": "host-bits", "network": network, "ipCidrRange": "10.1.1.1/24"}
    assert raw(sandbox.url, "POST", url, host_bits)[0] == 400
    status, answer = raw(
        sandbox.url, "POST", url, {"name": "orphan", "network": "global/networks/none", "ipCidrRange": "10.9.0.0/24"}
    )
    assert status == 404 and "networks/none" in answer["error"]["message"]


def test_network_in_use_cannot_be_deleted(clients, sandbox):
    create_networks(clients)
    with pytest.raises(exceptions.BadRequest) as in_use:
        clients.networks.delete(project=PROJECT, network=SPEC.gvnic_network)
    assert in_use.value.errors[0]["reason"] == "resourceInUseByAnotherResource"
    assert SPEC.gvnic_network in in_use.value.message
    # The order FACTS §4 gives works: firewall, subnets, then networks.
    for request in network_delete_requests(SPEC):
        kind, name = request.path.rsplit("/", 2)[-2:]
        if kind == "firewalls":
            operation = clients.firewalls.delete(project=PROJECT, firewall=name)
        elif kind == "subnetworks":
            operation = clients.subnetworks.delete(project=PROJECT, region=REGION, subnetwork=name)
        else:
            operation = clients.networks.delete(project=PROJECT, network=name)
        assert operation.done(), request.resource
    assert sandbox.inventory() == []


def test_subnet_used_by_a_node_pool_cannot_be_deleted(clients, sandbox):
    create_networks(clients)
    create_cluster(clients)
    create_node_pool(clients)
    with pytest.raises(exceptions.BadRequest) as in_use:
        clients.subnetworks.delete(project=PROJECT, region=REGION, subnetwork=SPEC.rdma_subnets[0])
    assert in_use.value.errors[0]["reason"] == "resourceInUseByAnotherResource"
    assert SPEC.node_pool_name in in_use.value.message
    with pytest.raises(exceptions.BadRequest):
        clients.networks.delete(project=PROJECT, network=SPEC.network)


def test_network_profiles_and_reservations(clients, sandbox):
    profile = clients.profiles.get(project=PROJECT, network_profile=SPEC.network_profile)
    assert profile.location.name == ZONE
    names = {p.name for p in clients.profiles.list(project=PROJECT)}
    assert names == {"us-central1-b-vpc-roce", "europe-west1-b-vpc-roce", "us-east4-b-vpc-roce"}
    with pytest.raises(exceptions.NotFound):
        clients.profiles.get(project=PROJECT, network_profile="us-west1-a-vpc-roce")

    reservation = clients.reservations.get(project=PROJECT, zone=ZONE, reservation=RESERVATION)
    assert reservation.specific_reservation.count == 2
    assert reservation.specific_reservation.in_use_count == 0
    assert reservation.specific_reservation.instance_properties.machine_type == SPEC.effective_machine_type
    accelerator = reservation.specific_reservation.instance_properties.guest_accelerators[0]
    assert (accelerator.accelerator_type, accelerator.accelerator_count) == ("nvidia-b200", 8)
    sandbox.seed_reservation(PROJECT, ZONE, "busy", machine_type="a3-ultragpu-8g", count=4, in_use_count=3)
    listed = {
        r.name: r.specific_reservation.in_use_count for r in clients.reservations.list(project=PROJECT, zone=ZONE)
    }
    assert listed == {RESERVATION: 0, "busy": 3}
    with pytest.raises(exceptions.NotFound):
        clients.reservations.get(project=PROJECT, zone="us-east4-b", reservation=RESERVATION)


def test_an_operation_runs_for_its_latency_then_is_done(clients, sandbox):
    sandbox.set_latency(scale=1.0, seconds={"compute.networks.insert": 0.6, "compute.subnetworks.insert": 0.3})
    operation = insert_compute(clients, networks.gvnic_network_request(SPEC, OWNER))
    assert operation.status in (compute_v1.Operation.Status.PENDING, compute_v1.Operation.Status.RUNNING)
    polled = clients.global_operations.get(project=PROJECT, operation=operation.name)
    assert polled.status != compute_v1.Operation.Status.DONE
    # Readable while it is created, but nothing may refer to it yet.
    assert clients.networks.get(project=PROJECT, network=SPEC.gvnic_network).name == SPEC.gvnic_network
    with pytest.raises(exceptions.BadRequest) as not_ready:
        insert_compute(clients, networks.gvnic_subnet_request(SPEC, OWNER))
    assert not_ready.value.errors[0]["reason"] == "resourceNotReady"
    assert [i["state"] for i in sandbox.inventory()] == ["CREATING"]

    waited = clients.global_operations.wait(project=PROJECT, operation=operation.name)
    assert waited.status == compute_v1.Operation.Status.DONE
    assert waited.progress == 100 and waited.end_time
    subnet_op = insert_compute(clients, networks.gvnic_subnet_request(SPEC, OWNER))
    assert subnet_op.status != compute_v1.Operation.Status.DONE
    time.sleep(0.35)
    region_op = clients.region_operations.get(project=PROJECT, region=REGION, operation=subnet_op.name)
    assert region_op.status == compute_v1.Operation.Status.DONE
    # A regional operation is not found under global/operations, and vice versa.
    with pytest.raises(exceptions.NotFound):
        clients.global_operations.get(project=PROJECT, operation=subnet_op.name)


def test_request_id_makes_a_retried_call_idempotent(clients, sandbox):
    request_id = str(uuid.uuid4())
    body = {"name": "retried", "autoCreateSubnetworks": False}
    first = raw(sandbox.url, "POST", f"{P}/global/networks?requestId={request_id}", body)
    second = raw(sandbox.url, "POST", f"{P}/global/networks?requestId={request_id}", body)
    assert first[0] == second[0] == 200
    assert first[1]["name"] == second[1]["name"]
    assert raw(sandbox.url, "POST", f"{P}/global/networks", body)[0] == 409
    # The client's request_id field, on a delete retried after it went through.
    delete_id = str(uuid.uuid4())
    request = compute_v1.DeleteNetworkRequest(project=PROJECT, network="retried", request_id=delete_id)
    deleted = clients.networks.delete(request=request)
    again = clients.networks.delete(request=request)
    assert deleted.name == again.name
    for bad in ("abc-123", "00000000-0000-0000-0000-000000000000"):
        status, answer = raw(sandbox.url, "POST", f"{P}/global/networks?requestId={bad}", body)
        assert status == 400 and "requestId" in answer["error"]["message"]


def _region(clients):
    return compute_v1.RegionsClient(**clients._kw()).get(project=PROJECT, region=REGION)


def test_region_quotas(clients, sandbox):
    region = _region(clients)
    assert region.status == "UP"
    assert f"{ZONE}" in [zone.rsplit("/", 1)[1] for zone in region.zones]
    quotas = {q.metric: q.limit for q in region.quotas}
    assert quotas["N2_CPUS"] == 600
    # As on Google: compute v1's Quota.metric enum has no B200 or H200 metric, so regions.get lists none.
    assert not [m for m in quotas if "B200" in m or "H200" in m]
    sandbox.seed({"quotas": {"N2_CPUS": 8}})
    assert {q.metric: q.limit for q in _region(clients).quotas}["N2_CPUS"] == 8
    status, body = raw(sandbox.url, "GET", f"{P}/regions/{REGION}")
    assert status == 200
    compute_v1.Region.from_json(json.dumps(body), ignore_unknown_fields=False)
    sandbox.seed({"quotas": {"N2_CPUS": 600}})


def test_list_filter_and_paging(clients, sandbox):
    create_networks(clients)
    request = compute_v1.ListNetworksRequest(project=PROJECT, filter=f'name = "{SPEC.network}"')
    assert [n.name for n in clients.networks.list(request=request)] == [SPEC.network]
    paged = clients.networks.list(request=compute_v1.ListNetworksRequest(project=PROJECT, max_results=1))
    assert len(list(paged)) == 3
