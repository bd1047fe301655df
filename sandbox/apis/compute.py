"""Compute Engine v1: networks, subnetworks, firewalls, global addresses, network profiles, reservations, regions
(their quotas) and operations.

Mutations answer a compute Operation (``status`` PENDING/RUNNING/DONE; on failure ``error.errors[]`` plus
``httpErrorStatusCode``/``httpErrorMessage``, which is what ``ExtendedOperation`` turns into an exception). A resource
is readable while its insert runs, but another resource may only refer to it once it is ready (400
``resourceNotReady``, as GCE answers). References in bodies may be full URLs, relative or partial paths or bare
names; the API answers with ``https://www.googleapis.com/compute/v1/...`` links, whatever form was sent.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# The sandbox runs as its own process, never inside a DAG parse: the heavy import ban does not apply.
from google.cloud import compute_v1  # noqa: TID253

from sandbox import formats
from sandbox.apis import servicenetworking
from sandbox.errors import HTTP_PHRASES, ApiError, already_exists, in_use, invalid, not_found, not_ready
from sandbox.http import Call, Reply, Router, reply
from sandbox.iam import require_compute
from sandbox.operations import Effect, Operation
from sandbox.store import Resource
from sandbox.validation import (
    COMPUTE_NAME,
    REGION,
    ZONE,
    check_labels,
    check_name,
    check_request_id,
    message_dict,
    parse_message,
)

if TYPE_CHECKING:
    from sandbox.context import Sandbox

SERVICE = "compute"
PREFIX = "/compute/v1/projects/{project}"
USER = "sandbox@127.0.0.1"
# An operations.wait call answers at the latest after this long, like the real one (2 minutes).
WAIT_LIMIT_SECONDS = 120.0
WAIT_POLL_SECONDS = 0.05
AUTO_MODE_RANGE = ipaddress.ip_network("10.128.0.0/9")
PEERING_POOL = ipaddress.ip_network("10.0.0.0/8")
EXTERNAL_POOL = ipaddress.ip_network("203.0.113.0/24")
MTU_RANGE = (1300, 8896)
DEFAULT_MTU = 1460
FIREWALL_PROTOCOLS = {"tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all"}
PORT_PROTOCOLS = {"tcp", "udp", "sctp"}
_PORTS = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?$")
_FILTER = re.compile(r'^\s*(\w+)\s*(=|!=|eq|ne)\s*"?([^"]*)"?\s*$')
STATES = {
    kind: {"creating": "CREATING", "ready": "READY", "deleting": "DELETING", "error": "ERROR"}
    for kind in ("compute.network", "compute.subnetwork", "compute.firewall", "compute.address")
}

Prepare = Callable[["Sandbox", str, "str | None", str, dict[str, Any]], list[str]]


@dataclass(frozen=True)
class Collection:
    """One insertable compute collection: its URL segment, message type, scope and body checks."""

    kind: str
    segment: str
    noun: str
    message: type
    regional: bool
    op_kind: str
    item_kind: str
    prepare: Prepare

    def key(self, project: str, region: str | None, name: str) -> str:
        """The resource path of ``name`` in this collection."""
        scope = f"regions/{region}" if self.regional else "global"
        return f"projects/{project}/{scope}/{self.segment}/{name}"


# ---------------------------------------------------------------------------------------------------------------------
# References between resources
# ---------------------------------------------------------------------------------------------------------------------
def _reference(sb: Sandbox, value: str, project: str, segment: str, *, field: str) -> str:
    """The key of a referenced resource that must exist and be ready (404 / 400 resourceNotReady otherwise)."""
    key = formats.compute_key(value, project, segment)
    if key is None:
        raise invalid(f"Invalid value for field '{field}': '{value}'. The URL is malformed.")
    found = sb.store.get(key)
    if found is None:
        raise not_found(f"The resource '{key}' was not found")
    if found.phase != "ready":
        raise not_ready(f"The resource '{key}' is not ready")
    return key


def _network_of(sb: Sandbox, value: str, project: str, field: str) -> Resource:
    key = _reference(sb, value, project, "networks", field=field)
    resource = sb.store.get(key)
    assert resource is not None
    return resource


def _cidr(value: str, field: str, *, strict: bool = True) -> ipaddress.IPv4Network:
    try:
        network = ipaddress.ip_network(value, strict=strict)
    except ValueError as exc:
        raise invalid(f"Invalid value for field '{field}': '{value}'. Invalid IPCidrRange: {exc}.") from exc
    if not isinstance(network, ipaddress.IPv4Network):
        raise invalid(f"Invalid value for field '{field}': '{value}'. Only IPv4 ranges are supported.")
    return network


def _ranges_on(sb: Sandbox, network_key: str) -> Iterable[tuple[Resource, ipaddress.IPv4Network]]:
    """Every IPv4 range already taken on a network: its subnets and its reserved peering ranges."""
    for resource in sb.store.users_of(network_key):
        if resource.kind == "compute.subnetwork":
            yield resource, ipaddress.IPv4Network(resource.body["ipCidrRange"])
        elif resource.kind == "compute.address" and resource.body.get("prefixLength"):
            yield resource, ipaddress.IPv4Network(f"{resource.body['address']}/{resource.body['prefixLength']}")


def _conflict(sb: Sandbox, network: Resource, cidr: ipaddress.IPv4Network) -> str | None:
    if network.body.get("autoCreateSubnetworks") and cidr.overlaps(AUTO_MODE_RANGE):
        return f"the auto mode range {AUTO_MODE_RANGE} of network '{network.name}'"
    for resource, taken in _ranges_on(sb, network.key):
        if cidr.overlaps(taken):
            noun = "subnetwork" if resource.kind == "compute.subnetwork" else "address range"
            return f"existing {noun} '{resource.name}' ({taken})"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Body checks per collection: validate, canonicalise references, fill what the server fills; return the refs.
# ---------------------------------------------------------------------------------------------------------------------
def prepare_network(sb: Sandbox, project: str, region: str | None, key: str, body: dict[str, Any]) -> list[str]:
    """Networks: subnet mode, MTU, routing mode, and the RoCE network profile."""
    if "IPv4Range" in body or "autoCreateSubnetworks" not in body:
        raise invalid(
            "Invalid value for field 'resource.autoCreateSubnetworks': legacy networks cannot be created; "
            "set autoCreateSubnetworks to true (auto mode) or false (custom mode)."
        )
    mtu = body.setdefault("mtu", DEFAULT_MTU)
    if not MTU_RANGE[0] <= mtu <= MTU_RANGE[1]:
        raise invalid(f"Invalid value for field 'resource.mtu': '{mtu}'. Must be in [{MTU_RANGE[0]}, {MTU_RANGE[1]}].")
    routing = body.setdefault("routingConfig", {})
    routing.setdefault("routingMode", "REGIONAL")
    if routing["routingMode"] not in ("REGIONAL", "GLOBAL"):
        raise invalid(f"Invalid value for field 'resource.routingConfig.routingMode': '{routing['routingMode']}'.")
    profile = body.get("networkProfile")
    if profile is not None:
        profile_key = formats.compute_key(profile, project, "networkProfiles")
        if profile_key is None or formats.key_name(profile_key) not in _profiles(sb):
            raise invalid(
                f"Invalid value for field 'resource.networkProfile': '{profile}'. The network profile does not exist."
            )
        if body["autoCreateSubnetworks"]:
            raise invalid(
                "Invalid value for field 'resource.autoCreateSubnetworks': 'true'. "
                f"Network profile '{formats.key_name(profile_key)}' does not allow auto mode subnets."
            )
        body["networkProfile"] = formats.compute_link(profile_key)
    body.setdefault("networkFirewallPolicyEnforcementOrder", "AFTER_CLASSIC_FIREWALL")
    return []


def prepare_subnetwork(sb: Sandbox, project: str, region: str | None, key: str, body: dict[str, Any]) -> list[str]:
    """Subnets: an existing network, a valid range that overlaps nothing on that network, the path's region."""
    assert region is not None
    if "region" in body and formats.key_name(body["region"]) != region:
        raise invalid(f"Invalid value for field 'resource.region': '{body['region']}'. Does not match '{region}'.")
    if not body.get("network"):
        raise invalid("Invalid value for field 'resource.network': ''. The network must be specified.")
    network = _network_of(sb, body["network"], project, "resource.network")
    if "ipCidrRange" not in body:
        raise invalid("Invalid value for field 'resource.ipCidrRange': ''. The range must be specified.")
    cidr = _cidr(body["ipCidrRange"], "resource.ipCidrRange")
    if not 8 <= cidr.prefixlen <= 29:
        raise invalid(f"Invalid IPCidrRange: {cidr}: the prefix length must be between 8 and 29.")
    conflict = _conflict(sb, network, cidr)
    if conflict:
        raise invalid(f"Invalid IPCidrRange: {cidr} conflicts with {conflict}.")
    body["network"] = formats.compute_link(network.key)
    body["region"] = formats.compute_link(f"projects/{project}/regions/{region}")
    body["gatewayAddress"] = str(cidr.network_address + 1)
    body["fingerprint"] = formats.numeric_id(key, "fingerprint")[:11]
    body.setdefault("privateIpGoogleAccess", False)
    body.setdefault("stackType", "IPV4_ONLY")
    body.setdefault("purpose", "PRIVATE")
    return [network.key]


