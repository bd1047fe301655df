"""The sweeper DAG run for real with ``dag.test``: the metadata DB, the task runner, other runs' states through the
Task SDK, and its deferrals run inline, against the sandbox. The groups are made by the run's operators step by step
(tests/operators/harness.py), as in tests/operators/test_sweeper.py, which covers the scenarios in depth.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sandbox.demo import latest_run
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.lease import acquire, forget, read_lease, release
from nemo_rl_gke.run import outcomes
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.ownership import SWEEPER_DAG_ID, Owner
from tests.operators.harness import project_resources, run_step, start_run
from tests.paths import ROOT

pytestmark = pytest.mark.airflow
PROJECT = "sweeper-e2e"
HOUR = 3600.0
OTHER_NAMES = {"network": "net-2", "gvnic_prefix": "gv-2", "rdma_prefix": "rd-2", "cluster_name": "c-2"}


def _hook() -> Any:
    from nemo_rl_gke.gcp.hooks import GcpHook

    return GcpHook()


def _sweeper_dag() -> Any:
    from tests.airflow_compat import dag_bag

    bag = dag_bag(str(ROOT / "dags" / "nemo_rl_gke_sweeper.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags[SWEEPER_DAG_ID]


def _writes_since(sandbox: SandboxProcess, seq: int) -> list[str]:
    return [f"{c['method']} {c['path']}" for c in sandbox.calls(since=seq) if c["method"] != "GET"]


def test_the_sweeper_dag_reports_a_dry_run_then_sweeps_by_ttl_and_by_the_state_airflow_gives(
    sandbox: SandboxProcess, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sweeper's project must be one the deployment allows, as a run's must.
    monkeypatch.setenv("AIRFLOW__NEMO_RL_GKE__ALLOWED_PROJECTS", PROJECT)
    # A warm group its last run let go of 30 hours ago.
    warm = start_run(PROJECT, teardown_policy=t.KEEP_WARM)
    for step in (t.NET, t.GVNIC_NET, t.GVNIC_FW):
        assert run_step(warm, step)[0]["action"] == outcomes.CREATED
    release(_hook(), PROJECT, warm.owner, warm=True, now=time.time() - 30 * HOUR)
    # A run killed mid-way that this Airflow has no record of: its state cannot be told, so it is left alone.
    killed = start_run(PROJECT, **OTHER_NAMES)
    assert run_step(killed, t.NET)[0]["action"] == outcomes.CREATED
    acquire(_hook(), PROJECT, killed.owner, 1.0, now=time.time() - HOUR)
    dag = _sweeper_dag()
    seq = sandbox.calls()[-1]["seq"]

    dag.test(run_conf={"project": PROJECT, "dry_run": True})

    dry = latest_run(SWEEPER_DAG_ID)
    assert dry["state"] == "success" and _writes_since(sandbox, seq) == []
    report = dry["xcom"][("sweep", "return_value")]
    groups = {g["group"]: g for g in report["groups"]}
    assert report["dry_run"] is True and len(groups[warm.owner.group]["deleted"]) == 3
    assert "is unknown: left alone" in groups[killed.owner.group]["skipped"]
    assert "(dry run: nothing was written)" in dry["xcom"][("sweep", "text")]

    # The killed run's lease now names the dry sweep's run, which Airflow knows (success): it goes this time.
    forget(_hook(), PROJECT, killed.owner.group, unless_held=False)
    named = Owner(killed.owner.deployment, killed.owner.group, f"{SWEEPER_DAG_ID}/{dry['run_id']}")
    acquire(_hook(), PROJECT, named, 1.0, now=time.time() - HOUR, names=killed.spec.group_names)

    # Every param given: in one process Airflow keeps the previous run's conf in the DAG's Param objects.
    dag.test(run_conf={"project": PROJECT, "dry_run": False, "warm_ttl_hours": 24})

    swept = latest_run(SWEEPER_DAG_ID)
    assert swept["state"] == "success", swept["tasks"]
    groups = {g["group"]: g for g in swept["xcom"][("sweep", "return_value")]["groups"]}
    assert groups[warm.owner.group]["why"].startswith("warm and idle 30.0 h")
    assert f"{named.run} expired" in groups[killed.owner.group]["why"]
    assert groups[killed.owner.group]["why"].endswith("and the run is success")
    assert project_resources(sandbox, PROJECT) == {}
    assert read_lease(_hook(), PROJECT, warm.owner.group) is None
    assert read_lease(_hook(), PROJECT, killed.owner.group) is None
