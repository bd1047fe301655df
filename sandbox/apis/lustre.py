"""Managed Lustre v1: instances (create, get, list, delete), exportData / importData, google.longrunning operations.

Each instance gets a local data directory under the state dir (what later issues mount as ``/data``); deleting the
instance deletes it. ``exportData`` copies a path of that directory into ``gcs/{bucket}/{prefix}`` under the state
dir when its operation finishes; ``importData`` copies the other way. The instance's IP comes from the peering range
its network is connected through, as Lustre's private services access gives it.
"""

from __future__ import annotations

import copy
import ipaddress
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The sandbox runs as its own process, never inside a DAG parse: the heavy import ban does not apply.
from google.cloud import lustre_v1  # noqa: TID253

from sandbox import files, formats
from sandbox.apis import servicenetworking
from sandbox.errors import ApiError, already_exists, failed_precondition, invalid, not_found
from sandbox.http import Call, Reply, Router, reply
from sandbox.operations import Effect, Operation
from sandbox.store import Resource
from sandbox.validation import (
    LUSTRE_FILESYSTEM,
    LUSTRE_INSTANCE,
    ZONE,
    check_labels,
    check_name,
    check_request_id,
    message_dict,
    parse_message,
)

if TYPE_CHECKING:
    from sandbox.context import Sandbox

SERVICE = "lustre"
PREFIX = "/v1/projects/{project}/locations/{location}"
TYPE_BASE = "type.googleapis.com/google.cloud.lustre.v1."
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
STATE_NAMES = {"creating": "CREATING", "ready": "ACTIVE", "deleting": "DELETING", "error": "STATE_UNSPECIFIED"}
STATES = {"lustre.instance": STATE_NAMES}
# FACTS §4: throughput tier (MB/s/TiB) -> (min GiB, max GiB, step up to the threshold, threshold, step above).
CAPACITY_TIERS: dict[int, tuple[int, int, int, int, int]] = {
    1000: (9_000, 10_008_000, 9_000, 1_530_000, 72_000),
    500: (18_000, 20_016_000, 18_000, 3_060_000, 144_000),
    250: (36_000, 40_032_000, 36_000, 6_120_000, 288_000),
    125: (72_000, 12_240_000, 72_000, 12_240_000, 72_000),
}
FALLBACK_RANGE = ipaddress.ip_network("172.16.0.0/12")
TRANSFER_VERBS = ("exportData", "importData")
# FACTS §14: one transfer per instance at a time; a second one is refused on the call.
TRANSFER_BUSY = "unable to queue the operation"
_GCS_URI = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,61}[a-z0-9])(?:/(.*))?$")
# What each verb's operation metadata and response are, as the client unpacks them.
METADATA_TYPES = {
    "create": "OperationMetadata",
    "update": "OperationMetadata",
    "delete": "OperationMetadata",
    "exportData": "ExportDataMetadata",
    "importData": "ImportDataMetadata",
}
RESPONSE_TYPES = {
    "create": TYPE_BASE + "Instance",
    "update": TYPE_BASE + "Instance",
    "delete": EMPTY_TYPE,
    "exportData": TYPE_BASE + "ExportDataResponse",
    "importData": TYPE_BASE + "ImportDataResponse",
}


def _zone(call: Call) -> str:
    location = call.params["location"]
    if not ZONE.match(location):
        raise invalid(f'Location "{location}" is not a zone: Lustre instances are zonal.')
    return location


def _instance(sb: Sandbox, call: Call) -> Resource:
    key = f"projects/{call.params['project']}/locations/{_zone(call)}/instances/{call.params['instance']}"
    instance = sb.store.get(key)
    if instance is None:
        raise not_found(f"Resource '{key}' was not found")
    return instance


def check_capacity(capacity: int, throughput: int) -> None:
    """400 unless the capacity fits the throughput tier's range and step (FACTS §4)."""
    if throughput not in CAPACITY_TIERS:
        raise invalid(f"perUnitStorageThroughput must be one of {sorted(CAPACITY_TIERS)}, got {throughput}.")
    low, high, step, threshold, step_above = CAPACITY_TIERS[throughput]
    step_here = step if capacity <= threshold else step_above
    if not low <= capacity <= high or capacity % step_here:
        raise invalid(
            f"capacityGib {capacity} is not valid for {throughput} MB/s/TiB: it must be between {low} and {high}, "
            f"in steps of {step} up to {threshold} and of {step_above} above."
        )


