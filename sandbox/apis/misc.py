"""Cloud Resource Manager v1 ``projects.get`` (the project number) and Service Usage v1 (is an API enabled?).

Every syntactically valid project ID exists in the sandbox; its number is derived from the ID, so it is stable
across restarts. Services are ENABLED when they are in the seeded list (:mod:`sandbox.config`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox import formats
from sandbox.errors import ApiError, invalid
from sandbox.http import Call, Reply, Router, reply
from sandbox.validation import PROJECT_ID

if TYPE_CHECKING:
    from sandbox.context import Sandbox

MAX_BATCH = 30


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
    router.add("GET", "/v1/projects/{project}/services:batchGet", "serviceusage", batch_get_services)
    router.add("GET", "/v1/projects/{project}/services/{name}", "serviceusage", get_service)
