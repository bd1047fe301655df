"""``/v1/projects/{p}/locations/{l}/operations[/{op}]``: the paths GKE and Lustre share on the sandbox's one port.

Operation ids are unique across services, so the id alone finds the operation; it is then rendered in the format of
the service that started it (a container Operation or a google.longrunning Operation).

A *list* names no operation, and the two answers cannot be mixed: the longrunning parser rejects container fields. So
the sandbox tells the callers apart: a region is GKE's (Lustre is zonal); in a zone, the GKE REST client asks for
numeric enums (``$alt=json;enum-encoding=int``) and Lustre's ``list_operations`` does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox.apis import container, lustre
from sandbox.errors import ApiError, not_found
from sandbox.http import Call, Reply, Router, reply
from sandbox.operations import Operation
from sandbox.validation import REGION

if TYPE_CHECKING:
    from sandbox.context import Sandbox

SERVICE = "operations"
PATH = "/v1/projects/{project}/locations/{location}/operations/{operation}"
NUMERIC_ENUMS = "enum-encoding=int"
RENDERERS = {container.SERVICE: container.render_operation, lustre.SERVICE: lustre.render_operation}


def _operation(sb: Sandbox, call: Call) -> Operation:
    project, location, op_id = call.params["project"], call.params["location"], call.params["operation"]
    operation = sb.store.operation(op_id)
    if (
        operation is None
        or operation.service not in RENDERERS
        or (operation.project, operation.location) != (project, location)
    ):
        raise not_found(f"Not found: projects/{project}/locations/{location}/operations/{op_id}.")
    return operation


def render(sb: Sandbox, operation: Operation) -> dict[str, Any]:
    """The operation in its own service's format."""
    return RENDERERS[operation.service](sb, operation)


async def get_operation(sb: Sandbox, call: Call) -> Reply:
    """``projects.locations.operations.get`` of GKE and of Lustre."""
    return reply(render(sb, _operation(sb, call)))


async def list_operations(sb: Sandbox, call: Call) -> Reply:
    """``projects.locations.operations.list`` of GKE or of Lustre, whichever client is asking (see above)."""
    project, location = call.params["project"], call.params["location"]
    service = (
        container.SERVICE if REGION.match(location) or NUMERIC_ENUMS in (call.arg("$alt") or "") else lustre.SERVICE
    )
    found = [
        o
        for o in sorted(sb.store.operations.values(), key=lambda o: (o.start, o.id))
        if o.service == service and o.project == project and location in ("-", o.location)
    ]
    return reply({"operations": [render(sb, o) for o in found]} if found else {})


async def cancel_operation(sb: Sandbox, call: Call) -> Reply:
    """``operations.cancel``: an unfinished operation ends now with CANCELLED (its effect is undone, not applied)."""
    operation = _operation(sb, call)
    if not operation.done:
        sb.store.abort(operation, sb.now(), ApiError("CANCELLED", "Operation was cancelled."))
    return reply({})


def register(router: Router) -> None:
    """Add the shared operations routes."""
    router.add("GET", PATH.rsplit("/", 1)[0], SERVICE, list_operations)
    router.add("GET", PATH, SERVICE, get_operation)
    router.add("POST", PATH + ":cancel", SERVICE, cancel_operation)
