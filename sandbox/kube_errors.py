"""The Kubernetes API's errors: an exception each sandbox module raises, answered as a ``Status`` object."""

from __future__ import annotations

from typing import Any

from sandbox.auth import KUBE_UNAUTHORIZED


class KubeError(Exception):
    """A Kubernetes API error, answered as a ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> dict[str, Any]:
        """The ``Status`` body (an authentication failure's, like the API server's, has no details)."""
        if self.code == 401:
            return dict(KUBE_UNAUTHORIZED)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }
