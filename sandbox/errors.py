"""Google's error JSON: the :class:`ApiError` every handler raises, and the HTTP/RPC status tables behind it.

Every Google REST API answers an error as ``{"error": {"code", "message", "status", "errors": [...]}}``. Compute fills
``errors[].reason`` (``notFound``, ``alreadyExists``, ``resourceInUseByAnotherResource``, ...); the newer APIs fill
``status`` and an ``ErrorInfo`` detail. The sandbox sends all of them, so each client finds what it parses
(google-api-core reads ``message``, ``errors`` and the ``ErrorInfo`` reason; googleapiclient keeps the raw body).
"""

from __future__ import annotations

from typing import Any

# google.rpc.Code: name -> (number, HTTP status), from google/rpc/code.proto.
RPC_CODES: dict[str, tuple[int, int]] = {
    "OK": (0, 200),
    "CANCELLED": (1, 499),
    "UNKNOWN": (2, 500),
    "INVALID_ARGUMENT": (3, 400),
    "DEADLINE_EXCEEDED": (4, 504),
    "NOT_FOUND": (5, 404),
    "ALREADY_EXISTS": (6, 409),
    "PERMISSION_DENIED": (7, 403),
    "RESOURCE_EXHAUSTED": (8, 429),
    "FAILED_PRECONDITION": (9, 400),
    "ABORTED": (10, 409),
    "OUT_OF_RANGE": (11, 400),
    "UNIMPLEMENTED": (12, 501),
    "INTERNAL": (13, 500),
    "UNAVAILABLE": (14, 503),
    "DATA_LOSS": (15, 500),
    "UNAUTHENTICATED": (16, 401),
}
RPC_NAMES_BY_NUMBER: dict[int, str] = {number: name for name, (number, _) in RPC_CODES.items()}
# The status an HTTP code stands for when a fault gives only the HTTP code (409 is ABORTED as often as not).
RPC_NAME_BY_HTTP: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
# Compute's operation.httpErrorMessage is the upper-case HTTP reason phrase.
HTTP_PHRASES: dict[int, str] = {
    400: "BAD REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT FOUND",
    409: "CONFLICT",
    429: "TOO MANY REQUESTS",
    499: "CLIENT CLOSED REQUEST",
    500: "INTERNAL SERVER ERROR",
    501: "NOT IMPLEMENTED",
    503: "SERVICE UNAVAILABLE",
    504: "GATEWAY TIMEOUT",
}
# The reason compute puts into errors[] for each status when the handler names none.
DEFAULT_REASONS: dict[str, str] = {
    "INVALID_ARGUMENT": "invalid",
    "FAILED_PRECONDITION": "failedPrecondition",
    "NOT_FOUND": "notFound",
    "ALREADY_EXISTS": "alreadyExists",
    "PERMISSION_DENIED": "forbidden",
    "RESOURCE_EXHAUSTED": "rateLimitExceeded",
    "ABORTED": "aborted",
    "UNAVAILABLE": "backendError",
    "INTERNAL": "backendError",
    "DEADLINE_EXCEEDED": "deadlineExceeded",
    "UNAUTHENTICATED": "authError",
    "UNIMPLEMENTED": "notImplemented",
    "CANCELLED": "cancelled",
}
ERROR_DOMAIN = "global"
# Where the newer ErrorInfo spells a compute reason its own way, and the errors[] domain of the rate quotas: a 403
# rateLimitExceeded comes with domain usageLimits and ErrorInfo RATE_LIMIT_EXCEEDED (compute api-quota docs).
INFO_REASONS: dict[str, str] = {
    "rateLimitExceeded": "RATE_LIMIT_EXCEEDED",
    "userRateLimitExceeded": "RATE_LIMIT_EXCEEDED",
}
USAGE_LIMITS_DOMAIN = "usageLimits"


class ApiError(Exception):
    """A Google API error: HTTP status, ``google.rpc`` status name, message and compute-style reason."""

    def __init__(self, status: str, message: str, *, reason: str | None = None, http: int | None = None) -> None:
        super().__init__(message)
        if status not in RPC_CODES:
            raise ValueError(f"unknown google.rpc status {status!r}")
        self.status = status
        self.message = message
        self.reason = reason or DEFAULT_REASONS.get(status, status.lower())
        self.http = http if http is not None else RPC_CODES[status][1]

    @property
    def rpc_code(self) -> int:
        """The ``google.rpc.Code`` number, as long-running operations carry it in ``error.code``."""
        return RPC_CODES[self.status][0]

    def to_json(self) -> dict[str, Any]:
        """The error body, in the shape every Google REST API uses."""
        return error_body(self.http, self.status, self.message, self.reason)

    def to_record(self) -> dict[str, Any]:
        """A JSON-safe record of this error, as an operation stores it to render it later."""
        return {"status": self.status, "message": self.message, "reason": self.reason, "http": self.http}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ApiError:
        """The inverse of :meth:`to_record`."""
        return cls(record["status"], record["message"], reason=record.get("reason"), http=record.get("http"))


def error_body(http: int, status: str, message: str, reason: str) -> dict[str, Any]:
    """``{"error": {...}}`` with ``errors[]`` (compute, googleapiclient) and an ErrorInfo detail (api-core)."""
    return {
        "error": {
            "code": http,
            "message": message,
            "status": status,
            "errors": [
                {
                    "message": message,
                    "domain": USAGE_LIMITS_DOMAIN if reason in INFO_REASONS else ERROR_DOMAIN,
                    "reason": reason,
                }
            ],
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": INFO_REASONS.get(reason, reason),
                    "domain": "googleapis.com",
                }
            ],
        }
    }


def invalid(message: str, reason: str = "invalid") -> ApiError:
    """400 INVALID_ARGUMENT: a malformed body, a bad name, a reference to the wrong kind of thing."""
    return ApiError("INVALID_ARGUMENT", message, reason=reason)


def failed_precondition(message: str, reason: str = "failedPrecondition") -> ApiError:
    """400 FAILED_PRECONDITION: the request is fine but the world is not in the state it needs."""
    return ApiError("FAILED_PRECONDITION", message, reason=reason)


def not_found(message: str) -> ApiError:
    """404 NOT_FOUND."""
    return ApiError("NOT_FOUND", message, reason="notFound")


def already_exists(message: str) -> ApiError:
    """409 ALREADY_EXISTS."""
    return ApiError("ALREADY_EXISTS", message, reason="alreadyExists")


def in_use(message: str) -> ApiError:
    """400 with compute's ``resourceInUseByAnotherResource`` reason: a delete of something still used."""
    return ApiError("FAILED_PRECONDITION", message, reason="resourceInUseByAnotherResource", http=400)


def not_ready(message: str) -> ApiError:
    """400 with compute's ``resourceNotReady`` reason: the resource is still being created or deleted."""
    return ApiError("FAILED_PRECONDITION", message, reason="resourceNotReady", http=400)


def status_for_http(http: int) -> str:
    """The ``google.rpc`` status name an HTTP code stands for (a fault that only names the code)."""
    if http in RPC_NAME_BY_HTTP:
        return RPC_NAME_BY_HTTP[http]
    return "INTERNAL" if http >= 500 else "INVALID_ARGUMENT"
