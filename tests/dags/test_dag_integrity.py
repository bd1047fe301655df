"""DAG integrity: imports, tags, retries, docs, params <-> RunSpec, valid defaults, and no parse-time lookups."""

from __future__ import annotations

import ast
import json
from typing import Any

import pytest

from nemo_rl_gke.dag_params import FORM_OPEN_SECTION, PARAM_SCHEMA_DIALECT, form_fields, form_section
from nemo_rl_gke.preflight.offline import check_conf
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.conf_schema import param_schema, recipe_defaulted, spec_fields
from nemo_rl_gke.run.deployment import DEFAULT_MAX_ACTIVE_RUNS
from nemo_rl_gke.run.ownership import SWEEPER_DAG_ID
from nemo_rl_gke.run.paths import SCHEDULES_DIR
from nemo_rl_gke.run.recipes import with_recipe_defaults
from nemo_rl_gke.run.schedules import load_schedules
from nemo_rl_gke.run.spec import RunSpec
from tests.dags.guard import parse_dag_folder, present
from tests.owners import owner_of
from tests.paths import ROOT

MANUAL = "nemo_rl_grpo_gke"
SCHEDULES = {s.dag_id: s for s in load_schedules(SCHEDULES_DIR)}
DAG_IDS = [MANUAL, *SCHEDULES]
# Not a run's DAG: the sweeper has its own checks below.
OTHER_DAG_IDS = [SWEEPER_DAG_ID]


@pytest.fixture(scope="module")
def dagbag():
    return parse_dag_folder(ROOT / "dags")


