"""A DAG's alert settings: where its alerts go and whether a run has a deadline (a schedule file sets them).

Plain data, checked when built: the schedule files and the DAG factory read it; :mod:`nemo_rl_gke.alerts` sends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from nemo_rl_gke.run.airflow_settings import CONN_ID, SECTION


class AlertSettingsError(ValueError):
    """A schedule's alert settings are malformed."""


@dataclass(frozen=True)
class AlertSettings:
    """What a DAG's alerts do: where they go and whether a run has a deadline.

    :param connections: alert connection ids; empty means every one of the deployment's ``alert_conn_ids``. Ids
        the deployment does not allow are dropped with an error in the log when an alert is sent.
    :param deadline_hours: hours after a run is queued by which it should be done; past it, a deadline alert is
        sent (once; nothing if the run ends first). None: no deadline alert.
    """

    connections: tuple[str, ...] = ()
    deadline_hours: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.connections, str) or not isinstance(self.connections, Sequence):
            raise AlertSettingsError(
                f"alerts.connections={self.connections!r}: must be a list of connection ids. Fix: write a list, "
                f"e.g. [alert_webhook], or leave it out for every connection in [{SECTION}] alert_conn_ids"
            )
        for conn_id in self.connections:
            if not isinstance(conn_id, str) or not CONN_ID.fullmatch(conn_id):
                raise AlertSettingsError(
                    f"alerts.connections: {str(conn_id)[:80]!r} is not a connection id (1-250 letters, digits, "
                    f"'_', '.' or '-'). Fix: name connections listed in the deployment's [{SECTION}] alert_conn_ids"
                )
        object.__setattr__(self, "connections", tuple(dict.fromkeys(self.connections)))
        hours = self.deadline_hours
        if hours is not None and (
            isinstance(hours, bool) or not isinstance(hours, (int, float)) or not math.isfinite(hours) or hours <= 0
        ):
            raise AlertSettingsError(
                f"alerts.deadline_hours={hours!r}: must be a number of hours greater than 0. Fix: set how many hours "
                "after it is queued a run should be done (e.g. 6), or leave it out for no deadline alert"
            )
