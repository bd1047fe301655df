"""The deployment's section of the Airflow config, and the one setting read while a DAG file is parsed.

The section's name and environment prefix, the rule a connection id follows, and ``max_active_runs`` (the DAG
object needs it when it is built). Everything else of the deployment is read at run time
(:mod:`nemo_rl_gke.run.deployment`); this module stays small because every DAG file imports it.
"""

from __future__ import annotations

import os
import re

SECTION = "nemo_rl_gke"
ENV_PREFIX = f"AIRFLOW__{SECTION.upper()}__"
CONN_ID = re.compile(r"[A-Za-z0-9_.-]{1,250}")
DEFAULT_MAX_ACTIVE_RUNS = 4
MAX_ACTIVE_RUNS_CEILING = 64


class DeploymentError(ValueError):
    """The deployment's settings are malformed: an admin must fix the Airflow config, not the run conf."""


def whole_number(raw: str, name: str) -> int:
    """The setting ``name``'s text as an integer, or a :class:`DeploymentError` naming the setting and the fix."""
    try:
        return int(raw.strip())
    except ValueError:
        raise DeploymentError(
            f"[{SECTION}] {name} must be a whole number (got {raw.strip()[:40]!r}). Fix it in airflow.cfg or "
            f"{ENV_PREFIX}{name.upper()}"
        ) from None


def max_active_runs_problem(value: object) -> str | None:
    """Why ``value`` is no valid ``max_active_runs``, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ACTIVE_RUNS_CEILING:
        return f"max_active_runs must be a whole number from 1 to {MAX_ACTIVE_RUNS_CEILING} (got {str(value)[:40]})"
    return None


def max_active_runs() -> int:
    """``[nemo_rl_gke] max_active_runs``, read while a DAG file is parsed: one config lookup, no connection. A bad
    value is the DAG file's import error, naming the setting and the fix."""
    try:
        from airflow.configuration import conf  # lazy: only inside Airflow
    except ImportError:
        raw = os.environ.get(ENV_PREFIX + "MAX_ACTIVE_RUNS")
    else:
        raw = conf.get(SECTION, "max_active_runs", fallback=None)
    if raw is None or not str(raw).strip():
        return DEFAULT_MAX_ACTIVE_RUNS
    value = whole_number(str(raw), "max_active_runs")
    problem = max_active_runs_problem(value)
    if problem:
        raise DeploymentError(f"[{SECTION}] settings are not valid: {problem}. Fix it in airflow.cfg or {ENV_PREFIX}"
                              "MAX_ACTIVE_RUNS")  # fmt: skip
    return value