def _network(sb: Sandbox, value: str) -> Resource:
    parts = value.split("/")
    if len(parts) != 5 or parts[0] != "projects" or parts[2:4] != ["global", "networks"]:
        raise invalid(f'network "{value}" must be projects/PROJECT/global/networks/NETWORK.')
    project = parts[1]
    if project.isdigit():
        by_number = {formats.project_number(p): p for p in sb.store.config.known_projects}
        project = by_number.get(project, project)
    network = sb.store.get(f"projects/{project}/global/networks/{parts[4]}")
    if network is None or network.phase != "ready":
        raise invalid(f'network "{value}" was not found or is not ready.')
    return network


def _peering_ip(sb: Sandbox, network: Resource) -> str:
    """An address from the range the network is peered through (Lustre lives in the service producer's VPC)."""
    connections = [
        r for r in sb.store.users_of(network.key) if r.kind == "servicenetworking.connection" and r.phase == "ready"
    ]
    if not connections:
        raise failed_precondition(
            f'Network "{network.key}" has no private services access connection: create the Service Networking '
            "peering first."
        )
    ranges = [r for r in (sb.store.get(k) for k in connections[0].refs) if r and r.kind == "compute.address"]
    used = {r.extra.get("ip") for r in sb.store.resources.values() if r.kind == "lustre.instance"}
    pools = [ipaddress.ip_network(f"{r.body['address']}/{r.body['prefixLength']}") for r in ranges] or [FALLBACK_RANGE]
    for pool in pools:
        # .1 is the range's gateway; the instance takes the first free address after it.
        for offset in range(2, pool.num_addresses - 1):
            host = str(pool.network_address + offset)
            if host not in used:
                return host
    raise failed_precondition(f'The peering ranges of network "{network.key}" have no free address left.')


# ---------------------------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------------------------
def render_instance(body: dict[str, Any], phase: str) -> dict[str, Any]:
    """An Instance with its state."""
    rendered = copy.deepcopy(body)
    rendered["state"] = STATE_NAMES[phase]
    return rendered


def render_operation(sb: Sandbox, operation: Operation) -> dict[str, Any]:
    """A google.longrunning Operation with Lustre's metadata and, when done, its response or error."""
    verb = operation.verb
    metadata: dict[str, Any] = {
        "@type": TYPE_BASE + METADATA_TYPES[verb],
        "createTime": formats.zulu(operation.start),
        "target": operation.target,
        "requestedCancellation": False,
        "apiVersion": "v1",
    }
    if verb in ("create", "update", "delete"):
        metadata["verb"] = verb
    else:
        metadata["operationMetadata"] = operation.meta["transfer"]
    body: dict[str, Any] = {
        "name": f"projects/{operation.project}/locations/{operation.location}/operations/{operation.id}",
        "metadata": metadata,
        "done": operation.done,
    }
    if not operation.done:
        return body
    metadata["endTime"] = formats.zulu(operation.finished or operation.start)
    error = operation.api_error()
    if error is not None:
        body["error"] = {"code": error.rpc_code, "message": error.message}
    elif verb in ("create", "update"):
        body["response"] = {"@type": RESPONSE_TYPES[verb], **render_instance(operation.snapshot or {}, "ready")}
    else:
        body["response"] = {"@type": RESPONSE_TYPES[verb]}
    return body


# ---------------------------------------------------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------------------------------------------------
def _earlier(sb: Sandbox, call: Call, request_id: str | None) -> Operation | None:
    """The operation an earlier call with this ``requestId`` started: a retried request gets it back."""
    return sb.store.by_request_id(SERVICE, call.params["project"], request_id) if request_id else None


async def create_instance(sb: Sandbox, call: Call) -> Reply:
    """``instances.create`` with ``?instanceId=``: the body is the Instance."""
    project, zone = call.params["project"], _zone(call)
    sb.store.config.remember_project(project)
    request_id = check_request_id(call.arg("requestId"))
    earlier = _earlier(sb, call, request_id)
    if earlier is not None:
        return reply(render_operation(sb, earlier))
    instance_id = call.arg("instanceId") or ""
    check_name(instance_id, LUSTRE_INSTANCE, "instanceId")
    body = message_dict(parse_message(lustre_v1.Instance, call.json(), "instance"))
    check_name(body.get("filesystem", ""), LUSTRE_FILESYSTEM, "instance.filesystem")
    check_capacity(int(body.get("capacityGib", 0)), int(body.get("perUnitStorageThroughput", 0)))
    check_labels(body.get("labels", {}), "instance.labels")
    key = f"projects/{project}/locations/{zone}/instances/{instance_id}"
    if sb.store.get(key) is not None:
        raise already_exists(f"Resource '{key}' already exists")
    if not body.get("network"):
        raise invalid("instance.network is required.")
    network = _network(sb, body["network"])
    ip = _peering_ip(sb, network)
    data_dir = files.lustre_dir(sb.state_dir, project, zone, instance_id)
    data_dir.mkdir(parents=True, exist_ok=True)
    at = sb.now()
    body.update(
        name=key,
        mountPoint=f"{ip}@tcp:/{body['filesystem']}",
        createTime=formats.zulu(at),
        updateTime=formats.zulu(at),
        uid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{key}@{at}")),
    )
    extra = {"data_dir": str(data_dir), "ip": ip}
    sb.store.put(Resource("lustre.instance", key, body, refs=[network.key], created=at, extra=extra))
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind="lustre.instances.create",
        verb="create",
        project=project,
        location=zone,
        target=key,
        effect=Effect(ready=[key]),
        request_id=request_id,
    )
    return reply(render_operation(sb, operation))


