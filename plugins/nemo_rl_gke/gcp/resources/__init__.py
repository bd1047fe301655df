"""The Google Cloud objects of a run as resources, and the two idempotent actions on them: ensure and delete.

``base`` (the Resource interface, 404 handling), ``drift`` (comparing with the conf), ``errors``, one module per
family (``compute``, ``peering``, ``lustre``, ``gke``), the ``registry`` keyed by the topology's task ids, the
``actions``, and ``keep`` (what a teardown keeps for Lustre's sake). Importing this package pulls in the Google
clients: never at parse time.
"""

from nemo_rl_gke.gcp.resources.actions import ActionResult, delete_resource, delete_verdict, ensure
from nemo_rl_gke.gcp.resources.base import Resource
from nemo_rl_gke.gcp.resources.errors import (
    DriftError,
    NotOwnedError,
    NotReadyError,
    ResourceError,
    ResourceFailedError,
)
from nemo_rl_gke.gcp.resources.registry import resources

__all__ = [
    "ActionResult",
    "DriftError",
    "NotOwnedError",
    "NotReadyError",
    "Resource",
    "ResourceError",
    "ResourceFailedError",
    "delete_resource",
    "delete_verdict",
    "ensure",
    "resources",
]
