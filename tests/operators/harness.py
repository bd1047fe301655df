"""Run the package's operators one step at a time against the real sandbox, as Airflow's task runner would.

The task instance is a small stand-in (XCom by task id and key, shared by the steps of one run), but everything
else is real: the operators build their hook from ``AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT`` pointing at the sandbox,
``pre_execute`` and ``execute`` run as in Airflow, a deferral raises ``TaskDeferred`` with the actual trigger, that
trigger runs to its event, and ``execute_complete`` is called on a fresh operator, as Airflow does after a deferral.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from sandbox.testing import SandboxProcess

from nemo_rl_gke.airflow_compat import AirflowSkipException
from nemo_rl_gke.dag_factory import OPERATORS
from nemo_rl_gke.gcp.resources import Resource, resources
from nemo_rl_gke.preflight.offline import check_conf
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.deployment import DEFAULT_DEPLOYMENT_ID, Deployment
from nemo_rl_gke.run.ownership import Owner
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.topology import LEASE, RETURN, VALIDATE

REGION, ZONE = "us-central1", "us-central1-b"  # a RoCE zone of the sandbox
POLL = 0.05
DAG_ID = "nemo_rl_grpo_gke"
_run_numbers = itertools.count(1)
DEPLOYMENT_ENV = "AIRFLOW__NEMO_RL_GKE__DEPLOYMENT_ID"


class Run:
    """One DAG run: its id, the deployment (Airflow) it runs in, and its XComs as the steps push and pull them."""

    def __init__(self, conf: dict[str, Any], run_id: str, deployment: str = DEFAULT_DEPLOYMENT_ID) -> None:
        self.run_id = run_id
        self.deployment = deployment
        self.xcom: dict[tuple[str, str], Any] = {(VALIDATE, RETURN): conf}

    @property
    def spec(self) -> RunSpec:
        """The spec its validate task accepted."""
        return RunSpec.from_conf(self.xcom[(VALIDATE, RETURN)])

    @property
    def owner(self) -> Owner:
        """The run's identity, as its operators build it."""
        return Owner(self.deployment, self.spec.group_id, f"{DAG_ID}/{self.run_id}")

    def resources(self) -> dict[str, Resource]:
        """The run's GCP resources, judged as the run's own."""
        return resources(self.spec, self.owner)

    def context(self, task_id: str) -> dict[str, Any]:
        """The context a task instance of ``task_id`` gets."""
        return {"ti": TaskInstance(self, task_id), "dag": SimpleNamespace(dag_id=DAG_ID), "run_id": self.run_id}


class TaskInstance:
    """What the operators use of a task instance: XCom pull and push, scoped to one run."""

    def __init__(self, run: Run, task_id: str) -> None:
        self.run = run
        self.task_id = task_id
        self.start_date = None

    def xcom_pull(self, task_ids: str | None = None, key: str = RETURN, **_: Any) -> Any:
        return self.run.xcom.get((task_ids or self.task_id, key))

    def xcom_push(self, key: str, value: Any) -> None:
        json.dumps(value)  # XCom values must be JSON-serializable, as Airflow's are
        self.run.xcom[(self.task_id, key)] = value


# The sandbox the current test's connection points at (set by ``gcp_conn``), for the buckets a run needs.
_sandboxes: list[SandboxProcess] = []


def start_run(project: str, *, lease: bool = True, deployment: str = DEFAULT_DEPLOYMENT_ID, **conf: Any) -> Run:
    """A run of ``deployment`` whose validate task accepted this conf (validated for real) in ``project``, and that
    took its group's lease as the DAG's lease step does (``lease=False`` leaves that to the test)."""
    raw = {"project": project, "region": REGION, "zone": ZONE, "reservation": "gpu-res", "poll_interval_s": POLL}
    raw.update(conf)
    # Judged as by a deployment whose Google connection names the test's project.
    spec, findings = check_conf(raw, Deployment(gcp_project=project))
    assert spec is not None, findings
    if _sandboxes:
        # The export bucket exists before the run, as preflight requires (its records and copies live there).
        _sandboxes[-1].seed_bucket(spec.project, spec.export_bucket_name)
    run = Run(spec.to_conf(), f"manual__test-{next(_run_numbers)}", deployment)
    if lease:
        run_step(run, LEASE)
    return run


def operator(task_id: str) -> Any:
    """The operator the DAG factory builds for a step."""
    return OPERATORS[topology.step(task_id).op](step=task_id)


def trigger_events(trigger: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Every event of a trigger run to its end."""

    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), timeout))


def run_step(run: Run, task_id: str) -> tuple[Any, TaskDeferred | None]:
    """One try of a step: pre_execute, execute; on a deferral its trigger's event and execute_complete on a fresh
    operator. Its return value lands in the run's XCom. A skip returns ("skipped", None)."""
    with _deployment(run.deployment):
        return _run_step(run, task_id)


@contextmanager
def _deployment(deployment_id: str) -> Iterator[None]:
    """The Airflow config of the run's deployment while its step runs (operators read it at run time)."""
    before = os.environ.get(DEPLOYMENT_ENV)
    os.environ[DEPLOYMENT_ENV] = deployment_id
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DEPLOYMENT_ENV, None)
        else:
            os.environ[DEPLOYMENT_ENV] = before


def _run_step(run: Run, task_id: str) -> tuple[Any, TaskDeferred | None]:
    context = run.context(task_id)
    task = operator(task_id)
    deferred: TaskDeferred | None = None
    try:
        task.pre_execute(context)
        result = task.execute(context)
    except AirflowSkipException:
        # A teardown step that keeps what it would delete ends skipped with its result in XCom.
        return run.xcom.get((task_id, RETURN), "skipped"), None
    except TaskDeferred as exc:
        deferred = exc
        events = trigger_events(exc.trigger)
        assert len(events) == 1
        resumed = getattr(operator(task_id), exc.method_name)
        result = resumed(context, event=events[0], **(exc.kwargs or {}))
    run.xcom[(task_id, RETURN)] = result
    return result, deferred


def project_resources(sandbox: SandboxProcess, project: str) -> dict[str, dict[str, Any]]:
    """The sandbox's live resources of one project, by name."""
    return {r["name"]: r for r in sandbox.inventory() if f"projects/{project}/" in r["path"]}


@pytest.fixture
def gcp_conn(sandbox: SandboxProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """google_cloud_default -> the sandbox, exactly as a deployment would configure it for local runs."""
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", sandbox.connection_json("sandbox"))
    # The scenarios hold several runs' leases in one project at once; a test of the GPU total sets its own.
    monkeypatch.setenv("AIRFLOW__NEMO_RL_GKE__MAX_GPU_NODES_TOTAL", "64")
    _sandboxes.append(sandbox)
    try:
        yield
    finally:
        _sandboxes.remove(sandbox)