def _check_rules(rules: list[dict[str, Any]], field: str) -> None:
    for index, rule in enumerate(rules):
        protocol = str(rule.get("IPProtocol", ""))
        if not (protocol in FIREWALL_PROTOCOLS or (protocol.isdigit() and int(protocol) <= 255)):
            raise invalid(f"Invalid value for field '{field}[{index}].IPProtocol': '{protocol}'.")
        ports = rule.get("ports", [])
        if ports and protocol not in PORT_PROTOCOLS and protocol != "all":
            raise invalid(f"Invalid value for field '{field}[{index}].ports': ports need tcp, udp or sctp.")
        for port in ports:
            match = _PORTS.match(port)
            low, high = (int(match.group(1)), int(match.group(2) or match.group(1))) if match else (1, 0)
            if not match or not 0 <= low <= high <= 65535:
                raise invalid(f"Invalid value for field '{field}[{index}].ports': '{port}'.")


def prepare_firewall(sb: Sandbox, project: str, region: str | None, key: str, body: dict[str, Any]) -> list[str]:
    """Firewall rules: an existing network, exactly one of allowed/denied, valid protocols, ports and ranges."""
    network = _network_of(sb, body.get("network", "global/networks/default"), project, "resource.network")
    allowed, denied = body.get("allowed", []), body.get("denied", [])
    if bool(allowed) == bool(denied):
        raise invalid("Invalid value for field 'resource': exactly one of 'allowed' and 'denied' must be set.")
    _check_rules(allowed, "resource.allowed")
    _check_rules(denied, "resource.denied")
    direction = body.setdefault("direction", "INGRESS")
    if direction not in ("INGRESS", "EGRESS"):
        raise invalid(f"Invalid value for field 'resource.direction': '{direction}'.")
    for index, value in enumerate([*body.get("sourceRanges", []), *body.get("destinationRanges", [])]):
        _cidr(value, f"resource.ranges[{index}]", strict=False)
    if direction == "INGRESS" and not any(body.get(k) for k in ("sourceRanges", "sourceTags", "sourceServiceAccounts")):
        body["sourceRanges"] = ["0.0.0.0/0"]
    priority = body.setdefault("priority", 1000)
    if not 0 <= priority <= 65535:
        raise invalid(f"Invalid value for field 'resource.priority': '{priority}'.")
    body["network"] = formats.compute_link(network.key)
    body.setdefault("logConfig", {"enable": False})
    body.setdefault("disabled", False)
    return [network.key]


