"""GKE (container v1): clusters and node pools, with GKE's rules on names, networks, reservations and concurrency.

A cluster is PROVISIONING until its create operation is done, then RUNNING (RECONCILING while a node pool operation
runs on it), STOPPING while it is deleted, ERROR when its create failed. Node pools are stored as the cluster's
children, so deleting a cluster deletes them. One operation at a time per cluster: a node pool create, a node pool
delete or a cluster delete while another runs answers 400 FAILED_PRECONDITION ("incompatible operation"), as GKE
does. A cluster has its own CA from its create on (``masterAuth.clusterCaCertificate``, :mod:`sandbox.tls`); once it
runs, ``endpoint`` is ``127.0.0.1:PORT``, where :mod:`sandbox.kube` serves its Kubernetes API over HTTPS.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

# The sandbox runs as its own process, never inside a DAG parse: the heavy import ban does not apply.
from google.cloud import container_v1  # noqa: TID253

from sandbox import capacity, formats
from sandbox.config import GPU_MACHINES
from sandbox.errors import already_exists, failed_precondition, invalid, not_found
from sandbox.http import Call, Reply, Router, reply
from sandbox.operations import Effect, Operation
from sandbox.store import Resource
from sandbox.validation import GKE_NAME, REGION, ZONE, check_labels, check_name, message_dict, parse_message

if TYPE_CHECKING:
    from sandbox.context import Sandbox

SERVICE = "container"
PREFIX = "/v1/projects/{project}/locations/{location}"
MASTER_VERSION = "1.33.5-gke.1201000"
# The versions the sandbox's GKE offers (serverConfig's validMasterVersions); a cluster gets MASTER_VERSION unless
# it asks for one of these, or for a prefix ("1.32") that GKE resolves to the newest matching one.
VALID_VERSIONS = ("1.33.5-gke.1201000", "1.32.4-gke.1106000", "1.32.2-gke.1652000", "1.31.6-gke.1020000")
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
CLUSTER_STATUS = {"creating": "PROVISIONING", "ready": "RUNNING", "deleting": "STOPPING", "error": "ERROR"}
POOL_STATUS = {"creating": "PROVISIONING", "ready": "RUNNING", "deleting": "STOPPING", "error": "ERROR"}
STATES = {"container.cluster": CLUSTER_STATUS, "container.nodePool": POOL_STATUS}
ZONE_SUFFIXES = ("a", "b", "c")


def _location(call: Call) -> str:
    location = call.params["location"]
    if not (REGION.match(location) or ZONE.match(location)):
        raise invalid(f'Location "{location}" is not a valid region or zone.')
    return location


def _region_of(location: str) -> str:
    return location.rsplit("-", 1)[0] if ZONE.match(location) else location


def _cluster_key(project: str, location: str, name: str) -> str:
    return f"projects/{project}/locations/{location}/clusters/{name}"


def _cluster(sb: Sandbox, call: Call) -> Resource:
    key = _cluster_key(call.params["project"], _location(call), call.params["cluster"])
    cluster = sb.store.get(key)
    if cluster is None:
        raise not_found(f"Not found: {key}.")
    return cluster


def _incompatible(sb: Sandbox, cluster: Resource) -> None:
    """400 FAILED_PRECONDITION while any operation runs on the cluster or one of its pools (its own create included;
    hanging ones are superseded first). GKE's reason is the generic ``failedPrecondition``: only the text says which
    precondition (terraform-provider-google's node pool retry reads the same reason)."""
    sb.supersede_hung(cluster)
    running = sb.store.running(cluster.key)
    if running:
        raise failed_precondition(f"Cluster is running incompatible operation {running[0].id}.")


def _network_key(sb: Sandbox, value: str, project: str, field: str) -> str:
    key = formats.compute_key(value, project, "networks")
    if key is None:
        raise invalid(f"Invalid value for field '{field}': \"{value}\" is not a network name or path.")
    found = sb.store.get(key)
    if found is None:
        raise invalid(f'Network "{value}" does not exist.')
    if found.phase != "ready":
        raise failed_precondition(f'Network "{value}" is not ready.')
    return key


def _subnet_key(sb: Sandbox, value: str, project: str, *, region: str, network_key: str, field: str) -> str:
    key = formats.compute_key(value, project, "subnetworks", region)
    if key is None or key.split("/")[3] != region:
        raise invalid(f"Invalid value for field '{field}': subnetwork \"{value}\" must be in region {region}.")
    found = sb.store.get(key)
    if found is None:
        raise invalid(f'Subnetwork "{value}" does not exist in region {region}.')
    if found.phase != "ready":
        raise failed_precondition(f'Subnetwork "{value}" is not ready.')
    if network_key not in found.refs:
        raise invalid(f'Subnetwork "{value}" is not in network "{formats.key_name(network_key)}".')
    return key


# ---------------------------------------------------------------------------------------------------------------------
# Node pool checks, shared by cluster create (its initial pools) and node pool create
# ---------------------------------------------------------------------------------------------------------------------
def _check_autoscaling(autoscaling: dict[str, Any], field: str) -> None:
    per_zone = [k for k in ("minNodeCount", "maxNodeCount") if k in autoscaling]
    total = [k for k in ("totalMinNodeCount", "totalMaxNodeCount") if k in autoscaling]
    if per_zone and total:
        raise invalid(
            f"{field}: per zone limits ({', '.join(per_zone)}) and total limits ({', '.join(total)}) "
            "cannot be specified together."
        )
    for low, high in (("minNodeCount", "maxNodeCount"), ("totalMinNodeCount", "totalMaxNodeCount")):
        if autoscaling.get(low, 0) > autoscaling.get(high, autoscaling.get(low, 0)):
            raise invalid(f"{field}: {low} must not exceed {high}.")
    if autoscaling.get("enabled") and not (autoscaling.get("maxNodeCount") or autoscaling.get("totalMaxNodeCount")):
        raise invalid(f"{field}: autoscaling needs maxNodeCount or totalMaxNodeCount greater than zero.")


def _check_accelerators(config: dict[str, Any], field: str) -> None:
    expected = GPU_MACHINES.get(config["machineType"])
    for accelerator in config.get("acceleratorConfig", config.get("accelerators", [])):
        kind, count = accelerator.get("acceleratorType"), int(accelerator.get("acceleratorCount", 0))
        if expected is not None and (kind, count) != expected:
            raise invalid(
                f"{field}.accelerators: machine type {config['machineType']} comes with {expected[1]} x "
                f"{expected[0]}, not {count} x {kind}."
            )


RESERVATION_VALUE = re.compile(
    r"^(?:projects/(?P<owner>[a-z][-a-z0-9]{4,28}[a-z0-9])/reservations/)?(?P<name>[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)"
    r"(?:/reservationBlocks/(?P<block>[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?))?$"
)


def _check_reservation(sb: Sandbox, project: str, config: dict[str, Any], zones: list[str], field: str) -> None:
    affinity = config.get("reservationAffinity")
    if not affinity or affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
        return
    if affinity.get("key") != RESERVATION_KEY or not affinity.get("values"):
        raise invalid(f"{field}.reservationAffinity: SPECIFIC_RESERVATION needs key {RESERVATION_KEY} and a value.")
    for value in affinity["values"]:
        # GKE's forms: NAME, projects/OWNER/reservations/NAME, either + /reservationBlocks/BLOCK (FACTS §19).
        form = RESERVATION_VALUE.match(value)
        if not form:
            raise invalid(
                f'{field}.reservationAffinity.values: "{value}" is not RESERVATION, '
                "projects/PROJECT/reservations/RESERVATION or RESERVATION/reservationBlocks/BLOCK."
            )
        owner, name, block = form.group("owner") or project, form.group("name"), form.group("block")
        found = [
            sb.store.config.reservations.get(f"projects/{owner}/zones/{zone}/reservations/{name}") for zone in zones
        ]
        reservations = [r for r in found if r is not None]
        if not reservations:
            raise invalid(f'{field}.reservationAffinity: reservation "{value}" was not found in zones {zones}.')
        if block and not any(block in r.blocks for r in reservations):
            raise invalid(f'{field}.reservationAffinity: reservation block "{block}" of "{name}" was not found.')
        for reservation in reservations:
            if reservation.machine_type != config["machineType"]:
                raise invalid(
                    f'{field}.reservationAffinity: reservation "{value}" is for {reservation.machine_type}, '
                    f"not {config['machineType']}."
                )


# GKE's first version with flex-start on GPUs (GKE docs: About flex-start provisioning mode, Requirements).
FLEX_START_MIN_VERSION = (1, 32, 2, 1652000)


def _version_tuple(version: str) -> tuple[int, ...]:
    """``1.33.5-gke.1080000`` -> (1, 33, 5, 1080000); what cannot be read sorts first."""
    found = re.match(r"^(\d+)\.(\d+)\.(\d+)(?:-gke\.(\d+))?", version)
    return tuple(int(g or 0) for g in found.groups()) if found else (0,)


def _check_capacity(pool: dict[str, Any], cluster: dict[str, Any], field: str) -> None:
    """Spot, flex-start and their reservation affinity, as GKE refuses them: flex-start needs GKE 1.32.2-gke.1652000,
    autoscaling, no auto-repair, no reservation, and is not spot; maxRunDuration at most 7 days."""
    config = pool.get("config", {})
    affinity = (config.get("reservationAffinity") or {}).get("consumeReservationType", "ANY_RESERVATION")
    flex = bool(config.get("flexStart"))
    if config.get("spot") and affinity == "SPECIFIC_RESERVATION":
        raise invalid(f"{field}.config: Spot VMs cannot consume a specific reservation.")
    if "maxRunDuration" in config:
        seconds = re.fullmatch(r"(\d+)(?:\.\d+)?s", str(config["maxRunDuration"]))
        if not flex or seconds is None or not 0 < int(seconds.group(1)) <= capacity.MAX_RUN_S:
            raise invalid(f"{field}.config.maxRunDuration must be set with flexStart, at most 7 days (604800s).")
    queued = bool((pool.get("queuedProvisioning") or {}).get("enabled"))
    if flex:
        version = cluster.get("currentMasterVersion") or MASTER_VERSION
        if _version_tuple(version) < FLEX_START_MIN_VERSION:
            raise invalid(
                f"{field}.config.flexStart needs GKE 1.32.2-gke.1652000 or later; the cluster runs {version}."
            )
    if flex or queued:
        _check_dws_pool(pool, affinity, field, queued=queued)


def _check_dws_pool(pool: dict[str, Any], affinity: str, field: str, *, queued: bool) -> None:
    """A Dynamic Workload Scheduler pool, flex-start or queued provisioning (GKE docs: flex-start; flex-start with
    queued provisioning): it is not spot, takes no reservation, scales from 0 on autoscaling and is not repaired."""
    kind, flag = ("queued provisioning", "queued provisioning") if queued else ("flex-start", "flexStart")
    if (pool.get("config") or {}).get("spot"):
        raise invalid(f"{field}.config: {flag} and spot cannot both be set.")
    if affinity != "NO_RESERVATION":
        raise invalid(f"{field}.config.reservationAffinity: {kind} node pools need NO_RESERVATION.")
    if not pool.get("autoscaling", {}).get("enabled"):
        raise invalid(f"{field}.autoscaling: {kind} node pools need autoscaling enabled.")
    if pool.get("management", {}).get("autoRepair", False):
        raise invalid(f"{field}.management.autoRepair: {kind} node pools do not support auto-repair.")


def _prepare_pool(
    sb: Sandbox, project: str, location: str, *, cluster: dict[str, Any], pool: dict[str, Any], field: str
) -> list[str]:
    """Check one node pool against GKE's rules and fill what GKE fills; returns the compute keys it uses."""
    check_name(pool.get("name", ""), GKE_NAME, f"{field}.name")
    if int(pool.get("initialNodeCount", 0)) < 0:
        raise invalid(f"{field}.initialNodeCount must not be negative.")
    region = _region_of(location)
    zones = pool.setdefault("locations", list(cluster["locations"]))
    for zone in zones:
        if not ZONE.match(zone) or _region_of(zone) != region:
            raise invalid(f'{field}.locations: "{zone}" is not a zone of region {region}.')
    _check_autoscaling(pool.get("autoscaling", {}), f"{field}.autoscaling")
    config = pool.setdefault("config", {})
    config.setdefault("machineType", "e2-medium")
    check_labels(config.get("resourceLabels", {}), f"{field}.config.resourceLabels")
    _check_accelerators(config, f"{field}.config")
    _check_reservation(sb, project, config, zones, f"{field}.config")
    _check_capacity(pool, cluster, field)
    refs: list[str] = []
    extra_networks = pool.get("networkConfig", {}).get("additionalNodeNetworkConfigs", [])
    if extra_networks and not cluster.get("networkConfig", {}).get("enableMultiNetworking"):
        raise invalid(f"{field}.networkConfig: additional node networks need a cluster with multi-networking enabled.")
    for index, extra in enumerate(extra_networks):
        where = f"{field}.networkConfig.additionalNodeNetworkConfigs[{index}]"
        network = _network_key(sb, extra.get("network", ""), project, f"{where}.network")
        if network == cluster["networkConfig"]["network"]:
            raise invalid(f"{where}: the additional network must differ from the cluster's network.")
        subnet = _subnet_key(
            sb, extra.get("subnetwork", ""), project, region=region, network_key=network, field=f"{where}.subnetwork"
        )
        refs += [network, subnet]
    config.setdefault("diskSizeGb", 100)
    config.setdefault("diskType", "pd-balanced")
    config.setdefault("imageType", "COS_CONTAINERD")
    config.setdefault("serviceAccount", "default")
    pool.setdefault("version", cluster.get("currentMasterVersion") or MASTER_VERSION)
    pool.setdefault("podIpv4CidrSize", 24)
    return list(dict.fromkeys(refs))


def _pool_resource(cluster_key: str, pool: dict[str, Any], refs: list[str], at: float) -> Resource:
    """A node pool for the store, with the fields GKE fills in."""
    key = f"{cluster_key}/nodePools/{pool['name']}"
    pool["selfLink"] = formats.container_link(key)
    pool["etag"] = formats.numeric_id(key, str(at))[:8]
    return Resource("container.nodePool", key, pool, refs=refs, created=at, keep_on_error=True)


# ---------------------------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------------------------
def _status_message(sb: Sandbox, resource: Resource) -> str | None:
    if resource.phase != "error":
        return None
    failed = [o for o in sb.store.operations.values() if o.target == resource.key and o.error]
    return failed[-1].error["message"] if failed and failed[-1].error else "Creation failed."


def _node_count(pool: Resource) -> int:
    """A pool's nodes: its last setSize, else its initial count in each of its zones."""
    if "nodeCount" in pool.extra:
        return int(pool.extra["nodeCount"])
    return int(pool.body.get("initialNodeCount", 0)) * len(pool.body.get("locations", []))


def _stockouts(sb: Sandbox, pool: Resource) -> list[str]:
    """What keeps the pool's autoscaler from adding a node: each used-up specific reservation (compute's message),
    or the zone out of Spot or on-demand VMs (sandbox/capacity.py)."""
    model = sb.kuberay.capacity
    found = [
        f"Specified reservation '{key}' does not have available resources for the request."
        for key in model.stocked_out(pool)
    ]
    kind = capacity.pool_capacity(pool.body)
    if kind in ("spot", "on_demand") and sb.store.config.capacity.get(f"{kind}_stockout"):
        found.append(f"The zone does not have enough resources available to fulfill the request ({kind} VMs).")
    return found


def render_pool(sb: Sandbox, pool: Resource) -> dict[str, Any]:
    """A node pool with its status; a GCE_STOCKOUT condition while its reservation has no VM left for its nodes.

    The stock-out is a StatusCondition (code GCE_STOCKOUT, "Google Compute Engine is out of capacity"), as GKE puts
    what keeps a pool's nodes from coming; the message is compute's for a used-up specific reservation.
    """
    body = copy.deepcopy(pool.body)
    body["status"] = POOL_STATUS[pool.phase]
    message = _status_message(sb, pool)
    if message:
        body["statusMessage"] = message
    if pool.phase == "ready":
        conditions = [
            {"code": "GCE_STOCKOUT", "message": message, "canonicalCode": "RESOURCE_EXHAUSTED"}
            for message in _stockouts(sb, pool)
        ]
        if conditions:
            body["conditions"] = conditions
    return body


def render_cluster(sb: Sandbox, cluster: Resource) -> dict[str, Any]:
    """A cluster with its status (RECONCILING while a node pool operation runs) and its node pools."""
    body = copy.deepcopy(cluster.body)
    status = CLUSTER_STATUS[cluster.phase]
    if cluster.phase == "ready" and sb.store.running(cluster.key):
        status = "RECONCILING"
    body["status"] = status
    message = _status_message(sb, cluster)
    if message:
        body["statusMessage"] = message
    pools = sorted(sb.store.children(cluster.key), key=lambda r: (r.created, r.key))
    body["nodePools"] = [render_pool(sb, p) for p in pools if p.kind == "container.nodePool"]
    body["currentNodeCount"] = sum(_node_count(p) for p in pools if p.kind == "container.nodePool")
    # As GKE: a bare address (here with the port of the cluster's own listener), HTTPS under the cluster's CA.
    body["endpoint"] = sb.kube.endpoint(cluster)
    body["masterAuth"] = {"clusterCaCertificate": sb.kube.tls(cluster).ca_base64}
    return body


def render_operation(sb: Sandbox, operation: Operation) -> dict[str, Any]:
    """A container Operation: status PENDING/RUNNING/DONE, links by project number, ``error`` when it failed."""
    at = sb.now()
    rest = operation.target.split("/", 2)[2]
    body: dict[str, Any] = {
        "name": operation.id,
        "zone": operation.location,
        "location": operation.location,
        "operationType": operation.meta["operationType"],
        "status": operation.status(at),
        "selfLink": formats.container_operation_link(
            operation.project, f"locations/{operation.location}/operations/{operation.id}"
        ),
        "targetLink": formats.container_operation_link(operation.project, rest),
        "startTime": formats.zulu(operation.start),
    }
    if operation.done:
        body["endTime"] = formats.zulu(operation.finished or operation.start)
    error = operation.api_error()
    if error is not None:
        body["error"] = {"code": error.rpc_code, "message": error.message}
        body["statusMessage"] = error.message
    return body


# ---------------------------------------------------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------------------------------------------------
def _check_parent(body: dict[str, Any], parent: str) -> None:
    if body.get("parent", parent) != parent:
        raise invalid(f'parent "{body["parent"]}" in the body does not match the URL\'s "{parent}".')


def _cluster_network(sb: Sandbox, project: str, region: str, cluster: dict[str, Any]) -> tuple[list[str], str]:
    """Check the cluster's network and subnet; returns the keys it uses and its subnet's name."""
    network = _network_key(sb, cluster.get("network", "default"), project, "cluster.network")
    network_resource = sb.store.get(network)
    assert network_resource is not None
    subnet_name = cluster.get("subnetwork")
    if subnet_name:
        subnet = _subnet_key(sb, subnet_name, project, region=region, network_key=network, field="cluster.subnetwork")
        return [network, subnet], formats.key_name(subnet)
    if not network_resource.body.get("autoCreateSubnetworks"):
        raise invalid(f'Network "{formats.key_name(network)}" is a custom mode network: specify a subnetwork.')
    # An auto mode network has one subnet per region, named like the network.
    return [network], formats.key_name(network)


def _check_cluster(project: str, cluster: dict[str, Any]) -> None:
    check_labels(cluster.get("resourceLabels", {}), "cluster.resourceLabels")
    pool = cluster.get("workloadIdentityConfig", {}).get("workloadPool")
    if pool is not None and pool != f"{project}.svc.id.goog":
        raise invalid(f'Workload Identity pool "{pool}" must be "{project}.svc.id.goog".')
    network_config = cluster.get("networkConfig", {})
    if network_config.get("enableMultiNetworking") and network_config.get("datapathProvider") != "ADVANCED_DATAPATH":
        raise invalid("Multi-networking requires GKE Dataplane V2 (networkConfig.datapathProvider=ADVANCED_DATAPATH).")


def _initial_pools(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    """The cluster's node pools: ``nodePools``, or a default pool from the legacy ``initialNodeCount``."""
    pools = cluster.pop("nodePools", [])
    if pools and ("initialNodeCount" in cluster or "nodeConfig" in cluster):
        raise invalid("Cluster.initial_node_count and Cluster.node_config must not be set when node_pools is set.")
    if not pools:
        if int(cluster.get("initialNodeCount", 0)) <= 0:
            raise invalid("Cluster.initial_node_count must be greater than zero.")
        count, config = cluster.pop("initialNodeCount"), cluster.pop("nodeConfig", {})
        pools = [{"name": "default-pool", "initialNodeCount": count, "config": config}]
    names = [p.get("name") for p in pools]
    if len(set(names)) != len(names):
        raise invalid(f"Node pool names must be unique: {names}.")
    return pools


def default_version(sb: Sandbox) -> str:
    """GKE's default version here: the seed's ``gke_default_version``, else :data:`MASTER_VERSION`."""
    return sb.store.config.gke_default_version or MASTER_VERSION


def _cluster_version(cluster: dict[str, Any], default: str) -> str:
    """The version a new cluster gets: GKE's default, or the one it asks for (a prefix resolves to the newest)."""
    asked = cluster.get("initialClusterVersion") or ""
    if not asked or asked in ("latest", "-"):
        return default
    found = [v for v in VALID_VERSIONS if v == asked or v.startswith(asked + ".") or v.startswith(asked + "-")]
    if not found:
        raise invalid(f'Master version "{asked}" is unsupported.')
    return found[0]


def _fill_cluster(
    cluster: dict[str, Any], key: str, location: str, subnet_name: str, at: float, *, default: str
) -> None:
    """What GKE fills in: location, zones, versions, links, ids, ranges, the resolved network paths."""
    project, region = formats.key_project(key), _region_of(location)
    version = _cluster_version(cluster, default)
    zones = [location] if ZONE.match(location) else [f"{region}-{s}" for s in ZONE_SUFFIXES]
    cluster.update(
        location=location,
        zone=location,
        locations=cluster.get("locations") or zones,
        selfLink=formats.container_link(key),
        id=formats.numeric_id(key, str(at)) + "0" * 12,
        createTime=formats.zulu(at),
        initialClusterVersion=version,
        currentMasterVersion=version,
        currentNodeVersion=version,
        network=cluster.get("network", "default"),
        subnetwork=subnet_name,
        clusterIpv4Cidr="10.4.0.0/14",
        servicesIpv4Cidr="34.118.224.0/20",
        etag=formats.numeric_id(key, "etag")[:8],
    )
    network_config = cluster.setdefault("networkConfig", {})
    network_config["network"] = f"projects/{project}/global/networks/{formats.key_name(cluster['network'])}"
    network_config["subnetwork"] = f"projects/{project}/regions/{region}/subnetworks/{subnet_name}"


async def create_cluster(sb: Sandbox, call: Call) -> Reply:
    """``clusters.create``: the body is the whole CreateClusterRequest (parent repeated, as gcloud sends it)."""
    project, location = call.params["project"], _location(call)
    sb.store.config.remember_project(project)
    body = message_dict(parse_message(container_v1.CreateClusterRequest, call.json(), "request"))
    _check_parent(body, f"projects/{project}/locations/{location}")
    cluster = body.get("cluster")
    if not cluster:
        raise invalid("Cluster must be specified.")
    check_name(cluster.get("name", ""), GKE_NAME, "cluster.name")
    key = _cluster_key(project, location, cluster["name"])
    if sb.store.get(key) is not None:
        raise already_exists(f"Already exists: {key}.")
    _check_cluster(project, cluster)
    refs, subnet_name = _cluster_network(sb, project, _region_of(location), cluster)
    pools = _initial_pools(cluster)
    at = sb.now()
    _fill_cluster(cluster, key, location, subnet_name, at, default=default_version(sb))
    pool_resources = []
    for index, node_pool in enumerate(pools):
        field = f"cluster.nodePools[{index}]"
        pool_refs = _prepare_pool(sb, project, location, cluster=cluster, pool=node_pool, field=field)
        pool_resources.append(_pool_resource(key, node_pool, pool_refs, at))
    created = Resource("container.cluster", key, cluster, refs=refs, created=at, keep_on_error=True)
    sb.kube.tls(created)  # the cluster's CA exists from the create on, as GKE's
    sb.store.put(created)
    for resource in pool_resources:
        sb.store.put(resource)
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind="container.clusters.create",
        verb="create",
        project=project,
        location=location,
        target=key,
        effect=Effect(ready=[key, *(r.key for r in pool_resources)]),
        meta={"operationType": "CREATE_CLUSTER"},
    )
    return reply(render_operation(sb, operation))


async def get_cluster(sb: Sandbox, call: Call) -> Reply:
    """``clusters.get``."""
    return reply(render_cluster(sb, _cluster(sb, call)))


async def get_server_config(sb: Sandbox, call: Call) -> Reply:
    """``locations.getServerConfig``: the default version a cluster gets and the versions it may ask for (the
    fields the package reads; GKE also lists image types and release channels)."""
    _location(call)
    return reply(
        {
            "defaultClusterVersion": default_version(sb),
            "validMasterVersions": list(VALID_VERSIONS),
            "validNodeVersions": list(VALID_VERSIONS),
            "defaultImageType": "COS_CONTAINERD",
        }
    )


async def list_clusters(sb: Sandbox, call: Call) -> Reply:
    """``clusters.list`` (location ``-`` lists every location)."""
    location = call.params["location"]
    prefix = f"projects/{call.params['project']}/locations/" + ("" if location == "-" else f"{_location(call)}/")
    clusters = [render_cluster(sb, c) for c in sb.store.of_kind("container.cluster", prefix)]
    return reply({"clusters": clusters} if clusters else {})


async def delete_cluster(sb: Sandbox, call: Call) -> Reply:
    """``clusters.delete``: refused while an operation runs on the cluster or its pools; takes its pools along."""
    cluster = _cluster(sb, call)
    _incompatible(sb, cluster)
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind="container.clusters.delete",
        verb="delete",
        project=call.params["project"],
        location=call.params["location"],
        target=cluster.key,
        effect=Effect(remove=[cluster.key]),
        meta={"operationType": "DELETE_CLUSTER"},
    )
    return reply(render_operation(sb, operation))


