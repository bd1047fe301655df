"""The Google Cloud REST errors the async hook raises, apart from it so that a trigger's module can name them.

The triggerer imports a trigger's module on the event loop every deferred task shares; the hook itself (aiohttp,
Airflow's Google base hook) is imported in a worker thread when the trigger runs
(:func:`nemo_rl_gke.triggers.clients.client_module`).
"""

from __future__ import annotations


class GcpApiError(Exception):
    """A Google Cloud REST call failed; ``status`` is the HTTP status, or ``None`` when no response came back."""

    def __init__(self, message: str, *, status: int | None, service: str, path: str) -> None:
        super().__init__(message)
        self.status = status
        self.service = service
        self.path = path


class TransientApiError(GcpApiError):
    """A failure worth retrying: 408, 429, any 5xx, a rate-limited 403, a connection error or a request timeout."""


class PermanentApiError(GcpApiError):
    """A failure that a retry cannot fix (400, 401, 403, 404, ...), or a response that is not a JSON object."""
