"""Fault injection: fail the n-th matching API call with an HTTP status, make the operation it starts end in
error or hang, or hold its answer.

A fault is ``{"match": {...}, "nth": 1, "times": 1, ...}`` plus one of ``"status": 503`` (the call is answered
with that error before the API sees it, so nothing changes), ``"operation": "error"`` / ``"operation": "hang"``
(the call goes through, and the operation it starts ends in error, or never ends), or ``"delay_s": 60`` (the call
goes through and takes effect; its answer is held that long, as one stuck on its way back through a proxy: a
client that dies or gives up meanwhile never learns that it worked). ``match`` may hold ``method``
and the regexes ``path``, ``query`` and ``body``, searched (``re.search``) in the request path, the raw query string
and the request body (``body`` tells apart inserts into one collection, e.g. one of nine subnets).

Counting: a status or delay fault counts every matching call; an operation fault counts only matching calls that
start an operation (a 409 starts none). Calls ``nth`` .. ``nth + times - 1`` of that count are hit; ``times: null`` hits
every call from the ``nth`` on. Optional: ``"message"``, ``"error_status"`` (a ``google.rpc`` code name: the
call's status name, default from the HTTP code; the failed operation's error, default INTERNAL) and ``"reason"``
(``errors[].reason`` and the ErrorInfo reason, e.g. ``rateLimitExceeded`` on a 403: default from the status).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from sandbox.errors import RPC_CODES, ApiError, status_for_http

FAULT_KEYS = {"match", "nth", "times", "status", "operation", "delay_s", "message", "error_status", "reason"}
MATCH_KEYS = {"method", "path", "query", "body"}
OPERATION_FAULTS = ("error", "hang")
MAX_DELAY_S = 600.0


class FaultSpecError(ValueError):
    """A fault definition the sandbox cannot use."""


@dataclass
class Fault:
    """One installed fault and how often it has matched and fired."""

    id: str
    method: str | None
    path: str
    query: str | None
    body: str | None
    nth: int
    times: int | None
    status: int | None
    operation: str | None
    message: str | None
    error_status: str | None
    reason: str | None = None
    delay_s: float | None = None
    seen: int = 0
    fired: int = 0
    _path_re: re.Pattern[str] = field(init=False, repr=False)
    _query_re: re.Pattern[str] | None = field(init=False, repr=False)
    _body_re: re.Pattern[str] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._path_re = re.compile(self.path)
        self._query_re = re.compile(self.query) if self.query is not None else None
        self._body_re = re.compile(self.body) if self.body is not None else None

    def matches(self, method: str, path: str, query: str, body: str = "") -> bool:
        """Whether a call is one this fault counts (``body`` tells apart inserts into one collection)."""
        if self.method is not None and self.method != method.upper():
            return False
        if not self._path_re.search(path):
            return False
        if self._body_re is not None and not self._body_re.search(body):
            return False
        return self._query_re is None or bool(self._query_re.search(query))

    def hits(self, count: int) -> bool:
        """Whether the ``count``-th matching call is one this fault fails."""
        return count >= self.nth and (self.times is None or count < self.nth + self.times)

    def call_error(self) -> ApiError:
        """The error a status fault answers with."""
        assert self.status is not None
        status = self.error_status or status_for_http(self.status)
        message = self.message or f"Injected fault {self.id}: HTTP {self.status}"
        return ApiError(status, message, http=self.status, reason=self.reason)

    def operation_error(self) -> ApiError:
        """The error an operation hit by an ``operation: error`` fault ends with."""
        status = self.error_status or "INTERNAL"
        return ApiError(status, self.message or f"Injected fault {self.id}: operation failed", reason=self.reason)

    def to_json(self) -> dict[str, Any]:
        """The fault as the admin API lists it."""
        match = {"method": self.method, "path": self.path, "query": self.query, "body": self.body}
        return {
            "id": self.id,
            "match": {k: v for k, v in match.items() if v is not None},
            "nth": self.nth,
            "times": self.times,
            "status": self.status,
            "operation": self.operation,
            "message": self.message,
            "error_status": self.error_status,
            "reason": self.reason,
            "delay_s": self.delay_s,
            "seen": self.seen,
            "fired": self.fired,
        }


class Faults:
    """The installed faults, in the order they were added (the first one that fires wins)."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)

    def add(self, spec: dict[str, Any]) -> Fault:
        """Validate and install a fault definition."""
        if not isinstance(spec, dict):
            raise FaultSpecError("a fault is a JSON object")
        unknown = set(spec) - FAULT_KEYS
        if unknown:
            raise FaultSpecError(f"unknown keys {sorted(unknown)}; known: {sorted(FAULT_KEYS)}")
        match = spec.get("match", {})
        if not isinstance(match, dict) or set(match) - MATCH_KEYS:
            raise FaultSpecError(f"match must be an object with keys among {sorted(MATCH_KEYS)}")
        status, operation, delay_s = _effect(spec)
        error_status = spec.get("error_status")
        if error_status is not None and error_status not in RPC_CODES:
            raise FaultSpecError(f"error_status must be a google.rpc code name, got {error_status!r}")
        reason = spec.get("reason")
        if reason is not None and (not isinstance(reason, str) or not reason):
            raise FaultSpecError(f"reason must be a non-empty string, got {reason!r}")
        nth, times = spec.get("nth", 1), spec.get("times", 1)
        if not isinstance(nth, int) or nth < 1:
            raise FaultSpecError(f"nth must be an integer >= 1, got {nth!r}")
        if times is not None and (not isinstance(times, int) or times < 1):
            raise FaultSpecError(f"times must be an integer >= 1 or null, got {times!r}")
        try:
            fault = Fault(
                id=f"fault-{next(self._ids)}",
                method=str(match["method"]).upper() if match.get("method") else None,
                path=str(match.get("path", "")),
                query=str(match["query"]) if match.get("query") is not None else None,
                body=str(match["body"]) if match.get("body") is not None else None,
                nth=nth,
                times=times,
                status=status,
                operation=operation,
                message=spec.get("message"),
                error_status=error_status,
                reason=reason,
                delay_s=None if delay_s is None else float(delay_s),
            )
        except re.error as exc:
            raise FaultSpecError(f"bad regular expression: {exc}") from exc
        self._faults.append(fault)
        return fault

    def list(self) -> list[Fault]:
        """Every installed fault."""
        return list(self._faults)

    def remove(self, fault_id: str) -> bool:
        """Uninstall one fault; returns whether it existed."""
        before = len(self._faults)
        self._faults = [f for f in self._faults if f.id != fault_id]
        return len(self._faults) != before

    def clear(self) -> None:
        """Uninstall every fault."""
        self._faults.clear()

    def call_fault(self, method: str, path: str, query: str, body: str = "") -> Fault | None:
        """Count the call against every status fault; the first one it hits, if any."""
        return self._count([f for f in self._faults if f.status is not None], method, path, query, body)

    def delay_fault(self, method: str, path: str, query: str, body: str = "") -> Fault | None:
        """Count the call against every delay fault; the first one it hits, if any (its answer is held)."""
        return self._count([f for f in self._faults if f.delay_s is not None], method, path, query, body)

    @staticmethod
    def _count(faults: list[Fault], method: str, path: str, query: str, body: str) -> Fault | None:
        hit: Fault | None = None
        for fault in faults:
            if not fault.matches(method, path, query, body):
                continue
            fault.seen += 1
            if hit is None and fault.hits(fault.seen):
                fault.fired += 1
                hit = fault
        return hit

    def operation_fault(self, method: str, path: str, query: str, body: str = "") -> Fault | None:
        """The operation fault the call would hit if it starts an operation (nothing is counted yet)."""
        for fault in self._faults:
            if fault.operation is not None and fault.matches(method, path, query, body) and fault.hits(fault.seen + 1):
                return fault
        return None

    def operation_started(self, method: str, path: str, query: str, applied: Fault | None, body: str = "") -> None:
        """Count a call that started an operation against every operation fault it matches."""
        for fault in self._faults:
            if fault.operation is not None and fault.matches(method, path, query, body):
                fault.seen += 1
                if fault is applied:
                    fault.fired += 1


def _effect(spec: dict[str, Any]) -> tuple[Any, Any, Any]:
    """A fault's one effect, checked: an HTTP status, an operation fault, or a delay (the other two None)."""
    status, operation, delay_s = spec.get("status"), spec.get("operation"), spec.get("delay_s")
    if [status, operation, delay_s].count(None) != 2:
        raise FaultSpecError(
            "give exactly one of status (an HTTP code), operation (error or hang) and delay_s (seconds)"
        )
    if delay_s is not None and (
        isinstance(delay_s, bool) or not isinstance(delay_s, int | float) or not 0 < delay_s <= MAX_DELAY_S
    ):
        raise FaultSpecError(f"delay_s must be a number of seconds in (0, {MAX_DELAY_S:g}], got {delay_s!r}")
    if status is not None and not (isinstance(status, int) and 400 <= status <= 599):
        raise FaultSpecError(f"status must be an HTTP error code 400-599, got {status!r}")
    if operation is not None and operation not in OPERATION_FAULTS:
        raise FaultSpecError(f"operation must be one of {OPERATION_FAULTS}, got {operation!r}")
    return status, operation, delay_s