def prepare_address(sb: Sandbox, project: str, region: str | None, key: str, body: dict[str, Any]) -> list[str]:
    """Global addresses: a VPC_PEERING range on an existing network (allocated when no address is given)."""
    check_labels(body.get("labels", {}), "resource.labels")
    if body.get("labels"):
        body["labelFingerprint"] = formats.numeric_id(key, str(sorted(body["labels"].items())))[:11]
    body.setdefault("ipVersion", "IPV4")
    body["status"] = "RESERVED"
    purpose = body.get("purpose")
    if purpose not in (None, "VPC_PEERING", "PRIVATE_SERVICE_CONNECT"):
        raise invalid(f"Invalid value for field 'resource.purpose': '{purpose}'. Not valid for a global address.")
    if purpose is None:
        body.setdefault("addressType", "EXTERNAL")
        body.setdefault("networkTier", "PREMIUM")
        body.setdefault("address", str(EXTERNAL_POOL[int(formats.numeric_id(key)) % 250 + 2]))
        return []
    if body.get("addressType", "INTERNAL") != "INTERNAL":
        raise invalid(f"Invalid value for field 'resource.addressType': '{body['addressType']}'. Must be INTERNAL.")
    body["addressType"] = "INTERNAL"
    if not body.get("network"):
        raise invalid(f"Invalid value for field 'resource.network': ''. A {purpose} address needs a network.")
    network = _network_of(sb, body["network"], project, "resource.network")
    body["network"] = formats.compute_link(network.key)
    if purpose == "PRIVATE_SERVICE_CONNECT":
        body.setdefault("address", "10.255.255.254")
        return [network.key]
    prefix = body.get("prefixLength")
    if prefix is None or not 8 <= prefix <= 29:
        raise invalid(f"Invalid value for field 'resource.prefixLength': '{prefix}'. Must be in [8, 29].")
    if "address" in body:
        cidr = _cidr(f"{body['address']}/{prefix}", "resource.address")
        conflict = _conflict(sb, network, cidr)
        if conflict:
            raise invalid(f"Invalid value for field 'resource.address': {cidr} conflicts with {conflict}.")
    else:
        cidr = _free_block(sb, network, prefix)
        body["address"] = str(cidr.network_address)
    return [network.key]