async def get_instance(sb: Sandbox, call: Call) -> Reply:
    """``instances.get``."""
    instance = _instance(sb, call)
    return reply(render_instance(instance.body, instance.phase))


async def list_instances(sb: Sandbox, call: Call) -> Reply:
    """``instances.list`` (location ``-`` lists every zone)."""
    location = call.params["location"]
    prefix = f"projects/{call.params['project']}/locations/" + ("" if location == "-" else f"{_zone(call)}/")
    instances = [render_instance(r.body, r.phase) for r in sb.store.of_kind("lustre.instance", prefix)]
    return reply({"instances": instances} if instances else {})


# What instances.patch may change here (the run changes only these; capacity changes are not modelled).
UPDATABLE = ("labels", "description")


async def update_instance(sb: Sandbox, call: Call) -> Reply:
    """``instances.patch`` with ``?updateMask=``: labels and description, applied at once, on an ACTIVE instance."""
    instance = _instance(sb, call)
    mask = [m.strip() for m in (call.arg("updateMask") or "").split(",") if m.strip()]
    if not mask:
        raise invalid("updateMask is required.")
    bad = [m for m in mask if m not in UPDATABLE]
    if bad:
        raise invalid(f"updateMask: {', '.join(bad)} cannot be updated here; updatable: {', '.join(UPDATABLE)}.")
    body = message_dict(parse_message(lustre_v1.Instance, call.json(), "instance"))
    if "labels" in mask:
        check_labels(body.get("labels", {}), "instance.labels")
    _busy(sb, instance)
    for field in mask:
        if field in body:
            instance.body[field] = body[field]
        else:
            instance.body.pop(field, None)
    instance.body["updateTime"] = formats.zulu(sb.now())
    sb.store.put(instance)
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind="lustre.instances.update",
        verb="update",
        project=call.params["project"],
        location=call.params["location"],
        target=instance.key,
        effect=Effect(),
        request_id=check_request_id(call.arg("requestId")),
    )
    operation.snapshot = copy.deepcopy(instance.body)
    return reply(render_operation(sb, operation))


def _busy(sb: Sandbox, instance: Resource) -> None:
    """400 unless the instance is ACTIVE with no operation running (a hanging create is superseded: then 404)."""
    if instance.phase == "creating" and sb.supersede_hung(instance):
        raise not_found(f"Resource '{instance.key}' was not found")
    if instance.phase != "ready":
        raise failed_precondition(f"Instance {instance.key} is {STATE_NAMES[instance.phase]}, not ACTIVE.")
    sb.supersede_hung(instance)
    running = sb.store.running(instance.key)
    if running:
        raise failed_precondition(f"Instance {instance.key} has an operation in progress: {running[0].id}.")


async def delete_instance(sb: Sandbox, call: Call) -> Reply:
    """``instances.delete``: the instance's files go with it."""
    request_id = check_request_id(call.arg("requestId"))
    earlier = _earlier(sb, call, request_id)
    if earlier is not None:
        return reply(render_operation(sb, earlier))
    instance = _instance(sb, call)
    _busy(sb, instance)
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind="lustre.instances.delete",
        verb="delete",
        project=call.params["project"],
        location=call.params["location"],
        target=instance.key,
        effect=Effect(remove=[instance.key]),
        request_id=request_id,
    )
    # Service Networking keeps counting the instance as a producer on its network for a while after it is gone.
    for network_key in instance.refs:
        servicenetworking.release_producer(sb, network_key, operation.end or sb.now())
    return reply(render_operation(sb, operation))


