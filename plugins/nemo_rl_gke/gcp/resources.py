"""The Google Cloud objects of a run as resources, and the two idempotent actions on them: ensure and delete.

Each :class:`Resource` knows one object of the run by a stable key (``net``, ``gvnic-sub``, ``lustre``, ...): how to
read it (``get``, ``None`` on 404), create it with the request the builders made (``create``), delete it (``delete``),
tell whether this package made it (``owned``: labels ``managed-by=airflow-nemo-rl-gke`` where the API has labels, the
description marker otherwise, the peering range for the peering), how it differs from the run conf (``drift``) and
whether it is usable (``ready``). Names and bodies come from the RunSpec and the request builders only.

:func:`ensure` and :func:`delete_resource` put these together (DESIGN rule 2):

- ensure: get; missing -> create (and hand back the operation to wait on); present -> refuse it when someone else
  made it (unless the conf adopts existing resources), refuse it when it differs from the conf (never changed in
  place, never retried), else use it. A resource still being created (Lustre CREATING, cluster or pool PROVISIONING)
  is waited on through the operation the API lists for it (container ``operations.list``, Lustre's longrunning
  ``operations.list`` by ``metadata.target``), so the caller defers on it exactly as on its own create. When the API
  shows no such operation the call raises :class:`NotReadyError` (the task's retry reads the resource again) rather
  than waiting here, since a sync wait would hold a worker slot (DESIGN rule 3).
- delete: get; missing -> ``absent``; not ours -> ``kept-unowned`` (never deleted); else delete (404 counts as done).

Waiting is not done here: the operator defers on the returned :class:`~nemo_rl_gke.gcp.operations.OperationRef`.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from google.cloud import lustre_v1
from google.longrunning import operations_pb2

from nemo_rl_gke.gcp.api import ApiRequest
from nemo_rl_gke.gcp.gke import cluster_create_request, node_pool_create_request
from nemo_rl_gke.gcp.hooks import http_status, is_conflict, is_not_found
from nemo_rl_gke.gcp.lustre import lustre_create_request
from nemo_rl_gke.gcp.networks import (
    gvnic_firewall_request,
    gvnic_network_request,
    gvnic_subnet_request,
    main_network_request,
    rdma_network_request,
    rdma_subnet_requests,
)
from nemo_rl_gke.gcp.operations import COMPUTE, CONTAINER, LONGRUNNING, OperationRef
from nemo_rl_gke.gcp.peering import (
    ANY_CONNECTION,
    PEERING_SERVICE,
    PROJECT_NUMBER_PLACEHOLDER,
    SERVICE_PARENT,
    connection_create_request,
    connection_delete_request,
    peering_range_request,
)
from nemo_rl_gke.spec import OWNER_LABEL_KEY, OWNER_LABEL_VALUE

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.spec import RunSpec

log = logging.getLogger(__name__)

OWNER_MARKER = f"{OWNER_LABEL_KEY}={OWNER_LABEL_VALUE}"
STAGES = ("network", "storage", "cluster")
# The order deletions succeed in (FACTS §4): Lustre before its peering, the peering before its range, everything on
# NET before NET, a firewall and subnets before their network. The GPU node pool goes with its cluster.
TEARDOWN_ORDER: tuple[str, ...] = (
    "lustre",
    "peering",
    "peering-range",
    "cluster",
    "gvnic-fw",
    "gvnic-sub",
    *(f"rdma-sub-{n}" for n in range(8)),
    "gvnic-net",
    "rdma-net",
    "net",
)
# Where the connection's annotation of its peering range lives in the dict PeeringConnection.get returns.
PEERING_RANGE_FIELD = "x-nemoRlPeeringRange"


# ---------------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------------
class ResourceError(RuntimeError):
    """A resource of the run cannot be ensured or deleted as the conf asks."""

    # Whether running the task again can succeed without a human: the operator fails at once when it cannot.
    retryable: ClassVar[bool] = False


class NotOwnedError(ResourceError):
    """The resource exists, this package did not create it, and the conf does not adopt existing resources."""


class DriftError(ResourceError):
    """The resource exists but differs from the run conf; it is never changed in place and never retried."""

    def __init__(self, message: str, diff: Sequence[str]) -> None:
        super().__init__(message)
        self.diff = list(diff)


class NotReadyError(ResourceError):
    """The resource exists but is not usable yet and the API shows no operation to wait on; retry the task later."""

    retryable = True


class ResourceFailedError(ResourceError):
    """The resource exists in an error state (cluster ERROR, Lustre STOPPED, ...); it needs a human."""


# ---------------------------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EnsureResult:
    """What :func:`ensure` did (``created``, ``adopted`` or ``exists``) and the operation to wait on, if any."""

    action: str
    operation: OperationRef | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form, for XCom."""
        return {"action": self.action, "operation": self.operation.to_dict() if self.operation else None}