def _free_block(sb: Sandbox, network: Resource, prefix: int) -> ipaddress.IPv4Network:
    for block in PEERING_POOL.subnets(new_prefix=prefix):
        if _conflict(sb, network, block) is None:
            return block
    raise ApiError("RESOURCE_EXHAUSTED", f"No free /{prefix} range is left in {PEERING_POOL} on '{network.name}'.")


NETWORKS = Collection(
    kind="compute.network",
    segment="networks",
    noun="network",
    message=compute_v1.Network,
    regional=False,
    op_kind="compute.networks",
    item_kind="compute#network",
    prepare=prepare_network,
)
SUBNETWORKS = Collection(
    kind="compute.subnetwork",
    segment="subnetworks",
    noun="subnetwork",
    message=compute_v1.Subnetwork,
    regional=True,
    op_kind="compute.subnetworks",
    item_kind="compute#subnetwork",
    prepare=prepare_subnetwork,
)
FIREWALLS = Collection(
    kind="compute.firewall",
    segment="firewalls",
    noun="firewall",
    message=compute_v1.Firewall,
    regional=False,
    op_kind="compute.firewalls",
    item_kind="compute#firewall",
    prepare=prepare_firewall,
)
ADDRESSES = Collection(
    kind="compute.address",
    segment="addresses",
    noun="address",
    message=compute_v1.Address,
    regional=False,
    op_kind="compute.globalAddresses",
    item_kind="compute#address",
    prepare=prepare_address,
)
COLLECTIONS = (NETWORKS, SUBNETWORKS, FIREWALLS, ADDRESSES)


# ---------------------------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------------------------
def render(sb: Sandbox, resource: Resource) -> dict[str, Any]:
    """A resource as the API answers it (a network lists its subnets and peerings, as GCE's does)."""
    body = dict(resource.body)
    if resource.kind == "compute.network":
        users = sb.store.users_of(resource.key)
        subnets = [formats.compute_link(r.key) for r in users if r.kind == "compute.subnetwork"]
        if subnets:
            body["subnetworks"] = subnets
        # A peering is listed until the operation that removes it ends.
        live = ("ready", "deleting")
        connections = [r for r in users if r.kind == "servicenetworking.connection" and r.phase in live]
        peerings = [r.extra["peering"] for r in connections]
        if peerings:
            body["peerings"] = peerings
    return body


