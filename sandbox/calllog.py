"""The log of API calls the sandbox answered, for tests ("which calls were made?") and the makespan bench.

Admin calls under ``/sandbox/`` and token requests are not logged. Every other call is, refused ones included, with
whether a valid bearer token came with it (``auth``). The log lives in memory only: a restarted sandbox starts anew.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CallRecord:
    """One answered API call."""

    seq: int
    time: float
    method: str
    path: str
    query: str
    service: str
    status: int
    duration_ms: float
    operations: list[str] = field(default_factory=list)
    fault: str | None = None
    error: str | None = None
    # The bearer token's verdict (sandbox.auth.Verdict: valid, missing, invalid, expired); never the token itself.
    auth: str = ""
    # The JSON body the client sent (None: no body, or not JSON), so a test can compare it with the plan's.
    body: Any = None


class CallLog:
    """An append-only list of :class:`CallRecord` with a running sequence number."""

    def __init__(self) -> None:
        self._records: list[CallRecord] = []
        self._seq = itertools.count(1)

    def append(self, **fields: Any) -> CallRecord:
        """Record a call (the sequence number is assigned here)."""
        record = CallRecord(seq=next(self._seq), **fields)
        self._records.append(record)
        return record

    def since(self, seq: int = 0) -> list[dict[str, Any]]:
        """Every record with a sequence number above ``seq``, as JSON."""
        return [asdict(r) for r in self._records if r.seq > seq]

    def clear(self) -> None:
        """Forget every record (sequence numbers keep counting)."""
        self._records.clear()
