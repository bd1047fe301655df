"""Private services access for Managed Lustre: the reserved range on NET and the Service Networking peering.

gcloud.md §4-5, FACTS §4. Service Networking names NET by the project *number*, which only Cloud Resource Manager
knows (``projects.get``), so the builders that need it take ``project_number``; offline (the plan) it is the
placeholder :data:`PROJECT_NUMBER_PLACEHOLDER`. A repeated ``connections.create`` is not refused with 409 but fails
inside its operation, so the action lists the connections first (:func:`connection_list_request`).

Service Networking and Cloud Resource Manager v1 have no google-cloud message types here; their requests are plain
dicts checked against the discovery documents bundled with google-api-python-client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from google.cloud import compute_v1

from nemo_rl_gke.plan.api import (
    ApiRequest,
    collection_path,
    compute_url,
    discovery_request,
    message_body,
)

if TYPE_CHECKING:
    from nemo_rl_gke.run.ownership import Owner
    from nemo_rl_gke.run.spec import RunSpec

PROJECT_NUMBER_PLACEHOLDER = "<PROJECT_NUMBER>"
# The ranges other run groups have on the VPC's one connection: known only once the run has read it.
OTHER_RANGES_PLACEHOLDER = "<the connection's other ranges>"
PEERING_SERVICE = "servicenetworking.googleapis.com"
SERVICE_PARENT = f"services/{PEERING_SERVICE}"
# "-" stands for "the connection of this consumer network", which deleteConnection names in its body (gcloud.md §5).
ANY_CONNECTION = f"{SERVICE_PARENT}/connections/-"
# One connection per (network, service), named after the service; also the name of its VPC peering (FACTS §13).
PEERING_NAME = "servicenetworking-googleapis-com"
CONNECTION_NAME = f"{SERVICE_PARENT}/connections/{PEERING_NAME}"
RANGES_MASK = "reservedPeeringRanges"
SERVICE_NETWORKING = ("servicenetworking", "v1")
RESOURCE_MANAGER = ("cloudresourcemanager", "v1")


def peering_range_request(spec: RunSpec, owner: Owner) -> ApiRequest:
    """Reserve the global range peered to the Lustre service (``addresses create --global --purpose=VPC_PEERING``).

    gcloud sends ``addressType: INTERNAL`` and ``ipVersion: IPV4`` without being asked (gcloud.md §4); so do we. The
    start address is sent only when the conf gives one; otherwise Google picks a free block of the prefix length.
    The description is the owner's record (an address takes labels only through setLabels, FACTS §15); gcloud sends
    none.
    """
    address = compute_v1.Address(
        name=spec.peering_range,
        description=owner.description,
        purpose=compute_v1.Address.Purpose.VPC_PEERING.name,
        address_type=compute_v1.Address.AddressType.INTERNAL.name,
        ip_version=compute_v1.Address.IpVersion.IPV4.name,
        prefix_length=spec.peering_prefix_length,
        network=compute_url(spec.network_path(spec.network)),
    )
    if spec.peering_range_address:
        address.address = spec.peering_range_address
    path = spec.global_address_path(spec.peering_range)
    return ApiRequest(
        service="compute",
        method="globalAddresses.insert",
        http_method="POST",
        path="/compute/v1/" + collection_path(path),
        body=message_body(address),
        resource=f"global address {spec.peering_range}",
        message=address,
    )


def project_request(spec: RunSpec) -> ApiRequest:
    """Read the project, whose ``projectNumber`` Service Networking needs (what ``vpc-peerings connect`` does first)."""
    return discovery_request(
        *RESOURCE_MANAGER, "projects.get", resource=f"project {spec.project}", params={"projectId": spec.project}
    )


def connection_list_request(spec: RunSpec, project_number: str = PROJECT_NUMBER_PLACEHOLDER) -> ApiRequest:
    """List NET's peering connections to the service: create only when there is none (a repeat does not 409)."""
    return discovery_request(
        *SERVICE_NETWORKING,
        "services.connections.list",
        resource=f"peering connections of {spec.network}",
        params={"parent": SERVICE_PARENT, "network": spec.consumer_network_path(project_number)},
    )