def render_operation(sb: Sandbox, operation: Operation) -> dict[str, Any]:
    """A compute Operation: status, progress, links, and on failure the error list plus the HTTP status."""
    at = sb.now()
    scope = "global" if operation.location == "global" else f"regions/{operation.location}"
    body: dict[str, Any] = {
        "kind": "compute#operation",
        "id": formats.numeric_id(operation.id),
        "name": operation.id,
        "operationType": operation.meta["operationType"],
        "targetLink": formats.compute_link(operation.target),
        "targetId": operation.meta.get("targetId", "0"),
        "status": operation.status(at),
        "user": USER,
        "progress": operation.progress(at),
        "insertTime": formats.rfc3339(operation.start),
        "startTime": formats.rfc3339(operation.start),
        "selfLink": formats.compute_link(f"projects/{operation.project}/{scope}/operations/{operation.id}"),
    }
    if scope != "global":
        body["region"] = formats.compute_link(f"projects/{operation.project}/{scope}")
    if operation.done:
        body["endTime"] = formats.rfc3339(operation.finished or operation.start)
    error = operation.api_error()
    if error is not None:
        code = re.sub(r"(?<!^)(?=[A-Z])", "_", error.reason).upper()
        body["error"] = {"errors": [{"code": code, "message": error.message}]}
        body["httpErrorStatusCode"] = error.http
        body["httpErrorMessage"] = HTTP_PHRASES.get(error.http, "ERROR")
    return body


def _list_reply(items: list[dict[str, Any]], kind: str, self_link: str, call: Call) -> Reply:
    """A compute list: optional ``filter`` (one ``field = value`` clause), ``maxResults`` and ``pageToken``."""
    expression = call.arg("filter")
    if expression:
        match = _FILTER.match(expression)
        if not match:
            raise invalid(f"Invalid list filter expression '{expression}'.")
        field, op, value = match.groups()
        equal = op in ("=", "eq")
        if op in ("eq", "ne"):
            items = [i for i in items if bool(re.fullmatch(value, str(i.get(field, "")))) == equal]
        else:
            items = [i for i in items if (str(i.get(field, "")) == value) == equal]
    start = int(call.arg("pageToken") or 0)
    size = int(call.arg("maxResults") or 500)
    body: dict[str, Any] = {"kind": kind, "id": self_link, "items": items[start : start + size]}
    body["selfLink"] = formats.compute_link(self_link)
    if start + size < len(items):
        body["nextPageToken"] = str(start + size)
    if not body["items"]:
        del body["items"]
    return reply(body)


def _region(call: Call) -> str | None:
    region = call.params.get("region")
    if region is not None and not REGION.match(region):
        raise invalid(f"Invalid value for field 'region': '{region}'. Must be a match of regex '{REGION.pattern}'")
    return region


# ---------------------------------------------------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------------------------------------------------
def _insert(collection: Collection) -> Callable[[Sandbox, Call], Any]:
    async def insert(sb: Sandbox, call: Call) -> Reply:
        project, region = call.params["project"], _region(call)
        sb.store.config.remember_project(project)
        request_id = check_request_id(call.arg("requestId"))
        if request_id:
            earlier = sb.store.by_request_id(SERVICE, project, request_id)
            if earlier is not None:
                return reply(render_operation(sb, earlier))
        if not call.text.strip():
            raise invalid("Required field 'resource' not specified", reason="required")
        body = message_dict(parse_message(collection.message, call.json(), "resource"))
        check_name(body.get("name", ""), COMPUTE_NAME, "resource.name")
        key = collection.key(project, region, body["name"])
        if sb.store.get(key) is not None:
            raise already_exists(f"The resource '{key}' already exists")
        refs = collection.prepare(sb, project, region, key, body)
        at = sb.now()
        body.update(
            kind=collection.item_kind,
            id=formats.numeric_id(key, str(at)),
            creationTimestamp=formats.rfc3339(at),
            selfLink=formats.compute_link(key),
        )
        if collection is NETWORKS:
            body["selfLinkWithId"] = formats.compute_link(f"projects/{project}/global/networks/{body['id']}")
        sb.store.put(Resource(collection.kind, key, body, refs=refs, created=at))
        operation = sb.start_operation(
            call,
            service=SERVICE,
            kind=f"{collection.op_kind}.insert",
            verb="insert",
            project=project,
            location=region or "global",
            target=key,
            effect=Effect(ready=[key]),
            meta={"operationType": "insert", "targetId": body["id"]},
            request_id=request_id,
        )
        return reply(render_operation(sb, operation))

    return insert


