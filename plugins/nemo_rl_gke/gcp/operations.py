"""Long-running operations of the four Google API families, reduced to one shape: done or not, error or not.

- compute: ``status`` PENDING/RUNNING/DONE, failures in ``error.errors[]``;
- container: ``status`` PENDING/RUNNING/DONE/ABORTING, failures in ``error`` (google.rpc.Status) or ``statusMessage``;
- lustre and servicenetworking: google.longrunning (``done``, ``error``, ``response``).

Pure and JSON-only, so the same code reads an operation in an action (sync) and in a trigger (async).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

COMPUTE = "compute"
CONTAINER = "container"
LONGRUNNING = "longrunning"
SHAPES = (COMPUTE, CONTAINER, LONGRUNNING)


@dataclass(frozen=True)
class OperationRef:
    """Where to poll one operation: the API service, the GET path of the operation, its shape and what it changes.

    ``service`` selects the endpoint (compute, container, lustre, servicenetworking); ``path`` is the REST path
    with its version prefix (``/compute/v1/projects/p/global/operations/op-1``, ``/v1/operations/abc``, ...).
    """

    service: str
    path: str
    shape: str
    resource: str

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown operation shape {self.shape!r}; expected one of {SHAPES}")

    def to_dict(self) -> dict[str, str]:
        """JSON form, for trigger kwargs and XCom."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OperationRef:
        """Inverse of :meth:`to_dict`."""
        return cls(str(data["service"]), str(data["path"]), str(data["shape"]), str(data["resource"]))


@dataclass(frozen=True)
class OperationStatus:
    """What an operation says now: finished or not, its failure if any, and a short state for messages."""

    done: bool
    error: str
    state: str

    @property
    def failed(self) -> bool:
        """Finished with an error."""
        return self.done and bool(self.error)


def operation_status(shape: str, body: dict[str, Any]) -> OperationStatus:
    """Read an operation's JSON body (REST, camelCase) in its family's shape."""
    if shape == COMPUTE:
        status = str(body.get("status", "PENDING"))
        errors = (body.get("error") or {}).get("errors") or []
        error = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}".strip(": ") for e in errors)
        if not error and body.get("httpErrorStatusCode"):
            error = f"HTTP {body['httpErrorStatusCode']}: {body.get('httpErrorMessage', '')}"
        return OperationStatus(status == "DONE", error, status)
    if shape == CONTAINER:
        status = str(body.get("status", "PENDING"))
        err = body.get("error") or {}
        error = str(err.get("message") or "") if err.get("code") or err.get("message") else ""
        if status == "DONE" and not error and body.get("statusMessage"):
            error = str(body["statusMessage"])
        return OperationStatus(status == "DONE", error, status)
    if shape == LONGRUNNING:
        done = bool(body.get("done"))
        err = body.get("error") or {}
        error = f"{err.get('code', '')}: {err.get('message', '')}".strip(": ") if err else ""
        state = "DONE" if done else str((body.get("metadata") or {}).get("state") or "RUNNING")
        return OperationStatus(done, error, state)
    raise ValueError(f"unknown operation shape {shape!r}")