@dataclass(frozen=True)
class DeleteResult:
    """What :func:`delete_resource` did (``deleted``, ``absent`` or ``kept-unowned``) and the operation to wait on."""

    action: str
    operation: OperationRef | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form, for XCom."""
        return {"action": self.action, "operation": self.operation.to_dict() if self.operation else None}


# ---------------------------------------------------------------------------------------------------------------------
# Comparing what exists with what the conf asks for
# ---------------------------------------------------------------------------------------------------------------------
def message_dict(message: Any) -> dict[str, Any]:
    """A google-cloud message as its REST JSON (camelCase names, enum names), the shape every ``get`` returns."""
    return type(message).to_dict(
        message,
        use_integers_for_enums=False,
        preserving_proto_field_name=False,
        always_print_fields_with_no_presence=False,
    )


def normalize_ref(value: str) -> str:
    """A resource reference without its host and API version, so the three spellings compare equal.

    ``https://www.googleapis.com/compute/v1/projects/p/global/networks/n``,
    ``https://compute.googleapis.com/compute/v1/projects/p/global/networks/n`` and
    ``projects/p/global/networks/n`` all become the last; a bare name stays a bare name.
    """
    ref = re.sub(r"^[a-z]+://[^/]+", "", value.strip()).lstrip("/")
    ref = re.sub(r"^(?:compute/)?(?:v1|beta|alpha)/", "", ref)
    return ref


def _after_project(ref: str) -> str:
    """``projects/<id or number>/rest`` -> ``rest``: what does not depend on how the project is named."""
    return re.sub(r"^projects/[^/]+/", "", ref)


def same_ref(expected: str, actual: str) -> bool:
    """Whether two references name the same resource: whole paths compared when both have them, else the names.

    GKE and the pool's additional networks take bare names in the same project, while Compute answers with URLs.
    """
    left, right = normalize_ref(expected), normalize_ref(actual)
    if "/" in left and "/" in right:
        return left == right
    return left.rsplit("/", 1)[-1] == right.rsplit("/", 1)[-1]


def _last(value: Any) -> Any:
    return normalize_ref(value).rsplit("/", 1)[-1] if isinstance(value, str) else value


def dig(data: dict[str, Any] | None, path: str, default: Any = None) -> Any:
    """The value at a dotted JSON path, or ``default`` when any part is missing."""
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _show(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value, default=str)


def _as_int(value: Any) -> Any:
    # JSON carries int64 as strings ("capacityGib": "18000"); both spellings mean the same number.
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


@dataclass(frozen=True)
class Check:
    """One field drift compares: its dotted JSON path, the API's value when absent, and how to normalise it.

    ``ref`` compares resource references with :func:`same_ref`.
    """

    path: str
    default: Any = None
    norm: Callable[[Any], Any] | None = None
    ref: bool = False


def diff(expected_body: dict[str, Any], actual: dict[str, Any], checks: Sequence[Check]) -> list[str]:
    """``"field: expected X, found Y"`` for every checked field whose actual value differs from the request body's."""
    lines: list[str] = []
    for check in checks:
        expected = dig(expected_body, check.path, check.default)
        if expected is None:
            continue  # the conf does not set it: any value will do
        found = dig(actual, check.path, check.default)
        if check.ref:
            same = isinstance(found, str) and same_ref(expected, found)
        else:
            if check.norm is not None:
                expected, found = check.norm(expected), check.norm(found)
            same = expected == found
        if not same:
            lines.append(f"{check.path}: expected {_show(expected)}, found {_show(found)}")
    return lines


