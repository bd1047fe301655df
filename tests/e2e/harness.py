"""Run the DAG in apply mode against a local GCP sandbox, with real Airflow (`dag.test` / `airflow dags test`)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sandbox.testing import connection_extra, connection_json

from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.paths import ROOT

DAG_ID = "nemo_rl_grpo_gke"
# The local CPU recipe (include/conf/local.json) with two steps: a run that trains trains for real, briefly.
# Its 1 s poll interval too: the sandbox's operations are done at the first poll, and at 0.05 s the job's trigger
# asked Ray for its status 20 times a second while it trained (Ray's dashboard, the sandbox's proxy and the test's
# own process: a whole run alone took 142 s of CPU at 0.05 s and 105 s at 1 s, for the same wall, 2026-12-06).
LOCAL_CONF = json.loads((ROOT / "include" / "conf" / "local.json").read_text())
# The model out's evaluation is off unless a test is about it (test_train's main run, the nights, the browser): each
# one is two evaluation jobs, and the CI budget is whole-DAG runs. The conversion and the export still run.
APPLY = {**LOCAL_CONF, "mode": "apply", "max_steps": 2, "eval_benchmark": "off", "publish": "always"}
# What a test about the model out lays over APPLY: the conf's defaults again.
MODEL_OUT = {"eval_benchmark": "gsm8k", "publish": "if_better"}
# Most scenarios are about the infrastructure: they stop after it (no RayCluster, no training), teardown as always.
INFRA_ONLY = {"stop_after": t.CLUSTER}
# Lustre and what it needs: the peering, its range, the firewall rule for Lustre traffic, the main network. What
# teardown keeps when the run's checkpoint has no copy.
LUSTRE_CHAIN = {
    "lustre.instance",
    "servicenetworking.connection",
    "compute.address",
    "compute.firewall",
    "compute.network",
}
# Test secrets: they must never show up in logs, XCom or rendered fields (tests grep for them).
HF_TEST_TOKEN = "hf_TESTtoken0123456789abcdefSECRET"
WANDB_TEST_KEY = "wandbTESTkey0123456789abcdefSECRET"
# Each in-process DAG's pristine params, taken before its first run.
_PARAM_DEFAULTS: dict[int, Any] = {}
SEED = {
    "reservations": [
        {
            "project": RunSpec().project,
            "zone": RunSpec().zone,
            "name": RunSpec().reservation,
            "machine_type": RunSpec().effective_machine_type,
            "count": RunSpec().worker_replicas,
        }
    ],
    # Spot and flex-start VMs' own GPU quota (the sandbox lists none by default, as a new project has none).
    "preemptible_gpu_family_quotas": {"NVIDIA_B200": 64},
    # The export bucket, writable by the project's Lustre service agent (preflight_live checks both).
    "buckets": [
        {
            "project": RunSpec().project,
            "name": RunSpec().export_bucket_name,
            "lustre_agent_role": "roles/storage.objectUser",
        }
    ],
}


def connection_env(sandbox_url: str) -> dict[str, str]:
    """The google_cloud_default connection pointing at the sandbox with its service-account key, as a user would
    configure it (``python -m sandbox credentials``)."""
    extra = connection_extra(sandbox_url, RunSpec().project)
    return {
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": connection_json(extra),
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT": json.dumps({"conn_type": "generic", "password": HF_TEST_TOKEN}),
        "AIRFLOW_CONN_WANDB_DEFAULT": json.dumps({"conn_type": "generic", "password": WANDB_TEST_KEY}),
    }


@dataclass(frozen=True)
class RunResult:
    """The outcome of one DAG run: its state and every task's state and try number."""

    state: str
    tasks: dict[str, str]
    tries: dict[str, int]
    output: str = ""
    run_id: str = ""

    def errors(self, limit: int = 4000) -> str:
        """The output's error lines (failed tasks' exceptions and their messages), for an assertion's message: a
        failure in CI then says why a task failed, not only that it did."""
        marks = ("ERROR", "Exception", "Error:", "not valid", "  - [")
        lines = [line for line in self.output.splitlines() if any(mark in line for mark in marks)]
        return "\n".join(lines)[-limit:]


def _run_from_db(run_id: str, dag_id: str = DAG_ID) -> RunResult:
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.run_id == run_id).one()
        tis = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id).all()
        return RunResult(
            str(run.state),
            {ti.task_id: str(ti.state) for ti in tis},
            {ti.task_id: int(ti.try_number or 0) for ti in tis},
            run_id=run_id,
        )


def run_in_process(
    dag: Any, conf: dict[str, Any] | None, *, base: dict[str, Any] | None = APPLY, logical_date: Any = None
) -> RunResult:
    """``dag.test()`` in this process (triggers run inline); the connection comes from the environment.

    The run's conf is ``base`` (the local recipe in apply mode) under ``conf``; ``base=None`` and ``conf=None`` run
    with the DAG's own defaults, as a scheduled run does, at ``logical_date``.
    """
    # Airflow resolves a run's conf into the DAG's own Param objects (Param.resolve keeps the value), so in one
    # process a key the previous run set and this one omits would keep that value; each run starts from the defaults.
    defaults = _PARAM_DEFAULTS.setdefault(id(dag), copy.deepcopy(dag.params))
    dag.params = copy.deepcopy(defaults)
    run_conf = {**(base or {}), **(conf or {})} or None
    run = dag.test(run_conf=run_conf, logical_date=logical_date)
    return _run_from_db(run.run_id, dag.dag_id)


def run_logged(dag: Any, conf: dict[str, Any], capfd: pytest.CaptureFixture[str]) -> RunResult:
    """:func:`run_in_process` with what the run printed (its task and trigger logs) as the result's output: the log
    assertions of :func:`run_cli` without a new interpreter, Airflow import and DAG parse per run."""
    capfd.readouterr()
    result = run_in_process(dag, conf)
    captured = capfd.readouterr()
    _keep_output(captured.out + captured.err)
    return dataclasses.replace(result, output=captured.out + captured.err)


def _keep_output(output: str) -> None:
    """For debugging a failed run (assertion messages show only a part of its output): with ``E2E_OUTPUT_DIR`` set,
    each run's whole output goes to a file there."""
    if os.environ.get("E2E_OUTPUT_DIR"):
        out_dir = Path(os.environ["E2E_OUTPUT_DIR"])
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"run-{len(list(out_dir.iterdir())):03d}-{os.getpid()}.log").write_text(output)


def run_cli(conf: dict[str, Any], env: dict[str, str]) -> RunResult:
    """``airflow dags test`` in a subprocess, exactly as a user runs it; the output is kept for log assertions."""
    airflow = Path(sys.executable).parent / "airflow"
    full_env = {**os.environ, **env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [str(airflow), "dags", "test", DAG_ID, "-c", json.dumps({**APPLY, **conf})],
        env=full_env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    _keep_output(output)
    match = re.search(r"run_id=(\S+?),", output.split("DagRun Finished", 1)[-1])
    assert match, output[-3000:]
    result = _run_from_db(match.group(1))
    return dataclasses.replace(result, output=output)


def load_dag() -> Any:
    """The DAG as Airflow parses it from dags/."""
    from tests.airflow_compat import dag_bag

    bag = dag_bag(str(ROOT / "dags"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags[DAG_ID]


def latest_xcom(dag_id: str = DAG_ID) -> dict[tuple[str, str], Any]:
    """Every XCom of the newest run of ``dag_id``, keyed by (task id, key)."""
    from sandbox.demo import latest_run

    return latest_run(dag_id)["xcom"]
