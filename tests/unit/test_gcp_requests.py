"""The GCP request builders: each request equals, field for field, what gcloud sends for the tutorial's command.

The expected bodies are transcribed from /work/notes/gcloud.md (gcloud 578.0.0 and 528.0.0, run against a loopback
server) with the tutorial's names filled in. Each ``GCLOUD_*`` dict is what gcloud sends; each field's comment names
the flag it comes from, or says "implicit" where gcloud adds it unasked. Where our body deliberately differs (the
ownership marker, the MTU), the difference is a separate dict, merged in, with the reason next to it.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

import pytest
from google.cloud import compute_v1, container_v1, lustre_v1

from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.plan import api
from nemo_rl_gke.plan.api import ApiRequest, DiscoveryMismatchError, discovery_request, message_body
from nemo_rl_gke.plan.gke import (
    GKE_DEFAULT_SCOPES,
    cluster_create_request,
    cluster_delete_request,
    node_pool_create_request,
    node_pool_delete_request,
)
from nemo_rl_gke.plan.lustre import lustre_create_request, lustre_delete_request
from nemo_rl_gke.plan.peering import (
    PROJECT_NUMBER_PLACEHOLDER,
    connection_create_request,
    connection_delete_request,
    connection_list_request,
    peering_range_delete_request,
    peering_range_request,
    project_request,
)
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.ownership import Owner
from nemo_rl_gke.run.spec import RunSpec

# The tutorial's run (its names are RunSpec's defaults) in a concrete project and location.
P, R, Z = "my-project", "us-east5", "us-east5-b"
SPEC = RunSpec.from_conf({"project": P, "region": R, "zone": Z, "reservation": "my-res"})
PN = "123456789012"  # a project number, as projects.get would return it
COMPUTE = f"https://compute.googleapis.com/compute/v1/projects/{P}"
NET, GVNIC_NET, GVNIC_SUB, FIREWALL = "nemo-rl-net", "nemo-rl-gvnic-net", "nemo-rl-gvnic-sub", "nemo-rl-gvnic-internal"
RDMA_NET = "nemo-rl-rdma-net"
RDMA_SUBS = [f"nemo-rl-rdma-sub-{n}" for n in range(8)]
RANGE, CLUSTER, POOL, LUSTRE = "nemo-rl-lustre-range", "nemo-rl-cluster", "gpu-pool", "nemo-rl-lustre"
# The run's identity: its deployment, its run group and the run that creates things.
OWNER = Owner("dep-a", SPEC.group_id, "nemo_rl_grpo_gke/manual__test")
LABELS = OWNER.labels
# Networks, subnets, firewalls and addresses take no labels at insert: the owner's description record marks them.
# gcloud sends none.
OURS_DESCRIPTION = {"description": OWNER.description}


def network_requests(spec: RunSpec) -> list[ApiRequest]:
    """The network stage's creates, in the topology's order (from the registry, as the plan lists them)."""
    return [r.request for r in resources(spec, OWNER).values() if r.stage == t.NETWORK]


def network_delete_requests(spec: RunSpec) -> list[ApiRequest]:
    """The network stage's deletes, in the topology's teardown order."""
    found = resources(spec, OWNER)
    order = [target for s in t.teardown_steps() for target in s.deletes if target in found]
    return [found[k].delete_request for k in order if found[k].stage == t.NETWORK]


def _by_resource(requests: list[ApiRequest]) -> dict[str, ApiRequest]:
    found = {r.resource: r for r in requests}
    assert len(found) == len(requests), "two requests for the same resource"
    return found


# =====================================================================================================================
# Networks (gcloud.md §1-3)
# =====================================================================================================================
# gcloud compute networks create NET --subnet-mode=auto
GCLOUD_NET = {
    "name": NET,
    "autoCreateSubnetworks": True,  # --subnet-mode=auto
    "routingConfig": {"routingMode": "REGIONAL"},  # implicit: --bgp-routing-mode defaults to regional
}
# gcloud compute networks create {GVNIC}-net --subnet-mode=custom
GCLOUD_GVNIC_NET = {
    "name": GVNIC_NET,
    "autoCreateSubnetworks": False,  # --subnet-mode=custom
    "routingConfig": {"routingMode": "REGIONAL"},  # implicit
}
# gcloud compute networks create {RDMA}-net --network-profile={ZONE}-vpc-roce --subnet-mode=custom
GCLOUD_RDMA_NET = {
    "name": RDMA_NET,
    "autoCreateSubnetworks": False,  # --subnet-mode=custom
    # --network-profile: gcloud resolves the bare name in the caller's project to a full compute URL
    "networkProfile": f"{COMPUTE}/global/networkProfiles/{Z}-vpc-roce",
    "routingConfig": {"routingMode": "REGIONAL"},  # implicit
}


def _gcloud_subnet(name: str, network: str, cidr: str) -> dict[str, Any]:
    # gcloud compute networks subnets create NAME --network=NETWORK --region=R --range=CIDR
    return {
        "name": name,
        "network": f"{COMPUTE}/global/networks/{network}",  # --network, resolved to a full URL
        "ipCidrRange": cidr,  # --range
        "privateIpGoogleAccess": False,  # implicit: --enable-private-ip-google-access is store_true, always sent
    }


# gcloud compute firewall-rules create {GVNIC}-internal --network=... --action=ALLOW
#     --rules=tcp:0-65535,udp:0-65535,icmp --source-ranges=192.168.0.0/16
GCLOUD_FIREWALL = {
    "name": FIREWALL,
    "network": f"{COMPUTE}/global/networks/{GVNIC_NET}",  # --network, resolved to a full URL
    "allowed": [  # --action=ALLOW --rules=...; protocols as typed, icmp without ports (an empty list is omitted)
        {"IPProtocol": "tcp", "ports": ["0-65535"]},
        {"IPProtocol": "udp", "ports": ["0-65535"]},
        {"IPProtocol": "icmp"},
    ],
    "direction": "INGRESS",  # implicit: always sent, INGRESS unless --direction
    "sourceRanges": ["192.168.0.0/16"],  # --source-ranges
}


def test_network_requests_come_in_creation_order() -> None:
    requests = network_requests(SPEC)
    assert [(r.method, r.resource) for r in requests] == [
        ("networks.insert", f"network {NET}"),
        ("networks.insert", f"network {GVNIC_NET}"),
        ("subnetworks.insert", f"subnet {GVNIC_SUB}"),
        ("firewalls.insert", f"firewall {FIREWALL}"),
        ("networks.insert", f"network {RDMA_NET}"),
        *(("subnetworks.insert", f"subnet {s}") for s in RDMA_SUBS),
    ]
    assert {(r.service, r.http_method) for r in requests} == {("compute", "POST")}


def test_main_network_is_gclouds_plus_description_and_mtu() -> None:
    request = _by_resource(network_requests(SPEC))[f"network {NET}"]
    assert request.path == f"/compute/v1/projects/{P}/global/networks"
    # gcloud sends no mtu without --mtu; the API's default is 1460, so sending net_mtu=1460 changes nothing, and the
    # conf may raise it to 8896 for Lustre throughput (FACTS §4).
    assert request.body == {**GCLOUD_NET, **OURS_DESCRIPTION, "mtu": 1460}
    jumbo = RunSpec.from_conf({"project": P, "net_mtu": 8896})
    assert _by_resource(network_requests(jumbo))[f"network {NET}"].body["mtu"] == 8896


def test_gvnic_network_is_gclouds_plus_description() -> None:
    request = _by_resource(network_requests(SPEC))[f"network {GVNIC_NET}"]
    assert request.path == f"/compute/v1/projects/{P}/global/networks"
    assert request.body == {**GCLOUD_GVNIC_NET, **OURS_DESCRIPTION}


def test_rdma_network_is_gclouds_plus_description() -> None:
    request = _by_resource(network_requests(SPEC))[f"network {RDMA_NET}"]
    assert request.path == f"/compute/v1/projects/{P}/global/networks"
    assert request.body == {**GCLOUD_RDMA_NET, **OURS_DESCRIPTION}
    # No MTU on the side networks: the tutorial sets none, and the RoCE profile decides the RDMA network's.
    assert "mtu" not in request.body


def test_subnets_are_gclouds_plus_description() -> None:
    by_resource = _by_resource(network_requests(SPEC))
    gvnic = by_resource[f"subnet {GVNIC_SUB}"]
    assert gvnic.path == f"/compute/v1/projects/{P}/regions/{R}/subnetworks"  # --region: in the path only
    assert gvnic.body == {**_gcloud_subnet(GVNIC_SUB, GVNIC_NET, "192.168.0.0/24"), **OURS_DESCRIPTION}
    for n, name in enumerate(RDMA_SUBS):
        rdma = by_resource[f"subnet {name}"]
        assert rdma.path == f"/compute/v1/projects/{P}/regions/{R}/subnetworks"
        # the tutorial's loop: --range=192.168.$((N+1)).0/24
        assert rdma.body == {**_gcloud_subnet(name, RDMA_NET, f"192.168.{n + 1}.0/24"), **OURS_DESCRIPTION}


def test_firewall_is_gclouds_plus_description() -> None:
    request = _by_resource(network_requests(SPEC))[f"firewall {FIREWALL}"]
    assert request.path == f"/compute/v1/projects/{P}/global/firewalls"
    assert request.body == {**GCLOUD_FIREWALL, **OURS_DESCRIPTION}
    assert "priority" not in request.body  # gcloud sends none either: the server default 1000 applies


def test_network_delete_requests_in_teardown_order() -> None:
    # FACTS §4: firewall, then subnets, then networks (a network still in use answers 400).
    base = f"/compute/v1/projects/{P}"
    assert [(r.method, r.http_method, r.path, r.body) for r in network_delete_requests(SPEC)] == [
        ("firewalls.delete", "DELETE", f"{base}/global/firewalls/{FIREWALL}", None),
        ("subnetworks.delete", "DELETE", f"{base}/regions/{R}/subnetworks/{GVNIC_SUB}", None),
        *(("subnetworks.delete", "DELETE", f"{base}/regions/{R}/subnetworks/{s}", None) for s in RDMA_SUBS),
        ("networks.delete", "DELETE", f"{base}/global/networks/{GVNIC_NET}", None),
        ("networks.delete", "DELETE", f"{base}/global/networks/{RDMA_NET}", None),
        ("networks.delete", "DELETE", f"{base}/global/networks/{NET}", None),
    ]
    created = {r.resource for r in network_requests(SPEC)}
    assert {r.resource for r in network_delete_requests(SPEC)} == created  # teardown deletes exactly what setup made


# =====================================================================================================================
# Peering (gcloud.md §4-5)
# =====================================================================================================================
# gcloud compute addresses create {LUSTRE}-range --global --purpose=VPC_PEERING --prefix-length=20 --network=NET
GCLOUD_RANGE = {
    "name": RANGE,
    "purpose": "VPC_PEERING",  # --purpose
    "prefixLength": 20,  # --prefix-length
    "network": f"{COMPUTE}/global/networks/{NET}",  # --network, resolved to a full URL
    "addressType": "INTERNAL",  # implicit: set whenever a network is given
    "ipVersion": "IPV4",  # implicit: set for a global address without --addresses
}
# Addresses take labels; we also set the description, which Compute documents as settable on create (labels are
# documented as "setLabels only", so the description keeps the marker even if an insert dropped them).
OURS_RANGE = OURS_DESCRIPTION


def test_peering_range_is_gclouds_plus_ownership() -> None:
    request = peering_range_request(SPEC, OWNER)
    assert (request.service, request.method, request.http_method) == ("compute", "globalAddresses.insert", "POST")
    assert request.path == f"/compute/v1/projects/{P}/global/addresses"
    assert request.body == {**GCLOUD_RANGE, **OURS_RANGE}
    assert "address" not in request.body  # no --addresses: Google picks a free /20


def test_peering_range_with_a_start_address() -> None:
    spec = RunSpec.from_conf({"project": P, "peering_range_address": "10.90.0.0", "peering_prefix_length": 22})
    body = peering_range_request(spec, OWNER).body
    # as `--addresses=10.90.0.0 --prefix-length=22` would send (ipVersion stays: gcloud drops it only with --addresses,
    # and the API's default for a global address is IPV4 anyway)
    assert body == {**GCLOUD_RANGE, **OURS_RANGE, "address": "10.90.0.0", "prefixLength": 22}


def test_project_number_lookup() -> None:
    # vpc-peerings connect first reads the project from Cloud Resource Manager v1 for its projectNumber.
    request = project_request(SPEC)
    assert request.to_dict() == {
        "service": "cloudresourcemanager",
        "method": "projects.get",
        "http_method": "GET",
        "path": f"/v1/projects/{P}",
        "body": None,
        "resource": f"project {P}",
    }


def test_connection_list_is_checked_before_create() -> None:
    # A repeated create does not answer 409 (FACTS §4): the action looks for an existing connection first.
    request = connection_list_request(SPEC, PN)
    assert (request.service, request.method, request.http_method) == (
        "servicenetworking",
        "services.connections.list",
        "GET",
    )
    assert request.path == (
        f"/v1/services/servicenetworking.googleapis.com/connections?network=projects/{PN}/global/networks/{NET}"
    )
    assert request.body is None


def test_connection_create_is_gclouds() -> None:
    # gcloud services vpc-peerings connect --service=servicenetworking.googleapis.com --ranges=RANGE --network=NET
    request = connection_create_request(SPEC, PN)
    assert (request.service, request.method, request.http_method) == (
        "servicenetworking",
        "services.connections.create",
        "POST",
    )
    assert request.path == "/v1/services/servicenetworking.googleapis.com/connections"  # --service
    assert request.body == {
        "network": f"projects/{PN}/global/networks/{NET}",  # --network, by project NUMBER (peering.py:22 in gcloud)
        "reservedPeeringRanges": [RANGE],  # --ranges
    }


def test_connection_delete_is_gclouds() -> None:
    # gcloud services vpc-peerings delete --network=NET: POST .../connections/- with no ":deleteConnection" suffix
    request = connection_delete_request(SPEC, PN)
    assert (request.method, request.http_method) == ("services.connections.deleteConnection", "POST")
    assert request.path == "/v1/services/servicenetworking.googleapis.com/connections/-"
    assert request.body == {"consumerNetwork": f"projects/{PN}/global/networks/{NET}"}


def test_project_number_is_a_placeholder_offline() -> None:
    # The plan is built without I/O: the number is known only after projects.get.
    assert (
        connection_create_request(SPEC).body["network"]
        == f"projects/{PROJECT_NUMBER_PLACEHOLDER}/global/networks/{NET}"
    )
    assert unquote(connection_list_request(SPEC).path).endswith(
        f"network=projects/{PROJECT_NUMBER_PLACEHOLDER}/global/networks/{NET}"
    )
    assert connection_delete_request(SPEC).body == {
        "consumerNetwork": f"projects/{PROJECT_NUMBER_PLACEHOLDER}/global/networks/{NET}"
    }


def test_peering_chain_and_its_teardown() -> None:
    found = resources(SPEC, OWNER)
    planned = [*found[t.PEERING_RANGE].planned, *found[t.PEERING].planned]
    assert [r.method for r in planned] == [
        "globalAddresses.insert",
        "projects.get",
        "services.connections.list",
        "services.connections.create",
    ]
    # FACTS §4: the connection goes before the range it uses.
    teardown = [target for s in t.teardown_steps() for target in s.deletes]
    assert teardown.index(t.PEERING) < teardown.index(t.PEERING_RANGE)
    assert found[t.PEERING].delete_request == connection_delete_request(SPEC)
    assert found[t.PEERING_RANGE].delete_request == peering_range_delete_request(SPEC)
    delete = peering_range_delete_request(SPEC)
    assert (delete.method, delete.http_method, delete.path, delete.body) == (
        "globalAddresses.delete",
        "DELETE",
        f"/compute/v1/projects/{P}/global/addresses/{RANGE}",
        None,
    )


# =====================================================================================================================
# Managed Lustre (gcloud.md §8)
# =====================================================================================================================
# gcloud lustre instances create L --per-unit-storage-throughput=500 --capacity-gib=18000 --filesystem=lustrefs
#     --location=ZONE --network=projects/P/global/networks/NET --gke-support-enabled
GCLOUD_LUSTRE = {
    "filesystem": "lustrefs",  # --filesystem
    "capacityGib": "18000",  # --capacity-gib (int64: a JSON string)
    "perUnitStorageThroughput": "500",  # --per-unit-storage-throughput (int64: a JSON string)
    "network": f"projects/{P}/global/networks/{NET}",  # --network: a relative path, not a URL
    "gkeSupportEnabled": True,  # --gke-support-enabled
}


def test_lustre_create_is_gclouds_plus_labels_and_where_its_checkpoint_records_live() -> None:
    request = lustre_create_request(SPEC, OWNER)
    assert (request.service, request.method, request.http_method) == (
        "lustre",
        "projects.locations.instances.create",
        "POST",
    )
    # --location=ZONE in the path; the instance ID is a query parameter, not a body field
    assert request.path == f"/v1/projects/{P}/locations/{Z}/instances?instanceId={LUSTRE}"
    # labels: our ownership marker, gcloud sends none; the description names the records' place once (gcp.pending)
    records = f"gs://{SPEC.export_bucket_name}/nemo-rl-gke/records/{P}/{Z}/{LUSTRE}/"
    assert request.body == {
        **GCLOUD_LUSTRE,
        "labels": LABELS,
        "description": "nemo-rl-gke checkpoint records v1 " + records,
    }


def test_lustre_delete() -> None:
    request = lustre_delete_request(SPEC)
    assert (request.method, request.http_method, request.path, request.body) == (
        "projects.locations.instances.delete",
        "DELETE",
        f"/v1/projects/{P}/locations/{Z}/instances/{LUSTRE}",
        None,
    )


# =====================================================================================================================
# GKE (gcloud.md §6-7)
# =====================================================================================================================
GCLOUD_MANAGEMENT = {"autoRepair": True, "autoUpgrade": True}  # implicit: --enable-autoupgrade/-autorepair defaults
GCLOUD_UPGRADE = {"maxSurge": 1}  # implicit: --max-surge-upgrade defaults to 1
# gcloud container clusters create CLUSTER --location=REGION --workload-pool=P.svc.id.goog --enable-dataplane-v2
#     --enable-ip-alias --enable-multi-networking --addons=RayOperator,LustreCsiDriver --enable-legacy-lustre-port
#     --machine-type=n2-highmem-80 --num-nodes=1 --min-nodes=1 --max-nodes=5 --enable-autoscaling --network=NET
GCLOUD_CLUSTER = {
    "parent": f"projects/{P}/locations/{R}",  # --location=REGION (also the URL), repeated in the body
    "cluster": {
        "name": CLUSTER,
        "network": NET,  # --network: the raw name, not a URL
        "addonsConfig": {
            # implicit: --addons disables every one of these four that it does not name
            "httpLoadBalancing": {"disabled": True},
            "horizontalPodAutoscaling": {"disabled": True},
            "kubernetesDashboard": {"disabled": True},
            "networkPolicyConfig": {"disabled": True},
            "rayOperatorConfig": {"enabled": True},  # --addons=RayOperator
            # --addons=LustreCsiDriver + --enable-legacy-lustre-port
            "lustreCsiDriverConfig": {"enabled": True, "enableLegacyLustrePort": True},
        },
        # --enable-ip-alias; createSubnetwork false is implicit (no --create-subnetwork)
        "ipAllocationPolicy": {"useIpAliases": True, "createSubnetwork": False},
        # --enable-dataplane-v2, --enable-multi-networking
        "networkConfig": {"datapathProvider": "ADVANCED_DATAPATH", "enableMultiNetworking": True},
        "workloadIdentityConfig": {"workloadPool": f"{P}.svc.id.goog"},  # --workload-pool
        "nodePools": [
            {
                "name": "default-pool",  # implicit: gcloud always creates the default pool through nodePools[]
                "initialNodeCount": 1,  # --num-nodes=1: PER ZONE of the regional cluster (3 nodes in 3 zones)
                "config": {
                    "machineType": "n2-highmem-80",  # --machine-type
                    "oauthScopes": list(GKE_DEFAULT_SCOPES),  # implicit: --scopes=gke-default
                },
                # --enable-autoscaling --min-nodes=1 --max-nodes=5: per zone as well
                "autoscaling": {"enabled": True, "minNodeCount": 1, "maxNodeCount": 5},
                "management": GCLOUD_MANAGEMENT,
                "upgradeSettings": GCLOUD_UPGRADE,
            }
        ],
    },
}


def test_gke_default_scopes_are_gclouds_list() -> None:
    # gcloud.md §6b: constants.GKE_DEFAULT_SCOPES, sorted, all under https://www.googleapis.com/auth/.
    assert list(GKE_DEFAULT_SCOPES) == sorted(GKE_DEFAULT_SCOPES)
    assert [s.removeprefix("https://www.googleapis.com/auth/") for s in GKE_DEFAULT_SCOPES] == [
        "devstorage.read_only",
        "logging.write",
        "monitoring",
        "service.management.readonly",
        "servicecontrol",
        "trace.append",
    ]


def test_cluster_create_is_gclouds_plus_resource_labels() -> None:
    request = cluster_create_request(SPEC, OWNER)
    assert (request.service, request.method, request.http_method) == (
        "container",
        "projects.locations.clusters.create",
        "POST",
    )
    assert request.path == f"/v1/projects/{P}/locations/{R}/clusters"
    expected = json.loads(json.dumps(GCLOUD_CLUSTER))
    expected["cluster"]["resourceLabels"] = LABELS  # our ownership marker; gcloud sends none without --labels
    assert request.body == expected


def test_cluster_create_follows_the_default_pool_conf() -> None:
    spec = RunSpec.from_conf(
        {
            "system_machine_type": "n2-standard-16",
            "system_initial_nodes": 2,
            "system_min_nodes": 0,
            "system_max_nodes": 3,
        }
    )
    (pool,) = cluster_create_request(spec, OWNER).body["cluster"]["nodePools"]
    assert pool["config"]["machineType"] == "n2-standard-16"
    assert pool["initialNodeCount"] == 2
    # minNodeCount 0 is proto3's zero value, and gcloud (apitools) would send 0 explicitly; the server reads both alike.
    assert pool["autoscaling"] == {"enabled": True, "maxNodeCount": 3}


def _gcloud_node_pool(spec: RunSpec, machine_type: str, accelerator: str) -> dict[str, Any]:
    # gcloud container node-pools create gpu-pool --cluster=C --location=REGION --node-locations=ZONE
    #     --machine-type=M --accelerator=type=A,count=8,gpu-driver-version=DEFAULT --reservation-affinity=specific
    #     --reservation=RES --enable-autoscaling --num-nodes=0 --total-max-nodes=2
    #     --additional-node-network=network={GVNIC}-net,subnetwork={GVNIC}-sub
    #     --additional-node-network=network={RDMA}-net,subnetwork={RDMA}-sub-N   (N = 0..7)
    return {
        "parent": f"projects/{spec.project}/locations/{spec.region}/clusters/{CLUSTER}",  # --cluster, --location
        "nodePool": {
            "name": POOL,
            "initialNodeCount": 0,  # --num-nodes=0, sent as an explicit 0
            "locations": [spec.zone],  # --node-locations
            "autoscaling": {"enabled": True, "totalMaxNodeCount": 2},  # --enable-autoscaling --total-max-nodes=2
            "config": {
                "machineType": machine_type,  # --machine-type
                "accelerators": [  # --accelerator (count is int64: a JSON string)
                    {
                        "acceleratorCount": "8",
                        "acceleratorType": accelerator,
                        "gpuDriverInstallationConfig": {"gpuDriverVersion": "DEFAULT"},
                    }
                ],
                "oauthScopes": list(GKE_DEFAULT_SCOPES),  # implicit: --scopes=gke-default
                "reservationAffinity": {  # --reservation-affinity=specific --reservation=RES
                    "consumeReservationType": "SPECIFIC_RESERVATION",
                    "key": "compute.googleapis.com/reservation-name",
                    "values": [spec.reservation],
                },
            },
            "management": GCLOUD_MANAGEMENT,
            # --additional-node-network, in flag order, names as given (not URLs)
            "networkConfig": {
                "additionalNodeNetworkConfigs": [
                    {"network": GVNIC_NET, "subnetwork": GVNIC_SUB},
                    *({"network": RDMA_NET, "subnetwork": s} for s in RDMA_SUBS),
                ]
            },
            "upgradeSettings": GCLOUD_UPGRADE,
        },
    }


@pytest.mark.parametrize(
    ("conf", "machine_type", "accelerator"),
    [
        ({}, "a4-highgpu-8g", "nvidia-b200"),  # the tutorial's B200 run
        ({"gpu_type": "h200"}, "a3-ultragpu-8g", "nvidia-h200-141gb"),  # FACTS §4 GPU pairs
    ],
    ids=["b200", "h200"],
)
def test_node_pool_create_is_gclouds_plus_resource_labels(
    conf: dict[str, Any], machine_type: str, accelerator: str
) -> None:
    spec = RunSpec.from_conf({"project": P, "region": R, "zone": Z, "reservation": "my-res", **conf})
    request = node_pool_create_request(spec, OWNER)
    assert (request.service, request.method, request.http_method) == (
        "container",
        "projects.locations.clusters.nodePools.create",
        "POST",
    )
    assert request.path == f"/v1/projects/{P}/locations/{R}/clusters/{CLUSTER}/nodePools"
    expected = _gcloud_node_pool(spec, machine_type, accelerator)
    expected["nodePool"]["config"]["resourceLabels"] = LABELS  # our ownership marker, on the pool's VMs
    assert request.body == expected


def test_node_pool_max_nodes_is_a_total() -> None:
    spec = RunSpec.from_conf({"worker_replicas": 4, "gpu_pool_max_nodes": 4})
    autoscaling = node_pool_create_request(spec, OWNER).body["nodePool"]["autoscaling"]
    # total_* and per-zone fields cannot be mixed (FACTS §4)
    assert autoscaling == {"enabled": True, "totalMaxNodeCount": 4}


def test_gke_chain_and_its_teardown() -> None:
    found = resources(SPEC, OWNER)
    assert [found[k].request.method for k in (t.GKE_CLUSTER, t.NODE_POOL)] == [
        "projects.locations.clusters.create",
        "projects.locations.clusters.nodePools.create",
    ]
    # The cluster delete takes its node pools with it: the pool has no teardown step.
    assert t.step(t.NODE_POOL).teardown is None
    assert found[t.GKE_CLUSTER].delete_request == cluster_delete_request(SPEC)
    deletes = (cluster_delete_request(SPEC), node_pool_delete_request(SPEC))
    assert [(r.method, r.http_method, r.path, r.body) for r in deletes] == [
        ("projects.locations.clusters.delete", "DELETE", f"/v1/projects/{P}/locations/{R}/clusters/{CLUSTER}", None),
        (
            "projects.locations.clusters.nodePools.delete",
            "DELETE",
            f"/v1/projects/{P}/locations/{R}/clusters/{CLUSTER}/nodePools/{POOL}",
            None,
        ),
    ]


# =====================================================================================================================
# Typed bodies and message_body
# =====================================================================================================================
def _all_requests(spec: RunSpec, project_number: str = PN) -> list[ApiRequest]:
    # Every create and delete of the registry; the peering's with the project number it sends at run time.
    found = {k: r for k, r in resources(spec, OWNER).items() if k != t.PEERING}
    return [
        *(r.request for r in found.values()),
        project_request(spec),
        connection_list_request(spec, project_number),
        connection_create_request(spec, project_number),
        *(r.delete_request for r in found.values()),
        connection_delete_request(spec, project_number),
    ]


@pytest.mark.parametrize(
    "make",
    [
        lambda: compute_v1.Network(nmae="x"),
        lambda: compute_v1.Allowed(ip_protocol="tcp"),  # the field is I_p_protocol
        lambda: container_v1.Cluster(workload_identity=container_v1.WorkloadIdentityConfig()),
        lambda: container_v1.NodePoolAutoscaling(total_max_nodes=2),
        lambda: lustre_v1.Instance(capacity_gb=18000),
    ],
    ids=["compute-network", "compute-allowed", "container-cluster", "container-autoscaling", "lustre-instance"],
)
def test_a_misspelt_field_raises(make: Any) -> None:
    with pytest.raises(ValueError, match="Unknown field"):
        make()


def test_a_misspelt_service_networking_field_raises() -> None:
    with pytest.raises(DiscoveryMismatchError, match="reservedRanges"):
        discovery_request(
            "servicenetworking",
            "v1",
            "services.connections.create",
            resource="x",
            params={"parent": "services/servicenetworking.googleapis.com"},
            body={"network": "projects/1/global/networks/n", "reservedRanges": ["r"]},
        )
    with pytest.raises(DiscoveryMismatchError, match="output only"):
        discovery_request(
            "servicenetworking",
            "v1",
            "services.connections.create",
            resource="x",
            params={"parent": "services/servicenetworking.googleapis.com"},
            body={"network": "projects/1/global/networks/n", "peering": "p"},
        )
    with pytest.raises(DiscoveryMismatchError, match="no method"):
        discovery_request("servicenetworking", "v1", "services.connections.remove", resource="x", params={})
    with pytest.raises(DiscoveryMismatchError, match="does not match"):
        discovery_request(
            "servicenetworking", "v1", "services.connections.list", resource="x", params={"parent": "a/b/c"}
        )


def test_a_misspelt_explicit_field_raises() -> None:
    policy = container_v1.IPAllocationPolicy(use_ip_aliases=True)
    with pytest.raises(ValueError, match="createSubnet"):
        message_body(policy, explicit=("createSubnet",))
    assert message_body(policy, explicit=("createSubnetwork",)) == {"useIpAliases": True, "createSubnetwork": False}


def test_message_body_speaks_rest_json() -> None:
    firewall = compute_v1.Firewall(
        name="f", allowed=[compute_v1.Allowed(I_p_protocol="icmp", ports=[])], denied=[], source_ranges=["10.0.0.0/8"]
    )
    # JSON names (IPProtocol), empty lists left out, as apitools does
    assert message_body(firewall) == {"name": "f", "allowed": [{"IPProtocol": "icmp"}], "sourceRanges": ["10.0.0.0/8"]}
    accelerator = container_v1.AcceleratorConfig(
        accelerator_count=8,
        gpu_driver_installation_config=container_v1.GPUDriverInstallationConfig(
            gpu_driver_version=container_v1.GPUDriverInstallationConfig.GPUDriverVersion.LATEST
        ),
    )
    # int64 as a string, enums by name
    assert message_body(accelerator) == {
        "acceleratorCount": "8",
        "gpuDriverInstallationConfig": {"gpuDriverVersion": "LATEST"},
    }
    assert message_body(lustre_v1.Instance(labels={})) == {}  # an empty map is left out too


TYPED = [r for r in _all_requests(SPEC) if r.message is not None and r.body is not None]
DELETES = [r for r in _all_requests(SPEC) if r.http_method == "DELETE"]


@pytest.mark.parametrize("request_", DELETES, ids=lambda r: r.resource)
def test_every_delete_carries_the_clients_message_for_the_path_it_prints(request_: ApiRequest) -> None:
    # The action sends this message (a copy with its request id): it names exactly the object the plan prints.
    assert request_.body is None and request_.message is not None, request_.resource
    fields = {k: v for k, v in type(request_.message).to_dict(request_.message).items() if v}
    path = request_.path.split("?")[0]
    if "name" in fields:  # GKE and Lustre: the resource's full name is the path
        assert path == "/v1/" + fields.pop("name")
    else:  # Compute: the project, the region (regional objects) and the object's name
        after = path.split("/projects/", 1)[1].split("/")  # project, global or regions/<region>, collection, name
        assert after[0] == fields.pop("project")
        if after[1] == "regions":
            assert after[2] == fields.pop("region")
        assert [fields.pop(k) for k in list(fields)] == [after[-1]]
    assert not fields


@pytest.mark.parametrize("request_", TYPED, ids=lambda r: r.resource)
def test_every_body_parses_back_into_its_message(request_: ApiRequest) -> None:
    # The body is valid JSON for the message type (no unknown field) and loses nothing.
    cls = type(request_.message)
    assert cls.from_json(json.dumps(request_.body)) == request_.message
    assert request_.body == message_body(request_.message, explicit=_explicit(request_))


def _explicit(request_: ApiRequest) -> tuple[str, ...]:
    return {
        "projects.locations.clusters.create": (
            "cluster.ipAllocationPolicy.createSubnetwork",
            "cluster.nodePools.initialNodeCount",
        ),
        "projects.locations.clusters.nodePools.create": ("nodePool.initialNodeCount",),
    }.get(request_.method, ())


def test_api_request_to_dict_and_equality_leave_the_message_out() -> None:
    request = lustre_create_request(SPEC, OWNER)
    assert set(request.to_dict()) == {"service", "method", "http_method", "path", "body", "resource"}
    json.dumps([r.to_dict() for r in _all_requests(SPEC)])  # the whole plan is JSON
    assert request == ApiRequest(**request.to_dict())  # the message does not take part in equality
    assert "message" not in repr(request)


def test_compute_urls() -> None:
    assert api.compute_url(SPEC.network_path(NET)) == f"{COMPUTE}/global/networks/{NET}"
    assert api.collection_path(SPEC.subnet_path(GVNIC_SUB)) == f"projects/{P}/regions/{R}/subnetworks"


# =====================================================================================================================
# Every path is made of API words and names from the spec
# =====================================================================================================================
API_WORDS = {
    "compute",
    "v1",
    "projects",
    "global",
    "networks",
    "subnetworks",
    "firewalls",
    "addresses",
    "regions",
    "locations",
    "clusters",
    "nodePools",
    "instances",
    "instanceId",
    "services",
    "servicenetworking.googleapis.com",
    "connections",
    "network",
    "-",
}


@pytest.mark.parametrize(
    "conf",
    [
        {},
        {
            "project": "pj-odd",
            "region": "rg-odd",
            "zone": "rg-odd-z",
            "network": "nw-odd",
            "gvnic_prefix": "gv-odd",
            "rdma_prefix": "rd-odd",
            "cluster_name": "cl-odd",
            "node_pool_name": "np-odd",
            "lustre_name": "lu-odd",
        },
    ],
    ids=["tutorial", "renamed"],
)
def test_paths_only_hold_names_from_the_spec(conf: dict[str, Any]) -> None:
    spec = RunSpec.from_conf(conf)
    names = {
        spec.project,
        spec.region,
        spec.zone,
        spec.network,
        spec.gvnic_network,
        spec.gvnic_subnet,
        spec.gvnic_firewall,
        spec.rdma_network,
        *spec.rdma_subnets,
        spec.peering_range,
        spec.lustre_firewall,
        spec.cluster_name,
        spec.node_pool_name,
        spec.lustre_name,
        PN,
    }
    for request in _all_requests(spec):
        segments = [s for s in re.split(r"[/?=&]", unquote(request.path)) if s]
        strangers = [s for s in segments if s not in API_WORDS | names]
        assert not strangers, f"{request.resource}: {request.path} has {strangers}"
        assert spec.project in request.path or request.service == "servicenetworking"
