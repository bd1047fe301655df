"""Compute Engine objects of a run: the networks, subnets, the firewall rules and the peering range."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from nemo_rl_gke.gcp.operations import COMPUTE, OperationRef
from nemo_rl_gke.gcp.resources.base import Resource, absent_on_404, request_id
from nemo_rl_gke.gcp.resources.drift import Check, as_int, message_dict
from nemo_rl_gke.gcp.resources.errors import NotReadyError
from nemo_rl_gke.plan.networks import lustre_firewall_request
from nemo_rl_gke.run.ownership import Owner, owner_from_description

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook


class _ComputeResource(Resource):
    """A Compute Engine object: networks, subnets, firewalls and global addresses share one client shape."""

    client_name: ClassVar[str]
    field: ClassVar[str]  # the client's keyword for the name: network, subnetwork, firewall, address
    regional: ClassVar[bool] = False
    marker_where = "description"  # the only place Compute lets a record live

    def _scope(self) -> dict[str, str]:
        scope = {"project": self.spec.project}
        if self.regional:
            scope["region"] = self.spec.region
        return scope

    def _client(self, hook: GcpHook) -> Any:
        return hook.compute(self.client_name)

    def get(self, hook: GcpHook) -> dict[str, Any] | None:
        """GET the object; ``None`` on 404."""
        client = self._client(hook)
        found = absent_on_404(
            lambda: hook.call(client.get, **self._scope(), **{self.field: self.name}, what=f"get {self.label}")
        )
        return None if found is None else message_dict(found)

    def create(self, hook: GcpHook) -> OperationRef:
        """POST the builder's message to the collection."""
        # insert_unary, not insert: insert's ExtendedOperation polls through a client built without our
        # client_options, i.e. always compute.googleapis.com. The operator defers on the OperationRef instead.
        client = self._client(hook)
        request = {**self._scope(), f"{self.field}_resource": self.request.message, "request_id": request_id()}
        operation = hook.call(client.insert_unary, request=request, what=f"create {self.label}")
        return self._operation(operation.name)

    def delete(self, hook: GcpHook) -> OperationRef | None:
        """DELETE the object with the plan's request (a fresh request id added); ``None`` when it was already gone."""
        client = self._client(hook)
        request = self.delete_message(request_id=request_id())
        operation = absent_on_404(lambda: hook.call(client.delete_unary, request=request, what=f"delete {self.label}"))
        return None if operation is None else self._operation(operation.name)

    def _operation(self, name: str) -> OperationRef:
        # The operation's selfLink carries whatever host answered; the path is rebuilt so the poller adds its own.
        scope = f"regions/{self.spec.region}" if self.regional else "global"
        path = f"/compute/v1/projects/{self.spec.project}/{scope}/operations/{name.rsplit('/', 1)[-1]}"
        return OperationRef("compute", path, COMPUTE, self.label)

    def recorded_owner(self, actual: dict[str, Any]) -> Owner | None:
        """The description record (Compute networks, subnets, firewalls and addresses take no labels at insert)."""
        return owner_from_description(actual.get("description"))


class Network(_ComputeResource):
    """A VPC network: NET (auto subnets), the gVNIC network, the RDMA network (RoCE profile)."""

    kind = "network"
    client_name = "networks"
    field = "network"
    checks = (
        Check("autoCreateSubnetworks", default=False),
        Check("routingConfig.routingMode"),
        # 1460 is the API's MTU when none is given.
        Check("mtu", default=None, norm=as_int),
        Check("networkProfile", ref=True),
    )

    def drift(self, actual: dict[str, Any]) -> list[str]:
        """As :meth:`Resource.drift`; an MTU the API left unset is its default, 1460."""
        if "mtu" not in actual:
            actual = {**actual, "mtu": 1460}
        return super().drift(actual)


class Subnet(_ComputeResource):
    """A regional subnet of the gVNIC or RDMA network."""

    kind = "subnet"
    client_name = "subnetworks"
    field = "subnetwork"
    regional = True
    checks = (Check("ipCidrRange"), Check("network", ref=True))


def _rules(allowed: Any) -> list[list[Any]]:
    # Protocols are case-insensitive to the API ("TCP" == "tcp"); icmp has no ports.
    return sorted([str(r.get("IPProtocol", "")).lower(), sorted(r.get("ports") or [])] for r in allowed or [])


class Firewall(_ComputeResource):
    """The gVNIC network's internal allow rule."""

    kind = "firewall"
    client_name = "firewalls"
    field = "firewall"
    checks = (
        Check("network", ref=True),
        Check("direction", default="INGRESS"),
        Check("allowed", norm=_rules),
        Check("sourceRanges", norm=lambda v: sorted(v or [])),
    )


class LustreFirewall(Firewall):
    """NET's rule letting Lustre traffic in from the peering range, whose CIDR Google may pick: read at create time."""

    def __init__(self, *args: Any, peering_range: GlobalAddress, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peering_range = peering_range

    def create(self, hook: GcpHook) -> OperationRef:
        """Insert the rule with the range's CIDR as the API reports it (the conf's address is only a request)."""
        actual = self.peering_range.get(hook)
        if actual is None or not actual.get("address"):
            raise NotReadyError(f"{self.peering_range.label} has no address yet; run the task again once it has")
        cidr = f"{actual['address']}/{actual.get('prefixLength', self.spec.peering_prefix_length)}"
        message = lustre_firewall_request(self.spec, self.owner, cidr).message
        request = {**self._scope(), "firewall_resource": message, "request_id": request_id()}
        operation = hook.call(self._client(hook).insert_unary, request=request, what=f"create {self.label}")
        return self._operation(operation.name)

    def drift(self, actual: dict[str, Any]) -> list[str]:
        """As :meth:`Resource.drift`, but the source range is only compared when the conf fixes the range's address."""
        if self.spec.peering_range_cidr:
            return super().drift(actual)
        return [line for line in super().drift(actual) if not line.startswith("sourceRanges")]


class GlobalAddress(_ComputeResource):
    """The range reserved on NET for the private services peering (purpose VPC_PEERING)."""

    kind = "global address"
    client_name = "global_addresses"
    field = "address"
    checks = (
        Check("purpose"),
        Check("addressType", default="EXTERNAL"),
        Check("prefixLength", norm=as_int),
        Check("network", ref=True),
        Check("address"),
    )
    state_field = "status"  # RESERVING, RESERVED or IN_USE

    def ready(self, actual: dict[str, Any]) -> bool:
        """Reserved (or already used by the peering)."""
        return self.state(actual) != "RESERVING"
