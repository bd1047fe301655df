"""Service Networking v1: the private services access connection (VPC peering) that Managed Lustre needs.

Paths are the discovery document's: ``POST v1/{+parent}/connections`` (create), ``GET v1/{+parent}/connections``
(list, ``?network=`` required), ``POST v1/{+name}`` with name ``services/S/connections/-`` (deleteConnection: no
``:deleteConnection`` suffix) and ``GET v1/{+name}`` for ``operations/...``. Networks are named by project *number*.
A repeated create is not refused with 409: its operation ends in error (FACTS §4). A connection is listed once its
operation is done.

``deleteConnection`` is not refused on the call while a producer uses the connection: its operation ends in error,
code 9 FAILED_PRECONDITION "Failed to delete connection; Producer services ... are still using this connection.",
while a Lustre instance is on the network and for ``servicenetworking.producers.linger`` seconds (scaled) after the
last one's delete (terraform-provider-google #18834, magic-modules #18476). While a peering change runs on the
network, another one's operation ends in error code 3 "There is a peering operation in progress on the local or
peer network. Try again later." (what the same provider's error tables quote).
"""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING, Any

from sandbox import formats
from sandbox.errors import ApiError, failed_precondition, invalid, not_found
from sandbox.http import Call, Reply, Router, reply
from sandbox.operations import Effect, Operation
from sandbox.store import Resource
from sandbox.validation import check_discovery_body

if TYPE_CHECKING:
    from sandbox.context import Sandbox

SERVICE = "servicenetworking"
PRODUCER = "servicenetworking.googleapis.com"
PEERING_NAME = "servicenetworking-googleapis-com"
OPERATION_PREFIX = "pssn."
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
CONNECTION_TYPE = "type.googleapis.com/google.cloud.servicenetworking.v1.Connection"
STATES = {
    "servicenetworking.connection": {
        "creating": "CREATING",
        "ready": "ACTIVE",
        "deleting": "DELETING",
        "error": "ERROR",
    }
}
_CONSUMER_NETWORK = re.compile(r"^projects/([^/]+)/global/networks/([^/]+)$")
REPEATED_CREATE = "Cannot modify allocated ranges in CreateConnection. Please use UpdateConnection."
PRODUCERS_IN_USE = (
    "Failed to delete connection; Producer services (e.g. CloudSQL, Cloud Memstore, etc.) are still using this "
    "connection."
)
PEERING_IN_PROGRESS = "There is a peering operation in progress on the local or peer network. Try again later."
# Operations that change a network's peerings: only one runs per network at a time.
PEERING_KINDS = frozenset(
    {
        "servicenetworking.connections.create",
        "servicenetworking.connections.patch",
        "servicenetworking.connections.deleteConnection",
        "compute.networks.removePeering",
    }
)
LINGER_KEY = "servicenetworking.producers.linger"
RELEASED_AT = "producers_released_at"


def peering_busy(sb: Sandbox, network_key: str) -> bool:
    """Whether a peering change (a connection's create, patch or delete, a removePeering) runs on the network."""
    targets = {network_key, _connection_key(network_key)}
    return any(o.kind in PEERING_KINDS and not o.done and o.target in targets for o in sb.store.operations.values())


def producers_using(sb: Sandbox, network_key: str) -> bool:
    """Whether Service Networking still counts a producer on the network: a Lustre instance on it, or one deleted
    less than the linger time ago."""
    if any(r.kind == "lustre.instance" for r in sb.store.users_of(network_key)):
        return True
    network = sb.store.get(network_key)
    released = network.extra.get(RELEASED_AT) if network is not None else None
    return released is not None and sb.now() < float(released) + sb.latency.seconds(LINGER_KEY)


def release_producer(sb: Sandbox, network_key: str, at: float) -> None:
    """Note when a producer instance on the network is due to be gone (its delete operation's end)."""
    network = sb.store.get(network_key)
    if network is not None:
        network.extra[RELEASED_AT] = max(at, float(network.extra.get(RELEASED_AT) or 0.0))
        sb.store.put(network)


def _producer(call: Call) -> str:
    service = call.params["service"]
    if service != PRODUCER:
        raise not_found(f"Service 'services/{service}' is not a service producer known to Service Networking.")
    return service


def _project_of(sb: Sandbox, value: str, field: str) -> tuple[str | None, str]:
    """(project ID or None when the number is unknown, network name) of ``projects/NUMBER/global/networks/N``."""
    match = _CONSUMER_NETWORK.match(value or "")
    if not match:
        raise invalid(f'{field}: "{value}" must be projects/PROJECT_NUMBER/global/networks/NETWORK.')
    number, name = match.groups()
    if not number.isdigit():
        raise invalid(
            f'{field}: "{value}" names the project by ID; Service Networking needs the project number '
            "(Cloud Resource Manager projects.get gives it)."
        )
    by_number = {formats.project_number(p): p for p in sb.store.config.known_projects}
    return by_number.get(number), name


