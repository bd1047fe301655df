"""Live preflight (``preflight_live``): what only the project itself can tell, checked before anything is created.

Every check reads; none creates. All findings come back at once (DESIGN rule 5), each naming the parameter, the
value, the rule and the fix:

- ``live.iam``: the connection's identity holds every permission of ``include/iam/nemo-rl-gke-role.yaml`` (one
  ``projects.testIamPermissions`` call); each missing one is named with a predefined role that grants it.
- ``live.reservation`` / ``live.reservation-machine-type`` / ``live.reservation-capacity``: the reservation exists in
  ``spec.zone`` of its owner project (the run's, or a shared reservation's ``projects/OWNER``), holds
  ``spec.effective_machine_type`` machines, and has at least ``spec.worker_replicas`` of them free
  (``count - inUseCount``). The run needs one GPU node per Ray worker; ``gpu_pool_max_nodes`` is only the
  autoscaler's ceiling, so the worker count is the honest minimum. A reservation block is checked through its
  reservation.
- ``live.network-profile``: ``{zone}-vpc-roce`` exists (only A3 Ultra / A4 zones have it; the RDMA network needs it).
- ``live.api-enabled``: every API the run calls is enabled (Service Usage ``services.batchGet``). When Service Usage
  itself cannot be read (403), that is logged and not reported: the create calls would say so precisely anyway.
- ``live.export-bucket`` / ``live.export-bucket-access``: the export bucket exists (Storage ``buckets.get``) and
  the Lustre service agent holds a role that writes objects on it (``buckets.getIamPolicy``), or exportData fails
  after the GPU-hours are spent.
- ``live.cpu-quota``: the region's CPU quota of the default pool's machine family (``N2_CPUS`` for n2-*, from
  ``regions.get``) has room for the nodes the cluster create makes at once (initial nodes per zone x zones x vCPUs).
- ``live.gpu-quota``: the region's ``compute.googleapis.com/gpus_per_gpu_family`` limit for the GPU family
  (``NVIDIA_B200``, ``NVIDIA_H200``; Service Usage v1beta1 ``consumerQuotaMetrics``) is at least the run's GPUs.
  ``regions.get`` does not list B200 or H200 quotas, which is why reading it always ended "unknown". A quota that is
  not listed for the region is reported as such. Usage is not compared: the reservation already holds its share.
  A shared reservation's quota is its owner's, so it is not checked here. Spot and flex-start count against
  ``preemptible_gpus_per_gpu_family``; each rung of a capacity ladder is checked against its own metric.
- ``live.gke-version``: ``gke_version`` is offered in the region (``getServerConfig``), and with flex-start on the
  ladder the version the cluster gets (GKE's default when ``gke_version`` is empty) has flex-start GPU pools.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.gcp.hooks import http_status, is_not_found
from nemo_rl_gke.gcp.iam import granting_role, missing_permissions, role_permissions
from nemo_rl_gke.gcp.resources.drift import message_dict, normalize_ref
from nemo_rl_gke.run import capacity
from nemo_rl_gke.run.conf_schema import FLEX_KINDS, FLEX_START_MIN_GKE, RESERVATION_CAPACITY, SPOT, version_parts
from nemo_rl_gke.run.findings import Finding

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.run.spec import RunSpec

log = logging.getLogger(__name__)

# Every API a run calls: the tutorial enables the first three; Lustre, its peering and the project-number lookup are
# called by the storage chain; Cloud Storage receives the checkpoint export.
REQUIRED_SERVICES: tuple[str, ...] = (
    "compute.googleapis.com",
    "container.googleapis.com",
    "storage.googleapis.com",
    "lustre.googleapis.com",
    "servicenetworking.googleapis.com",
    "cloudresourcemanager.googleapis.com",
)
# Bucket roles that let the Lustre service agent write objects (exportData), and the one a finding grants.
WRITER_ROLES = frozenset(
    {
        "roles/storage.objectUser",
        "roles/storage.objectCreator",
        "roles/storage.objectAdmin",
        "roles/storage.admin",
        "roles/storage.legacyBucketWriter",
        "roles/storage.legacyBucketOwner",
    }
)
EXPORT_ROLE = "roles/storage.objectUser"
GPU_FAMILY_METRIC = "compute.googleapis.com/gpus_per_gpu_family"
# Spot and flex-start VMs count against this one instead (Compute Engine: GPU quota, preemptible quota).
PREEMPTIBLE_GPU_FAMILY_METRIC = "compute.googleapis.com/preemptible_gpus_per_gpu_family"
# A regional cluster's default pool gets its node count in each of this many zones of the region (GKE's default).
REGIONAL_CLUSTER_ZONES = 3


def live_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """Every live problem of the run's project, zone and reservation, all at once; ``[]`` when the run can start."""
    iam = iam_findings(spec, hook)
    findings = list(iam)
    checks = (
        reservation_findings,
        network_profile_findings,
        api_findings,
        bucket_findings,
        cpu_quota_findings,
        gpu_quota_findings,
        gke_version_findings,
    )
    for check in checks:
        try:
            findings += check(spec, hook)
        except Exception as exc:
            # A read refused for a permission live.iam already names: that finding says it, the others still run.
            if http_status(exc) != 403 or not iam:
                raise
            log.warning("%s not checked: %s", check.__name__, exc)
    return findings


