"""Sandbox fault matches for the calls that create or delete one resource of the run (by its topology task id)."""

from __future__ import annotations

import re

from nemo_rl_gke.gcp.resources import Resource


def create_match(resource: Resource) -> dict[str, str]:
    """The sandbox fault match for the call that creates ``resource``."""
    request = resource.request
    match = {"method": request.http_method, "path": re.escape(request.path.split("?", 1)[0]) + "$"}
    if request.service in ("compute", "container"):
        # Several networks and nine subnets share one collection: the body names the one to fail.
        match["body"] = rf'"name":\s*"{re.escape(resource.name)}"'
    return match


def delete_match(resource: Resource) -> dict[str, str]:
    """The sandbox fault match for the call that deletes ``resource``."""
    request = resource.delete_request
    return {"method": request.http_method, "path": re.escape(request.path.split("?", 1)[0]) + "$"}
