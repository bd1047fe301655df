"""Every Google Cloud object of a run, keyed by the task id of the step that makes it (:mod:`nemo_rl_gke.run.topology`).

Names and requests come from the plan's :func:`~nemo_rl_gke.plan.provision.provision_requests` only, so what the plan
prints is what the resources send, and teardown deletes exactly what setup made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nemo_rl_gke.gcp.resources.compute import Firewall, GlobalAddress, LustreFirewall, Network, Subnet
from nemo_rl_gke.gcp.resources.gke import GkeCluster, GkeNodePool
from nemo_rl_gke.gcp.resources.lustre import LustreInstance
from nemo_rl_gke.gcp.resources.peering import PeeringConnection
from nemo_rl_gke.plan.provision import provision_requests
from nemo_rl_gke.run import topology as t

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.resources.base import Resource
    from nemo_rl_gke.run.ownership import Owner
    from nemo_rl_gke.run.spec import RunSpec

# The resource class of each step (the RDMA subnets are added below).
KINDS: dict[str, type[Resource]] = {
    t.NET: Network,
    t.GVNIC_NET: Network,
    t.GVNIC_SUB: Subnet,
    t.GVNIC_FW: Firewall,
    t.RDMA_NET: Network,
    **dict.fromkeys(t.RDMA_SUBS, Subnet),
    t.PEERING_RANGE: GlobalAddress,
    t.PEERING: PeeringConnection,
    t.LUSTRE_FW: LustreFirewall,
    t.LUSTRE: LustreInstance,
    t.GKE_CLUSTER: GkeCluster,
    t.NODE_POOL: GkeNodePool,
}


def resources(spec: RunSpec, owner: Owner) -> dict[str, Resource]:
    """Every Google Cloud object of the run, by task id, in the topology's creation order.

    ``owner`` is the run's identity: stamped on what it creates, compared with what it finds.
    """
    found: dict[str, Resource] = {}
    for key, step in provision_requests(spec, owner).items():
        extra: dict[str, Any] = {}
        if key == t.PEERING:
            extra = {"lookups": step.lookups, "peering_range": found[t.PEERING_RANGE]}
        elif key == t.LUSTRE_FW:
            extra = {"peering_range": found[t.PEERING_RANGE]}
        found[key] = KINDS[key](
            spec,
            owner,
            key=key,
            name=step.name,
            name_param=step.name_param,
            request=step.create,
            delete_request=step.delete,
            **extra,
        )
    return found
