"""Compute Engine v1 projects: ``projects.get`` and ``projects.setCommonInstanceMetadata``.

A caller without ``compute.projects.setCommonInstanceMetadata`` on the project gets compute's 403 (the lease writes
need it, and the tutorial's roles do not grant it).

A project's common instance metadata is a list of key/value items with a fingerprint. Every write must send the
fingerprint it read; a stale one is refused with 412 ``conditionNotMet`` (optimistic locking, as GCE does), so two
writers that read the same version cannot both win. The run's lease on its group lives here.
"""

from __future__ import annotations

import base64
import re
import secrets
from typing import TYPE_CHECKING, Any

from sandbox import formats
from sandbox.apis.compute import PREFIX, SERVICE, render_operation
from sandbox.errors import ApiError, invalid
from sandbox.http import Call, Reply, Router, reply
from sandbox.iam import require_compute
from sandbox.operations import Effect
from sandbox.validation import check_request_id

if TYPE_CHECKING:
    from sandbox.context import Sandbox

_KEY = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
MAX_VALUE_BYTES = 256 * 1024
MAX_TOTAL_BYTES = 512 * 1024


def _fingerprint() -> str:
    return base64.b64encode(secrets.token_bytes(8)).decode()


def _metadata(sb: Sandbox, project: str) -> dict[str, Any]:
    """The project's metadata record, created empty (with a fingerprint) the first time the project is seen."""
    found = sb.store.metadata.get(project)
    if found is None:
        found = sb.store.metadata[project] = {"fingerprint": _fingerprint(), "items": []}
        sb.store.dirty = True
    return found


async def get_project(sb: Sandbox, call: Call) -> Reply:
    """``projects.get``: the project with its common instance metadata."""
    project = call.params["project"]
    sb.store.config.remember_project(project)
    metadata = _metadata(sb, project)
    body: dict[str, Any] = {
        "kind": "compute#project",
        "id": formats.project_number(project),
        "name": project,
        "creationTimestamp": formats.rfc3339(sb.started),
        "commonInstanceMetadata": {"kind": "compute#metadata", "fingerprint": metadata["fingerprint"]},
        "defaultNetworkTier": "PREMIUM",
        "selfLink": formats.compute_link(f"projects/{project}"),
    }
    if metadata["items"]:
        body["commonInstanceMetadata"]["items"] = [dict(item) for item in metadata["items"]]
    return reply(body)


def _check_items(items: Any) -> list[dict[str, str]]:
    if not isinstance(items, list):
        raise invalid("metadata.items must be a list")
    checked, seen, total = [], set(), 0
    for n, item in enumerate(items):
        key, value = (item or {}).get("key"), (item or {}).get("value", "")
        if not isinstance(key, str) or not _KEY.match(key):
            raise invalid(f"metadata.items[{n}].key: {key!r} must match [a-zA-Z0-9_-]{{1,128}}")
        if key in seen:
            raise invalid(f"metadata.items[{n}].key: duplicate key {key!r}")
        if not isinstance(value, str):
            raise invalid(f"Invalid value for field 'metadata.items[{n}].value': a string is required.")
        if len(value.encode()) > MAX_VALUE_BYTES:
            raise invalid(
                f"Value for field 'metadata.items[{n}].value' is too large: maximum size {MAX_VALUE_BYTES} "
                f"byte(s); actual size {len(value.encode())}."
            )
        seen.add(key)
        total += len(key.encode()) + len(value.encode())
        checked.append({"key": key, "value": value})
    if total > MAX_TOTAL_BYTES:
        # The limit is compute v1's Metadata reference (FACTS §21); the wording is the sandbox's (docs/fidelity.md).
        raise invalid(
            f"Metadata size exceeds the limit: the total size of all keys and values is {total} bytes; the maximum "
            f"is {MAX_TOTAL_BYTES} bytes.",
            reason="invalid",
        )
    return checked


async def set_common_instance_metadata(sb: Sandbox, call: Call) -> Reply:
    """``projects.setCommonInstanceMetadata``: replace the items, if the fingerprint is the current one."""
    project = call.params["project"]
    require_compute(sb, project, "compute.projects.setCommonInstanceMetadata")
    body = call.json()
    request_id = check_request_id(call.arg("requestId"))
    metadata = _metadata(sb, project)
    if body.get("fingerprint") != metadata["fingerprint"]:
        raise ApiError(
            "FAILED_PRECONDITION",
            "Supplied fingerprint does not match current metadata fingerprint.",
            reason="conditionNotMet",
            http=412,
        )
    metadata["items"] = _check_items(body.get("items") or [])
    metadata["fingerprint"] = _fingerprint()
    sb.store.dirty = True
    operation = sb.start_operation(
        call,
        service=SERVICE,
        kind="compute.projects.setCommonInstanceMetadata",
        verb="update",
        project=project,
        location="global",
        target=f"projects/{project}",
        effect=Effect(),
        meta={
            "operationType": "compute.projects.setCommonInstanceMetadata",
            "targetId": formats.project_number(project),
        },
        request_id=request_id,
    )
    return reply(render_operation(sb, operation))


def register(router: Router) -> None:
    """Add the project routes."""
    router.add("GET", PREFIX, SERVICE, get_project)
    router.add("POST", PREFIX + "/setCommonInstanceMetadata", SERVICE, set_common_instance_metadata)
