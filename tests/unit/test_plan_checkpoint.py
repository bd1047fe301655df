"""The plan layer's checkpoint requests and resume arithmetic: pure functions of the RunSpec and the lineage."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import pytest

from nemo_rl_gke.plan.build import build_plan
from nemo_rl_gke.plan.resume import ResumeBudgetError, check_resume_budget, lineage_of, resume_point, set_aside
from nemo_rl_gke.plan.transfers import LayoutError, import_source, lustre_export_request, lustre_import_request
from nemo_rl_gke.plan.validation import validation_job
from nemo_rl_gke.run.recipes import load_recipe
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.steps import final_step
from tests.paths import ROOT

DAG, RUN = "nemo_rl_nightly", "scheduled__2026-12-01T01:00:00+00:00"
SPEC = RunSpec.from_conf({"checkpoint_dir": "/data/nightly", "resume": "latest", "steps_per_run": 20})


def _event(extra: object, run: str = "scheduled__1") -> SimpleNamespace:
    return SimpleNamespace(extra=extra, source_dag_id=DAG, source_run_id=run)


def test_the_lineage_keeps_only_our_exports_oldest_first() -> None:
    events = [
        _event({"uri": "gs://b/a/", "step": 20, "parent": None, "metrics": {"first_reward": 0.1, "last_reward": 0.4}}),
        _event({"uri": "gs://b/x/", "step": "20"}),  # another producer's event: its step is no int
        _event(None),
        _event({"uri": "gs://b/c/", "step": 40, "parent": "gs://b/a/"}, run="scheduled__2"),
    ]
    assert lineage_of(events) == [
        {"run": f"{DAG}/scheduled__1", "step": 20, "uri": "gs://b/a/", "parent": None,
         "first_reward": 0.1, "last_reward": 0.4},
        {"run": f"{DAG}/scheduled__2", "step": 40, "uri": "gs://b/c/", "parent": "gs://b/a/",
         "first_reward": None, "last_reward": None},
    ]  # fmt: skip


def test_the_resume_point_is_the_newest_step_plus_the_budget() -> None:
    start = resume_point(SPEC, [])
    assert (start.parent, start.start, start.max_steps) == (None, 0, 20)
    point = resume_point(SPEC, [{"step": 20, "uri": "gs://b/a/"}, {"step": 40, "uri": "gs://b/c/"}])
    assert (point.parent, point.start, point.max_steps) == ({"step": 40, "uri": "gs://b/c/"}, 40, 60)
    no_budget = RunSpec.from_conf({"resume": "latest", "max_steps": 50})
    assert resume_point(no_budget, [{"step": 40, "uri": "u"}]).max_steps == 50


def test_a_promoted_resume_sets_aside_only_the_lineages_later_exports() -> None:
    import dataclasses

    exported = [{"step": 3, "uri": "a"}, {"step": 6, "uri": "b"}, {"step": 9, "uri": "c"}, {"step": 6, "uri": "d"}]
    promoted = dataclasses.replace(SPEC, resume="promoted")
    assert set_aside(promoted, exported, 3) == [6, 9]
    assert set_aside(promoted, exported, 9) == []
    assert set_aside(promoted, exported, 0) == [3, 6, 9]  # nothing published yet: from scratch
    assert set_aside(dataclasses.replace(SPEC, resume="latest"), exported, 3) == []


def test_the_resume_budget_refuses_a_run_that_trains_nothing_or_that_the_epoch_cap_cuts() -> None:
    assert check_resume_budget(SPEC, 40, 60).startswith("step 40 + 20 = ")
    with pytest.raises(ResumeBudgetError, match="max_steps=40 is not past the resumed step 40"):
        check_resume_budget(SPEC, 40, 40)
    # The tutorial's dataset allows 467 steps per epoch and one epoch.
    with pytest.raises(ResumeBudgetError, match="epoch cap ends the job first"):
        check_resume_budget(SPEC, 460, 480)


def test_the_transfers_keep_their_request_ids_and_send_everything_but_the_name() -> None:
    export = lustre_export_request(SPEC, DAG, RUN, 60)
    assert export.path == f"/v1/{SPEC.lustre_path}:exportData"
    assert export.body == {
        "lustrePath": {"path": "/nightly/step_60"},
        "gcsPath": {"uri": SPEC.export_uri(DAG, RUN, 60)},
        "requestId": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{DAG}/{RUN}/60")),  # what a retried export reuses
    }
    assert export.message.name == SPEC.lustre_path
    source = import_source(SPEC, SPEC.export_uri(DAG, RUN, 40), 40)
    assert source == SPEC.export_prefix(DAG, RUN)
    imported = lustre_import_request(SPEC, DAG, "scheduled__next", source, 40)
    assert imported.path == f"/v1/{SPEC.lustre_path}:importData"
    assert imported.body == {
        "gcsPath": {"uri": source},
        "lustrePath": {"path": "/"},
        "requestId": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{DAG}/scheduled__next/import/40")),
    }
    with pytest.raises(LayoutError, match="is not laid out as nightly/step_40/"):
        import_source(SPEC, "gs://b/dag/run/elsewhere/step_40/", 40)


def test_the_validation_job_ships_the_remote_folder_and_no_secret() -> None:
    job = validation_job(SPEC, DAG, RUN, "nemo-rl-x-1", {"step": 60, "training_ranks": 8})
    assert job.submission_id == "nemo-rl-x-1-validate"
    assert job.entrypoint.startswith('python -m remote validate "${SANDBOX_DATA_DIR:-/data}"/nightly --expect ')
    assert job.secrets == () and job.env_vars == {}
    assert job.runtime_env() == {"env_vars": {}, "working_dir": {"files": ["nemo_rl_gke/remote"]}}
    assert (ROOT / "plugins" / job.working_dir_files[0] / "__main__.py").is_file()
    assert job.metadata == {"airflow_dag_id": DAG, "airflow_run_id": RUN, "purpose": "validate"}


def test_a_resume_plan_shows_the_import_and_a_plain_one_does_not() -> None:
    resumed = build_plan(SPEC, dag_id=DAG, run_id=RUN)
    assert resumed.checkpoint.resume_import is not None
    assert resumed.checkpoint.resume_import.path.endswith(":importData")
    assert resumed.checkpoint.resume_import.body["lustrePath"] == {"path": "/"}
    assert "[train.resume, before the job is submitted" in resumed.to_text()
    assert resumed.checkpoint.export.body["lustrePath"]["path"] == "/nightly/step_<lineage step + 20>"
    plain = build_plan(RunSpec.from_conf({}), dag_id=DAG, run_id=RUN)
    assert plain.checkpoint.resume_import is None
    assert "importData" not in json.dumps(plain.to_dict())
    # The plan's validation job is the one the checkpoint step submits for the planned final step.
    expected = json.loads(
        plain.checkpoint.validation_job.entrypoint.split("--expect ")[1].split(" --list-steps")[0][1:-1]
    )
    assert expected["step"] == final_step(plain.spec, load_recipe(plain.spec.recipe)) and expected["stopped"] is False