def iam_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """The identity holds every permission the run uses; one finding per missing permission, with a granting role."""
    try:
        missing = missing_permissions(hook, spec.project, role_permissions())
    except Exception as exc:
        if http_status(exc) == 403:
            # Resource Manager disabled: api_findings names it; testIamPermissions itself needs no permission.
            log.warning("Cannot test IAM permissions on %s (%s); not checked", spec.project, exc)
            return []
        raise
    return [
        Finding(
            "live.iam",
            ("project",),
            permission,
            f"the Google connection's identity lacks {permission} on project {spec.project}, which the run uses",
            f"grant {granting_role(permission)} (gcloud projects add-iam-policy-binding {spec.project} "
            f"--member=MEMBER --role={granting_role(permission)}), or the custom role of "
            "include/iam/nemo-rl-gke-role.yaml, which has every permission the run uses (README: IAM roles)",
        )
        for permission in missing
    ]


def _reservation_command(spec: RunSpec) -> str:
    return (
        f"gcloud compute reservations create {spec.reservation_name} --project={spec.reservation_project} "
        f"--zone={spec.zone} --machine-type={spec.effective_machine_type} --vm-count={spec.worker_replicas} "
        "--require-specific-reservation"
    )


def reservation_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """The reservation exists in the zone of its owner project, holds the pool's machine type and has room.

    A shared reservation (``projects/OWNER/reservations/NAME``) is read in OWNER; a block
    (``.../reservationBlocks/BLOCK``) through its reservation. A run whose nodes come from elsewhere (``capacity``
    other than reservation) uses no reservation: nothing to check.
    """
    if spec.capacity != RESERVATION_CAPACITY:
        return []
    owner = spec.reservation_project
    try:
        found = hook.call(
            hook.reservations_client.get,
            project=owner,
            zone=spec.zone,
            reservation=spec.reservation_name,
            what=f"get reservation {spec.reservation}",
        )
    except Exception as exc:
        if http_status(exc) == 403 and owner != spec.project:
            # A consumer of a shared reservation need not be able to read it in its owner's project.
            log.warning(
                "Cannot read shared reservation %s in project %s (%s); not checked", spec.reservation, owner, exc
            )
            return []
        if not is_not_found(exc):
            raise
        shared = "" if owner == spec.project else f" (a reservation shared by project {owner})"
        return [
            Finding(
                "live.reservation",
                ("reservation", "zone"),
                spec.reservation,
                f"reservation {spec.reservation_name} does not exist in zone {spec.zone} of project {owner}"
                f"{shared}; the GPU pool consumes only that reservation",
                f"create it ({_reservation_command(spec)}), share it with project {spec.project}, or name an "
                f"existing reservation of zone {spec.zone}",
            )
        ]
    reservation = message_dict(found)
    specific = reservation.get("specificReservation") or {}
    findings: list[Finding] = []
    machine_type = normalize_ref(str((specific.get("instanceProperties") or {}).get("machineType", ""))).rsplit("/")[-1]
    if machine_type != spec.effective_machine_type:
        findings.append(
            Finding(
                "live.reservation-machine-type",
                ("reservation", "gpu_type", "machine_type"),
                machine_type or None,
                f"reservation {spec.reservation} holds {machine_type or 'no specific'} machines, but the GPU pool "
                f"needs {spec.effective_machine_type} (gpu_type={spec.gpu_type})",
                f"name a reservation of {spec.effective_machine_type} machines in {spec.zone}, or set gpu_type to "
                "the reservation's GPU",
            )
        )
    count = int(specific.get("count") or 0)
    in_use = int(specific.get("inUseCount") or 0)
    free = count - in_use
    rungs = capacity.options(spec)
    if free < spec.worker_replicas and len(rungs) > 1:
        # Busy now is what a ladder is for: the run tries the reservation and falls to the next rung if it stays so.
        log.warning(
            "reservation %s has %s free machine(s) of the %s workers need: unless they free up, the run falls to %s",
            spec.reservation, free, spec.worker_replicas, rungs[1],
        )  # fmt: skip
    elif free < spec.worker_replicas:
        findings.append(
            Finding(
                "live.reservation-capacity",
                ("reservation", "worker_replicas"),
                {"count": count, "in_use": in_use, "free": free},
                f"reservation {spec.reservation} has {free} free machine(s) ({count} reserved, {in_use} in use); "
                f"the run needs {spec.worker_replicas} (worker_replicas, one GPU node per Ray worker)",
                f"lower worker_replicas to {max(free, 1)} or less, free machines in the reservation, or grow it "
                f"(gcloud compute reservations update {spec.reservation} --zone={spec.zone} "
                f"--vm-count={in_use + spec.worker_replicas})",
            )
        )
    elif free < spec.gpu_pool_max_nodes:
        log.info(
            "reservation %s has %s free machines: enough for %s workers, fewer than gpu_pool_max_nodes=%s",
            spec.reservation,
            free,
            spec.worker_replicas,
            spec.gpu_pool_max_nodes,
        )
    return findings


