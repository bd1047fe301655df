"""The GKE cluster and its GPU node pool, as container v1 REST requests (gcloud.md §6-7, FACTS §4).

The bodies reproduce what ``gcloud container clusters create`` and ``node-pools create`` send for the tutorial's flags,
including what gcloud adds unasked: the addons ``--addons`` implicitly disables, the gke-default OAuth scopes, node
management and surge upgrades. Both bodies are whole ``Create*Request`` messages (``parent`` is repeated in the body,
as gcloud does). ``resourceLabels`` carry our ownership marker; gcloud sends none.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from google.cloud import container_v1

from nemo_rl_gke.plan.api import ApiRequest, message_body
from nemo_rl_gke.run.conf_schema import FLEX_KINDS, QUEUED, RESERVATION_CAPACITY, SPOT

if TYPE_CHECKING:
    from nemo_rl_gke.run.ownership import Owner
    from nemo_rl_gke.run.spec import RunSpec

SERVICE = "container"
API_PREFIX = "/v1/"
# What gcloud sends for its default --scopes=gke-default (gcloud.md §6b: constants.GKE_DEFAULT_SCOPES, sorted).
# The API's own default is no scope at all, which would leave nodes unable to pull images or write logs.
GKE_DEFAULT_SCOPES: tuple[str, ...] = (
    "https://www.googleapis.com/auth/devstorage.read_only",
    "https://www.googleapis.com/auth/logging.write",
    "https://www.googleapis.com/auth/monitoring",
    "https://www.googleapis.com/auth/service.management.readonly",
    "https://www.googleapis.com/auth/servicecontrol",
    "https://www.googleapis.com/auth/trace.append",
)
RESERVATION_KEY = "compute.googleapis.com/reservation-name"


def _management() -> container_v1.NodeManagement:
    # gcloud's defaults: --enable-autoupgrade, and auto-repair whenever no --image-type is given (gcloud.md §6c, §7).
    return container_v1.NodeManagement(auto_repair=True, auto_upgrade=True)


def _upgrade_settings() -> container_v1.NodePool.UpgradeSettings:
    # gcloud's default --max-surge-upgrade=1 (gcloud.md §6c, §7).
    return container_v1.NodePool.UpgradeSettings(max_surge=1)


def cluster_create_request(spec: RunSpec, owner: Owner) -> ApiRequest:
    """Create the regional cluster with its default pool (``gcloud container clusters create`` of the tutorial).

    The default pool's node counts are per zone of the region, as gcloud's --num-nodes/--min-nodes/--max-nodes are.
    """
    addons = container_v1.AddonsConfig(
        # --addons=RayOperator,LustreCsiDriver enables those two and explicitly disables these four (gcloud.md §6a).
        http_load_balancing=container_v1.HttpLoadBalancing(disabled=True),
        horizontal_pod_autoscaling=container_v1.HorizontalPodAutoscaling(disabled=True),
        kubernetes_dashboard=container_v1.KubernetesDashboard(disabled=True),
        network_policy_config=container_v1.NetworkPolicyConfig(disabled=True),
        ray_operator_config=container_v1.RayOperatorConfig(enabled=True),
        lustre_csi_driver_config=container_v1.LustreCsiDriverConfig(enabled=True, enable_legacy_lustre_port=True),
    )
    default_pool = container_v1.NodePool(
        name=spec.system_pool_name,
        initial_node_count=spec.system_initial_nodes,
        config=container_v1.NodeConfig(machine_type=spec.system_machine_type, oauth_scopes=list(GKE_DEFAULT_SCOPES)),
        autoscaling=container_v1.NodePoolAutoscaling(
            enabled=True, min_node_count=spec.system_min_nodes, max_node_count=spec.system_max_nodes
        ),
        management=_management(),
        upgrade_settings=_upgrade_settings(),
    )
    request = container_v1.CreateClusterRequest(
        parent=spec.cluster_parent,
        cluster=container_v1.Cluster(
            name=spec.cluster_name,
            # gcloud passes --network through as the raw name, not a URL (gcloud.md §6d).
            network=spec.network,
            addons_config=addons,
            ip_allocation_policy=container_v1.IPAllocationPolicy(use_ip_aliases=True, create_subnetwork=False),
            network_config=container_v1.NetworkConfig(
                datapath_provider=container_v1.DatapathProvider.ADVANCED_DATAPATH, enable_multi_networking=True
            ),
            workload_identity_config=container_v1.WorkloadIdentityConfig(workload_pool=spec.workload_pool),
            node_pools=[default_pool],
            resource_labels=owner.labels,
        ),
    )
    if spec.gke_version:
        request.cluster.initial_cluster_version = spec.gke_version  # --cluster-version; else GKE's default
    return ApiRequest(
        service=SERVICE,
        method="projects.locations.clusters.create",
        http_method="POST",
        path=f"{API_PREFIX}{spec.cluster_parent}/clusters",
        # gcloud sends these two at their zero value; proto3 cannot tell that from "unset" unless told (api.py).
        body=message_body(
            request, explicit=("cluster.ipAllocationPolicy.createSubnetwork", "cluster.nodePools.initialNodeCount")
        ),
        resource=f"GKE cluster {spec.cluster_name}",
        message=request,
    )


def _reservation_affinity(spec: RunSpec) -> container_v1.ReservationAffinity:
    """Only the named reservation (``--reservation-affinity=specific``), or none at all (``=none``): a pool without
    a reservation must not take a reservation's VMs meant for someone else (GKE's default is ANY_RESERVATION)."""
    if spec.capacity == RESERVATION_CAPACITY:
        return container_v1.ReservationAffinity(
            consume_reservation_type=container_v1.ReservationAffinity.Type.SPECIFIC_RESERVATION,
            key=RESERVATION_KEY,
            values=[spec.reservation],
        )
    return container_v1.ReservationAffinity(
        consume_reservation_type=container_v1.ReservationAffinity.Type.NO_RESERVATION
    )


def node_pool_create_request(spec: RunSpec, owner: Owner) -> ApiRequest:
    """Create the GPU node pool in the zone (``gcloud container node-pools create gpu-pool`` of the tutorial).

    It starts empty and autoscales up to ``gpu_pool_max_nodes`` in total (the total_* fields; they cannot be mixed
    with the per-zone ones), and gets the gVNIC NIC then the eight RDMA NICs, which cannot be changed after creation.
    Its capacity (``spec.capacity``) as GKE's docs give the gcloud flags for each:

    - reservation: ``--reservation-affinity=specific --reservation=NAME``;
    - flex_start: ``--flex-start [--max-run-duration] --reservation-affinity=none --location-policy=ANY
      --no-enable-autorepair``, autoscaling from 0 (GKE DWS flex-start docs);
    - queued: flex-start's flags and ``--enable-queued-provisioning``; the max run duration goes on the run's
      ProvisioningRequest (``maxRunDurationSeconds``), not the pool (GKE docs: flex-start with queued provisioning);
    - spot: ``--spot --reservation-affinity=none``;
    - on_demand: ``--reservation-affinity=none``.
    """
    gpu = spec.gpu
    flex = spec.capacity in FLEX_KINDS
    extra_networks = [
        container_v1.AdditionalNodeNetworkConfig(network=spec.gvnic_network, subnetwork=spec.gvnic_subnet),
        *(
            container_v1.AdditionalNodeNetworkConfig(network=spec.rdma_network, subnetwork=subnet)
            for subnet in spec.rdma_subnets
        ),
    ]
    config = container_v1.NodeConfig(
        machine_type=spec.effective_machine_type,
        accelerators=[
            container_v1.AcceleratorConfig(
                accelerator_type=gpu.accelerator_type,
                accelerator_count=gpu.gpus_per_node,
                gpu_driver_installation_config=container_v1.GPUDriverInstallationConfig(
                    gpu_driver_version=container_v1.GPUDriverInstallationConfig.GPUDriverVersion.DEFAULT
                ),
            )
        ],
        oauth_scopes=list(GKE_DEFAULT_SCOPES),
        reservation_affinity=_reservation_affinity(spec),
        resource_labels=owner.labels,
    )
    # Set only when asked for, as gcloud does: flex_start is an optional field, sent even as false once set.
    if spec.capacity == SPOT:
        config.spot = True
    if flex:
        config.flex_start = True
        if spec.flex_start_max_hours and spec.capacity != QUEUED:
            # Whole seconds, as GKE's Duration field and gcloud's --max-run-duration take it.
            config.max_run_duration = timedelta(seconds=round(spec.flex_start_max_hours * 3600))
    autoscaling = container_v1.NodePoolAutoscaling(enabled=True, total_max_node_count=spec.gpu_pool_max_nodes)
    management = _management()
    if flex:
        # Flex-start VMs are not repaired (a node that ends is gone) and come from wherever in the zone has them.
        autoscaling.location_policy = container_v1.NodePoolAutoscaling.LocationPolicy.ANY
        management.auto_repair = False
    request = container_v1.CreateNodePoolRequest(
        parent=spec.cluster_path,
        node_pool=container_v1.NodePool(
            name=spec.node_pool_name,
            initial_node_count=0,
            locations=[spec.zone],
            autoscaling=autoscaling,
            config=config,
            management=management,
            # Bare names, as gcloud passes --additional-node-network through (gcloud.md §7).
            network_config=container_v1.NodeNetworkConfig(additional_node_network_configs=extra_networks),
            upgrade_settings=_upgrade_settings(),
        ),
    )
    if spec.capacity == QUEUED:
        # Its nodes come only through a ProvisioningRequest; GKE taints them cloud.google.com/gke-queued.
        request.node_pool.queued_provisioning = container_v1.NodePool.QueuedProvisioning(enabled=True)
    return ApiRequest(
        service=SERVICE,
        method="projects.locations.clusters.nodePools.create",
        http_method="POST",
        path=f"{API_PREFIX}{spec.cluster_path}/nodePools",
        # --num-nodes=0 is sent as an explicit 0 by gcloud; proto3 drops it unless told (api.py). So is
        # --no-enable-autorepair's false.
        body=message_body(
            request,
            explicit=("nodePool.initialNodeCount", *(("nodePool.management.autoRepair",) if flex else ())),
        ),
        resource=f"GKE node pool {spec.node_pool_name}",
        message=request,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Teardown
# ---------------------------------------------------------------------------------------------------------------------
def cluster_delete_request(spec: RunSpec) -> ApiRequest:
    """Delete the cluster; its node pools, the GPU pool included, go with it."""
    return ApiRequest(
        service=SERVICE,
        method="projects.locations.clusters.delete",
        http_method="DELETE",
        path=API_PREFIX + spec.cluster_path,
        body=None,
        resource=f"GKE cluster {spec.cluster_name}",
        message=container_v1.DeleteClusterRequest(name=spec.cluster_path),
    )


def node_pool_delete_request(spec: RunSpec) -> ApiRequest:
    """Delete only the GPU pool (for a teardown that keeps the cluster; with the cluster delete it is not needed)."""
    return ApiRequest(
        service=SERVICE,
        method="projects.locations.clusters.nodePools.delete",
        http_method="DELETE",
        path=API_PREFIX + spec.node_pool_path,
        body=None,
        resource=f"GKE node pool {spec.node_pool_name}",
        message=container_v1.DeleteNodePoolRequest(name=spec.node_pool_path),
    )
