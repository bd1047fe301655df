"""Cloud Resource Manager v1 ``projects.get`` and ``projects.testIamPermissions``, and Service Usage: v1 (is an
API enabled?) and v1beta1 ``consumerQuotaMetrics.get`` (the GPU quota per GPU family).

Every syntactically valid project ID exists in the sandbox; its number is derived from the ID, so it is stable
across restarts. Services are ENABLED when they are in the seeded list (:mod:`sandbox.config`).
``testIamPermissions`` answers the subset of the asked permissions the project grants (``Config.granted``); it needs
no permission itself, refuses wildcards, and omits ``permissions`` when none is granted, as Google does.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from sandbox import formats
from sandbox.errors import ApiError, invalid, not_found
from sandbox.http import Call, Reply, Router, reply
from sandbox.iam import require_service
from sandbox.validation import PROJECT_ID

if TYPE_CHECKING:
    from sandbox.context import Sandbox

MAX_BATCH = 30
# At most this many permissions per testIamPermissions request (not verified against Google; see docs/fidelity.md).
MAX_PERMISSIONS = 100
PERMISSION = re.compile(r"^[a-z][a-zA-Z0-9]*(\.[a-zA-Z][a-zA-Z0-9]*){2}$")
GPU_FAMILY_METRIC = "compute.googleapis.com/gpus_per_gpu_family"
# Spot and flex-start VMs count against the preemptible GPU quota, not the on-demand one.
PREEMPTIBLE_GPU_FAMILY_METRIC = "compute.googleapis.com/preemptible_gpus_per_gpu_family"


def _project(sb: Sandbox, value: str) -> str:
    """The project ID of a project ID or number (403 for a number the sandbox has never seen, as for no access)."""
    if value.isdigit():
        by_number = {formats.project_number(p): p for p in sb.store.config.known_projects}
        if value not in by_number:
            raise ApiError("PERMISSION_DENIED", f"The caller does not have permission on project {value}.")
        return by_number[value]
    if not PROJECT_ID.match(value):
        raise invalid(f'Project id "{value}" is not valid: 6-30 lowercase letters, digits or hyphens.')
    sb.store.config.remember_project(value)
    return value


async def get_project(sb: Sandbox, call: Call) -> Reply:
    """``cloudresourcemanager.projects.get`` (v1)."""
    project = _project(sb, call.params["project"])
    return reply(
        {
            "projectNumber": formats.project_number(project),
            "projectId": project,
            "lifecycleState": "ACTIVE",
            "name": project,
            "createTime": formats.zulu(sb.started),
        }
    )


async def test_iam_permissions(sb: Sandbox, call: Call) -> Reply:
    """``cloudresourcemanager.projects.testIamPermissions`` (v1): the granted subset of the asked permissions."""
    project = _project(sb, call.params["project"])
    asked = call.json().get("permissions", [])
    if not isinstance(asked, list) or not all(isinstance(p, str) for p in asked):
        raise invalid("permissions must be a list of strings.")
    if len(asked) > MAX_PERMISSIONS:
        raise invalid(f"The number of permissions in the request ({len(asked)}) exceeds the limit {MAX_PERMISSIONS}.")
    for permission in asked:
        if "*" in permission:
            raise invalid(f"Permissions with wildcards (such as * or storage.*) are not allowed: {permission}.")
        if not PERMISSION.match(permission):
            raise invalid(f"Permission {permission} is not valid.")
    granted = sb.store.config.granted(project)
    held = [p for p in asked if p in granted]
    return reply({"permissions": held} if held else {})


def _quota_bucket(family: str, region: str, limit: float) -> dict[str, Any]:
    value = str(int(limit))
    return {
        "effectiveLimit": value,
        "defaultLimit": value,
        "dimensions": {"region": region, "gpu_family": family},
    }


async def get_consumer_quota_metric(sb: Sandbox, call: Call) -> Reply:
    """``serviceusage.services.consumerQuotaMetrics.get`` (v1beta1) of compute's GPU-family metrics (on-demand and
    preemptible).

    Its limit ``1/{project}/{region}`` has one bucket per region and GPU family; the sandbox lists the seeded families
    in every region whose zones it knows (the RoCE zones' regions), which is where the GPU machines are.
    """
    project = _project(sb, call.params["project"])
    metric = f"{call.params['metric_service']}/{call.params['metric']}"
    quotas = {
        GPU_FAMILY_METRIC: sb.store.config.gpu_family_quotas,
        PREEMPTIBLE_GPU_FAMILY_METRIC: sb.store.config.preemptible_gpu_family_quotas,
    }
    if call.params["service"] != "compute.googleapis.com" or metric not in quotas:
        raise not_found(f"Metric {metric} of service {call.params['service']} was not found.")
    require_service(sb, project, "serviceusage.quotas.get", f"projects/{project}")
    number = formats.project_number(project)
    regions = sorted({zone.rsplit("-", 1)[0] for zone in sb.store.config.roce_zones})
    buckets = [
        _quota_bucket(family, region, limit) for region in regions for family, limit in sorted(quotas[metric].items())
    ]
    encoded = metric.replace("/", "%2F")
    return reply(
        {
            "name": f"projects/{number}/services/compute.googleapis.com/consumerQuotaMetrics/{encoded}",
            "displayName": "GPUs per GPU family" if metric == GPU_FAMILY_METRIC else "Preemptible GPUs per GPU family",
            "metric": metric,
            "unit": "1/{project}/{region}/{gpu_family}",
            "consumerQuotaLimits": [
                {
                    "name": f"projects/{number}/services/compute.googleapis.com/consumerQuotaMetrics/{encoded}"
                    "/limits/%2Fproject%2Fregion%2Fgpu_family",
                    "unit": "1/{project}/{region}/{gpu_family}",
                    "metric": metric,
                    "isPrecise": True,
                    "quotaBuckets": buckets,
                }
            ],
        }
    )


def _service(sb: Sandbox, project: str, name: str) -> dict[str, Any]:
    number = formats.project_number(project)
    return {
        "name": f"projects/{number}/services/{name}",
        "parent": f"projects/{number}",
        "config": {"name": name, "title": name.split(".", 1)[0]},
        "state": "ENABLED" if name in sb.store.config.enabled_services else "DISABLED",
    }


async def get_service(sb: Sandbox, call: Call) -> Reply:
    """``serviceusage.services.get``: ENABLED or DISABLED."""
    project = _project(sb, call.params["project"])
    return reply(_service(sb, project, call.params["name"]))


async def batch_get_services(sb: Sandbox, call: Call) -> Reply:
    """``serviceusage.services.batchGet?names=projects/P/services/S&names=...`` (at most 30)."""
    project = _project(sb, call.params["project"])
    names = call.args("names")
    if not names or len(names) > MAX_BATCH:
        raise invalid(f"names must list 1 to {MAX_BATCH} services.")
    services = []
    for name in names:
        parts = name.split("/")
        if len(parts) != 4 or parts[0] != "projects" or parts[2] != "services":
            raise invalid(f'"{name}" is not projects/PROJECT/services/SERVICE.')
        if _project(sb, parts[1]) != project:
            raise invalid(f'"{name}" is not in the parent project {call.params["project"]}.')
        services.append(_service(sb, project, parts[3]))
    return reply({"services": services})


def register(router: Router) -> None:
    """Add the Resource Manager and Service Usage routes."""
    router.add("GET", "/v1/projects/{project}", "cloudresourcemanager", get_project)
    router.add("POST", "/v1/projects/{project}:testIamPermissions", "cloudresourcemanager", test_iam_permissions)
    router.add(
        "GET",
        # The metric's "/" arrives %2F-encoded and is decoded before routing: the metric spans two segments.
        "/v1beta1/projects/{project}/services/{service}/consumerQuotaMetrics/{metric_service}/{metric}",
        "serviceusage",
        get_consumer_quota_metric,
    )
    router.add("GET", "/v1/projects/{project}/services:batchGet", "serviceusage", batch_get_services)
    router.add("GET", "/v1/projects/{project}/services/{name}", "serviceusage", get_service)
