"""The VPC networks, subnets and firewall rules of a run, as Compute Engine REST requests.

Three networks (gcloud.md §1-3, FACTS §4): the main network NET (auto subnets: the cluster and Lustre live on it, with
a rule that lets Lustre traffic in from the peering range), the gVNIC network (one subnet, one internal firewall rule)
and the RDMA network (RoCE network profile, eight subnets, one per GPU NIC). None of them can carry labels, so each
carries its owner's exact description record (FACTS §15); gcloud sends no description, and that record is what lets
teardown and adoption tell a group's resources apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.cloud import compute_v1

from nemo_rl_gke.plan.api import ApiRequest, collection_path, compute_url, message_body

if TYPE_CHECKING:
    from nemo_rl_gke.run.ownership import Owner
    from nemo_rl_gke.run.spec import RunSpec

SERVICE = "compute"
API_PREFIX = "/compute/v1/"
# gcloud's --rules=tcp:0-65535,udp:0-65535,icmp: protocol strings as typed (lower case), icmp without ports.
GVNIC_FIREWALL_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tcp", ("0-65535",)),
    ("udp", ("0-65535",)),
    ("icmp", ()),
)
# Lustre's ports, opened from the private-services range on the VPC (Google's GKE Managed Lustre guide, FACTS §19):
# 988, and 6988, the legacy port of instances made with gke-support-enabled (as ours are).
LUSTRE_FIREWALL_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (("tcp", ("988", "6988")),)
# The range's CIDR when Google picks its address: known only once the range exists (the create reads it then).
PEERING_CIDR_PLACEHOLDER = "<PEERING_RANGE_CIDR>"
# gcloud always sends a routing mode; its --bgp-routing-mode defaults to regional (gcloud.md §1).
ROUTING_MODE = compute_v1.NetworkRoutingConfig.RoutingMode.REGIONAL.name


def _insert(
    resource: str, kind: str, path: str, message: compute_v1.Network | compute_v1.Subnetwork | compute_v1.Firewall
) -> ApiRequest:
    """POST ``message`` to the collection of ``path`` (Compute's ``insert`` takes the whole resource as the body)."""
    return ApiRequest(
        service=SERVICE,
        method=f"{kind}.insert",
        http_method="POST",
        path=API_PREFIX + collection_path(path),
        body=message_body(message),
        resource=resource,
        message=message,
    )


def _network(spec: RunSpec, owner: Owner, name: str, *, auto_subnets: bool, **extra: object) -> ApiRequest:
    network = compute_v1.Network(
        name=name,
        description=owner.description,
        auto_create_subnetworks=auto_subnets,
        routing_config=compute_v1.NetworkRoutingConfig(routing_mode=ROUTING_MODE),
        **extra,
    )
    return _insert(f"network {name}", "networks", spec.network_path(name), network)


def main_network_request(spec: RunSpec, owner: Owner) -> ApiRequest:
    """Create NET, the auto-mode network of the cluster and of Lustre (``networks create NET --subnet-mode=auto``).

    Unlike gcloud (which sends no MTU unless --mtu is given) the MTU is always sent: the default 1460 is the API's own
    default, and 8896 speeds up Lustre clients.
    """
    return _network(spec, owner, spec.network, auto_subnets=True, mtu=spec.net_mtu)


def gvnic_network_request(spec: RunSpec, owner: Owner) -> ApiRequest:
    """Create the gVNIC network (``networks create {prefix}-net --subnet-mode=custom``)."""
    return _network(spec, owner, spec.gvnic_network, auto_subnets=False)


def rdma_network_request(spec: RunSpec, owner: Owner) -> ApiRequest:
    """Create the RDMA network on the zone's RoCE profile (``--network-profile={zone}-vpc-roce``, custom subnets)."""
    profile = compute_url(spec.network_profile_path)
    return _network(spec, owner, spec.rdma_network, auto_subnets=False, network_profile=profile)


def _subnet(spec: RunSpec, owner: Owner, name: str, network: str, cidr: str) -> ApiRequest:
    subnet = compute_v1.Subnetwork(
        name=name,
        description=owner.description,
        network=compute_url(spec.network_path(network)),
        ip_cidr_range=cidr,
        # gcloud always sends its --enable-private-ip-google-access flag, false by default (gcloud.md §2).
        private_ip_google_access=False,
    )
    return _insert(f"subnet {name}", "subnetworks", spec.subnet_path(name), subnet)


def gvnic_subnet_request(spec: RunSpec, owner: Owner) -> ApiRequest:
    """Create the gVNIC subnet in the region (``subnets create {prefix}-sub --range=192.168.0.0/24``)."""
    return _subnet(spec, owner, spec.gvnic_subnet, spec.gvnic_network, spec.gvnic_subnet_cidr)


def rdma_subnet_requests(spec: RunSpec, owner: Owner) -> list[ApiRequest]:
    """Create the eight RDMA subnets, in NIC order (``subnets create {prefix}-sub-N --range=192.168.N+1.0/24``)."""
    return [
        _subnet(spec, owner, name, spec.rdma_network, cidr)
        for name, cidr in zip(spec.rdma_subnets, spec.rdma_subnet_cidrs, strict=True)
    ]


def gvnic_firewall_request(spec: RunSpec, owner: Owner) -> ApiRequest:
    """Allow tcp, udp and icmp inside the gVNIC network (``firewall-rules create {prefix}-internal --action=ALLOW``)."""
    firewall = compute_v1.Firewall(
        name=spec.gvnic_firewall,
        description=owner.description,
        network=compute_url(spec.network_path(spec.gvnic_network)),
        # gcloud always sends a direction: INGRESS unless --direction says otherwise (gcloud.md §3).
        direction=compute_v1.Firewall.Direction.INGRESS.name,
        allowed=[
            compute_v1.Allowed(I_p_protocol=protocol, ports=list(ports)) for protocol, ports in GVNIC_FIREWALL_RULES
        ],
        source_ranges=[spec.firewall_source_range],
    )
    return _insert(f"firewall {spec.gvnic_firewall}", "firewalls", spec.firewall_path(spec.gvnic_firewall), firewall)


def lustre_firewall_request(spec: RunSpec, owner: Owner, source_range: str = "") -> ApiRequest:
    """Allow Lustre's tcp 988 and 6988 into NET from the peering range (``firewall-rules create L-fw
    --network=NET --allow=tcp:988,tcp:6988 --source-ranges=RANGE``, Google's GKE Managed Lustre guide).

    ``source_range`` is the range's CIDR as read from the API; without it, the conf's, else a placeholder.
    """
    firewall = compute_v1.Firewall(
        name=spec.lustre_firewall,
        description=owner.description,
        network=compute_url(spec.network_path(spec.network)),
        direction=compute_v1.Firewall.Direction.INGRESS.name,
        allowed=[
            compute_v1.Allowed(I_p_protocol=protocol, ports=list(ports)) for protocol, ports in LUSTRE_FIREWALL_RULES
        ],
        source_ranges=[source_range or spec.peering_range_cidr or PEERING_CIDR_PLACEHOLDER],
    )
    return _insert(f"firewall {spec.lustre_firewall}", "firewalls", spec.firewall_path(spec.lustre_firewall), firewall)


# ---------------------------------------------------------------------------------------------------------------------
# Teardown
# ---------------------------------------------------------------------------------------------------------------------
def _delete(kind: str, label: str, path: str, message: object) -> ApiRequest:
    return ApiRequest(
        service=SERVICE,
        method=f"{kind}.delete",
        http_method="DELETE",
        path=API_PREFIX + path,
        body=None,
        resource=f"{label} {path.rsplit('/', 1)[1]}",
        message=message,
    )


def network_delete_request(spec: RunSpec, name: str) -> ApiRequest:
    """Delete one network of this run (an auto-mode network takes its auto subnets with it)."""
    message = compute_v1.DeleteNetworkRequest(project=spec.project, network=name)
    return _delete("networks", "network", spec.network_path(name), message)


def subnet_delete_request(spec: RunSpec, name: str) -> ApiRequest:
    """Delete one subnet of this run."""
    message = compute_v1.DeleteSubnetworkRequest(project=spec.project, region=spec.region, subnetwork=name)
    return _delete("subnetworks", "subnet", spec.subnet_path(name), message)


def firewall_delete_request(spec: RunSpec, name: str) -> ApiRequest:
    """Delete one firewall rule of this run."""
    message = compute_v1.DeleteFirewallRequest(project=spec.project, firewall=name)
    return _delete("firewalls", "firewall", spec.firewall_path(name), message)
