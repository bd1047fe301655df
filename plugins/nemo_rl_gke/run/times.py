"""Times, in the two forms the run writes them: ISO-8601 UTC with milliseconds where XCom and task states hold them
(read back as epoch seconds), and to the second with a ``Z`` where people read them (reports, alerts, the view).
The one home of both: every module formats and parses times here."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def epoch_of(value: Any) -> float | None:
    """Epoch seconds of an ISO-8601 time (None for a missing or unreadable one)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def iso_of(epoch: float) -> str:
    """Epoch seconds as an ISO-8601 UTC time, the form every time in XCom takes."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def iso_now() -> str:
    """Now as an ISO-8601 UTC time, the form every time in XCom takes."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def shown(epoch: float | None) -> str | None:
    """Epoch seconds as people read them: ``2026-12-05T10:00:00Z`` (None for None)."""
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def shown_or_dash(epoch: float | None) -> str:
    """:func:`shown`, with ``-`` for a time that is not there (a table's empty cell)."""
    return shown(epoch) or "-"


def shown_value(value: Any) -> str | None:
    """An aware or naive datetime (naive is UTC) or an ISO-8601 text, as :func:`shown` writes it; text that is not
    a time is kept, cut to 40 characters (None for None)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        at = value if value.tzinfo else value.replace(tzinfo=UTC)
        return shown(at.timestamp())
    try:
        return shown_value(datetime.fromisoformat(str(value)))
    except ValueError:
        return str(value)[:40]
