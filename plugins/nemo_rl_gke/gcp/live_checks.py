"""Live preflight (``preflight_live``): what only the project itself can tell, checked before anything is created.

Every check reads; none creates. All findings come back at once (DESIGN rule 5), each naming the parameter, the
value, the rule and the fix:

- ``live.reservation`` / ``live.reservation-machine-type`` / ``live.reservation-capacity``: the reservation exists in
  ``spec.zone``, holds ``spec.effective_machine_type`` machines, and has at least ``spec.worker_replicas`` of them
  free (``count - inUseCount``). The run needs one GPU node per Ray worker; ``gpu_pool_max_nodes`` is only the
  autoscaler's ceiling (offline preflight already checks it is >= worker_replicas), and a pool that cannot grow to
  its ceiling still runs the job, so the worker count is the honest minimum.
- ``live.network-profile``: ``{zone}-vpc-roce`` exists (only A3 Ultra / A4 zones have it; the RDMA network needs it).
- ``live.api-enabled``: every API the run calls is enabled (Service Usage ``services.batchGet``). When Service Usage
  itself cannot be read (403), that is logged and not reported: the create calls would say so precisely anyway.
- ``live.gpu-quota``: best effort. A regional GPU quota limit below the run's GPU count is reported; a quota the API
  does not show (or a region read that fails) is "unknown", logged, and not a finding. Usage is not compared: the
  reservation already holds its share of the quota, so usage near the limit is expected.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from nemo_rl_gke.findings import Finding
from nemo_rl_gke.gcp.hooks import http_status, is_not_found
from nemo_rl_gke.gcp.resources.drift import message_dict, normalize_ref

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook
    from nemo_rl_gke.spec import RunSpec

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


def live_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """Every live problem of the run's project, zone and reservation, all at once; ``[]`` when the run can start."""
    return [
        *reservation_findings(spec, hook),
        *network_profile_findings(spec, hook),
        *api_findings(spec, hook),
        *gpu_quota_findings(spec, hook),
    ]


def _reservation_command(spec: RunSpec) -> str:
    return (
        f"gcloud compute reservations create {spec.reservation} --project={spec.project} --zone={spec.zone} "
        f"--machine-type={spec.effective_machine_type} --vm-count={spec.worker_replicas} "
        "--require-specific-reservation"
    )


def reservation_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """The reservation exists in the zone, holds the pool's machine type and has enough free machines."""
    try:
        found = hook.call(
            hook.reservations_client.get,
            project=spec.project,
            zone=spec.zone,
            reservation=spec.reservation,
            what=f"get reservation {spec.reservation}",
        )
    except Exception as exc:
        if not is_not_found(exc):
            raise
        return [
            Finding(
                "live.reservation",
                ("reservation", "zone"),
                spec.reservation,
                f"reservation {spec.reservation} does not exist in zone {spec.zone} of project {spec.project}; "
                "the GPU pool consumes only that reservation",
                f"create it ({_reservation_command(spec)}) or name an existing reservation of zone {spec.zone}",
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
    if free < spec.worker_replicas:
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


def _quota_metrics(accelerator_type: str) -> tuple[str, ...]:
    # nvidia-b200 -> NVIDIA_B200_GPUS; nvidia-h200-141gb -> NVIDIA_H200_141GB_GPUS or NVIDIA_H200_GPUS (the memory
    # suffix is dropped in some quota names, as for NVIDIA_H100_GPUS).
    parts = accelerator_type.upper().split("-")
    full = "_".join(parts) + "_GPUS"
    short = "_".join(parts[:2]) + "_GPUS"
    return (full, short) if full != short else (full,)


def gpu_quota_findings(spec: RunSpec, hook: GcpHook) -> list[Finding]:
    """Best effort: the region's GPU quota limit is at least the run's GPUs; unknown is logged, not reported."""
    needed = spec.worker_replicas * spec.gpus_per_node
    metrics = _quota_metrics(spec.gpu.accelerator_type)
    try:
        region = hook.call(
            hook.regions_client.get, project=spec.project, region=spec.region, what=f"get region {spec.region}"
        )
    except Exception as exc:
        log.info("GPU quota unknown (region %s could not be read: %s); not checked", spec.region, exc)
        return []
    quotas: list[dict[str, Any]] = message_dict(region).get("quotas") or []
    quota = next((q for q in quotas if q.get("metric") in metrics), None)
    if quota is None:
        log.info("GPU quota unknown: region %s shows none of %s; not checked", spec.region, ", ".join(metrics))
        return []
    limit = float(quota.get("limit") or 0)
    if limit >= needed:
        return []
    return [
        Finding(
            "live.gpu-quota",
            ("worker_replicas", "region"),
            {"metric": quota["metric"], "limit": limit, "needed": needed},
            f"the {quota['metric']} quota of region {spec.region} is {limit:g}, below the run's {needed} GPUs "
            f"({spec.worker_replicas} nodes x {spec.gpus_per_node})",
            f"request a quota increase for {quota['metric']} in {spec.region}, or lower worker_replicas",
        )
    ]
