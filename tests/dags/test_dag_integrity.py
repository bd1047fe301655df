"""DAG integrity: imports, tags, retries, docs, params <-> RunSpec, valid defaults, and no parse-time lookups."""

from __future__ import annotations

import pytest

from nemo_rl_gke.preflight import check_conf
from nemo_rl_gke.spec import param_schema, spec_fields
from tests.dags.guard import parse_dag_folder
from tests.paths import ROOT

DAG_IDS = ["nemo_rl_grpo_gke"]


@pytest.fixture(scope="module")
def dagbag():
    return parse_dag_folder(ROOT / "dags")


def test_no_import_errors(dagbag) -> None:
    assert dagbag.import_errors == {}
    assert sorted(dagbag.dag_ids) == sorted(DAG_IDS)


def test_a_parse_time_variable_lookup_fails_the_guard() -> None:
    bad = parse_dag_folder(ROOT / "tests/fixtures/bad_dags")
    (error,) = bad.import_errors.values()
    assert "Variable lookup called at DAG parse time" in error


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_tags_retries_docs_and_concurrency(dagbag, dag_id: str) -> None:
    dag = dagbag.dags[dag_id]
    assert {"nemo-rl", "grpo", "gke"} <= set(dag.tags)
    assert dag.doc_md and "NeMo RL GRPO on GKE" in dag.doc_md
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert dag.default_args["retries"] >= 1
    # Validation is deterministic: retrying a bad conf cannot help.
    assert dag.get_task("validate").retries == 0
    assert dag.get_task("plan").retries >= 1
    # validate feeds plan, and is the setup of the run report (which runs whenever the conf was valid).
    assert dag.get_task("validate").downstream_task_ids == {"plan", "report"}
    assert dag.get_task("report").is_teardown and not dag.get_task("report").on_failure_fail_dagrun


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_every_param_is_a_runspec_field_and_back(dagbag, dag_id: str) -> None:
    dag = dagbag.dags[dag_id]
    fields = [f.name for f in spec_fields()]
    assert list(dag.params.keys()) == fields
    for f in spec_fields():
        param = dag.params.get_param(f.name)
        schema = param_schema(f.name)
        assert param.description == schema.pop("description")
        assert param.schema == {**schema, "section": f.metadata["section"]}, f.name


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_every_default_conf_is_valid(dagbag, dag_id: str) -> None:
    defaults = {k: v for k, v in dagbag.dags[dag_id].params.dump().items()}
    spec, findings = check_conf(defaults)
    assert findings == [] and spec is not None
    assert spec.mode == "plan"


def test_teardown_tasks_are_teardowns_of_preflight_live(dagbag) -> None:
    dag = dagbag.dags["nemo_rl_grpo_gke"]
    deletes = [t for t in dag.tasks if t.task_id.startswith("teardown.")]
    assert deletes and all(t.is_teardown for t in deletes)
    assert all("preflight_live" in t.upstream_task_ids for t in deletes)
    # Only the network deletions count for the run's state: a failed ensure still fails the run.
    counted = {t.task_id for t in deletes if t.on_failure_fail_dagrun}
    assert counted == {"teardown.delete-net", "teardown.delete-gvnic-net", "teardown.delete-rdma-net"}
    ensures = [t for t in dag.tasks if t.task_id.split(".")[0] in ("network", "storage", "cluster")]
    # One ensure task per resource of the registry, in the group of its stage.
    from nemo_rl_gke.gcp.resources import resources
    from nemo_rl_gke.spec import RunSpec

    registry = resources(RunSpec())
    assert {t.task_id for t in ensures} == {f"{r.stage}.{key}" for key, r in registry.items()}
    kube_deletes = {"teardown.delete-raycluster", "teardown.delete-kube-objects"}
    gcp_deletes = {f"teardown.delete-{key}" for key in registry if key != "node-pool"}
    assert {t.task_id for t in deletes} == gcp_deletes | kube_deletes
    # Teardown starts only when every provisioning task has finished.
    applies = {t.task_id for t in dag.tasks if t.task_id.startswith("kube.")}
    assert applies == {"kube.nccl-installer", "kube.network-mapping", "kube.lustre-storage", "kube.raycluster"}
    for root in ("teardown.delete-raycluster", "teardown.delete-gvnic-fw"):
        assert {t.task_id for t in ensures} | applies <= dag.get_task(root).upstream_task_ids
    # The RayCluster goes first, then the other objects, then the cluster and Lustre they live in and on.
    assert "teardown.delete-raycluster" in dag.get_task("teardown.delete-kube-objects").upstream_task_ids
    for infra in ("teardown.delete-lustre", "teardown.delete-cluster"):
        assert "teardown.delete-kube-objects" in dag.get_task(infra).upstream_task_ids
