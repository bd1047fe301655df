"""Schedule files: what a good one becomes, and how each kind of bad one is refused (file, field, fix)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nemo_rl_gke.preflight.offline import check_conf
from nemo_rl_gke.run.paths import SCHEDULES_DIR
from nemo_rl_gke.run.schedules import ScheduleError, load_schedule, load_schedules
from nemo_rl_gke.run.spec import default_conf

EXAMPLE = yaml.safe_load((SCHEDULES_DIR / "nightly-tutorial.yaml").read_text())


def _write(tmp_path: Path, data: object, name: str = "nightly.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_the_shipped_example_is_the_tutorials_run_nightly_in_apply_mode_and_valid() -> None:
    (schedule,) = load_schedules(SCHEDULES_DIR)
    assert (schedule.dag_id, schedule.cron, schedule.timezone) == (
        "nemo_rl_grpo_gke__nightly-tutorial",
        "0 1 * * *",
        "UTC",
    )
    conf = {**default_conf(), **schedule.run_conf}
    spec, findings = check_conf(conf)
    assert findings == [] and spec is not None
    assert (spec.mode, spec.recipe, spec.worker_replicas, spec.gpu_type) == (
        "apply",
        "gemma3-27b-gsm8k-v0.5.0",
        2,
        "b200",
    )
    assert (spec.resume, spec.steps_per_run, spec.lease_held) == ("latest", 20, "skip")
    assert spec.teardown_policy == "keep_cluster_and_storage"
    assert schedule.alerts.deadline_hours == 8 and schedule.warm_ttl_hours == 36


@pytest.mark.parametrize(
    ("change", "where", "fix"),
    [
        ({"cron": "nightly"}, "cron: 'nightly' is not a cron expression", 'use five fields, e.g. "0 1 * * *"'),
        ({"timezone": "Mars/Olympus"}, "timezone: 'Mars/Olympus' is not an IANA time zone", "UTC or Europe/Berlin"),
        ({"steps_per_run": 0}, "steps_per_run: 0 is out of range", "set steps_per_run at least 1"),
        ({"steps_per_run": 2.5}, "steps_per_run: 2.5 is not a whole number", "a whole number"),
        ({"steps_per_run": True}, "steps_per_run: True is not a whole number", "a whole number"),
        ({"resume": "yesterday"}, "resume: 'yesterday' is not one of latest, promoted, none", "use one of"),
        ({"on_overlap": "queue"}, "on_overlap: 'queue' is not one of skip, wait", "use one of"),
        ({"warm_ttl_hours": -1}, "warm_ttl_hours: -1 is out of range", "between 0.25 and 720"),
        ({"alerts": {"connections": "slack"}}, "alerts.connections: 'slack' is not a list", "connection ids"),
        ({"alerts": {"to": ["x"]}}, "alerts: {'to': ['x']} is not a mapping", "deadline_hours"),
        ({"alerts": {"connections": ["a b"]}}, "alerts.connections: 'a b' is not a connection id", "alert_conn_ids"),
        ({"alerts": {"deadline_hours": float("nan")}}, "alerts.deadline_hours: nan is out of range", "between 0.1"),
        ({"warm_ttl_hours": float("inf")}, "warm_ttl_hours: inf is out of range", "between 0.25 and 720"),
        ({"description": ""}, "description: missing or not text", "say what the schedule is for"),
        ({"crom": "0 1 * * *"}, "crom: unknown field", "use only description, cron"),
        ({"conf": None}, "conf: missing, or not a mapping", "at least mode: apply"),
        ({"conf": {**EXAMPLE["conf"], "mode": "plan"}}, "conf.mode: a schedule that only plans never trains", "apply"),
        ({"conf": {**EXAMPLE["conf"], "max_step": 5}}, "conf.max_step:", "max_steps"),
        ({"conf": {**EXAMPLE["conf"], "worker_replicas": "2"}}, "conf.worker_replicas:", "integer"),
        ({"conf": {**EXAMPLE["conf"], "resume": "none"}}, "conf.resume: is set by the schedule's own field", "resume"),
        ({"conf": {**EXAMPLE["conf"], "hf_token": "hf_abcdefghijklmnopqrstuvwxyz012345"}}, "conf.hf_token:", ""),
    ],
)
def test_a_bad_field_is_refused_naming_the_file_the_field_and_the_fix(
    tmp_path: Path, change: dict, where: str, fix: str
) -> None:
    path = _write(tmp_path, {**EXAMPLE, **change})
    with pytest.raises(ScheduleError) as refused:
        load_schedule(path)
    message = str(refused.value)
    assert message.startswith(f"schedule file {path}: {where}"), message
    assert "Fix: " in message and fix in message.split("Fix: ", 1)[1], message
    assert "hf_abcdefghijklmnopqrstuvwxyz012345" not in message


@pytest.mark.parametrize(
    ("text", "name", "where"),
    [
        ("cron: [unclosed", "nightly.yaml", "YAML"),
        ("- a list", "nightly.yaml", "top level"),
        ("{}", "Nightly Run.yaml", "file name"),
    ],
)
def test_a_file_that_is_not_a_schedule_is_refused(tmp_path: Path, text: str, name: str, where: str) -> None:
    with pytest.raises(ScheduleError, match=f": {where}: "):
        load_schedule(_write(tmp_path, text, name))


def test_a_schedule_alerts_where_it_says_and_has_its_deadline(tmp_path: Path) -> None:
    from nemo_rl_gke.dag_factory import build_scheduled_dags

    _write(tmp_path, {**EXAMPLE, "alerts": {"connections": ["alert_webhook"], "deadline_hours": 2.5}})
    (dag,) = build_scheduled_dags(tmp_path).values()
    report = dag.get_task("report")
    assert report.alert_connections == ("alert_webhook",)
    assert "`alert_webhook`" in dag.doc_md and "2.5 h after it was queued" in dag.doc_md
    (deadline,) = dag.deadline if isinstance(dag.deadline, list) else [dag.deadline]
    assert deadline.interval.total_seconds() == 2.5 * 3600
    assert deadline.callback.kwargs["connections"] == ["alert_webhook"]


def test_a_schedule_without_a_deadline_has_none_and_alerts_every_allowed_connection(tmp_path: Path) -> None:
    from nemo_rl_gke.dag_factory import build_scheduled_dags

    _write(tmp_path, {**EXAMPLE, "alerts": {"connections": []}})
    (dag,) = build_scheduled_dags(tmp_path).values()
    assert not dag.deadline and dag.get_task("report").alert_connections == ()


def test_each_scheduled_group_has_its_own_warm_ttl_for_the_sweeper(tmp_path: Path) -> None:
    from nemo_rl_gke.run.schedules import warm_ttls
    from nemo_rl_gke.run.spec import RunSpec

    _write(tmp_path, {**EXAMPLE, "warm_ttl_hours": 6}, "a.yaml")
    other = {**EXAMPLE["conf"], "cluster_name": "nemo-rl-other"}
    _write(tmp_path, {**EXAMPLE, "warm_ttl_hours": 48, "conf": other}, "b.yaml")
    group_a = RunSpec.from_conf({**EXAMPLE["conf"], **load_schedule(tmp_path / "a.yaml").run_conf}).group_id
    ttls = warm_ttls(tmp_path)
    assert ttls[group_a] == 6.0 and len(ttls) == 2 and 48.0 in ttls.values()
    assert group_a.startswith(EXAMPLE["conf"].get("cluster_name", RunSpec().cluster_name))
