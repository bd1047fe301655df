"""The Google Cloud REST APIs the sandbox serves, one module per API, all on one port and routed by path."""

from __future__ import annotations

from sandbox.apis import compute, compute_projects, container, locations, lustre, misc, servicenetworking, storage
from sandbox.http import Router

# Inventory state names per resource kind, from each API's own status vocabulary.
STATES: dict[str, dict[str, str]] = {
    **compute.STATES,
    **container.STATES,
    **lustre.STATES,
    **servicenetworking.STATES,
}


def router() -> Router:
    """A router with every API's routes."""
    routes = Router()
    for module in (compute, compute_projects, container, lustre, locations, servicenetworking, misc, storage):
        module.register(routes)
    return routes