def connection_create_request(spec: RunSpec, project_number: str = PROJECT_NUMBER_PLACEHOLDER) -> ApiRequest:
    """Peer NET with the service over the reserved range (``services vpc-peerings connect``)."""
    return discovery_request(
        *SERVICE_NETWORKING,
        "services.connections.create",
        resource=f"peering connection {spec.network} -> {PEERING_SERVICE}",
        params={"parent": SERVICE_PARENT},
        body={
            "network": spec.consumer_network_path(project_number),
            "reservedPeeringRanges": [spec.peering_range],
        },
    )


# ---------------------------------------------------------------------------------------------------------------------
# Teardown
# ---------------------------------------------------------------------------------------------------------------------
def connection_delete_request(spec: RunSpec, project_number: str = PROJECT_NUMBER_PLACEHOLDER) -> ApiRequest:
    """Remove NET's peering with the service (``services vpc-peerings delete``): POST, no ``:deleteConnection``."""
    return discovery_request(
        *SERVICE_NETWORKING,
        "services.connections.deleteConnection",
        resource=f"peering connection {spec.network} -> {PEERING_SERVICE}",
        params={"name": ANY_CONNECTION},
        body={"consumerNetwork": spec.consumer_network_path(project_number)},
    )


def connection_ranges_request(spec: RunSpec, project_number: str, ranges: list[str]) -> ApiRequest:
    """Set the connection's reserved ranges to ``ranges`` (``connections.patch``, FACTS §13): how a run group adds its
    range to a connection another group made, and takes only its own out again. Dropping a range needs ``force``."""
    return discovery_request(
        *SERVICE_NETWORKING,
        "services.connections.patch",
        resource=f"peering connection {spec.network} -> {PEERING_SERVICE}",
        params={"name": CONNECTION_NAME, "updateMask": RANGES_MASK, "force": "true"},
        body={"network": spec.consumer_network_path(project_number), "reservedPeeringRanges": list(ranges)},
    )


def connection_join_request(spec: RunSpec, project_number: str = PROJECT_NUMBER_PLACEHOLDER) -> ApiRequest:
    """The create when the VPC's connection exists already (another run group's, FACTS §13): our range added to its
    ranges (printed with :data:`OTHER_RANGES_PLACEHOLDER` for the ones it has)."""
    return connection_ranges_request(spec, project_number, [OTHER_RANGES_PLACEHOLDER, spec.peering_range])


def connection_leave_request(spec: RunSpec, project_number: str = PROJECT_NUMBER_PLACEHOLDER) -> ApiRequest:
    """The delete while other run groups' ranges stay on the connection: only ours taken out."""
    return connection_ranges_request(spec, project_number, [OTHER_RANGES_PLACEHOLDER])


def filled_ranges(request: ApiRequest, others: list[str]) -> dict[str, Any]:
    """A join or leave request's body with the connection's other ranges in place of their placeholder (what the
    run sends once it has read them)."""
    body = dict(request.body or {})
    ranges: list[str] = []
    for item in body.get("reservedPeeringRanges") or []:
        ranges += list(others) if item == OTHER_RANGES_PLACEHOLDER else [item]
    return {**body, "reservedPeeringRanges": ranges}


def peering_range_delete_request(spec: RunSpec) -> ApiRequest:
    """Release the reserved range (only once the peering that uses it is gone)."""
    return ApiRequest(
        service="compute",
        method="globalAddresses.delete",
        http_method="DELETE",
        path="/compute/v1/" + spec.global_address_path(spec.peering_range),
        body=None,
        resource=f"global address {spec.peering_range}",
        message=compute_v1.DeleteGlobalAddressRequest(project=spec.project, address=spec.peering_range),
    )