def network_profile_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """The zone's RoCE network profile exists (the RDMA network cannot be created without it)."""
    try:
        hook.call(
            hook.network_profiles_client.get,
            project=spec.project,
            network_profile=spec.network_profile,
            what=f"get network profile {spec.network_profile}",
        )
    except Exception as exc:
        if not is_not_found(exc):
            raise
        return [
            Finding(
                "live.network-profile",
                ("zone",),
                spec.zone,
                f"network profile {spec.network_profile} does not exist: zone {spec.zone} offers no RDMA (RoCE) "
                "networking, which only A3 Ultra and A4 zones have",
                "pick a zone that has it (gcloud compute network-profiles list --filter='name~vpc-roce') and a "
                "reservation in that zone",
            )
        ]
    return []


def api_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """Every API the run calls is enabled in the project (one ``services.batchGet``; one finding per disabled API)."""
    parent = f"projects/{spec.project}"
    request = hook.serviceusage.services().batchGet(
        parent=parent, names=[f"{parent}/services/{service}" for service in REQUIRED_SERVICES]
    )
    try:
        answer = hook.execute(request, what=f"services.batchGet {spec.project}")
    except Exception as exc:
        if http_status(exc) == 403:
            # Service Usage disabled, or no serviceusage.services.get permission: we cannot tell; the creates can.
            log.warning("Cannot read Service Usage for %s (%s); enabled APIs not checked", spec.project, exc)
            return []
        raise
    # Answers name the project by number (projects/123/services/x): match on the service name alone.
    states = {str(s.get("name", "")).rsplit("/", 1)[-1]: s.get("state", "") for s in answer.get("services") or []}
    findings: list[Finding] = []
    for service in REQUIRED_SERVICES:
        state = states.get(service, "")
        if state != "ENABLED":
            findings.append(
                Finding(
                    "live.api-enabled",
                    ("project",),
                    spec.project,
                    f"the {service} API is not enabled in project {spec.project} (state {state or 'unknown'})",
                    f"gcloud services enable {service} --project={spec.project}",
                )
            )
    return findings


