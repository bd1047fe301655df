"""Every Google Cloud object of a run, keyed by the task id of the step that makes it (:mod:`nemo_rl_gke.topology`).

Names and bodies come from the RunSpec and the request builders only, so teardown deletes exactly what setup made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_gke import topology as t
from nemo_rl_gke.gcp.gke import (
    cluster_create_request,
    cluster_delete_request,
    node_pool_create_request,
    node_pool_delete_request,
)
from nemo_rl_gke.gcp.lustre import lustre_create_request, lustre_delete_request
from nemo_rl_gke.gcp.networks import (
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
from nemo_rl_gke.gcp.peering import peering_range_delete_request, peering_range_request
from nemo_rl_gke.gcp.resources.compute import Firewall, GlobalAddress, LustreFirewall, Network, Subnet
from nemo_rl_gke.gcp.resources.gke import GkeCluster, GkeNodePool
from nemo_rl_gke.gcp.resources.lustre import LustreInstance
from nemo_rl_gke.gcp.resources.peering import PeeringConnection

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.api import ApiRequest
    from nemo_rl_gke.gcp.resources.base import Resource
    from nemo_rl_gke.ownership import Owner
    from nemo_rl_gke.spec import RunSpec


def resources(spec: RunSpec, owner: Owner) -> dict[str, Resource]:
    """Every Google Cloud object of the run, by task id, in the topology's creation order.

    ``owner`` is the run's identity: stamped on what it creates, compared with what it finds.
    """

    def network(key: str, name: str, param: str, request: ApiRequest) -> Network:
        delete = network_delete_request(spec, name)
        return Network(spec, owner, key=key, name=name, name_param=param, request=request, delete_request=delete)

    def subnet(key: str, name: str, param: str, request: ApiRequest) -> Subnet:
        delete = subnet_delete_request(spec, name)
        return Subnet(spec, owner, key=key, name=name, name_param=param, request=request, delete_request=delete)

    peering_range = GlobalAddress(
        spec,
        owner,
        key=t.PEERING_RANGE,
        name=spec.peering_range,
        name_param="lustre_name",
        request=peering_range_request(spec, owner),
        delete_request=peering_range_delete_request(spec),
    )
    found: list[Resource] = [
        network(t.NET, spec.network, "network", main_network_request(spec, owner)),
        network(t.GVNIC_NET, spec.gvnic_network, "gvnic_prefix", gvnic_network_request(spec, owner)),
        subnet(t.GVNIC_SUB, spec.gvnic_subnet, "gvnic_prefix", gvnic_subnet_request(spec, owner)),
        Firewall(
            spec,
            owner,
            key=t.GVNIC_FW,
            name=spec.gvnic_firewall,
            name_param="gvnic_prefix",
            request=gvnic_firewall_request(spec, owner),
            delete_request=firewall_delete_request(spec, spec.gvnic_firewall),
        ),
        network(t.RDMA_NET, spec.rdma_network, "rdma_prefix", rdma_network_request(spec, owner)),
        *(
            subnet(key, name, "rdma_prefix", request)
            for key, name, request in zip(
                t.RDMA_SUBS, spec.rdma_subnets, rdma_subnet_requests(spec, owner), strict=True
            )
        ),
        peering_range,
        PeeringConnection(spec, owner, key=t.PEERING, peering_range=peering_range),
        LustreFirewall(
            spec,
            owner,
            key=t.LUSTRE_FW,
            name=spec.lustre_firewall,
            name_param="lustre_name",
            request=lustre_firewall_request(spec, owner),
            delete_request=firewall_delete_request(spec, spec.lustre_firewall),
            peering_range=peering_range,
        ),
        LustreInstance(
            spec,
            owner,
            key=t.LUSTRE,
            name=spec.lustre_name,
            name_param="lustre_name",
            request=lustre_create_request(spec, owner),
            delete_request=lustre_delete_request(spec),
        ),
        GkeCluster(
            spec,
            owner,
            key=t.GKE_CLUSTER,
            name=spec.cluster_name,
            name_param="cluster_name",
            request=cluster_create_request(spec, owner),
            delete_request=cluster_delete_request(spec),
        ),
        GkeNodePool(
            spec,
            owner,
            key=t.NODE_POOL,
            name=spec.node_pool_name,
            name_param="node_pool_name",
            request=node_pool_create_request(spec, owner),
            delete_request=node_pool_delete_request(spec),
        ),
    ]
    by_key = {resource.key: resource for resource in found}
    # The topology is the order: a resource missing from it (or from here) is a bug, caught at first use.
    order = [s.task_id for s in t.gcp_resources()]
    if sorted(order) != sorted(by_key):
        raise RuntimeError(f"the GCP resources {sorted(by_key)} do not match the topology's {sorted(order)}")
    return {key: by_key[key] for key in order}