def _gcs_dir(sb: Sandbox, uri: str, field: str) -> tuple[Path, str]:
    match = _GCS_URI.match(uri or "")
    if not match:
        raise invalid(f'{field}: "{uri}" is not a gs://BUCKET[/PREFIX] URI.')
    bucket, prefix = match.group(1), match.group(2) or ""
    try:
        return files.inside(files.gcs_root(sb.state_dir) / bucket, prefix), bucket
    except files.PathEscapeError as exc:
        raise invalid(f"{field}: {exc}") from exc


def _lustre_path(instance: Resource, path: str, field: str) -> Path:
    if not path.startswith("/"):
        raise invalid(f'{field}: "{path}" must be an absolute path on the instance.')
    try:
        return files.inside(Path(instance.extra["data_dir"]), path)
    except files.PathEscapeError as exc:
        raise invalid(f"{field}: {exc}") from exc


async def _transfer(sb: Sandbox, call: Call, verb: str) -> Reply:
    instance = _instance(sb, call)
    message_type = lustre_v1.ExportDataRequest if verb == "exportData" else lustre_v1.ImportDataRequest
    body = message_dict(parse_message(message_type, call.json(), "request"))
    request_id = check_request_id(body.get("requestId"))
    earlier = _earlier(sb, call, request_id)
    if earlier is not None:
        return reply(render_operation(sb, earlier))
    if body.get("name", instance.key) != instance.key:
        raise invalid(f'name "{body["name"]}" in the body does not match the URL\'s "{instance.key}".')
    lustre_path = body.get("lustrePath", {}).get("path", "")
    uri = body.get("gcsPath", {}).get("uri", "")
    local = _lustre_path(instance, lustre_path, "lustrePath.path")
    bucket_dir, _ = _gcs_dir(sb, uri, "gcsPath.uri")
    if uri.count("/") > 2 and not uri.endswith("/"):
        raise invalid(f'gcsPath.uri: "{uri}": a path inside the bucket must end with a forward slash (/).')
    if verb == "importData" and lustre_path.rstrip("/") and not local.is_dir():
        # LustrePath: "If you're importing data into Managed Lustre, any path other than the default must already
        # exist on the file system" (google-cloud-lustre 0.4.3, types/transfer.py).
        raise failed_precondition(
            f"lustrePath.path: {lustre_path} does not exist on instance {instance.name}; an import's destination "
            "other than / must already exist."
        )
    if instance.phase == "ready":
        sb.supersede_hung(instance)  # a hung transfer only exists because a test injected it
    transfers = [o for o in sb.store.running(instance.key) if o.verb in TRANSFER_VERBS]
    if transfers:
        raise ApiError("ABORTED", TRANSFER_BUSY, reason="aborted")
    _busy(sb, instance)
    if verb == "exportData":
        copy_pair = [str(local), str(bucket_dir)]
        transfer = {
            "sourceLustrePath": {"path": lustre_path},
            "destinationGcsPath": {"uri": uri},
            "transferType": "EXPORT",
        }
        missing = f"Lustre path {lustre_path} was not found on instance {instance.name}."
    else:
        copy_pair = [str(bucket_dir), str(local)]
        transfer = {
            "sourceGcsPath": {"uri": uri},
            "destinationLustrePath": {"path": lustre_path},
            "transferType": "IMPORT",
        }
        missing = f"{uri} was not found."
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind=f"lustre.instances.{verb}",
        verb=verb,
        project=call.params["project"],
        location=call.params["location"],
        target=instance.key,
        effect=Effect(copy=copy_pair),
        meta={"transfer": transfer, "missing_message": missing},
        request_id=request_id,
    )
    return reply(render_operation(sb, operation))


async def export_data(sb: Sandbox, call: Call) -> Reply:
    """``instances.exportData``: copy a Lustre path to ``gs://`` (a local bucket directory) when the op finishes."""
    return await _transfer(sb, call, "exportData")


async def import_data(sb: Sandbox, call: Call) -> Reply:
    """``instances.importData``: copy ``gs://`` (a local bucket directory) to a Lustre path when the op finishes."""
    return await _transfer(sb, call, "importData")


def register(router: Router) -> None:
    """Add the Lustre routes (operations are served with GKE's, by :mod:`sandbox.apis.locations`)."""
    instances = PREFIX + "/instances"
    router.add("POST", instances, SERVICE, create_instance)
    router.add("GET", instances, SERVICE, list_instances)
    router.add("GET", instances + "/{instance}", SERVICE, get_instance)
    router.add("DELETE", instances + "/{instance}", SERVICE, delete_instance)
    router.add("PATCH", instances + "/{instance}", SERVICE, update_instance)
    router.add("POST", instances + "/{instance}:exportData", SERVICE, export_data)
    router.add("POST", instances + "/{instance}:importData", SERVICE, import_data)