def _lustre_agent(number: str) -> str:
    return f"serviceAccount:service-{number}@gcp-sa-lustre.iam.gserviceaccount.com"


def bucket_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """The export bucket exists and Managed Lustre's service agent may write objects to it (exportData runs as it)."""
    bucket = spec.export_bucket_name
    buckets = hook.storage.buckets()
    number = hook.project_number(spec.project)
    agent = _lustre_agent(number)
    grant = f"gcloud storage buckets add-iam-policy-binding gs://{bucket} --member {agent} --role {EXPORT_ROLE}"
    try:
        hook.execute(buckets.get(bucket=bucket), what=f"buckets.get {bucket}")
    except Exception as exc:
        if not is_not_found(exc):
            raise
        return [
            Finding(
                "live.export-bucket",
                ("export_bucket", "project"),
                bucket,
                f"the export bucket gs://{bucket} does not exist; the checkpoint export would fail after training",
                f"create it (gcloud storage buckets create gs://{bucket} --project={spec.project} "
                f"--location={spec.region} --uniform-bucket-level-access), then {grant}; or set export_bucket",
            )
        ]
    policy = hook.execute(buckets.getIamPolicy(bucket=bucket), what=f"buckets.getIamPolicy {bucket}")
    roles = {b.get("role") for b in policy.get("bindings") or [] if agent in (b.get("members") or [])}
    if roles & WRITER_ROLES:
        return []
    return [
        Finding(
            "live.export-bucket-access",
            ("export_bucket",),
            bucket,
            f"Managed Lustre's service agent ({agent.split(':', 1)[1]}) holds no role that writes objects in "
            f"gs://{bucket} (it has {', '.join(sorted(r for r in roles if r)) or 'none'}); exportData runs as it",
            grant,
        )
    ]


def _machine_vcpus(machine_type: str) -> int | None:
    # n2-highmem-80 -> 80, n2-custom-8-16384 -> 8; None for a shape the name does not give (e.g. e2-medium).
    parts = machine_type.split("-")
    if len(parts) >= 3 and parts[1] == "custom" and parts[2].isdigit():
        return int(parts[2])
    return int(parts[-1]) if parts[-1].isdigit() else None


def _region(spec: RunSpec, hook: GcpHook) -> dict[str, Any] | None:
    try:
        found = hook.call(
            hook.regions_client.get, project=spec.project, region=spec.region, what=f"get region {spec.region}"
        )
    except Exception as exc:
        if http_status(exc) in {403, 404}:
            log.warning("Region %s cannot be read (%s); CPU quota not checked", spec.region, exc)
            return None
        raise
    return message_dict(found)


def cpu_quota_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """The region's CPU quota of the default pool's family has room for the nodes the cluster create makes at once."""
    vcpus = _machine_vcpus(spec.system_machine_type)
    region = _region(spec, hook)
    if vcpus is None or region is None:
        return []
    zones = min(REGIONAL_CLUSTER_ZONES, len(region.get("zones") or []) or REGIONAL_CLUSTER_ZONES)
    nodes = spec.system_initial_nodes * zones
    needed = nodes * vcpus
    family = spec.system_machine_type.split("-", 1)[0].upper()
    quotas = {str(q.get("metric")): q for q in region.get("quotas") or []}
    # A family with its own quota (N2_CPUS, N2D_CPUS, C3_CPUS...) counts there; N1 and E2 count in CPUS.
    metric = f"{family}_CPUS" if f"{family}_CPUS" in quotas else "CPUS"
    quota = quotas.get(metric)
    counted = (
        f"{nodes} nodes x {vcpus} vCPUs: system_initial_nodes={spec.system_initial_nodes} in each of {zones} zones"
    )
    if quota is None:
        return [
            Finding(
                "live.cpu-quota",
                ("system_machine_type", "region"),
                spec.system_machine_type,
                f"region {spec.region} lists no {metric} quota (regions.get), so the project cannot create "
                f"{spec.system_machine_type} nodes there; the default pool needs {needed} vCPUs ({counted})",
                f"request {metric} quota in {spec.region} (console: IAM & Admin > Quotas), or pick another "
                "system_machine_type",
            )
        ]
    free = float(quota.get("limit") or 0) - float(quota.get("usage") or 0)
    if free >= needed:
        return []
    return [
        Finding(
            "live.cpu-quota",
            ("system_initial_nodes", "system_machine_type", "region"),
            {"metric": metric, "free": free, "needed": needed},
            f"the {metric} quota of region {spec.region} has {free:g} vCPUs free, below the {needed} the default "
            f"pool needs ({counted})",
            f"request a {metric} increase in {spec.region} to at least {float(quota.get('usage') or 0) + needed:g}, "
            "or lower system_initial_nodes or pick a smaller system_machine_type",
        )
    ]


