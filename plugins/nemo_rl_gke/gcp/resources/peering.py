"""NET's Service Networking connection to the Lustre service, as a resource of the run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nemo_rl_gke.gcp.operations import LONGRUNNING, OperationRef
from nemo_rl_gke.gcp.peering import (
    ANY_CONNECTION,
    PEERING_SERVICE,
    PROJECT_NUMBER_PLACEHOLDER,
    SERVICE_PARENT,
    connection_create_request,
    connection_delete_request,
    connection_list_request,
    project_request,
)
from nemo_rl_gke.gcp.resources.base import Resource, absent_on_404
from nemo_rl_gke.gcp.resources.compute import GlobalAddress
from nemo_rl_gke.gcp.resources.drift import show

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.api import ApiRequest
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.spec import RunSpec

# Where the connection's annotation of its peering range lives in the dict PeeringConnection.get returns.
PEERING_RANGE_FIELD = "x-nemoRlPeeringRange"


class PeeringConnection(Resource):
    """NET's Service Networking connection to the Lustre service, over the reserved range.

    Service Networking names NET by project number (Cloud Resource Manager ``projects.get``, cached on the hook).
    A connection has no labels or description: its ownership marker is the range it uses, which we own by label.
    ``get`` therefore returns the connection with the range's own JSON under :data:`PEERING_RANGE_FIELD`.
    A repeated create does not answer 409 but fails inside its operation, so ``get`` lists the connections first.
    """

    kind = "peering"
    marker_where = "reserved peering range"

    def __init__(self, spec: RunSpec, *, key: str, peering_range: GlobalAddress) -> None:
        super().__init__(
            spec,
            key=key,
            name=f"{spec.network}->{PEERING_SERVICE}",
            name_param="network",
            request=connection_create_request(spec, PROJECT_NUMBER_PLACEHOLDER),
            delete_request=connection_delete_request(spec, PROJECT_NUMBER_PLACEHOLDER),
        )
        self.peering_range = peering_range

    @property
    def planned(self) -> list[ApiRequest]:
        """The lookups Service Networking needs first (the project number, existing connections), then the create."""
        return [project_request(self.spec), connection_list_request(self.spec), self.request]

    def get(self, hook: GcpHook) -> dict[str, Any] | None:
        """NET's connection to the service (preferring one that uses our range), or ``None``."""
        number = hook.project_number(self.spec.project)
        connections = hook.servicenetworking.services().connections()
        listing = connections.list(parent=SERVICE_PARENT, network=self.spec.consumer_network_path(number))
        body = absent_on_404(lambda: hook.execute(listing, what=f"list {self.label}"))
        found = (body or {}).get("connections") or []
        if not found:
            return None
        ours = [c for c in found if self.spec.peering_range in (c.get("reservedPeeringRanges") or [])]
        connection = dict((ours or found)[0])
        connection[PEERING_RANGE_FIELD] = self.peering_range.get(hook)
        return connection

    def create(self, hook: GcpHook) -> OperationRef:
        """``connections.create`` with the builder's body, for the real project number."""
        number = hook.project_number(self.spec.project)
        body = connection_create_request(self.spec, number).body
        request = hook.servicenetworking.services().connections().create(parent=SERVICE_PARENT, body=body)
        operation = hook.execute(request, what=f"create {self.label}")
        return OperationRef("servicenetworking", f"/v1/{operation['name']}", LONGRUNNING, self.label)

    def delete(self, hook: GcpHook) -> OperationRef | None:
        """``connections.deleteConnection`` of NET's connection; ``None`` when there was none."""
        number = hook.project_number(self.spec.project)
        body = connection_delete_request(self.spec, number).body
        request = hook.servicenetworking.services().connections().deleteConnection(name=ANY_CONNECTION, body=body)
        operation = absent_on_404(lambda: hook.execute(request, what=f"delete {self.label}"))
        if operation is None:
            return None
        return OperationRef("servicenetworking", f"/v1/{operation['name']}", LONGRUNNING, self.label)

    def owned(self, actual: dict[str, Any]) -> bool:
        """It uses our range, and the range carries our marker."""
        peering_range = actual.get(PEERING_RANGE_FIELD)
        return (
            self.spec.peering_range in (actual.get("reservedPeeringRanges") or [])
            and peering_range is not None
            and self.peering_range.owned(peering_range)
        )

    def drift(self, actual: dict[str, Any]) -> list[str]:
        """The connection must include our range (Lustre gets its addresses from it)."""
        ranges = actual.get("reservedPeeringRanges") or []
        if self.spec.peering_range in ranges:
            return []
        return [f"reservedPeeringRanges: expected to include {show(self.spec.peering_range)}, found {show(ranges)}"]