def _get(collection: Collection) -> Callable[[Sandbox, Call], Any]:
    async def get(sb: Sandbox, call: Call) -> Reply:
        key = collection.key(call.params["project"], _region(call), call.params["name"])
        resource = sb.store.get(key)
        if resource is None or resource.kind != collection.kind:
            raise not_found(f"The resource '{key}' was not found")
        return reply(render(sb, resource))

    return get


def _list(collection: Collection) -> Callable[[Sandbox, Call], Any]:
    async def list_(sb: Sandbox, call: Call) -> Reply:
        prefix = collection.key(call.params["project"], _region(call), "")
        items = [render(sb, r) for r in sb.store.of_kind(collection.kind, prefix)]
        return _list_reply(items, collection.item_kind + "List", prefix.rstrip("/"), call)

    return list_


def _delete(collection: Collection) -> Callable[[Sandbox, Call], Any]:
    async def delete(sb: Sandbox, call: Call) -> Reply:
        project, region = call.params["project"], _region(call)
        key = collection.key(project, region, call.params["name"])
        request_id = check_request_id(call.arg("requestId"))
        if request_id:
            earlier = sb.store.by_request_id(SERVICE, project, request_id)
            if earlier is not None:
                return reply(render_operation(sb, earlier))
        resource = sb.store.get(key)
        if resource is not None and resource.phase == "creating" and sb.supersede_hung(resource):
            resource = sb.store.get(key)
        if resource is None or resource.kind != collection.kind:
            raise not_found(f"The resource '{key}' was not found")
        if resource.phase in ("creating", "deleting"):
            raise not_ready(f"The resource '{key}' is not ready")
        users = sb.store.users_of(key)
        if users:
            raise in_use(f"The {collection.noun} resource '{key}' is already being used by '{users[0].key}'")
        operation = sb.start_operation(
            call,
            service=SERVICE,
            kind=f"{collection.op_kind}.delete",
            verb="delete",
            project=project,
            location=region or "global",
            target=key,
            effect=Effect(remove=[key]),
            meta={"operationType": "delete", "targetId": resource.body.get("id", "0")},
            request_id=request_id,
        )
        return reply(render_operation(sb, operation))

    return delete


def _operation(sb: Sandbox, call: Call) -> Operation:
    project, region, op_id = call.params["project"], _region(call), call.params["operation"]
    operation = sb.store.operation(op_id)
    location = region or "global"
    if operation is None or (operation.service, operation.project, operation.location) != (SERVICE, project, location):
        scope = f"regions/{region}" if region else "global"
        raise not_found(f"The resource 'projects/{project}/{scope}/operations/{op_id}' was not found")
    return operation


async def get_operation(sb: Sandbox, call: Call) -> Reply:
    """``globalOperations.get`` / ``regionOperations.get``."""
    return reply(render_operation(sb, _operation(sb, call)))


async def wait_operation(sb: Sandbox, call: Call) -> Reply:
    """``operations.wait``: answer when the operation is DONE, or after two minutes with its current status."""
    operation = _operation(sb, call)
    deadline = sb.now() + WAIT_LIMIT_SECONDS
    # A reset while waiting forgets the operation: stop waiting then rather than at the deadline.
    while not operation.done and sb.now() < deadline and sb.store.operation(operation.id) is operation:
        end = operation.end
        pause = WAIT_POLL_SECONDS if end is None else min(max(end - sb.now(), 0.0) + 0.001, 1.0)
        await asyncio.sleep(pause)
        sb.store.settle(sb.now())
    return reply(render_operation(sb, operation))


