"""The IAM permissions a run uses: the custom-role file under include/iam, the predefined role that grants each, and
one Cloud Resource Manager ``projects.testIamPermissions`` call that tells which the caller lacks.

The role file is the one list: a user applies it with ``gcloud iam roles create --file``, preflight checks it, and a
test keeps it equal to the API methods the package calls (tests/unit/test_iam_role.py).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import yaml

from nemo_rl_gke.run.paths import INCLUDE_DIR

if TYPE_CHECKING:
    from nemo_rl_gke.gcp.hooks import GcpHook

ROLE_FILE = INCLUDE_DIR / "iam" / "nemo-rl-gke-role.yaml"
# testIamPermissions answers at most this many permissions per call; the list is sent in slices of it.
MAX_PER_CALL = 100
# The predefined role that grants a permission, by longest matching prefix (Google's IAM roles reference).
GRANTING_ROLES: dict[str, str] = {
    "compute.firewalls.": "roles/compute.securityAdmin",
    "compute.networks.updatePolicy": "roles/compute.securityAdmin",
    "compute.networkProfiles.": "roles/compute.networkViewer",
    "compute.projects.get": "roles/compute.viewer",
    "compute.projects.setCommonInstanceMetadata": "roles/compute.instanceAdmin.v1",
    "compute.regions.": "roles/compute.viewer",
    "compute.reservations.": "roles/compute.viewer",
    "compute.": "roles/compute.networkAdmin",
    "container.": "roles/container.admin",
    "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser",
    "lustre.": "roles/lustre.admin",
    "resourcemanager.projects.get": "roles/browser",
    "servicenetworking.": "roles/servicenetworking.networksAdmin",
    "serviceusage.": "roles/serviceusage.serviceUsageViewer",
    "storage.buckets.": "roles/storage.admin",
    # The pending-checkpoint records are objects in the export bucket (gcp/pending.py).
    "storage.objects.": "roles/storage.objectUser",
}


class RoleFileError(ValueError):
    """The custom-role file is missing or malformed."""


@cache
def role_permissions() -> tuple[str, ...]:
    """Every permission of the custom-role file, in its order."""
    try:
        role = yaml.safe_load(ROLE_FILE.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RoleFileError(f"{ROLE_FILE}: {exc}") from exc
    permissions = role.get("includedPermissions") if isinstance(role, dict) else None
    if not isinstance(permissions, list) or not all(isinstance(p, str) and p for p in permissions):
        raise RoleFileError(f"{ROLE_FILE}: includedPermissions must be a list of permission names")
    return tuple(permissions)


def granting_role(permission: str) -> str:
    """The predefined role that grants ``permission`` (the custom role grants them all)."""
    matches = [prefix for prefix in GRANTING_ROLES if permission.startswith(prefix)]
    if not matches:
        raise KeyError(f"no predefined role known for {permission}")
    return GRANTING_ROLES[max(matches, key=len)]


def missing_permissions(hook: GcpHook, project: str, permissions: tuple[str, ...]) -> list[str]:
    """The permissions of ``permissions`` the hook's identity lacks on ``project``, in their order.

    One ``projects.testIamPermissions`` call per :data:`MAX_PER_CALL` permissions (one call for today's list); it
    answers the granted subset and needs no permission itself.
    """
    granted: set[str] = set()
    projects = hook.resourcemanager.projects()
    for start in range(0, len(permissions), MAX_PER_CALL):
        chunk = list(permissions[start : start + MAX_PER_CALL])
        answer = hook.execute(
            projects.testIamPermissions(resource=project, body={"permissions": chunk}),
            what=f"projects.testIamPermissions {project}",
        )
        granted.update(str(p) for p in answer.get("permissions") or [])
    return [p for p in permissions if p not in granted]
