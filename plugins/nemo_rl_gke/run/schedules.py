"""Schedule files: ``include/schedules/<name>.yaml`` each become one scheduled DAG, ``nemo_rl_grpo_gke__<name>``.

A file holds the cron expression and its time zone, a partial conf laid over the defaults, the step budget of each
run and how runs continue (``resume``), what to do when the previous run still holds the group, how long a warm group
may idle before the sweeper removes it, and the alerts. Example (``include/schedules/nightly-tutorial.yaml``)::

    description: The tutorial's model on the tutorial's shape, every night.
    cron: "0 1 * * *"
    timezone: UTC
    steps_per_run: 20
    resume: latest
    on_overlap: skip            # or wait (up to overlap_wait_minutes)
    warm_ttl_hours: 36
    alerts: {connections: [], deadline_hours: 8}
    conf: {mode: apply, teardown_policy: keep_cluster_and_storage, ...}

Parsing runs while Airflow parses the DAG file, so it only reads the files and checks them against the conf's own
schema (no Airflow connection, variable or cloud lookup); a bad file raises :class:`ScheduleError`, naming the file,
the field and the fix, which Airflow shows as the DAG file's import error. The full preflight of each schedule's conf
runs in its DAG's ``validate`` task, and in the DAG-integrity tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_gke.run.alert_settings import AlertSettings, AlertSettingsError
from nemo_rl_gke.run.conf_checks import conf_findings

DAG_PREFIX = "nemo_rl_grpo_gke__"
# A schedule's name becomes part of a DAG id: lowercase letters, digits, '-' and '_'.
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
FIELDS = (
    "description",
    "cron",
    "timezone",
    "steps_per_run",
    "resume",
    "on_overlap",
    "overlap_wait_minutes",
    "warm_ttl_hours",
    "alerts",
    "conf",
)
# Conf keys a schedule sets through its own fields (one place for each).
_OWN_FIELDS = {
    "steps_per_run": "steps_per_run",
    "resume": "resume",
    "lease_held": "on_overlap",
    "lease_wait_s": "overlap_wait_minutes",
}


class ScheduleError(ValueError):
    """A schedule file that cannot become a DAG: which file, which field, what is wrong and the fix."""

    def __init__(self, path: Path, where: str, problem: str, fix: str) -> None:
        super().__init__(f"schedule file {path}: {where}: {problem}. Fix: {fix}")
        self.path, self.where = path, where


@dataclass(frozen=True)
class Schedule:
    """One schedule file, checked."""

    name: str
    path: Path
    description: str
    cron: str
    timezone: str
    steps_per_run: int
    resume: str
    on_overlap: str
    overlap_wait_minutes: float
    warm_ttl_hours: float
    alerts: AlertSettings
    conf: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dag_id(self) -> str:
        """The scheduled DAG's id."""
        return DAG_PREFIX + self.name

    @property
    def run_conf(self) -> dict[str, Any]:
        """The conf the schedule's runs get on top of the defaults: its partial conf and its own fields."""
        return {
            **self.conf,
            "resume": self.resume,
            "steps_per_run": self.steps_per_run,
            "lease_held": self.on_overlap,
            "lease_wait_s": round(self.overlap_wait_minutes * 60),
        }

    @property
    def group_id(self) -> str:
        """The run group the schedule's runs use (what the sweeper finds their warm resources under)."""
        # lazy: only the sweeper asks, so the RunSpec stays out of DAG parsing
        from nemo_rl_gke.run.spec import RunSpec

        return RunSpec.from_conf(self.run_conf).group_id


def load_schedules(directory: Path) -> list[Schedule]:
    """Every ``*.yaml`` in ``directory``, checked, by name; raises :class:`ScheduleError` on the first bad one."""
    return [load_schedule(path) for path in sorted(directory.glob("*.yaml"))]


def warm_ttls(directory: Path) -> dict[str, float]:
    """Each scheduled run group's ``warm_ttl_hours``, by group id (the longest, if two schedules share a group)."""
    ttls: dict[str, float] = {}
    for schedule in load_schedules(directory):
        ttls[schedule.group_id] = max(ttls.get(schedule.group_id, 0.0), float(schedule.warm_ttl_hours))
    return ttls


