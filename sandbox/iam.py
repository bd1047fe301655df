"""IAM in the sandbox: which permissions the caller holds on a project, and the 403 a Google API answers without one.

The grants come from :meth:`sandbox.config.Config.granted` (the project's custom-role file, less what a seed denies).
:func:`guard` checks the permissions of every route the package calls (:data:`ROUTE_PERMISSIONS`) before its handler
runs; handlers check the rest themselves with the ``require_*`` of their API's message.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from sandbox.errors import ApiError

if TYPE_CHECKING:
    from sandbox.context import Sandbox
    from sandbox.http import Call, Handler, Reply, Router


def require_compute(sb: Sandbox, project: str, permission: str, resource: str | None = None) -> None:
    """Compute Engine's 403: ``Required 'PERMISSION' permission for 'projects/P/...'``, reason ``forbidden``."""
    if permission not in sb.store.config.granted(project):
        where = resource or f"projects/{project}"
        raise ApiError("PERMISSION_DENIED", f"Required '{permission}' permission for '{where}'", reason="forbidden")


def require_storage(sb: Sandbox, project: str, permission: str) -> None:
    """Cloud Storage's 403 on a bucket, reason ``forbidden``."""
    if permission not in sb.store.config.granted(project):
        raise ApiError(
            "PERMISSION_DENIED",
            f"The caller does not have {permission} access to the Google Cloud Storage bucket. Permission "
            f"'{permission}' denied on resource (or it may not exist).",
            reason="forbidden",
        )


def require_service(sb: Sandbox, project: str, permission: str, resource: str) -> None:
    """The newer APIs' 403 (Resource Manager, Service Usage, GKE, Lustre): PERMISSION_DENIED, IAM_PERMISSION_DENIED."""
    if permission not in sb.store.config.granted(project):
        raise ApiError(
            "PERMISSION_DENIED",
            f"Permission '{permission}' denied on resource '{resource}' (or it may not exist).",
            reason="IAM_PERMISSION_DENIED",
        )


# The permission(s) Google checks for each route the package calls (Google's permission reference per API; the same
# table as tests/unit/test_iam_role.py). Routes not listed check nothing here: their handlers do (buckets, quotas,
# reservations, metadata writes), or the package never calls them (lists, waits, the shared operations paths).
_C = "/compute/v1/projects/{project}"
_G = "/v1/projects/{project}/locations/{location}"
ROUTE_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("POST", _C + "/global/networks"): ("compute.networks.create",),
    ("GET", _C + "/global/networks/{name}"): ("compute.networks.get",),
    ("DELETE", _C + "/global/networks/{name}"): ("compute.networks.delete",),
    ("POST", _C + "/global/networks/{name}/removePeering"): ("compute.networks.removePeering",),
    ("POST", _C + "/regions/{region}/subnetworks"): ("compute.subnetworks.create",),
    ("GET", _C + "/regions/{region}/subnetworks/{name}"): ("compute.subnetworks.get",),
    ("DELETE", _C + "/regions/{region}/subnetworks/{name}"): ("compute.subnetworks.delete",),
    ("POST", _C + "/global/firewalls"): ("compute.firewalls.create", "compute.networks.updatePolicy"),
    ("GET", _C + "/global/firewalls/{name}"): ("compute.firewalls.get",),
    ("DELETE", _C + "/global/firewalls/{name}"): ("compute.firewalls.delete", "compute.networks.updatePolicy"),
    ("POST", _C + "/global/addresses"): ("compute.globalAddresses.create",),
    ("GET", _C + "/global/addresses/{name}"): ("compute.globalAddresses.get",),
    ("DELETE", _C + "/global/addresses/{name}"): ("compute.globalAddresses.delete",),
    ("GET", _C + "/regions/{region}"): ("compute.regions.get",),
    ("GET", _C + "/global/networkProfiles/{name}"): ("compute.networkProfiles.get",),
    ("GET", _C + "/global/operations/{operation}"): ("compute.globalOperations.get",),
    ("GET", _C + "/regions/{region}/operations/{operation}"): ("compute.regionOperations.get",),
    ("GET", _C): ("compute.projects.get",),
    ("POST", _G + "/clusters"): ("container.clusters.create", "iam.serviceAccounts.actAs"),
    ("GET", _G + "/clusters/{cluster}"): ("container.clusters.get",),
    ("DELETE", _G + "/clusters/{cluster}"): ("container.clusters.delete",),
    ("POST", _G + "/clusters/{cluster}/nodePools"): ("container.clusters.update", "iam.serviceAccounts.actAs"),
    ("GET", _G + "/clusters/{cluster}/nodePools/{pool}"): ("container.clusters.get",),
    ("DELETE", _G + "/clusters/{cluster}/nodePools/{pool}"): ("container.clusters.update",),
    ("POST", _G + "/clusters/{cluster}/nodePools/{pool}:setSize"): ("container.clusters.update",),
    ("POST", _G + "/instances"): ("lustre.instances.create",),
    ("GET", _G + "/instances/{instance}"): ("lustre.instances.get",),
    ("DELETE", _G + "/instances/{instance}"): ("lustre.instances.delete",),
    ("POST", _G + "/instances/{instance}:exportData"): ("lustre.instances.exportData",),
    ("POST", _G + "/instances/{instance}:importData"): ("lustre.instances.importData",),
    ("GET", "/v1/projects/{project}"): ("resourcemanager.projects.get",),
    ("GET", "/v1/projects/{project}/services:batchGet"): ("serviceusage.services.get",),
}


def guard(router: Router) -> Router:
    """Make every route of :data:`ROUTE_PERMISSIONS` refuse a caller without its permissions, as its API does."""
    for index, route in enumerate(router.routes):
        permissions = ROUTE_PERMISSIONS.get((route.method, route.template))
        if permissions:
            router.routes[index] = dataclasses.replace(
                route, handler=_guarded(route.handler, route.service, permissions)
            )
    return router


def _guarded(handler: Handler, service: str, permissions: tuple[str, ...]) -> Handler:
    async def guarded(sb: Sandbox, call: Call) -> Reply:
        project = call.params.get("project", "")
        # Resource Manager and Service Usage also take a project number; the handler maps and checks it.
        if project and not project.isdigit():
            for permission in permissions:
                if service == "compute":
                    require_compute(sb, project, permission, call.path.split("/compute/v1/", 1)[-1])
                else:
                    require_service(sb, project, permission, call.path.lstrip("/").split("/", 1)[-1])
        return await handler(sb, call)

    guarded.__name__ = getattr(handler, "__name__", "guarded")
    return guarded