def _request_id() -> str:
    # One id per create or delete call, reused by its transient retries: a retried request that had gone through gets
    # the first one's operation back instead of a 409. Never derived from the name: a later run recreating the same
    # name within the server's memory of ids would get the old, finished operation back.
    return str(uuid.uuid4())


def _has_owner_label(labels: Any) -> bool:
    return isinstance(labels, dict) and labels.get(OWNER_LABEL_KEY) == OWNER_LABEL_VALUE


def _has_owner_description(description: Any) -> bool:
    return isinstance(description, str) and OWNER_MARKER in description


# ---------------------------------------------------------------------------------------------------------------------
# Resources
# ---------------------------------------------------------------------------------------------------------------------
class Resource(ABC):
    """One Google Cloud object of the run: how to read, create, delete, own-check, drift-check and ready-check it.

    :param spec: the run's spec (every name and path comes from it).
    :param key: the stable key of the resource (``net``, ``rdma-sub-3``, ``node-pool``, ...).
    :param name: the object's name in Google Cloud.
    :param stage: network, storage or cluster: picks the wait's timeout (``spec.stage_timeout_s``).
    :param name_param: the conf parameter the name comes from, named in error messages.
    :param request: the create request the builders made; its message is sent and its body is the drift reference.
    """

    kind: ClassVar[str]
    checks: ClassVar[tuple[Check, ...]] = ()
    # Where the resource sits in its create body: the container bodies are whole Create*Request messages.
    body_root: ClassVar[str] = ""
    marker_where: ClassVar[str] = "label"

    def __init__(self, spec: RunSpec, *, key: str, name: str, stage: str, name_param: str, request: ApiRequest) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
        self.spec = spec
        self.key = key
        self.name = name
        self.stage = stage
        self.name_param = name_param
        self.request = request

    def __repr__(self) -> str:
        return f"{type(self).__name__}(key={self.key!r}, name={self.name!r})"

    @property
    def label(self) -> str:
        """How messages name it: ``network nemo-rl-net``."""
        return f"{self.kind} {self.name}"

    @abstractmethod
    def get(self, hook: GcpHook) -> dict[str, Any] | None:
        """The resource as its REST JSON, or ``None`` when it does not exist."""

    @abstractmethod
    def create(self, hook: GcpHook) -> OperationRef | None:
        """Send the create request; the operation to wait on (``None`` when the API finished at once)."""

    @abstractmethod
    def delete(self, hook: GcpHook) -> OperationRef | None:
        """Send the delete request; the operation to wait on, or ``None`` when the resource was already gone."""

    @abstractmethod
    def owned(self, actual: dict[str, Any]) -> bool:
        """Whether this package created it (the ownership marker is on it)."""

    def drift(self, actual: dict[str, Any]) -> list[str]:
        """How the resource differs from the run conf, one ``"field: expected X, found Y"`` line per field."""
        body = self.request.body or {}
        return diff(body.get(self.body_root, {}) if self.body_root else body, actual, self.checks)

    # The lifecycle: the field holding the state (none for most Compute objects) and what its values mean.
    state_field = ""
    ready_states: tuple[str, ...] = ()  # empty: usable as soon as it can be read
    failed_states: tuple[str, ...] = ()
    deleting_states: tuple[str, ...] = ()

    def state(self, actual: dict[str, Any]) -> str:
        """Its lifecycle state as the API says it (empty when the API has none)."""
        return str(actual.get(self.state_field, "")) if self.state_field else ""

    def ready(self, actual: dict[str, Any]) -> bool:
        """Whether it is usable now."""
        return not self.ready_states or self.state(actual) in self.ready_states

    def failed(self, actual: dict[str, Any]) -> bool:
        """Whether it is in a state no wait will fix."""
        return self.state(actual) in self.failed_states

    def deleting(self, actual: dict[str, Any]) -> bool:
        """Whether it is being deleted."""
        return self.state(actual) in self.deleting_states

    def pending_operation(self, hook: GcpHook, actual: dict[str, Any]) -> OperationRef | None:
        """The unfinished operation working on it (for a resource found mid-create), or ``None``."""
        return None