def load_schedule(path: Path) -> Schedule:
    """One schedule file, checked."""
    import yaml

    name = path.stem
    if not _NAME.fullmatch(name):
        raise ScheduleError(path, "file name", f"{name!r} cannot be part of a DAG id",
                            "name the file with lowercase letters, digits, '-' and '_' (at most 63)")  # fmt: skip
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ScheduleError(path, "YAML", str(exc).replace("\n", " "), "fix the YAML syntax") from exc
    if not isinstance(data, dict):
        raise ScheduleError(path, "top level", "must be a mapping of fields", f"use the fields {', '.join(FIELDS)}")
    unknown = sorted(str(k) for k in data if k not in FIELDS)
    if unknown:
        raise ScheduleError(path, unknown[0], "unknown field", f"use only {', '.join(FIELDS)}")
    return Schedule(
        name=name,
        path=path,
        description=_text(path, data, "description"),
        cron=_cron(path, data),
        timezone=_timezone(path, data),
        steps_per_run=_number(path, data, "steps_per_run", None, minimum=1, integer=True),
        resume=_choice(path, data, "resume", "latest", ("latest", "promoted", "none")),
        on_overlap=_choice(path, data, "on_overlap", "skip", ("skip", "wait")),
        overlap_wait_minutes=_number(path, data, "overlap_wait_minutes", 60, minimum=1, maximum=12 * 60),
        warm_ttl_hours=_number(path, data, "warm_ttl_hours", 24, minimum=0.25, maximum=24 * 30),
        alerts=_alerts(path, data.get("alerts")),
        conf=_conf(path, data.get("conf")),
    )


def _text(path: Path, data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ScheduleError(path, key, f"missing or not text ({value!r})", f"say what the schedule is for in {key}")
    return value.strip()


def _cron(path: Path, data: Mapping[str, Any]) -> str:
    from croniter import croniter

    value = data.get("cron")
    if not isinstance(value, str) or not croniter.is_valid(value):
        raise ScheduleError(path, "cron", f"{value!r} is not a cron expression",
                            'use five fields, e.g. "0 1 * * *" for 01:00 every day')  # fmt: skip
    return value


def _timezone(path: Path, data: Mapping[str, Any]) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    value = data.get("timezone", "UTC")
    try:
        ZoneInfo(str(value))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(path, "timezone", f"{value!r} is not an IANA time zone",
                            "use a name such as UTC or Europe/Berlin") from exc  # fmt: skip
    return str(value)


def _choice(path: Path, data: Mapping[str, Any], key: str, default: str, allowed: tuple[str, ...]) -> str:
    value = data.get(key, default)
    if value not in allowed:
        raise ScheduleError(path, key, f"{value!r} is not one of {', '.join(allowed)}", f"use one of {allowed}")
    return str(value)


def _number(
    path: Path,
    data: Mapping[str, Any],
    key: str,
    default: float | None,
    *,
    minimum: float,
    maximum: float | None = None,
    integer: bool = False,
    where: str | None = None,
) -> Any:
    value = data.get(key, default)
    label = where or key
    kinds = (int,) if integer else (int, float)
    bound = f"between {minimum:g} and {maximum:g}" if maximum is not None else f"at least {minimum:g}"
    if value is None or isinstance(value, bool) or not isinstance(value, kinds):
        wanted = "a whole number" if integer else "a number"
        raise ScheduleError(path, label, f"{value!r} is not {wanted}", f"set {label} to {wanted} {bound}")
    if not math.isfinite(value) or value < minimum or (maximum is not None and value > maximum):
        raise ScheduleError(path, label, f"{value!r} is out of range", f"set {label} {bound}")
    return value


def _alerts(path: Path, value: Any) -> AlertSettings:
    if value is None:
        return AlertSettings()
    if not isinstance(value, dict) or set(value) - {"connections", "deadline_hours"}:
        raise ScheduleError(path, "alerts", f"{value!r} is not a mapping of connections and deadline_hours",
                            "use alerts: {connections: [conn_id, ...], deadline_hours: 8}")  # fmt: skip
    connections = value.get("connections") or []
    if not isinstance(connections, list):
        raise ScheduleError(path, "alerts.connections", f"{connections!r} is not a list of connection ids",
                            "list Airflow connection ids the deployment allows for alerts")  # fmt: skip
    deadline = value.get("deadline_hours")
    if deadline is not None:
        where = "alerts.deadline_hours"
        deadline = float(_number(path, value, "deadline_hours", None, minimum=0.1, maximum=24 * 7, where=where))
    try:
        return AlertSettings(tuple(connections), deadline)
    except AlertSettingsError as exc:
        field_name, _, rest = str(exc).partition(": ")
        problem, _, fix = rest.partition(". Fix: ")
        raise ScheduleError(path, field_name.split("=")[0], problem, fix) from None


def _conf(path: Path, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScheduleError(path, "conf", "missing, or not a mapping of conf parameters",
                            "give the conf the runs differ from the defaults by, at least mode: apply")  # fmt: skip
    for key, own in _OWN_FIELDS.items():
        if key in value:
            raise ScheduleError(path, f"conf.{key}", "is set by the schedule's own field", f"set {own} instead")
    findings = conf_findings(value)
    if findings:
        first = findings[0]
        raise ScheduleError(path, f"conf.{first.param}", first.rule, first.fix)
    if value.get("mode") != "apply":
        raise ScheduleError(path, "conf.mode", "a schedule that only plans never trains",
                            "set mode: apply")  # fmt: skip
    return dict(value)
