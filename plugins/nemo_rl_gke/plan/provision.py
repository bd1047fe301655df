"""What provisioning sends: for each Google Cloud step of the topology, the object's name, the requests its create
makes and its delete request, all built from the RunSpec.

Pure (no I/O): the resources of :mod:`nemo_rl_gke.gcp.resources` are made from these and send them, and the plan
prints them, so both read one object per step instead of rebuilding it twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nemo_rl_gke.plan.gke import (
    cluster_create_request,
    cluster_delete_request,
    node_pool_create_request,
    node_pool_delete_request,
)
from nemo_rl_gke.plan.lustre import lustre_create_request, lustre_delete_request
from nemo_rl_gke.plan.networks import (
    firewall_delete_request,
    gvnic_firewall_request,
    gvnic_network_request,
    gvnic_subnet_request,
    lustre_firewall_request,
    main_network_request,
    network_delete_request,
    rdma_network_request,
    rdma_subnet_requests,
    subnet_delete_request,
)
from nemo_rl_gke.plan.peering import (
    PEERING_SERVICE,
    PROJECT_NUMBER_PLACEHOLDER,
    connection_create_request,
    connection_delete_request,
    connection_join_request,
    connection_leave_request,
    connection_list_request,
    peering_range_delete_request,
    peering_range_request,
    project_request,
)
from nemo_rl_gke.run import topology as t

if TYPE_CHECKING:
    from nemo_rl_gke.plan.api import ApiRequest
    from nemo_rl_gke.run.ownership import Owner
    from nemo_rl_gke.run.spec import RunSpec


@dataclass(frozen=True)
class StepRequests:
    """The requests of one Google Cloud step.

    :param key: the step's task id (:mod:`nemo_rl_gke.run.topology`).
    :param name: the object's name in Google Cloud.
    :param name_param: the conf parameter the name comes from, named in error messages.
    :param create: the create request; its message is sent and its body is the drift reference.
    :param delete: the delete request.
    :param lookups: the reads the create makes before it (the peering's project number and connections).
    :param shared: the create and the delete instead, when the object is shared with other run groups (the VPC's one
        Service Networking connection: our range added to it, and only ours taken out again).
    """

    key: str
    name: str
    name_param: str
    create: ApiRequest
    delete: ApiRequest
    lookups: tuple[ApiRequest, ...] = ()
    shared: tuple[ApiRequest, ApiRequest] | None = None

    @property
    def stage(self) -> str:
        """The stage of its step."""
        return t.step(self.key).stage

    @property
    def planned(self) -> list[ApiRequest]:
        """The requests its creation makes, in order, as the plan lists them."""
        return [*self.lookups, self.create]


def provision_requests(spec: RunSpec, owner: Owner) -> dict[str, StepRequests]:
    """Every Google Cloud step of the run, by task id, in the topology's creation order.

    ``owner`` is the run's identity, stamped on what the creates make. Values only the cloud knows are placeholders:
    the project number (Service Networking's network path) and a peering range's CIDR when Google picks it.
    """
    subnets = zip(t.RDMA_SUBS, spec.rdma_subnets, rdma_subnet_requests(spec, owner), strict=True)
    found: Iterable[StepRequests] = [
        StepRequests(
            t.NET,
            spec.network,
            "network",
            main_network_request(spec, owner),
            network_delete_request(spec, spec.network),
        ),
        StepRequests(
            t.GVNIC_NET,
            spec.gvnic_network,
            "gvnic_prefix",
            gvnic_network_request(spec, owner),
            network_delete_request(spec, spec.gvnic_network),
        ),
        StepRequests(
            t.GVNIC_SUB,
            spec.gvnic_subnet,
            "gvnic_prefix",
            gvnic_subnet_request(spec, owner),
            subnet_delete_request(spec, spec.gvnic_subnet),
        ),
        StepRequests(
            t.GVNIC_FW,
            spec.gvnic_firewall,
            "gvnic_prefix",
            gvnic_firewall_request(spec, owner),
            firewall_delete_request(spec, spec.gvnic_firewall),
        ),
        StepRequests(
            t.RDMA_NET,
            spec.rdma_network,
            "rdma_prefix",
            rdma_network_request(spec, owner),
            network_delete_request(spec, spec.rdma_network),
        ),
        *(
            StepRequests(key, name, "rdma_prefix", request, subnet_delete_request(spec, name))
            for key, name, request in subnets
        ),
        StepRequests(
            t.PEERING_RANGE,
            spec.peering_range,
            "lustre_name",
            peering_range_request(spec, owner),
            peering_range_delete_request(spec),
        ),
        StepRequests(
            t.PEERING,
            f"{spec.network}->{PEERING_SERVICE}",
            "network",
            connection_create_request(spec, PROJECT_NUMBER_PLACEHOLDER),
            connection_delete_request(spec, PROJECT_NUMBER_PLACEHOLDER),
            lookups=(project_request(spec), connection_list_request(spec)),
            shared=(connection_join_request(spec), connection_leave_request(spec)),
        ),
        StepRequests(
            t.LUSTRE_FW,
            spec.lustre_firewall,
            "lustre_name",
            lustre_firewall_request(spec, owner),
            firewall_delete_request(spec, spec.lustre_firewall),
        ),
        StepRequests(
            t.LUSTRE, spec.lustre_name, "lustre_name", lustre_create_request(spec, owner), lustre_delete_request(spec)
        ),
        StepRequests(
            t.GKE_CLUSTER,
            spec.cluster_name,
            "cluster_name",
            cluster_create_request(spec, owner),
            cluster_delete_request(spec),
        ),
        StepRequests(
            t.NODE_POOL,
            spec.node_pool_name,
            "node_pool_name",
            node_pool_create_request(spec, owner),
            node_pool_delete_request(spec),
        ),
    ]
    by_key = {step.key: step for step in found}
    # The topology is the order: a step missing from it (or from here) is a bug, caught at first use.
    order = [s.task_id for s in t.gcp_resources()]
    if sorted(order) != sorted(by_key):
        raise RuntimeError(f"the GCP resources {sorted(by_key)} do not match the topology's {sorted(order)}")
    return {key: by_key[key] for key in order}