async def remove_peering(sb: Sandbox, call: Call) -> Reply:
    """``networks.removePeering`` (body ``{name}``): only the Service Networking peering exists here.

    The peering (and the connection behind it) goes when the operation ends: ``network.peerings`` lists it until then.
    Refused with 400 while another peering change runs on the network: Google says so only in text (no reason of
    its own), so the reason is compute's generic ``badRequest``.
    """
    project, name = call.params["project"], call.params["name"]
    key = NETWORKS.key(project, None, name)
    network = sb.store.get(key)
    if network is None:
        raise not_found(f"The resource '{key}' was not found")
    peering = str(call.json().get("name") or "")
    connection = servicenetworking.peering_connection(sb, network, peering)
    if connection is None:
        raise invalid(f"There is no peering with name '{peering}' in network '{key}'.")
    if servicenetworking.peering_busy(sb, key):
        raise invalid(servicenetworking.PEERING_IN_PROGRESS, reason="badRequest")
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind="compute.networks.removePeering",
        verb="update",
        project=project,
        location="global",
        target=key,
        effect=Effect(remove=[connection]),
        meta={"operationType": "removePeering", "targetId": network.body.get("id", "0")},
    )
    return reply(render_operation(sb, operation))


# ---------------------------------------------------------------------------------------------------------------------
# Seeded, read-only: network profiles and reservations
# ---------------------------------------------------------------------------------------------------------------------
def _profiles(sb: Sandbox) -> dict[str, str]:
    """RoCE network profile name -> its zone."""
    return {f"{zone}-vpc-roce": zone for zone in sb.store.config.roce_zones}


def render_profile(sb: Sandbox, project: str, name: str, zone: str) -> dict[str, Any]:
    """A RoCE network profile (what A3 Ultra / A4 zones offer for the RDMA network)."""
    key = f"projects/{project}/global/networkProfiles/{name}"
    return {
        "kind": "compute#networkProfile",
        "id": formats.numeric_id("networkProfile", name),
        "name": name,
        "creationTimestamp": formats.rfc3339(sb.started),
        "description": f"RDMA over Converged Ethernet (RoCE) network profile for {zone}",
        "selfLink": formats.compute_link(key),
        "selfLinkWithId": formats.compute_link(
            f"projects/{project}/global/networkProfiles/{formats.numeric_id('networkProfile', name)}"
        ),
        "location": {"name": zone, "scope": "ZONE"},
        "profileType": {"networkType": "RDMA", "rdmaSubtype": "ROCE"},
        "features": {
            "interfaceTypes": ["MRDMA"],
            "allowAutoModeSubnet": "AUTO_MODE_SUBNET_BLOCKED",
            "allowVpcPeering": "VPC_PEERING_BLOCKED",
            "allowMultiNicInSameNetwork": "MULTI_NIC_IN_SAME_NETWORK_ALLOWED",
        },
    }


async def get_profile(sb: Sandbox, call: Call) -> Reply:
    """``networkProfiles.get``: ``{zone}-vpc-roce`` for each seeded RoCE zone."""
    project, name = call.params["project"], call.params["name"]
    zone = _profiles(sb).get(name)
    if zone is None:
        raise not_found(f"The resource 'projects/{project}/global/networkProfiles/{name}' was not found")
    return reply(render_profile(sb, project, name, zone))


async def list_profiles(sb: Sandbox, call: Call) -> Reply:
    """``networkProfiles.list``."""
    project = call.params["project"]
    items = [render_profile(sb, project, name, zone) for name, zone in _profiles(sb).items()]
    return _list_reply(items, "compute#networkProfileList", f"projects/{project}/global/networkProfiles", call)