def test_no_import_errors(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert sorted(dagbag.dag_ids) == sorted(DAG_IDS + OTHER_DAG_IDS)


def test_a_parse_time_variable_lookup_fails_the_guard() -> None:
    bad = parse_dag_folder(ROOT / "tests/fixtures/bad_dags")
    (error,) = bad.import_errors.values()
    assert "Variable lookup called at DAG parse time" in error
    # The guard skips only what an Airflow does not have; the task SDK's own lookups are there on every version.
    assert all(present(f"airflow.sdk.execution_time.context.{name}") for name in ("_get_connection", "_get_variable"))


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_tags_retries_docs_and_concurrency(dagbag, dag_id: str) -> None:
    dag = dagbag.dags[dag_id]
    assert {"nemo-rl", "grpo", "gke"} <= set(dag.tags)
    assert dag.doc_md and "NeMo RL GRPO on GKE" in dag.doc_md
    # Runs of different groups go side by side; a schedule's nights are one group, so one at a time.
    assert dag.max_active_runs == (1 if dag_id in SCHEDULES else DEFAULT_MAX_ACTIVE_RUNS) and dag.catchup is False
    assert dag.default_args["retries"] >= 1
    # Validation is deterministic: retrying a bad conf cannot help.
    assert dag.get_task(topology.VALIDATE).retries == 0
    assert dag.get_task(topology.PLAN).retries >= 1
    # validate feeds plan, and is the setup of the run report (which runs whenever the conf was valid).
    assert dag.get_task(topology.VALIDATE).downstream_task_ids == {topology.PLAN, topology.RUN_REPORT}
    report = dag.get_task(topology.RUN_REPORT)
    # It counts for the run's state: after a stall (train.wait failed, the checkpoint steps after it succeeded) it is
    # the task that fails the run.
    assert report.is_teardown and report.on_failure_fail_dagrun
    assert dag.get_task(topology.CHECK_CHECKPOINT).trigger_rule == "all_done"
    assert dag.description


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_every_param_is_a_runspec_field_and_back(dagbag, dag_id: str) -> None:
    dag = dagbag.dags[dag_id]
    # Every field once, in the form's order (sections a person changes first, each opening with its lead fields).
    assert list(dag.params.keys()) == [f.name for f in form_fields()]
    assert sorted(dag.params.keys()) == sorted(f.name for f in spec_fields())
    for f in spec_fields():
        param = dag.params.get_param(f.name)
        schema = param_schema(f.name)
        assert param.description == schema.pop("description")
        assert param.schema == {"$schema": PARAM_SCHEMA_DIALECT, **schema, "section": form_section(f)}, f.name


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_the_form_submits_with_its_defaults(dagbag, dag_id: str) -> None:
    """FACTS §11: the form blocks Trigger while a field typed without "null" is null or ""; an optional field is
    typed ["null", T] and starts as None."""
    params = dagbag.dags[dag_id].params
    for name in params:
        param = params.get_param(name)
        kinds = param.schema["type"] if isinstance(param.schema["type"], list) else [param.schema["type"]]
        if "null" not in kinds:
            assert param.value not in (None, ""), f"{name} is required by the form but has no default"
        # What the form sends for a field left alone is accepted by Airflow's own validation.
        param.resolve(param.value)
    blank = {name for name in params if params.get_param(name).value is None}
    assert blank >= {
        "machine_type",
        "peering_range_address",
        "image_tag",
        "extra_overrides",
        "wandb_project",
        "export_bucket",
    }
    # The first section is the one the form opens, and it holds what a person sets first.
    first = params.get_param(next(iter(params)))
    assert first.schema["section"] == FORM_OPEN_SECTION
    assert list(params)[:3] == ["mode", "recipe", "stop_after"]


def test_a_default_trigger_is_a_plan_of_the_tutorial_conf(dagbag) -> None:
    defaults = dagbag.dags[MANUAL].params.dump()
    tutorial = json.loads((ROOT / "include/conf/tutorial.json").read_text())
    # The parameters the recipe decides start empty, and the tutorial's recipe fills in the tutorial's values.
    assert [key for key in recipe_defaulted() if defaults[key] is not None] == []
    filled = with_recipe_defaults(defaults)
    assert {key: filled[key] for key in tutorial} == tutorial
    assert defaults["mode"] == "plan"


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_every_default_conf_is_valid(dagbag, dag_id: str) -> None:
    defaults = {k: v for k, v in dagbag.dags[dag_id].params.dump().items()}
    spec, findings = check_conf(defaults)
    assert findings == [] and spec is not None
    assert spec.mode == ("apply" if dag_id in SCHEDULES else "plan")


@pytest.mark.parametrize("dag_id", list(SCHEDULES))
def test_a_schedule_file_is_a_paused_cron_dag_whose_form_defaults_are_its_conf(dagbag, dag_id: str) -> None:
    dag, schedule = dagbag.dags[dag_id], SCHEDULES[dag_id]
    assert dag.timetable.summary == schedule.cron and str(dag.timetable._timezone) in (schedule.timezone, "UTC")
    assert dag.is_paused_upon_creation is True and dag.catchup is False
    assert "scheduled" in dag.tags and schedule.description in dag.doc_md
    defaults = dag.params.dump()
    assert {key: defaults[key] for key in schedule.run_conf} == schedule.run_conf
    assert defaults["resume"] == "latest" and defaults["steps_per_run"] == schedule.steps_per_run
    # Its checkpoints go on an Asset of its own, its published models on another: the lineages a resumed night reads
    # (resume latest, or promoted).
    export, resume = dag.get_task(topology.EXPORT), dag.get_task(topology.RESUME)
    publish = dag.get_task(topology.PUBLISH)
    assert [a.name for a in export.outlets] == [topology.checkpoint_asset(dag_id)]
    assert [a.name for a in publish.outlets] == [a.name for a in publish.inlets] == [topology.published_asset(dag_id)]
    assert [a.name for a in resume.inlets] == [topology.checkpoint_asset(dag_id), topology.published_asset(dag_id)]


def test_a_bad_schedule_file_is_an_import_error_naming_the_file_the_field_and_the_fix(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nemo_rl_gke.run.paths

    (tmp_path / "nightly.yaml").write_text((SCHEDULES_DIR / "nightly-tutorial.yaml").read_text().replace(
        'cron: "0 1 * * *"', 'cron: "every night"'
    ))  # fmt: skip
    monkeypatch.setattr(nemo_rl_gke.run.paths, "SCHEDULES_DIR", tmp_path)
    bag = parse_dag_folder(ROOT / "dags")
    (error,) = bag.import_errors.values()
    assert f"schedule file {tmp_path / 'nightly.yaml'}: cron: 'every night' is not a cron expression" in error
    assert 'Fix: use five fields, e.g. "0 1 * * *"' in error
    # The manual DAG is in another file: it still parses.
    assert MANUAL in bag.dag_ids


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_the_built_dag_is_exactly_the_topology(dagbag, dag_id: str) -> None:
    dag = dagbag.dags[dag_id]
    assert {task.task_id for task in dag.tasks} == set(topology.STEPS)
    edges = {(up, task.task_id) for task in dag.tasks for up in task.upstream_task_ids}
    assert edges == topology.edges()
    for task in dag.tasks:
        step = topology.step(task.task_id)
        assert task.task_group.group_id == step.group, task.task_id
        if step.retries is not None:
            assert task.retries == step.retries, task.task_id
        assert task.doc_md == step.doc and step.doc, task.task_id
        if step in topology.provisioning() and len(step.needs) > 1:
            assert task.trigger_rule == "none_failed_min_one_success", task.task_id


def test_teardown_tasks_are_teardowns_of_their_setups(dagbag) -> None:
    dag = dagbag.dags["nemo_rl_grpo_gke"]
    deletes = [dag.get_task(s.task_id) for s in topology.teardown_steps()]
    assert deletes and all(t.is_teardown for t in deletes)
    # Deletions need the live preflight; the lease's release needs the lease, and waits for every deletion.
    for t in deletes:
        setup = topology.LEASE if t.task_id == topology.RELEASE_LEASE else topology.PREFLIGHT_LIVE
        assert setup in t.upstream_task_ids, t.task_id
    release = dag.get_task(topology.RELEASE_LEASE)
    assert {s.task_id for s in topology.teardown_steps()} - {topology.RELEASE_LEASE} <= release.upstream_task_ids | {
        u for t in release.upstream_task_ids for u in dag.get_task(t).get_flat_relative_ids(upstream=True)
    }
    # Only the network deletions count for the run's state: a failed ensure still fails the run.
    counted = {t.task_id for t in deletes if t.on_failure_fail_dagrun}
    assert counted == {topology.DELETE_NET, topology.DELETE_GVNIC_NET, topology.DELETE_RDMA_NET}
    # One ensure task per resource of the registry; every resource but the node pool has a teardown step.
    from nemo_rl_gke.gcp.resources import resources
    from nemo_rl_gke.run.spec import RunSpec

    registry = resources(RunSpec(), owner_of(RunSpec()))
    assert [s.task_id for s in topology.gcp_resources()] == list(registry)
    deleted = {target for t in topology.teardown_steps() for target in t.deletes}
    assert set(registry) - deleted == {topology.NODE_POOL}
    # Teardown starts only when every provisioning task has finished.
    provisioning = {s.task_id for s in topology.provisioning()}
    for root in (topology.DELETE_RAYCLUSTER, topology.DELETE_GVNIC_FW):
        assert provisioning <= dag.get_task(root).upstream_task_ids
    # The RayCluster goes first, then the other objects, then the cluster and Lustre they live in and on.
    assert topology.DELETE_RAYCLUSTER in dag.get_task(topology.DELETE_KUBE_OBJECTS).upstream_task_ids
    for infra in (topology.DELETE_LUSTRE, topology.DELETE_CLUSTER):
        assert topology.DELETE_KUBE_OBJECTS in dag.get_task(infra).upstream_task_ids


def _task_id_literals(tree: ast.AST) -> list[ast.Constant]:
    """String literals that name a task: a grouped id or group prefix anywhere; a top-level id ("validate", "plan",
    ...: also ordinary words) where a task is named: task_id(s)=/step= arguments and (task_id, key) XCom pairs."""
    grouped = {i for i in topology.STEPS if "." in i} | {f"{s.group}." for s in topology.STEPS.values() if s.group}
    top = {i for i in topology.STEPS if "." not in i}
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in grouped]
    for node in ast.walk(tree):
        named = []
        if isinstance(node, ast.keyword) and node.arg in ("task_id", "task_ids", "step"):
            named = [node.value, *getattr(node.value, "elts", [])]
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2:
            named = [node.elts[0]]
        found += [n for n in named if isinstance(n, ast.Constant) and n.value in top]
    return found


def test_no_task_id_is_written_outside_the_topology() -> None:
    """Every task id is read from nemo_rl_gke.run.topology: a rename there renames it everywhere."""
    offenders = []
    for path in [*(ROOT / "plugins").rglob("*.py"), *(ROOT / "dags").rglob("*.py")]:
        if path.name != "topology.py":
            tree = ast.parse(path.read_text())
            offenders += [f"{path.relative_to(ROOT)}:{n.lineno}: {n.value!r}" for n in _task_id_literals(tree)]
    assert offenders == []
    # The check itself can fail: it finds each kind of literal it is meant to find.
    planted = ast.parse(f'pull(x, "{topology.WAIT}"); a = {{("report", "text"): 1}}; f(task_ids="plan"); "storage."')
    assert sorted(n.value for n in _task_id_literals(planted)) == ["plan", "report", "storage.", topology.WAIT]


def test_every_task_group_says_what_it_does_and_what_to_do_when_it_fails(dagbag) -> None:
    dag = dagbag.dags["nemo_rl_grpo_gke"]
    groups = {step.group for step in topology.STEPS.values() if step.group}
    for name in groups:
        group = dag.task_group_dict[name]
        assert group.tooltip, name
        if hasattr(group, "doc_md"):  # a group's docs came with Airflow 3.3 (airflow_compat.task_group)
            assert group.doc_md and "**If it fails**" in group.doc_md, name


def cron(timetable: Any) -> str:
    """A cron timetable's expression: the task SDK's (3.3) names it ``expression``, airflow-core's (3.1) ``summary``."""
    return getattr(timetable, "expression", None) or timetable.summary


def test_the_sweeper_is_hourly_paused_at_creation_and_alone() -> None:
    from nemo_rl_gke.operators.sweeper import SweepOperator

    dag = parse_dag_folder(ROOT / "dags").dags[SWEEPER_DAG_ID]
    assert dag.is_paused_upon_creation is True and dag.catchup is False and dag.max_active_runs == 1
    # "@hourly" becomes a cron trigger at minute 0 (FACTS §12), without data intervals.
    assert type(dag.timetable).__name__ == "CronTriggerTimetable" and cron(dag.timetable) == "0 * * * *"
    assert {"nemo-rl", "gke", "sweeper"} <= set(dag.tags) and dag.description
    assert dag.doc_md and "NeMo RL GKE sweeper" in dag.doc_md and "docs/sweeper.md" in dag.doc_md
    assert dag.default_args["retries"] >= 1
    (task,) = dag.tasks
    assert isinstance(task, SweepOperator)


def test_the_sweeper_params_have_a_schema_and_valid_defaults() -> None:
    from nemo_rl_gke.operators.sweeper import sweep_params

    dag = parse_dag_folder(ROOT / "dags").dags[SWEEPER_DAG_ID]
    assert list(dag.params.keys()) == ["project", "dry_run", "warm_ttl_hours"]
    types = {name: dag.params.get_param(name).schema["type"] for name in dag.params}
    assert types == {"project": "string", "dry_run": "boolean", "warm_ttl_hours": "number"}
    for name in dag.params:
        param = dag.params.get_param(name)
        assert param.description and param.schema.get("title"), name
    defaults = dag.params.dump()
    assert defaults == {"project": RunSpec().project, "dry_run": False, "warm_ttl_hours": 24}
    assert sweep_params(defaults) == (RunSpec().project, False, 24.0)


def test_the_sweeper_asks_for_the_project_as_a_run_does(dagbag) -> None:
    """The sweeper's project param is the run's (type, bounds, title, default), built from the same definition; the
    sweep then checks it with the run's rules. Its TTL bound is the one the sweep enforces."""
    from nemo_rl_gke.airflow_compat import AirflowFailException
    from nemo_rl_gke.dag_params import WARM_TTL_MAX_HOURS
    from nemo_rl_gke.operators.sweeper import SWEEP_PARAMS, sweep_params

    sweeper = dagbag.dags[SWEEPER_DAG_ID].params
    run = dagbag.dags[MANUAL].params.get_param("project")
    assert sweeper.get_param("project").schema == {k: v for k, v in run.schema.items() if k != "section"}
    assert sweeper.get_param("project").value == run.value
    assert tuple(sweeper.keys()) == SWEEP_PARAMS
    assert sweeper.get_param("warm_ttl_hours").schema["maximum"] == WARM_TTL_MAX_HOURS
    assert sweep_params({"warm_ttl_hours": WARM_TTL_MAX_HOURS, "project": run.value})[2] == WARM_TTL_MAX_HOURS
    with pytest.raises(AirflowFailException, match="warm_ttl_hours"):
        sweep_params({"warm_ttl_hours": WARM_TTL_MAX_HOURS + 1, "project": run.value})
