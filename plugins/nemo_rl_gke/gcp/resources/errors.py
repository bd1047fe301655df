"""Why a resource of the run cannot be ensured or deleted as the conf asks: one small class per reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar


class ResourceError(RuntimeError):
    """A resource of the run cannot be ensured or deleted as the conf asks."""

    # Whether running the task again can succeed without a human: the operator fails at once when it cannot.
    retryable: ClassVar[bool] = False


class NotOwnedError(ResourceError):
    """The resource exists, this package did not create it, and the conf does not adopt existing resources."""


class DriftError(ResourceError):
    """The resource exists but differs from the run conf; it is never changed in place and never retried."""

    def __init__(self, message: str, diff: Sequence[str]) -> None:
        super().__init__(message)
        self.diff = list(diff)


class NotReadyError(ResourceError):
    """The resource exists but is not usable yet and the API shows no operation to wait on; retry the task later."""

    retryable = True


class ResourceFailedError(ResourceError):
    """The resource exists in an error state (cluster ERROR, Lustre STOPPED, ...); it needs a human."""