def render_reservation(sb: Sandbox, key: str) -> dict[str, Any]:
    """A specific reservation, with its machine type, accelerators, count and in-use count."""
    reservation = sb.store.config.reservations[key]
    properties: dict[str, Any] = {"machineType": reservation.machine_type}
    if reservation.accelerator_type:
        properties["guestAccelerators"] = [
            {"acceleratorType": reservation.accelerator_type, "acceleratorCount": reservation.accelerator_count}
        ]
    return {
        "kind": "compute#reservation",
        "id": formats.numeric_id(key),
        "creationTimestamp": formats.rfc3339(reservation.created),
        "name": reservation.name,
        "zone": formats.compute_link(f"projects/{reservation.project}/zones/{reservation.zone}"),
        "selfLink": formats.compute_link(key),
        "specificReservation": {
            "count": str(reservation.count),
            "inUseCount": str(reservation.in_use_count),
            "instanceProperties": properties,
        },
        "specificReservationRequired": True,
        "status": "READY",
    }


def _zone(call: Call) -> str:
    zone = call.params["zone"]
    if not ZONE.match(zone):
        raise invalid(f"Invalid value for field 'zone': '{zone}'. Must be a match of regex '{ZONE.pattern}'")
    return zone


async def get_reservation(sb: Sandbox, call: Call) -> Reply:
    """``reservations.get`` (reservations are seeded, never created through the API)."""
    key = f"projects/{call.params['project']}/zones/{_zone(call)}/reservations/{call.params['name']}"
    require_compute(sb, call.params["project"], "compute.reservations.get", key)
    if key not in sb.store.config.reservations:
        raise not_found(f"The resource '{key}' was not found")
    return reply(render_reservation(sb, key))


async def list_reservations(sb: Sandbox, call: Call) -> Reply:
    """``reservations.list`` in one zone."""
    prefix = f"projects/{call.params['project']}/zones/{_zone(call)}/reservations"
    items = [render_reservation(sb, k) for k in sorted(sb.store.config.reservations) if k.startswith(prefix + "/")]
    return _list_reply(items, "compute#reservationList", prefix, call)


async def get_region(sb: Sandbox, call: Call) -> Reply:
    """``regions.get``: status UP, its zones (a, b, c and any seeded RoCE zone) and the seeded quota limits."""
    project, region = call.params["project"], _region(call)
    assert region is not None
    zones = sorted(
        {f"{region}-{s}" for s in "abc"} | {z for z in sb.store.config.roce_zones if z.startswith(region + "-")}
    )
    key = f"projects/{project}/regions/{region}"
    quotas = [
        {"metric": metric, "limit": limit, "usage": 0.0} for metric, limit in sorted(sb.store.config.quotas.items())
    ]
    return reply(
        {
            "kind": "compute#region",
            "id": formats.numeric_id("region", region),
            "creationTimestamp": formats.rfc3339(sb.started),
            "name": region,
            "description": region,
            "status": "UP",
            "zones": [formats.compute_link(f"projects/{project}/zones/{zone}") for zone in zones],
            "quotas": quotas,
            "selfLink": formats.compute_link(key),
        }
    )


def register(router: Router) -> None:
    """Add the compute routes."""
    for collection in COLLECTIONS:
        base = PREFIX + ("/regions/{region}/" if collection.regional else "/global/") + collection.segment
        router.add("POST", base, SERVICE, _insert(collection))
        router.add("GET", base, SERVICE, _list(collection))
        router.add("GET", base + "/{name}", SERVICE, _get(collection))
        router.add("DELETE", base + "/{name}", SERVICE, _delete(collection))
    router.add("POST", PREFIX + "/global/networks/{name}/removePeering", SERVICE, remove_peering)
    router.add("GET", PREFIX + "/regions/{region}", SERVICE, get_region)
    router.add("GET", PREFIX + "/global/networkProfiles", SERVICE, list_profiles)
    router.add("GET", PREFIX + "/global/networkProfiles/{name}", SERVICE, get_profile)
    router.add("GET", PREFIX + "/zones/{zone}/reservations", SERVICE, list_reservations)
    router.add("GET", PREFIX + "/zones/{zone}/reservations/{name}", SERVICE, get_reservation)
    for scope in ("/global/operations/{operation}", "/regions/{region}/operations/{operation}"):
        router.add("GET", PREFIX + scope, SERVICE, get_operation)
        router.add("POST", PREFIX + scope + "/wait", SERVICE, wait_operation)