async def create_node_pool(sb: Sandbox, call: Call) -> Reply:
    """``nodePools.create``: needs a RUNNING cluster with no other operation, valid networks and reservation."""
    cluster = _cluster(sb, call)
    project, location = call.params["project"], call.params["location"]
    body = message_dict(parse_message(container_v1.CreateNodePoolRequest, call.json(), "request"))
    _check_parent(body, cluster.key)
    pool = body.get("nodePool")
    if not pool:
        raise invalid("Node pool must be specified.")
    check_name(pool.get("name", ""), GKE_NAME, "nodePool.name")
    key = f"{cluster.key}/nodePools/{pool['name']}"
    if sb.store.get(key) is not None:
        raise already_exists(f"Already exists: {key}.")
    _incompatible(sb, cluster)
    if cluster.phase != "ready":
        raise failed_precondition(f"Cluster {cluster.name} is in status {CLUSTER_STATUS[cluster.phase]}, not RUNNING.")
    refs = _prepare_pool(sb, project, location, cluster=cluster.body, pool=pool, field="nodePool")
    at = sb.now()
    sb.store.put(_pool_resource(cluster.key, pool, refs, at))
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind="container.nodePools.create",
        verb="create",
        project=project,
        location=location,
        target=key,
        effect=Effect(ready=[key]),
        meta={"operationType": "CREATE_NODE_POOL"},
    )
    return reply(render_operation(sb, operation))