def gpu_family(accelerator_type: str) -> str:
    """The ``gpu_family`` quota dimension of an accelerator: nvidia-b200 -> NVIDIA_B200, nvidia-h200-141gb ->
    NVIDIA_H200 (the memory suffix is not part of the family)."""
    return "_".join(accelerator_type.upper().split("-")[:2])


def _bucket_limit(metric: dict[str, Any], region: str, family: str) -> float | None:
    # Buckets go from least to most specific; the most specific one whose dimensions all match is enforced.
    best: tuple[int, float] | None = None
    for limit in metric.get("consumerQuotaLimits") or []:
        for bucket in limit.get("quotaBuckets") or []:
            dims = bucket.get("dimensions") or {}
            wanted = {"region": region, "gpu_family": family}
            if any(wanted.get(k) != v for k, v in dims.items()):
                continue
            value = float(bucket.get("effectiveLimit", 0))
            if best is None or len(dims) >= best[0]:
                best = (len(dims), value)
    return None if best is None else best[1]


def gpu_quota_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """The region's GPU quota for the GPU family covers the run's GPUs on every rung of its capacity ladder
    (Service Usage ``consumerQuotaMetrics``): the preemptible metric for Spot and flex-start, the on-demand one for
    on-demand and for a reservation of this project's."""
    by_metric: dict[str, list[str]] = {}
    for option in capacity.options(spec):
        if option == RESERVATION_CAPACITY and spec.reservation_project != spec.project:
            # A shared reservation's machines count against its owner's quota, which this project cannot read.
            log.info("GPU quota not checked: reservation %s is shared by project %s", spec.reservation, spec.project)
            continue
        metric = PREEMPTIBLE_GPU_FAMILY_METRIC if option in (SPOT, *FLEX_KINDS) else GPU_FAMILY_METRIC
        by_metric.setdefault(metric, []).append(option)
    return [finding for metric, rungs in by_metric.items() for finding in _gpu_quota_finding(spec, hook, metric, rungs)]


