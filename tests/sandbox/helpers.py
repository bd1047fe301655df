"""Steps the sandbox tests share: send the production builders' requests through the real clients."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from google.api_core.future.polling import DEFAULT_POLLING
from google.cloud import compute_v1
from sandbox.testing import auth_headers

from nemo_rl_gke.plan import gke, lustre, peering
from nemo_rl_gke.plan.api import ApiRequest
from tests.sandbox.conftest import OWNER, SPEC, Clients, network_requests

# api-core polls long-running operations every second at first; the sandbox is faster than that.
FAST_POLLING = DEFAULT_POLLING.with_delay(initial=0.02, maximum=0.1, multiplier=1.5)


def raw(url: str, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    """One HTTP call with a hand-written body (what a client with a typo would send); returns status and JSON."""
    data = None if body is None else (body if isinstance(body, str) else json.dumps(body)).encode()
    headers = {"Content-Type": "application/json", **auth_headers(url)}
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def insert_compute(clients: Clients, request: ApiRequest) -> compute_v1.Operation:
    """Send one compute insert of the plan with the client that owns its message type; the operation it answers."""
    message = request.message
    if isinstance(message, compute_v1.Network):
        return clients.networks.insert(project=SPEC.project, network_resource=message)
    if isinstance(message, compute_v1.Subnetwork):
        return clients.subnetworks.insert(project=SPEC.project, region=SPEC.region, subnetwork_resource=message)
    if isinstance(message, compute_v1.Firewall):
        return clients.firewalls.insert(project=SPEC.project, firewall_resource=message)
    if isinstance(message, compute_v1.Address):
        return clients.addresses.insert(project=SPEC.project, address_resource=message)
    raise TypeError(type(message))


def create_networks(clients: Clients) -> None:
    """Every network, subnet and firewall of the plan (instant sandbox)."""
    for request in network_requests(SPEC):
        assert insert_compute(clients, request).done(), request.resource


def project_number(clients: Clients) -> str:
    return clients.discovery("cloudresourcemanager").projects().get(projectId=SPEC.project).execute()["projectNumber"]


def create_peering(clients: Clients) -> str:
    """The peering range and the Service Networking connection; returns the project number."""
    assert insert_compute(clients, peering.peering_range_request(SPEC, OWNER)).done()
    number = project_number(clients)
    request = peering.connection_create_request(SPEC, number)
    operation = (
        clients.discovery("servicenetworking")
        .services()
        .connections()
        .create(parent=peering.SERVICE_PARENT, body=request.body)
        .execute()
    )
    assert operation["done"] and "error" not in operation, operation
    return number


def create_lustre(clients: Clients) -> Any:
    request = lustre.lustre_create_request(SPEC, OWNER)
    operation = clients.lustre.create_instance(
        parent=SPEC.lustre_parent, instance_id=SPEC.lustre_name, instance=request.message
    )
    return operation.result(timeout=30, polling=FAST_POLLING)


def create_cluster(clients: Clients) -> Any:
    return clients.gke.create_cluster(request=gke.cluster_create_request(SPEC, OWNER).message)


def create_node_pool(clients: Clients) -> Any:
    return clients.gke.create_node_pool(request=gke.node_pool_create_request(SPEC, OWNER).message)


def operation_name(operation_id: str) -> str:
    """The container get_operation name of an operation id in the run's region."""
    return f"{SPEC.cluster_parent}/operations/{operation_id}"