class _ComputeResource(Resource):
    """A Compute Engine object: networks, subnets, firewalls and global addresses share one client shape."""

    client_name: ClassVar[str]
    field: ClassVar[str]  # the client's keyword for the name: network, subnetwork, firewall, address
    regional: ClassVar[bool] = False
    marker_where = "description"

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
        try:
            found = hook.call(client.get, **self._scope(), **{self.field: self.name}, what=f"get {self.label}")
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        return message_dict(found)

    def create(self, hook: GcpHook) -> OperationRef:
        """POST the builder's message to the collection."""
        # insert_unary, not insert: insert's ExtendedOperation polls through a client built without our
        # client_options, i.e. always compute.googleapis.com. The operator defers on the OperationRef instead.
        client = self._client(hook)
        request = {**self._scope(), f"{self.field}_resource": self.request.message, "request_id": _request_id()}
        operation = hook.call(client.insert_unary, request=request, what=f"create {self.label}")
        return self._operation(operation.name)

    def delete(self, hook: GcpHook) -> OperationRef | None:
        """DELETE the object; ``None`` when it was already gone."""
        client = self._client(hook)
        try:
            request = {**self._scope(), self.field: self.name, "request_id": _request_id()}
            operation = hook.call(client.delete_unary, request=request, what=f"delete {self.label}")
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        return self._operation(operation.name)

    def _operation(self, name: str) -> OperationRef:
        # The operation's selfLink carries whatever host answered; the path is rebuilt so the poller adds its own.
        scope = f"regions/{self.spec.region}" if self.regional else "global"
        path = f"/compute/v1/projects/{self.spec.project}/{scope}/operations/{name.rsplit('/', 1)[-1]}"
        return OperationRef("compute", path, COMPUTE, self.label)

    def owned(self, actual: dict[str, Any]) -> bool:
        """The description marker (Compute networks, subnets and firewalls have no labels)."""
        return _has_owner_description(actual.get("description")) or _has_owner_label(actual.get("labels"))


