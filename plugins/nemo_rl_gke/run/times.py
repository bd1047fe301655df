"""Times as XCom and the task states hold them: ISO-8601 text, read back as epoch seconds."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def epoch_of(value: Any) -> float | None:
    """Epoch seconds of an ISO-8601 time (None for a missing or unreadable one)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