def _network(sb: Sandbox, value: str, field: str) -> Resource:
    project, name = _project_of(sb, value, field)
    network = sb.store.get(f"projects/{project}/global/networks/{name}") if project else None
    if network is None or network.phase != "ready":
        raise failed_precondition(f'Network "{value}" was not found or is not ready.')
    return network


def _connection_key(network_key: str) -> str:
    return f"services/{PRODUCER}/connections/{network_key}"


def render_operation(sb: Sandbox, operation: Operation) -> dict[str, Any]:
    """A google.longrunning Operation, named ``operations/pssn...``."""
    body: dict[str, Any] = {"name": f"operations/{OPERATION_PREFIX}{operation.id}", "done": operation.done}
    if not operation.done:
        return body
    error = operation.api_error()
    if error is not None:
        body["error"] = {"code": error.rpc_code, "message": error.message}
    elif operation.verb == "create" and operation.snapshot:
        body["response"] = {"@type": CONNECTION_TYPE, **operation.snapshot}
    else:
        body["response"] = {"@type": EMPTY_TYPE}
    return body


async def create_connection(sb: Sandbox, call: Call) -> Reply:
    """``services.connections.create``: peer a network over its reserved VPC_PEERING ranges."""
    _producer(call)
    body = call.json()
    check_discovery_body("servicenetworking", "v1", "Connection", body, "connection")
    network = _network(sb, body.get("network", ""), "connection.network")
    ranges = body.get("reservedPeeringRanges") or []
    if not ranges:
        raise invalid("connection.reservedPeeringRanges must name at least one allocated range.")
    range_keys = _ranges(sb, network, list(ranges))
    key = _connection_key(network.key)
    common = {
        "service": SERVICE,
        "kind": "servicenetworking.connections.create",
        "verb": "create",
        "project": network.project,
        "location": "global",
        "target": key,
    }
    if sb.store.get(key) is not None:
        failed = sb.start_operation(call, **common, effect=Effect(), error=failed_precondition(REPEATED_CREATE))
        return reply(render_operation(sb, failed))
    if peering_busy(sb, network.key):
        failed = sb.start_operation(call, **common, effect=Effect(), error=invalid(PEERING_IN_PROGRESS))
        return reply(render_operation(sb, failed))
    at = sb.now()
    connection = {
        "network": body["network"],
        "reservedPeeringRanges": list(ranges),
        "peering": PEERING_NAME,
        "service": f"services/{PRODUCER}",
    }
    tenant = f"{formats.project_number(network.project)[:6]}-tp"
    peering = {
        "name": PEERING_NAME,
        "network": formats.compute_link(f"projects/{tenant}/global/networks/servicenetworking"),
        "state": "ACTIVE",
        "stateDetails": f"[{formats.rfc3339(at)}]: Connected.",
        "autoCreateRoutes": True,
        "exchangeSubnetRoutes": True,
        "exportCustomRoutes": False,
        "importCustomRoutes": False,
        "stackType": "IPV4_ONLY",
    }
    extra = {"project": network.project, "peering": peering}
    refs = [network.key, *range_keys]
    sb.store.put(Resource("servicenetworking.connection", key, connection, refs=refs, created=at, extra=extra))
    operation = sb.start_operation(call, **common, effect=Effect(ready=[key]))
    return reply(render_operation(sb, operation))


async def list_connections(sb: Sandbox, call: Call) -> Reply:
    """``services.connections.list?network=projects/NUMBER/global/networks/N``: the connections that are done."""
    _producer(call)
    value = call.arg("network")
    if not value:
        raise invalid("network is required: projects/PROJECT_NUMBER/global/networks/NETWORK.")
    project, name = _project_of(sb, value, "network")
    found = sb.store.get(_connection_key(f"projects/{project}/global/networks/{name}")) if project else None
    # Listed until its removal is done, as the network lists its peering.
    if found is None or found.phase not in ("ready", "deleting"):
        return reply({})
    return reply({"connections": [found.body]})


def _ranges(sb: Sandbox, network: Resource, names: list[str]) -> list[str]:
    """The keys of ``names``, each a ready VPC_PEERING range on ``network``; 400 otherwise."""
    keys = []
    for name in names:
        key = f"projects/{network.project}/global/addresses/{name}"
        address = sb.store.get(key)
        if (
            address is None
            or address.phase != "ready"
            or address.body.get("purpose") != "VPC_PEERING"
            or network.key not in address.refs
        ):
            raise failed_precondition(f"Allocated IP range '{name}' not found in network.")
        keys.append(key)
    return keys


def _hosts_instances(sb: Sandbox, address_key: str) -> bool:
    """Whether a Lustre instance got its IP from this range."""
    address = sb.store.get(address_key)
    if address is None or not address.body.get("address"):
        return False
    block = ipaddress.ip_network(f"{address.body['address']}/{address.body.get('prefixLength', 32)}", strict=False)
    return any(
        r.extra.get("ip") and ipaddress.ip_address(r.extra["ip"]) in block for r in sb.store.of_kind("lustre.instance")
    )