def _gpu_quota_finding(spec: RunSpec, hook: GcpHook, quota_metric: str, rungs: list[str]) -> list[Finding]:
    needed = spec.worker_replicas * spec.gpus_per_node
    family = gpu_family(spec.gpu.accelerator_type)
    preemptible = quota_metric == PREEMPTIBLE_GPU_FAMILY_METRIC
    name = f"projects/{spec.project}/services/compute.googleapis.com/consumerQuotaMetrics/" + quota_metric.replace(
        "/", "%2F"
    )
    request = hook.serviceusage_beta.services().consumerQuotaMetrics().get(name=name, view="FULL")
    on = "capacity=" + " and ".join(rungs)
    # The alternatives that need no more of this quota: another option (or fewer rungs), then the quota request.
    others = [f"take {' and '.join(rungs)} off capacity_ladder"] if spec.capacity_ladder else []
    if preemptible and not spec.capacity_ladder:
        others.append(f"use capacity=on_demand ({on} counts against preemptible quota)")
    where = f"{quota_metric} quota for gpu_family={family} in {spec.region} (console: IAM & Admin > Quotas)"
    instead = "".join(f", {other}" for other in others)
    params: tuple[str, ...] = ("capacity", "capacity_ladder") if spec.capacity_ladder else ("capacity",)
    try:
        metric = hook.execute(request, what=f"consumerQuotaMetrics.get {quota_metric}")
    except Exception as exc:
        if http_status(exc) == 403:
            log.warning("Cannot read the GPU quota of %s (%s): live.iam names the permission", spec.project, exc)
            return []
        if not is_not_found(exc):
            raise
        metric = {}
    limit = _bucket_limit(metric, spec.region, family)
    if limit is None:
        return [
            Finding(
                "live.gpu-quota",
                ("gpu_type", "region", *params) if preemptible or spec.capacity_ladder else ("gpu_type", "region"),
                {"gpu_family": family, "region": spec.region},
                f"project {spec.project} has no {family} GPU quota listed in region {spec.region} "
                f"({quota_metric}, for {on}); the run needs {needed} GPUs",
                f"request {where}{instead}, or pick a region where the project has {family} quota",
            )
        ]
    if limit >= needed:
        return []
    return [
        Finding(
            "live.gpu-quota",
            ("worker_replicas", "region", *params)
            if preemptible or spec.capacity_ladder
            else ("worker_replicas", "region"),
            {"gpu_family": family, "limit": limit, "needed": needed},
            f"the {family} GPU quota ({quota_metric}, for {on}) of region {spec.region} is {limit:g}, below the "
            f"run's {needed} GPUs ({spec.worker_replicas} nodes x {spec.gpus_per_node})",
            f"request at least {needed} of {where}{instead}, or lower worker_replicas",
        )
    ]


def gke_version_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """The cluster's GKE version is one GKE offers in the cluster's location, and a flex-start rung has a version
    that supports flex-start GPU pools: with ``gke_version`` empty, that is GKE's default there, which only
    ``getServerConfig`` tells (the offline rule judges a version the conf names)."""
    from google.cloud import container_v1

    flex = capacity.may_use_flex_start(spec)
    if not flex and not spec.gke_version:
        return []
    request = container_v1.GetServerConfigRequest(name=spec.cluster_parent)
    config = hook.call(hook.container_client.get_server_config, request=request, what="getServerConfig")
    offered = list(config.valid_master_versions)
    if spec.gke_version:
        # GKE resolves a prefix (1.32) to its newest patch; an exact version must be offered.
        found = [
            v
            for v in offered
            if v == spec.gke_version or v.startswith((spec.gke_version + ".", spec.gke_version + "-"))
        ]
        if not found:
            return [
                Finding(
                    "live.gke-version",
                    ("gke_version",),
                    spec.gke_version,
                    f"GKE does not offer {spec.gke_version} in {spec.region}: the cluster create would be "
                    f"refused after the networks exist (offered: {', '.join(offered[:6]) or 'none'})",
                    "set gke_version to an offered version or its minor (gcloud container get-server-config "
                    f"--location={spec.region}), or leave it empty for GKE's default",
                )
            ]
        version = found[0]
    else:
        version = config.default_cluster_version
    needed = version_parts(FLEX_START_MIN_GKE)
    if not flex or version_parts(version) >= needed:
        return []
    newer = [v for v in offered if version_parts(v) >= needed]
    where = (
        f"gke_version={spec.gke_version} resolves to {version}"
        if spec.gke_version
        else (f"GKE's default version in {spec.region} is {version} (gke_version is empty)")
    )
    return [
        Finding(
            "live.gke-version",
            ("gke_version", "capacity_ladder" if spec.capacity_ladder else "capacity"),
            version,
            f"{where}, which has no flex-start node pools for GPUs (they need {FLEX_START_MIN_GKE}): the flex-start "
            "rung's pool would be refused",
            f"set gke_version to {newer[0] if newer else FLEX_START_MIN_GKE} or later, or take flex_start off "
            "capacity and capacity_ladder",
        )
    ]
