"""How Google spells things: timestamps, numeric ids, project numbers, self links and resource references.

Compute bodies may name another resource by full URL (gcloud sends ``https://compute.googleapis.com/compute/v1/...``,
the API itself answers ``https://www.googleapis.com/compute/v1/...``), by relative path (``projects/P/global/...``),
by partial path (``global/networks/N``) or by bare name. :func:`compute_key` turns every form into the one relative
path the store keys resources by, and :func:`compute_link` turns it back into the URL the real API answers with.
"""

from __future__ import annotations

import hashlib
import re
import time
from datetime import UTC, datetime

COMPUTE_LINK_BASE = "https://www.googleapis.com/compute/v1/"
CONTAINER_LINK_BASE = "https://container.googleapis.com/v1/"
_COMPUTE_URL = re.compile(r"^https?://[^/]+/compute/(?:v1|beta|alpha)/(?P<path>.+)$")
# The collections compute bodies refer to, and whether they live under global/ or regions/{region}/.
_REGIONAL = {"subnetworks", "addresses"}


def rfc3339(at: float) -> str:
    """Compute's timestamps: RFC 3339 with milliseconds and a numeric offset."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


def kube_time(at: float) -> str:
    """Kubernetes' timestamps (metav1.Time): RFC 3339 in UTC, whole seconds, ``Z``."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def zulu(at: float) -> str:
    """The newer APIs' timestamps (container, lustre, longrunning): RFC 3339 in UTC with ``Z``."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now() -> float:
    """Wall-clock seconds: operations finish by the wall clock, so a restarted sandbox keeps their schedule."""
    return time.time()


def numeric_id(*parts: str) -> str:
    """A stable uint64 id as a decimal string, as compute gives every resource and operation."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()
    return str(int.from_bytes(digest[:8], "big") >> 1)


def project_number(project_id: str) -> str:
    """The project number of a project ID: 12 digits, stable, never starting with 0."""
    digest = hashlib.sha256(f"project\0{project_id}".encode()).digest()
    return str(100_000_000_000 + int.from_bytes(digest[:8], "big") % 900_000_000_000)


def compute_link(key: str) -> str:
    """The URL the compute API uses for a resource (``selfLink``, references in bodies it returns)."""
    return COMPUTE_LINK_BASE + key


def container_link(key: str) -> str:
    """A cluster's or node pool's ``selfLink``: its path, project by ID."""
    return CONTAINER_LINK_BASE + key


def container_operation_link(project: str, rest: str) -> str:
    """An operation's ``selfLink`` / ``targetLink``: GKE names the project by *number* in these."""
    return f"{CONTAINER_LINK_BASE}projects/{project_number(project)}/{rest}"


def compute_key(value: str, project: str, collection: str, region: str | None = None) -> str | None:
    """The store key (``projects/P/global/networks/N``) of a compute reference in any accepted form.

    ``None`` when the value cannot name a resource of ``collection`` (the caller answers 400).
    """
    match = _COMPUTE_URL.match(value)
    path = match.group("path") if match else value.strip("/")
    if not path.startswith("projects/"):
        scope = f"regions/{region}" if collection in _REGIONAL and region else "global"
        path = f"{scope}/{collection}/{path}" if "/" not in path else path
        path = f"projects/{project}/{path}"
    parts = path.split("/")
    if collection in _REGIONAL and len(parts) == 6 and parts[2] == "regions" and parts[4] == collection:
        return path
    if len(parts) == 5 and parts[2] == "global" and parts[3] == collection:
        return path
    return None


def key_name(key: str) -> str:
    """The last segment of a resource path: its name."""
    return key.rsplit("/", 1)[-1]


def key_project(key: str) -> str:
    """The project segment of a ``projects/P/...`` path."""
    return key.split("/")[1]