class Network(_ComputeResource):
    """A VPC network: NET (auto subnets), the gVNIC network, the RDMA network (RoCE profile)."""

    kind = "network"
    client_name = "networks"
    field = "network"
    checks = (
        Check("autoCreateSubnetworks", default=False),
        Check("routingConfig.routingMode"),
        # 1460 is the API's MTU when none is given.
        Check("mtu", default=None, norm=_as_int),
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


class GlobalAddress(_ComputeResource):
    """The range reserved on NET for the private services peering (purpose VPC_PEERING)."""

    kind = "global address"
    client_name = "global_addresses"
    field = "address"
    marker_where = "label"
    checks = (
        Check("purpose"),
        Check("addressType", default="EXTERNAL"),
        Check("prefixLength", norm=_as_int),
        Check("network", ref=True),
        Check("address"),
    )

    def owned(self, actual: dict[str, Any]) -> bool:
        """The labels (addresses have them), or the description marker we also set."""
        return _has_owner_label(actual.get("labels")) or _has_owner_description(actual.get("description"))

    state_field = "status"  # RESERVING, RESERVED or IN_USE

    def ready(self, actual: dict[str, Any]) -> bool:
        """Reserved (or already used by the peering)."""
        return self.state(actual) != "RESERVING"


class PeeringConnection(Resource):
    """NET's Service Networking connection to the Lustre service, over the reserved range.

    Service Networking names NET by project number (Cloud Resource Manager ``projects.get``, cached on the hook).
    A connection has no labels or description: its ownership marker is the range it uses, which we own by label.
    ``get`` therefore returns the connection with the range's own JSON under :data:`PEERING_RANGE_FIELD`.
    A repeated create does not answer 409 but fails inside its operation, so ``get`` lists the connections first.
    """

    kind = "peering"
    marker_where = "reserved peering range"

    def __init__(self, spec: RunSpec, peering_range: GlobalAddress) -> None:
        super().__init__(
            spec,
            key="peering",
            name=f"{spec.network}->{PEERING_SERVICE}",
            stage="storage",
            name_param="network",
            request=connection_create_request(spec, PROJECT_NUMBER_PLACEHOLDER),
        )
        self.peering_range = peering_range

    def get(self, hook: GcpHook) -> dict[str, Any] | None:
        """NET's connection to the service (preferring one that uses our range), or ``None``."""
        number = hook.project_number(self.spec.project)
        connections = hook.servicenetworking.services().connections()
        listing = connections.list(parent=SERVICE_PARENT, network=self.spec.consumer_network_path(number))
        try:
            body = hook.execute(listing, what=f"list {self.label}")
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        found = body.get("connections") or []
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
        try:
            operation = hook.execute(request, what=f"delete {self.label}")
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
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
        return [f"reservedPeeringRanges: expected to include {_show(self.spec.peering_range)}, found {_show(ranges)}"]


class LustreInstance(Resource):
    """The Managed Lustre instance in the zone."""

    kind = "Lustre instance"
    checks = (
        Check("capacityGib", norm=_as_int),
        Check("perUnitStorageThroughput", norm=_as_int),
        Check("filesystem"),
        Check("network", ref=True),
    )

    def get(self, hook: GcpHook) -> dict[str, Any] | None:
        """``instances.get``; ``None`` on 404."""
        try:
            found = hook.call(hook.lustre_client.get_instance, name=self.spec.lustre_path, what=f"get {self.label}")
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        return message_dict(found)

    def create(self, hook: GcpHook) -> OperationRef:
        """``instances.create`` with the builder's Instance and ``instanceId``."""
        request = lustre_v1.CreateInstanceRequest(
            parent=self.spec.lustre_parent,
            instance=self.request.message,
            instance_id=self.name,
            request_id=_request_id(),
        )
        operation = hook.call(hook.lustre_client.create_instance, request=request, what=f"create {self.label}")
        return self._operation(operation.operation.name)

    def delete(self, hook: GcpHook) -> OperationRef | None:
        """``instances.delete``; ``None`` on 404."""
        try:
            request = lustre_v1.DeleteInstanceRequest(name=self.spec.lustre_path, request_id=_request_id())
            operation = hook.call(hook.lustre_client.delete_instance, request=request, what=f"delete {self.label}")
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        return self._operation(operation.operation.name)

    def _operation(self, name: str) -> OperationRef:
        return OperationRef("lustre", f"/v1/{name}", LONGRUNNING, self.label)

    def owned(self, actual: dict[str, Any]) -> bool:
        """The labels."""
        return _has_owner_label(actual.get("labels"))

    state_field = "state"  # CREATING, ACTIVE, DELETING, ...
    ready_states = ("ACTIVE",)
    failed_states = ("STOPPED", "SUSPENDED")  # no wait brings it back
    deleting_states = ("DELETING",)

    def pending_operation(self, hook: GcpHook, actual: dict[str, Any]) -> OperationRef | None:
        """The unfinished longrunning operation whose ``metadata.target`` is this instance."""
        request = operations_pb2.ListOperationsRequest(name=self.spec.lustre_parent)
        response = _list_operations(hook, hook.lustre_client.list_operations, self, request=request)
        for operation in response.operations if response is not None else ():
            if operation.done:
                continue
            target = ""
            if operation.metadata.value:
                target = lustre_v1.OperationMetadata.deserialize(operation.metadata.value).target
            if target and same_ref(self.spec.lustre_path, target):
                return self._operation(operation.name)
        return None


def _list_operations(hook: GcpHook, method: Callable[..., Any], resource: Resource, **kwargs: Any) -> Any:
    """An ``operations.list`` answer, or ``None`` where the endpoint does not serve the listing (404, 405, 501)."""
    try:
        return hook.call(method, **kwargs, what=f"list operations of {resource.label}")
    except Exception as exc:
        if is_not_found(exc) or http_status(exc) in (405, 501):
            log.warning("%s: the API does not list operations here (%s)", resource.label, exc)
            return None
        raise


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
        try:
            found = hook.call(method, name=self.target_path, what=f"get {self.label}")
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        return message_dict(found)

    def create(self, hook: GcpHook) -> OperationRef:
        """``create_<noun>`` with the builder's request message."""
        method = getattr(hook.container_client, f"create_{self.api_noun}")
        return self._operation(hook.call(method, request=self.request.message, what=f"create {self.label}"))

    def delete(self, hook: GcpHook) -> OperationRef | None:
        """``delete_<noun>`` (a cluster's pools go with it); ``None`` on 404."""
        method = getattr(hook.container_client, f"delete_{self.api_noun}")
        try:
            operation = hook.call(method, name=self.target_path, what=f"delete {self.label}")
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        return self._operation(operation)

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
        response = _list_operations(hook, hook.container_client.list_operations, self, parent=self.spec.cluster_parent)
        for operation in response.operations if response is not None else ():
            if operation.status.name == "DONE" or not operation.target_link:
                continue
            # GKE's operation links name the project by number, our paths by ID: compare what follows it.
            if _after_project(normalize_ref(operation.target_link)) == _after_project(normalize_ref(self.target_path)):
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

    def owned(self, actual: dict[str, Any]) -> bool:
        """The cluster's resource labels."""
        return _has_owner_label(actual.get("resourceLabels"))


def _accelerators(value: Any) -> list[list[Any]]:
    return [[a.get("acceleratorType"), _as_int(a.get("acceleratorCount"))] for a in value or []]


def _node_networks(value: Any) -> list[list[Any]]:
    # The pool takes bare names; GKE may answer with paths. The order is the NIC order, so it is kept.
    return [[_last(n.get("network")), _last(n.get("subnetwork"))] for n in value or []]


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

    def owned(self, actual: dict[str, Any]) -> bool:
        """The nodes' resource labels (node pools have no labels of their own)."""
        config = actual.get("config") or {}
        return _has_owner_label(config.get("resourceLabels"))


def resources(spec: RunSpec) -> dict[str, Resource]:
    """Every Google Cloud object of the run, by key, in creation order (each after what it needs)."""

    def network(key: str, name: str, param: str, request: ApiRequest) -> Network:
        return Network(spec, key=key, name=name, stage="network", name_param=param, request=request)

    def subnet(key: str, name: str, param: str, request: ApiRequest) -> Subnet:
        return Subnet(spec, key=key, name=name, stage="network", name_param=param, request=request)

    found: list[Resource] = [
        network("net", spec.network, "network", main_network_request(spec)),
        network("gvnic-net", spec.gvnic_network, "gvnic_prefix", gvnic_network_request(spec)),
        subnet("gvnic-sub", spec.gvnic_subnet, "gvnic_prefix", gvnic_subnet_request(spec)),
        Firewall(
            spec,
            key="gvnic-fw",
            name=spec.gvnic_firewall,
            stage="network",
            name_param="gvnic_prefix",
            request=gvnic_firewall_request(spec),
        ),
        network("rdma-net", spec.rdma_network, "rdma_prefix", rdma_network_request(spec)),
        *(
            subnet(f"rdma-sub-{n}", name, "rdma_prefix", request)
            for n, (name, request) in enumerate(zip(spec.rdma_subnets, rdma_subnet_requests(spec), strict=True))
        ),
    ]
    peering_range = GlobalAddress(
        spec,
        key="peering-range",
        name=spec.peering_range,
        stage="storage",
        name_param="lustre_name",
        request=peering_range_request(spec),
    )
    found += [
        peering_range,
        PeeringConnection(spec, peering_range),
        LustreInstance(
            spec,
            key="lustre",
            name=spec.lustre_name,
            stage="storage",
            name_param="lustre_name",
            request=lustre_create_request(spec),
        ),
        GkeCluster(
            spec,
            key="cluster",
            name=spec.cluster_name,
            stage="cluster",
            name_param="cluster_name",
            request=cluster_create_request(spec),
        ),
        GkeNodePool(
            spec,
            key="node-pool",
            name=spec.node_pool_name,
            stage="cluster",
            name_param="node_pool_name",
            request=node_pool_create_request(spec),
        ),
    ]
    return {resource.key: resource for resource in found}


# ---------------------------------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------------------------------
def _not_owned(resource: Resource) -> NotOwnedError:
    return NotOwnedError(
        f"{resource.label} ({resource.key}) already exists in project {resource.spec.project} but was not created by "
        f"this DAG: it has no {OWNER_MARKER} {resource.marker_where}. This DAG never changes or deletes it. "
        f"Fix: set adopt_existing=true in the conf to use it as it is, or change '{resource.name_param}' so that "
        f"the run creates its own."
    )


def _drift(resource: Resource, lines: list[str]) -> DriftError:
    listed = "\n".join(f"  - {line}" for line in lines)
    return DriftError(
        f"{resource.label} ({resource.key}) exists but does not match the run conf; an existing resource is never "
        f"changed in place:\n{listed}\nFix: change the conf to match it, or delete it so the run creates it anew.",
        lines,
    )


def _existing(resource: Resource, hook: GcpHook, actual: dict[str, Any], action: str) -> EnsureResult:
    """The ensure outcome for a resource that is there: check it is usable, or find what to wait on."""
    if resource.ready(actual):
        return EnsureResult(action)
    state = resource.state(actual) or "not ready"
    if resource.deleting(actual):
        raise NotReadyError(f"{resource.label} is being deleted ({state}); run the task again once it is gone")
    if resource.failed(actual):
        raise ResourceFailedError(f"{resource.label} exists in state {state}; delete it (or repair it) and run again")
    operation = resource.pending_operation(hook, actual)
    if operation is None:
        raise NotReadyError(
            f"{resource.label} exists in state {state} and the API lists no operation on it to wait for; "
            "run the task again later"
        )
    log.info("%s is %s: waiting on its running operation %s", resource.label, state, operation.path)
    return EnsureResult(action, operation)


def ensure(resource: Resource, hook: GcpHook, adopt_existing: bool) -> EnsureResult:
    """Make ``resource`` exist as the conf says, without ever duplicating, changing or stealing it.

    - missing: create it -> ``created`` with the create operation;
    - present, not ours, ``adopt_existing`` false -> :class:`NotOwnedError` (naming the resource and how to adopt);
    - present but different from the conf -> :class:`DriftError` with the diff (never retried, never patched);
    - present and ours -> ``exists``; present, not ours, adopted -> ``adopted``; in both cases with the running
      operation to wait on when it is still being created (see the module docstring).

    A create answered with 409 (a retried create that had gone through, or a concurrent run) is read back and treated
    as present: ``created`` when it carries our marker, else the not-owned rules above.
    """
    actual = resource.get(hook)
    created_by_race = False
    if actual is None:
        try:
            operation = resource.create(hook)
        except Exception as exc:
            if not is_conflict(exc):
                raise
            actual = resource.get(hook)
            if actual is None:
                raise
            created_by_race = True
            log.info("%s: create answered 409; it exists now, checking it", resource.label)
        else:
            log.info("%s: created", resource.label)
            return EnsureResult("created", operation)
    owned = resource.owned(actual)
    if not owned and not adopt_existing:
        raise _not_owned(resource)
    lines = resource.drift(actual)
    if lines:
        raise _drift(resource, lines)
    action = ("created" if created_by_race else "exists") if owned else "adopted"
    log.info("%s: %s", resource.label, action)
    return _existing(resource, hook, actual, action)


def delete_resource(resource: Resource, hook: GcpHook) -> DeleteResult:
    """Delete ``resource`` if it is there and ours: ``deleted`` (with the operation), ``absent`` or ``kept-unowned``.

    An unowned resource is never deleted, whatever the conf says (DESIGN rule 2). A 404 at any step counts as done.
    """
    actual = resource.get(hook)
    if actual is None:
        log.info("%s: absent, nothing to delete", resource.label)
        return DeleteResult("absent")
    if not resource.owned(actual):
        log.warning("%s was not created by this DAG: keeping it", resource.label)
        return DeleteResult("kept-unowned")
    if resource.deleting(actual):
        operation = resource.pending_operation(hook, actual)
        if operation is None:
            raise NotReadyError(
                f"{resource.label} is already being deleted and the API lists no operation on it to wait for; "
                "run the task again later (it reads absent once the deletion is done)"
            )
        log.info("%s is already being deleted: waiting on %s", resource.label, operation.path)
        return DeleteResult("deleted", operation)
    operation = resource.delete(hook)
    if operation is None:
        return DeleteResult("absent")
    log.info("%s: delete requested (%s)", resource.label, operation.path)
    return DeleteResult("deleted", operation)
