"""NET's Service Networking connection to the Lustre service, as a resource of the run."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from google.cloud import compute_v1

from nemo_rl_gke.gcp.operations import COMPUTE, LONGRUNNING, OperationRef
from nemo_rl_gke.gcp.resources.base import Resource, absent_on_404
from nemo_rl_gke.gcp.resources.compute import GlobalAddress
from nemo_rl_gke.plan.peering import (
    ANY_CONNECTION,
    CONNECTION_NAME,
    PEERING_NAME,
    RANGES_MASK,
    SERVICE_PARENT,
    connection_create_request,
    connection_delete_request,
    connection_join_request,
    connection_leave_request,
    filled_ranges,
)

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.plan.api import ApiRequest
    from nemo_rl_gke.run.ownership import Owner

log = logging.getLogger(__name__)

# Where the connection's annotation of its peering range lives in the dict PeeringConnection.get returns.
PEERING_RANGE_FIELD = "x-nemoRlPeeringRange"
# What Service Networking answers while it still counts producer services on the connection (FACTS §13): code 9
# (FAILED_PRECONDITION) with no reason or detail of its own, so the text tells it from other failed preconditions.
PRODUCERS_IN_USE = "are still using this connection"
FAILED_PRECONDITION_CODE = 9


class PeeringConnection(Resource):
    """This run group's share of NET's Service Networking connection to the Lustre service: its reserved range.

    There is one connection per network and service (FACTS §13), and run groups that share a network share it, each
    with its own range. So this resource is the group's range *in* the connection: ``get`` finds the connection only
    when our range is part of it (with the range's own JSON under :data:`PEERING_RANGE_FIELD`, whose description
    record says who owns the share); ``create`` makes the connection, or adds our range to the one another group
    made (``connections.patch``); ``delete`` takes only our range out again, and deletes the connection only when
    no other range is left. Service Networking names NET by project number (``projects.get``, cached on the hook).
    A repeated create does not answer 409 but fails inside its operation, so ``get`` lists the connections first.
    """

    kind = "peering"
    marker_where = "reserved peering range"

    def __init__(
        self, *args: Any, lookups: tuple[ApiRequest, ...], peering_range: GlobalAddress, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lookups = lookups
        self.peering_range = peering_range

    @property
    def planned(self) -> list[ApiRequest]:
        """The lookups Service Networking needs first (the project number, existing connections), then the create."""
        return [*self.lookups, self.request]

    def connection(self, hook: GcpHook) -> dict[str, Any] | None:
        """NET's connection to the service, whoever's ranges it holds, or ``None``."""
        number = hook.project_number(self.spec.project)
        connections = hook.servicenetworking.services().connections()
        listing = connections.list(parent=SERVICE_PARENT, network=self.spec.consumer_network_path(number))
        body = absent_on_404(lambda: hook.execute(listing, what=f"list {self.label}"))
        found = (body or {}).get("connections") or []
        return dict(found[0]) if found else None

    def get(self, hook: GcpHook) -> dict[str, Any] | None:
        """The connection when our range is part of it (annotated with the range), else ``None``."""
        connection = self.connection(hook)
        if connection is None or self.spec.peering_range not in (connection.get("reservedPeeringRanges") or []):
            return None
        connection[PEERING_RANGE_FIELD] = self.peering_range.get(hook)
        return connection

    def create(self, hook: GcpHook) -> OperationRef:
        """Create the connection over our range, or add our range to the one that exists."""
        number = hook.project_number(self.spec.project)
        existing = self.connection(hook)
        connections = hook.servicenetworking.services().connections()
        if existing is None:
            body = connection_create_request(self.spec, number).body
            request = connections.create(parent=SERVICE_PARENT, body=body)
        else:
            others = [r for r in existing.get("reservedPeeringRanges") or [] if r != self.spec.peering_range]
            request = self._set_ranges(hook, number, connection_join_request(self.spec, number), others)
        operation = hook.execute(request, what=f"create {self.label}")
        return OperationRef("servicenetworking", f"/v1/{operation['name']}", LONGRUNNING, self.label)

    def _set_ranges(self, hook: GcpHook, number: str, planned: ApiRequest, others: list[str]) -> Any:
        """The plan's join or leave PATCH, with the connection's other ranges it read."""
        connections = hook.servicenetworking.services().connections()
        body = filled_ranges(planned, others)
        return connections.patch(name=CONNECTION_NAME, updateMask=RANGES_MASK, force=True, body=body)

    def delete(self, hook: GcpHook) -> OperationRef | None:
        """Take our range out of the connection; delete the connection only when no other range is left.

        Service Networking refuses the delete while producers still use the connection inside the operation, not on
        the call (FACTS §13, §19): :meth:`fallback_delete` takes over once that operation has failed.
        """
        connection = self.get(hook)
        if connection is None:
            return None
        number = hook.project_number(self.spec.project)
        others = [r for r in connection.get("reservedPeeringRanges") or [] if r != self.spec.peering_range]
        if others:
            leave = self._set_ranges(hook, number, connection_leave_request(self.spec, number), others)
            operation = hook.execute(leave, what=f"release {self.label}")
            return OperationRef("servicenetworking", f"/v1/{operation['name']}", LONGRUNNING, self.label)
        body = connection_delete_request(self.spec, number).body
        request = hook.servicenetworking.services().connections().deleteConnection(name=ANY_CONNECTION, body=body)
        operation = absent_on_404(lambda: hook.execute(request, what=f"delete {self.label}"))
        if operation is None:
            return None
        return OperationRef("servicenetworking", f"/v1/{operation['name']}", LONGRUNNING, self.label)

    def fallback_delete(self, hook: GcpHook, failed: OperationRef) -> OperationRef | None:
        """After ``deleteConnection`` failed inside its operation with code 9 "Producer services ... are still using
        this connection", which can last a while after the Lustre instance is gone (FACTS §13, §19): remove the
        network's peering with compute instead (terraform-provider-google #18834). Any other failure: ``None``."""
        if failed.service != "servicenetworking":
            return None
        name = failed.path.removeprefix("/v1/")
        operation = hook.execute(
            hook.servicenetworking.operations().get(name=name), what=f"read the failed delete of {self.label}"
        )
        error = operation.get("error") or {}
        if error.get("code") != FAILED_PRECONDITION_CODE or PRODUCERS_IN_USE not in str(error.get("message", "")):
            return None
        return self._remove_peering(hook)

    def _remove_peering(self, hook: GcpHook) -> OperationRef:
        log.warning("%s: Service Networking still sees producers on it; removing the network's peering", self.label)
        request = compute_v1.NetworksRemovePeeringRequest(name=PEERING_NAME)
        operation = hook.call(
            hook.compute("networks").remove_peering_unary,
            project=self.spec.project,
            network=self.spec.network,
            networks_remove_peering_request_resource=request,
            what=f"remove the peering of {self.label}",
        )
        path = f"/compute/v1/projects/{self.spec.project}/global/operations/{operation.name}"
        return OperationRef("compute", path, COMPUTE, self.label)

    def recorded_owner(self, actual: dict[str, Any]) -> Owner | None:
        """Our share is owned by whoever owns our range (a connection has no labels or description)."""
        peering_range = actual.get(PEERING_RANGE_FIELD)
        return None if peering_range is None else self.peering_range.recorded_owner(peering_range)

    def drift(self, actual: dict[str, Any]) -> list[str]:
        """Nothing to compare: ``get`` finds the share only when our range is in the connection."""
        return []
