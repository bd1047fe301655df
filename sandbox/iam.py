"""IAM in the sandbox: which permissions the caller holds on a project, and the 403 a Google API answers without one.

The grants come from :meth:`sandbox.config.Config.granted` (the project's custom-role file, less what a seed denies).
Handlers call :func:`require` for the calls that matter, with the message their API uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox.errors import ApiError

if TYPE_CHECKING:
    from sandbox.context import Sandbox


def require_compute(sb: Sandbox, project: str, permission: str, resource: str | None = None) -> None:
    """Compute Engine's 403: ``Required 'PERMISSION' permission for 'projects/P/...'``, reason ``forbidden``."""
    if permission not in sb.store.config.granted(project):
        where = resource or f"projects/{project}"
        raise ApiError("PERMISSION_DENIED", f"Required '{permission}' permission for '{where}'", reason="forbidden")


def require_storage(sb: Sandbox, project: str, permission: str, bucket: str) -> None:
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
