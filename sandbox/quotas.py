"""Per-project API rate quotas, as Google counts and refuses them.

Google counts a project's requests per quota group and refuses the ones past the group's limit until the interval
ends; the quota then refills at once (not gradually). Two groups of two APIs are modelled, with their published
defaults:

* **Compute Engine** (cloud.google.com/compute/docs/api-rate-limits): ``Read requests`` (``*.get`` and ``*.list``)
  and ``Queries`` (the mutation methods, ``compute.googleapis.com/default``), 1,500 requests a minute each per
  project, on synchronized one-minute intervals. Past it: 403 with reason ``rateLimitExceeded`` (domain
  ``usageLimits``), "wait a minute then try again".
* **Kubernetes Engine** (cloud.google.com/kubernetes-engine/quotas): 3,000 requests a minute per project, enforced
  on 100-second intervals (5,000 per interval). Past it: 429 ``RESOURCE_EXHAUSTED``, ErrorInfo
  ``RATE_LIMIT_EXCEEDED``.

The other APIs the run calls (Lustre, Service Networking, Storage, Resource Manager, Service Usage) are not limited
here (docs/fidelity.md). A seed's ``rate_quotas`` sets other limits per group (tests make them small); the counts are
kept in memory, as a new interval would have refilled them anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sandbox import formats
from sandbox.errors import ApiError


@dataclass(frozen=True)
class RateQuota:
    """One quota group: which calls it counts, its interval and its default limit, and what Google says past it."""

    name: str
    service: str
    reads: bool | None  # True: GET calls only; False: the others; None: every call
    interval_s: float
    default_limit: int
    metric: str
    limit_name: str
    status: str
    http: int

    def counts(self, service: str, method: str) -> bool:
        """Whether a call of ``service`` with HTTP ``method`` counts against this group."""
        if service != self.service:
            return False
        return self.reads is None or self.reads == (method == "GET")


RATE_QUOTAS: tuple[RateQuota, ...] = (
    RateQuota("compute.read", "compute", True, 60.0, 1500, "compute.googleapis.com/read_requests",
              "ReadRequestsPerMinutePerProject", "PERMISSION_DENIED", 403),
    RateQuota("compute.default", "compute", False, 60.0, 1500, "compute.googleapis.com/default",
              "defaultPerMinutePerProject", "PERMISSION_DENIED", 403),
    RateQuota("container.requests", "container", None, 100.0, 5000, "container.googleapis.com/requests",
              "RequestsPerMinutePerProject", "RESOURCE_EXHAUSTED", 429),
)  # fmt: skip
QUOTAS_BY_NAME = {q.name: q for q in RATE_QUOTAS}


class RateLimiter:
    """Each project's requests per quota group in the current interval."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], tuple[float, int]] = {}
        # What was refused, per project and group (the bench and the tests read it).
        self.refused: dict[tuple[str, str], int] = {}

    def charge(self, project: str, service: str, method: str, limits: dict[str, int], now: float) -> None:
        """Count one call; raise Google's quota error when its group's limit for this interval is spent."""
        for quota in RATE_QUOTAS:
            if not quota.counts(service, method):
                continue
            limit = int(limits.get(quota.name, quota.default_limit))
            start = math.floor(now / quota.interval_s) * quota.interval_s
            key = (project, quota.name)
            interval, used = self._counts.get(key, (start, 0))
            if interval != start:
                used = 0
            if used >= limit:
                self.refused[key] = self.refused.get(key, 0) + 1
                raise self._error(quota, project, limit)
            self._counts[key] = (start, used + 1)

    @staticmethod
    def _error(quota: RateQuota, project: str, limit: int) -> ApiError:
        # The wording Google's quota system uses for a rate quota (metric, limit, service and consumer).
        message = (
            f"Quota exceeded for quota metric '{quota.metric}' and limit '{quota.limit_name}' of service "
            f"'{quota.service}.googleapis.com' for consumer 'project_number:{formats.project_number(project)}'."
        )
        # errors[].reason rateLimitExceeded (domain usageLimits), ErrorInfo RATE_LIMIT_EXCEEDED (sandbox/errors.py).
        return ApiError(quota.status, message, reason="rateLimitExceeded", http=quota.http)