async def update_connection(sb: Sandbox, call: Call) -> Reply:
    """``services.connections.patch``: the ranges sent replace the connection's; dropping one that still hosts an
    instance needs ``force=true`` (FACTS §13)."""
    _producer(call)
    if call.params["connection"] not in ("-", PEERING_NAME):
        raise not_found(f"Connection '{call.params['connection']}' not found.")
    body = call.json()
    check_discovery_body("servicenetworking", "v1", "Connection", body, "connection")
    network = _network(sb, body.get("network", ""), "connection.network")
    key = _connection_key(network.key)
    connection = sb.store.get(key)
    if connection is None or connection.phase != "ready":
        raise not_found(f'No private services access connection exists for network "{body.get("network")}".')
    names = list(body.get("reservedPeeringRanges") or [])
    if not names:
        raise invalid(
            "connection.reservedPeeringRanges must name at least one allocated range; deleteConnection "
            "removes the whole connection."
        )
    keys = _ranges(sb, network, names)
    dropped = [r for r in connection.refs if r.startswith(f"projects/{network.project}/global/addresses/")]
    dropped = [r for r in dropped if r not in keys]
    force = (call.arg("force") or "").lower() == "true"
    if any(_hosts_instances(sb, r) for r in dropped) and not force:
        raise failed_precondition("A previously defined allocated range is removed: set force to true.")
    connection.body["reservedPeeringRanges"] = names
    connection.refs = [network.key, *keys]
    sb.store.put(connection)
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind="servicenetworking.connections.patch",
        verb="update",
        project=network.project,
        location="global",
        target=key,
        effect=Effect(),
    )
    operation.snapshot = dict(connection.body)
    return reply(render_operation(sb, operation))


def peering_connection(sb: Sandbox, network: Resource, peering: str) -> str | None:
    """The key of the connection behind the network's peering ``peering``, or ``None`` when it has none of that name.

    Compute ``networks.removePeering`` of the service's peering takes the connection with it when its operation
    ends (the fallback when deleteConnection keeps failing because producer services still use it)."""
    key = _connection_key(network.key)
    connection = sb.store.get(key)
    if peering != PEERING_NAME or connection is None or connection.phase not in ("ready", "deleting"):
        return None
    return key


async def delete_connection(sb: Sandbox, call: Call) -> Reply:
    """``services.connections.deleteConnection`` (POST ``.../connections/-``, body ``{consumerNetwork}``)."""
    _producer(call)
    if call.params["connection"] not in ("-", PEERING_NAME):
        raise not_found(f"Connection '{call.params['connection']}' not found.")
    body = call.json()
    check_discovery_body("servicenetworking", "v1", "DeleteConnectionRequest", body, "request")
    value = body.get("consumerNetwork", "")
    project, name = _project_of(sb, value, "consumerNetwork")
    network_key = f"projects/{project}/global/networks/{name}"
    key = _connection_key(network_key)
    connection = sb.store.get(key) if project else None
    if connection is not None and connection.phase == "creating" and sb.supersede_hung(connection):
        connection = sb.store.get(key)
    if connection is None:
        raise not_found(f'No private services access connection exists for network "{value}".')
    busy = peering_busy(sb, network_key)
    if connection.phase != "ready" and not busy:
        raise failed_precondition(f'The connection of network "{value}" has an operation in progress.')
    common = {
        "service": SERVICE,
        "kind": "servicenetworking.connections.deleteConnection",
        "verb": "delete",
        "project": connection.project,
        "location": "global",
        "target": key,
    }
    # Both refusals come inside the operation, not on the call (FACTS §13, §19).
    refusal = None
    if busy:
        refusal = invalid(PEERING_IN_PROGRESS)
    elif producers_using(sb, network_key):
        refusal = failed_precondition(PRODUCERS_IN_USE)
    if refusal is not None:
        return reply(render_operation(sb, sb.start_operation(call, **common, effect=Effect(), error=refusal)))
    operation = sb.start_operation(call, **common, effect=Effect(remove=[key]))
    return reply(render_operation(sb, operation))


async def get_operation(sb: Sandbox, call: Call) -> Reply:
    """``operations.get`` (``v1/operations/pssn...``)."""
    name = call.params["operation"]
    operation = sb.store.operation(name.removeprefix(OPERATION_PREFIX))
    if operation is None or operation.service != SERVICE or not name.startswith(OPERATION_PREFIX):
        raise ApiError("NOT_FOUND", f"Operation 'operations/{name}' not found.")
    return reply(render_operation(sb, operation))


def register(router: Router) -> None:
    """Add the Service Networking routes."""
    connections = "/v1/services/{service}/connections"
    router.add("POST", connections, SERVICE, create_connection)
    router.add("GET", connections, SERVICE, list_connections)
    router.add("POST", connections + "/{connection}", SERVICE, delete_connection)
    router.add("PATCH", connections + "/{connection}", SERVICE, update_connection)
    router.add("GET", "/v1/operations/{operation}", SERVICE, get_operation)