def _pool(sb: Sandbox, call: Call, cluster: Resource) -> Resource:
    key = f"{cluster.key}/nodePools/{call.params['pool']}"
    pool = sb.store.get(key)
    if pool is None:
        raise not_found(f"Not found: {key}.")
    return pool


async def get_node_pool(sb: Sandbox, call: Call) -> Reply:
    """``nodePools.get``."""
    cluster = _cluster(sb, call)
    return reply(render_pool(sb, _pool(sb, call, cluster)))


async def list_node_pools(sb: Sandbox, call: Call) -> Reply:
    """``nodePools.list``."""
    cluster = _cluster(sb, call)
    pools = [render_pool(sb, p) for p in sb.store.of_kind("container.nodePool", cluster.key + "/")]
    return reply({"nodePools": pools} if pools else {})


async def delete_node_pool(sb: Sandbox, call: Call) -> Reply:
    """``nodePools.delete``: refused while another operation runs on the cluster."""
    cluster = _cluster(sb, call)
    pool = _pool(sb, call, cluster)
    _incompatible(sb, cluster)
    pool = _pool(sb, call, cluster)
    # Its nodes go with it (drained first on GKE), and so does a flex-start request still queued for it.
    sb.kuberay.capacity.forget_pool(pool.key)
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind="container.nodePools.delete",
        verb="delete",
        project=call.params["project"],
        location=call.params["location"],
        target=pool.key,
        effect=Effect(remove=[pool.key]),
        meta={"operationType": "DELETE_NODE_POOL"},
    )
    return reply(render_operation(sb, operation))


