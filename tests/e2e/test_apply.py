"""The DAG in apply mode against the local GCP sandbox, with real Airflow: provision, tear down, adopt, fail.

Every GCP call goes through the production hooks and the real google-cloud clients to the sandbox over HTTP.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.spec import RunSpec
from tests.e2e.harness import (
    create_match,
    delete_match,
    run_cli,
    run_in_process,
)

pytestmark = pytest.mark.airflow
SPEC = RunSpec()
KEYS = list(resources(SPEC))
# The node pool goes with its cluster: it has no teardown task of its own.
DELETABLE = [k for k in KEYS if k != "node-pool"]


def ensure_task(key: str) -> str:
    return f"{resources(SPEC)[key].stage}.{key}"


def delete_task(key: str) -> str:
    return f"teardown.delete-{key}"


@pytest.fixture(autouse=True)
def _fresh_project(sandbox: SandboxProcess) -> Iterator[None]:
    """Each test starts from an empty project (the seeded reservation stays), whatever the one before left."""
    sandbox.reset()
    yield
    sandbox.clear_faults()


def _creates_since(sandbox: SandboxProcess, seq: int) -> list[str]:
    """Paths of the calls since ``seq`` that started a create (a POST that started an operation, not a delete)."""
    return [
        c["path"]
        for c in sandbox.calls(since=seq)
        if c["method"] == "POST" and c["operations"] and not c["path"].endswith(("/connections/-", ":exportData"))
    ]


def _last_seq(sandbox: SandboxProcess) -> int:
    calls = sandbox.calls()
    return calls[-1]["seq"] if calls else 0


def _xcom_actions(run_id_tasks: dict[str, str]) -> dict[str, str]:
    from sandbox.demo import latest_run

    xcom = latest_run("nemo_rl_grpo_gke")["xcom"]
    return {task: value["action"] for (task, key), value in xcom.items() if key == "return_value" and "action" in value}


def test_apply_provisions_every_resource_then_deletes_it_waiting_only_in_deferrals(
    sandbox: SandboxProcess, env: dict[str, str]
) -> None:
    result = run_cli({}, env)
    assert result.state == "success", result.output[-4000:]
    for key in KEYS:
        assert result.tasks[ensure_task(key)] == "success"
    for key in DELETABLE:
        assert result.tasks[delete_task(key)] == "success"
    actions = _xcom_actions(result.tasks)
    assert {actions[ensure_task(k)] for k in KEYS} == {"created"}
    assert {actions[delete_task(k)] for k in DELETABLE} == {"deleted"}
    # Every wait on a long-running operation was a deferral: no task held a worker slot while GCP worked.
    deferred = set(re.findall(r"Pausing task as DEFERRED\..*?task_id=(\S+)", result.output))
    waits = {ensure_task(k) for k in KEYS} | {delete_task(k) for k in DELETABLE}
    kube_and_job = {"kube.raycluster", "train.wait", "checkpoint.validate", "checkpoint.export"}
    assert deferred == waits | kube_and_job | {"teardown.delete-raycluster"}
    assert sandbox.inventory() == []


def test_keep_policy_keeps_everything_and_a_second_run_creates_nothing(sandbox: SandboxProcess, dag: Any) -> None:
    first = run_in_process(dag, {"teardown_policy": "keep_all"})
    assert first.state == "success"
    kept = sandbox.inventory()
    # Every resource of the run, plus the cluster's default pool (created with the cluster, not a resource of ours).
    assert len(kept) == len(KEYS) + 1 and "default-pool" in {i["name"] for i in kept}
    # Everything kept carries the ownership marker: a label where the API has labels, else the description. The
    # peering connection has neither: it is ours through the marked range it uses.
    for item in (i for i in kept if i["name"] != "default-pool" and i["kind"] != "servicenetworking.connection"):
        marker = json.dumps(item.get("labels") or {}) + (item.get("description") or "")
        assert "airflow-nemo-rl-gke" in marker, item

    seq = _last_seq(sandbox)
    second = run_in_process(dag, {"teardown_policy": "keep_all"})
    assert second.state == "success"
    assert _creates_since(sandbox, seq) == []
    assert {_xcom_actions(second.tasks)[ensure_task(k)] for k in KEYS} == {"exists"}
    assert len(sandbox.inventory()) == len(KEYS) + 1

    cleanup = run_in_process(dag, {"teardown_policy": "delete_all"})
    assert cleanup.state == "success"
    assert sandbox.inventory() == []


def _raw_create_network(sandbox: SandboxProcess, name: str) -> None:
    """A network someone else made: no ownership marker."""
    body = json.dumps({"name": name, "autoCreateSubnetworks": True, "routingConfig": {"routingMode": "REGIONAL"}})
    request = urllib.request.Request(
        f"{sandbox.url}/compute/v1/projects/{SPEC.project}/global/networks",
        data=body.encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def _raw_delete_network(sandbox: SandboxProcess, name: str) -> None:
    request = urllib.request.Request(
        f"{sandbox.url}/compute/v1/projects/{SPEC.project}/global/networks/{name}", method="DELETE"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def test_a_resource_the_run_did_not_create_survives_every_teardown(sandbox: SandboxProcess, dag: Any) -> None:
    _raw_create_network(sandbox, SPEC.network)
    try:
        refused = run_in_process(dag, {})
        assert refused.state == "failed"
        assert refused.tasks[ensure_task("net")] == "failed"
        assert [(i["kind"], i["name"]) for i in sandbox.inventory()] == [("compute.network", SPEC.network)]

        adopted = run_in_process(dag, {"adopt_existing": True})
        assert adopted.state == "success"
        actions = _xcom_actions(adopted.tasks)
        assert actions[ensure_task("net")] == "adopted"
        assert actions[delete_task("net")] == "kept-unowned"
        assert [(i["kind"], i["name"]) for i in sandbox.inventory()] == [("compute.network", SPEC.network)]
    finally:
        _raw_delete_network(sandbox, SPEC.network)


# Every create and every wait fails before any training, so each costs one short run. A delete fault needs a whole
# run (training included): one resource per API collection covers every delete code path (the other RDMA subnets and
# networks go through the same calls as rdma-sub-0 and net).
DELETE_FAULTS = ["net", "rdma-sub-0", "gvnic-fw", "peering-range", "peering", "lustre", "cluster"]
STEPS = [(key, "create") for key in KEYS] + [(key, "wait") for key in KEYS] + [(key, "delete") for key in DELETE_FAULTS]


@pytest.mark.parametrize(("key", "step"), STEPS, ids=[f"{step}-{key}" for key, step in STEPS])
def test_a_fault_in_any_step_fails_the_run_and_leaves_nothing_behind(
    sandbox: SandboxProcess, dag: Any, key: str, step: str
) -> None:
    if step == "create":
        sandbox.add_fault(create_match(key), status=400, message="injected: invalid request")
    elif step == "wait":
        sandbox.add_fault(create_match(key), operation="error", message="injected: operation failed")
    else:
        sandbox.add_fault(delete_match(key), status=400, message="injected: delete refused")
    result = run_in_process(dag, {})
    if step == "delete":
        # The deletion failed once; the teardown task retried it (the fault was one call) and the run reports it.
        assert result.tries[delete_task(key)] >= 2
        assert result.tasks[delete_task(key)] == "success"
    else:
        assert result.state == "failed"
        assert result.tasks[ensure_task(key)] == "failed"
        # Teardown ran after the failure and deleted everything the run had created.
        assert all(result.tasks[delete_task(k)] == "success" for k in DELETABLE)
    fired = [f for f in sandbox.faults() if f.get("fired")]
    assert len(fired) == 1, sandbox.faults()
    assert sandbox.inventory() == []
