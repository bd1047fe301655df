"""The GKE cluster and its GPU node pool, as resources of a run (container v1 over REST)."""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.gcp.operations import CONTAINER, OperationRef
from nemo_rl_gke.gcp.resources.base import Resource, absent_on_404, list_operations
from nemo_rl_gke.gcp.resources.drift import Check, after_project, as_int, last_part, message_dict, normalize_ref
from nemo_rl_gke.run.ownership import Owner, owner_from_labels

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook


class _GkeResource(Resource):
    """The cluster and the node pool: container v1 over REST, operations in the cluster's location."""

    @property
    @abstractmethod
    def target_path(self) -> str:
        """The resource path its operations' ``targetLink`` ends with."""

    # ClusterManagerClient method suffix: get_cluster / create_cluster / delete_cluster, ..._node_pool.
    api_noun: str = ""

    def get(self, hook: GcpHook) -> dict[str, Any] | None:
        """``get_<noun>``; ``None`` on 404 (for a pool, also when its cluster is gone)."""
        method = getattr(hook.container_client, f"get_{self.api_noun}")
        found = absent_on_404(lambda: hook.call(method, name=self.target_path, what=f"get {self.label}"))
        return None if found is None else message_dict(found)

    def create(self, hook: GcpHook) -> OperationRef:
        """``create_<noun>`` with the builder's request message."""
        method = getattr(hook.container_client, f"create_{self.api_noun}")
        return self._operation(hook.call(method, request=self.request.message, what=f"create {self.label}"))

    def delete(self, hook: GcpHook) -> OperationRef | None:
        """``delete_<noun>`` with the plan's request (a cluster's pools go with it); ``None`` on 404."""
        method = getattr(hook.container_client, f"delete_{self.api_noun}")
        request = self.delete_message()
        operation = absent_on_404(lambda: hook.call(method, request=request, what=f"delete {self.label}"))
        return None if operation is None else self._operation(operation)

    def _operation(self, operation: Any) -> OperationRef:
        # The operation's name may be the bare id or a full path; the poller needs the location-scoped GET path.
        op_id = operation.name.rsplit("/", 1)[-1]
        location = operation.location or operation.zone or self.spec.region
        path = f"/v1/projects/{self.spec.project}/locations/{location}/operations/{op_id}"
        return OperationRef("container", path, CONTAINER, self.label)

    state_field = "status"  # PROVISIONING, RUNNING, RECONCILING, STOPPING, ERROR, ...
    ready_states = ("RUNNING",)
    failed_states = ("ERROR", "RUNNING_WITH_ERROR")  # a pool's RUNNING_WITH_ERROR too
    deleting_states = ("STOPPING",)

    def pending_operation(self, hook: GcpHook, actual: dict[str, Any]) -> OperationRef | None:
        """The unfinished container operation whose target is this object (not a child of it)."""
        response = list_operations(hook, hook.container_client.list_operations, self, parent=self.spec.cluster_parent)
        for operation in response.operations if response is not None else ():
            if operation.status.name == "DONE" or not operation.target_link:
                continue
            # GKE's operation links name the project by number, our paths by ID: compare what follows it.
            if after_project(normalize_ref(operation.target_link)) == after_project(normalize_ref(self.target_path)):
                return self._operation(operation)
        return None


class GkeCluster(_GkeResource):
    """The regional GKE cluster with its default pool."""

    kind = "GKE cluster"
    body_root = "cluster"
    api_noun = "cluster"
    checks = (
        Check("network", ref=True),
        Check("networkConfig.enableMultiNetworking", default=False),
        Check("networkConfig.datapathProvider", default="DATAPATH_PROVIDER_UNSPECIFIED"),
        Check("ipAllocationPolicy.useIpAliases", default=False),
        Check("addonsConfig.rayOperatorConfig.enabled", default=False),
        Check("addonsConfig.lustreCsiDriverConfig.enabled", default=False),
        Check("addonsConfig.lustreCsiDriverConfig.enableLegacyLustrePort", default=False),
        Check("workloadIdentityConfig.workloadPool"),
    )

    @property
    def target_path(self) -> str:
        """The cluster's path."""
        return self.spec.cluster_path

    def recorded_owner(self, actual: dict[str, Any]) -> Owner | None:
        """The cluster's resource labels."""
        return owner_from_labels(actual.get("resourceLabels"))


def _accelerators(value: Any) -> list[list[Any]]:
    return [[a.get("acceleratorType"), as_int(a.get("acceleratorCount"))] for a in value or []]


def _node_networks(value: Any) -> list[list[Any]]:
    # The pool takes bare names; GKE may answer with paths. The order is the NIC order, so it is kept.
    return [[last_part(n.get("network")), last_part(n.get("subnetwork"))] for n in value or []]


def _reservation(value: Any) -> list[Any] | None:
    if not value:
        return None
    return [value.get("consumeReservationType"), value.get("key"), list(value.get("values") or [])]


class GkeNodePool(_GkeResource):
    """The GPU node pool in the zone, on the reservation, with the gVNIC and RDMA NICs."""

    kind = "GKE node pool"
    body_root = "nodePool"
    api_noun = "node_pool"
    checks = (
        Check("config.machineType"),
        Check("config.accelerators", norm=_accelerators),
        Check("config.reservationAffinity", norm=_reservation),
        Check(
            "networkConfig.additionalNodeNetworkConfigs",
            norm=_node_networks,
        ),
        Check("locations", norm=lambda v: sorted(v or [])),
    )

    @property
    def target_path(self) -> str:
        """The pool's path."""
        return self.spec.node_pool_path

    def recorded_owner(self, actual: dict[str, Any]) -> Owner | None:
        """The nodes' resource labels (node pools have no labels of their own)."""
        config = actual.get("config") or {}
        return owner_from_labels(config.get("resourceLabels"))

    def problem(self, actual: dict[str, Any]) -> str:
        """A stock-out GKE reports on the pool (a GCE_STOCKOUT condition): its GPU nodes will not come."""
        stockouts = [c for c in actual.get("conditions") or [] if c.get("code") == "GCE_STOCKOUT"]
        if not stockouts:
            return ""
        said = "; ".join(str(c.get("message", "")) for c in stockouts)
        if self.spec.capacity == "reservation":
            short = f"reservation '{self.spec.reservation}' in zone {self.spec.zone} has no capacity left"
            other = "a reservation (or zone) that has free machines (reservation, zone)"
        else:
            short = f"zone {self.spec.zone} has no {self.spec.capacity} capacity for {self.spec.effective_machine_type}"
            other = "another zone, or a capacity_ladder that goes on to another option"
        return (
            f"{self.label}: GKE reports a stock-out (GCE_STOCKOUT: {said}), so its GPU nodes will not come: {short}. "
            f"Fix: use {other}, wait until capacity frees up and run again, or ask for fewer GPU nodes (a smaller "
            "worker_replicas)."
        )

    def scale_to_zero(self, hook: GcpHook) -> OperationRef | None:
        """``setSize`` to 0 nodes: a cluster kept warm bills no GPU node until the next run scales it up (the pool
        autoscales from 0 when the RayCluster's pods ask for GPUs). ``None`` when the pool is gone."""
        from google.cloud import container_v1

        request = container_v1.SetNodePoolSizeRequest(name=self.target_path, node_count=0)
        operation = absent_on_404(
            lambda: hook.call(hook.container_client.set_node_pool_size, request=request, what=f"scale {self.label}")
        )
        return None if operation is None else self._operation(operation)
