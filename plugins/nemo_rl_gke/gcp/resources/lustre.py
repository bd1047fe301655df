"""The Managed Lustre instance of a run, as a resource. Its checkpoint records live in Cloud Storage
(:mod:`nemo_rl_gke.gcp.pending`); the instance itself is never written after its create."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from google.cloud import lustre_v1
from google.longrunning import operations_pb2

from nemo_rl_gke.gcp.operations import LONGRUNNING, OperationRef
from nemo_rl_gke.gcp.pending import CheckpointRecords
from nemo_rl_gke.gcp.resources.base import Resource, absent_on_404, list_operations, request_id
from nemo_rl_gke.gcp.resources.drift import Check, as_int, message_dict, same_ref
from nemo_rl_gke.run.ownership import Owner, PendingCheckpoint, owner_from_labels

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.plan.api import ApiRequest


class LustreInstance(Resource):
    """The Managed Lustre instance in the zone."""

    kind = "Lustre instance"
    checks = (
        Check("capacityGib", norm=as_int),
        Check("perUnitStorageThroughput", norm=as_int),
        Check("filesystem"),
        Check("network", ref=True),
    )

    def get(self, hook: GcpHook) -> dict[str, Any] | None:
        """``instances.get``; ``None`` on 404."""
        found = absent_on_404(
            lambda: hook.call(hook.lustre_client.get_instance, name=self.spec.lustre_path, what=f"get {self.label}")
        )
        return None if found is None else message_dict(found)

    def create(self, hook: GcpHook) -> OperationRef:
        """``instances.create`` with the builder's Instance and ``instanceId``."""
        request = lustre_v1.CreateInstanceRequest(
            parent=self.spec.lustre_parent,
            instance=self.request.message,
            instance_id=self.name,
            request_id=request_id(),
        )
        operation = hook.call(hook.lustre_client.create_instance, request=request, what=f"create {self.label}")
        return self._operation(operation.operation.name)

    def delete(self, hook: GcpHook) -> OperationRef | None:
        """``instances.delete`` with the plan's request (a fresh request id added); ``None`` on 404."""
        request = self.delete_message(request_id=request_id())
        operation = absent_on_404(
            lambda: hook.call(hook.lustre_client.delete_instance, request=request, what=f"delete {self.label}")
        )
        return None if operation is None else self._operation(operation.operation.name)

    def export_data(self, hook: GcpHook, request: ApiRequest) -> OperationRef:
        """``instances.exportData`` with the plan's request
        (:func:`~nemo_rl_gke.plan.transfers.lustre_export_request`)."""
        source = request.message.lustre_path.path
        operation = hook.call(hook.lustre_client.export_data, request=request.message, what=f"export {source}")
        return OperationRef(
            "lustre",
            f"/v1/{operation.operation.name}",
            LONGRUNNING,
            f"export {source} -> {request.message.gcs_path.uri}",
        )

    def import_data(self, hook: GcpHook, request: ApiRequest, *, what: str, label: str) -> OperationRef:
        """``instances.importData`` with the plan's request (:func:`~nemo_rl_gke.plan.transfers.lustre_import_request`);
        ``what`` names the call in errors, ``label`` the operation. A transfer already running on the instance refuses
        it (ABORTED): the hook retries it, bounded."""
        operation = hook.call(hook.lustre_client.import_data, request=request.message, what=what)
        return OperationRef("lustre", f"/v1/{operation.operation.name}", LONGRUNNING, label)

    def _operation(self, name: str) -> OperationRef:
        return OperationRef("lustre", f"/v1/{name}", LONGRUNNING, self.label)

    def recorded_owner(self, actual: dict[str, Any]) -> Owner | None:
        """The labels."""
        return owner_from_labels(actual.get("labels"))

    def legacy_mark(self, actual: dict[str, Any]) -> PendingCheckpoint | None:
        """The one pending checkpoint an instance marked before records carries in its labels, if any."""
        return PendingCheckpoint.on_instance(actual.get("labels"), actual.get("description"))

    def records(self, hook: GcpHook, actual: dict[str, Any] | None) -> list[PendingCheckpoint]:
        """Every checkpoint record of the instance (and its pre-records label mark), pending or exported."""
        found = CheckpointRecords(hook, self.spec, actual).all()
        legacy = self.legacy_mark(actual) if actual is not None else None
        return [*found, legacy] if legacy is not None else found

    state_field = "state"  # CREATING, ACTIVE, DELETING, ...
    ready_states = ("ACTIVE",)
    failed_states = ("STOPPED", "SUSPENDED")  # no wait brings it back
    deleting_states = ("DELETING",)

    def pending_operation(self, hook: GcpHook, actual: dict[str, Any]) -> OperationRef | None:
        """The unfinished longrunning operation whose ``metadata.target`` is this instance."""
        request = operations_pb2.ListOperationsRequest(name=self.spec.lustre_parent)
        response = list_operations(hook, hook.lustre_client.list_operations, self, request=request)
        for operation in response.operations if response is not None else ():
            if operation.done:
                continue
            target = ""
            if operation.metadata.value:
                target = lustre_v1.OperationMetadata.deserialize(operation.metadata.value).target
            if target and same_ref(self.spec.lustre_path, target):
                return self._operation(operation.name)
        return None