async def set_node_pool_size(sb: Sandbox, call: Call) -> Reply:
    """``nodePools.setSize``: the pool's node count now (autoscaling may change it later; nothing here does)."""
    cluster = _cluster(sb, call)
    pool = _pool(sb, call, cluster)
    body = message_dict(parse_message(container_v1.SetNodePoolSizeRequest, call.json(), "request"))
    count = int(body.get("nodeCount", 0))
    if count < 0:
        raise invalid("nodeCount must not be negative.")
    _incompatible(sb, cluster)
    if pool.phase != "ready":
        raise failed_precondition(f"Node pool {pool.name} is not RUNNING.")
    pool.extra["nodeCount"] = count
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind="container.nodePools.setSize",
        verb="update",
        project=call.params["project"],
        location=call.params["location"],
        target=pool.key,
        effect=Effect(),
        meta={"operationType": "SET_NODE_POOL_SIZE"},
    )
    return reply(render_operation(sb, operation))


def register(router: Router) -> None:
    """Add the container routes (operations are served with Lustre's, by :mod:`sandbox.apis.locations`)."""
    clusters = PREFIX + "/clusters"
    router.add("GET", PREFIX + "/serverConfig", SERVICE, get_server_config)
    router.add("POST", clusters, SERVICE, create_cluster)
    router.add("GET", clusters, SERVICE, list_clusters)
    router.add("GET", clusters + "/{cluster}", SERVICE, get_cluster)
    router.add("DELETE", clusters + "/{cluster}", SERVICE, delete_cluster)
    pools = clusters + "/{cluster}/nodePools"
    router.add("POST", pools, SERVICE, create_node_pool)
    router.add("GET", pools, SERVICE, list_node_pools)
    router.add("GET", pools + "/{pool}", SERVICE, get_node_pool)
    router.add("DELETE", pools + "/{pool}", SERVICE, delete_node_pool)
    router.add("POST", pools + "/{pool}:setSize", SERVICE, set_node_pool_size)
