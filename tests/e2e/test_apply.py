"""The DAG in apply mode against the local GCP sandbox, with real Airflow: keep and re-adopt, refuse and adopt what
someone else made, and a few faults run through the whole DAG (the full matrix runs step by step in
tests/operators/test_fault_matrix.py). These runs stop after the infrastructure: the RayCluster and the job are
covered by test_kube.py and test_train.py.

Every GCP call goes through the production hooks and the real google-cloud clients to the sandbox over HTTP.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.run import outcomes
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.ownership import owner_from_description, owner_from_labels
from nemo_rl_gke.run.spec import RunSpec
from tests.e2e.harness import INFRA_ONLY, run_in_process
from tests.faults import create_match, delete_match
from tests.owners import owner_of

pytestmark = pytest.mark.airflow
SPEC = RunSpec()
REGISTRY = resources(SPEC, owner_of(SPEC))
KEYS = list(REGISTRY)
DELETES = [s.task_id for s in t.teardown_steps() if s.op is t.Op.DELETE_GCP]
SKIPPED = [s.task_id for s in t.after(t.CLUSTER)]


@pytest.fixture(autouse=True)
def _fresh_project(sandbox: SandboxProcess) -> Iterator[None]:
    """Each test starts from an empty project (the seeded reservation stays), whatever the one before left."""
    sandbox.reset()
    yield
    sandbox.clear_faults()


def _creates_since(sandbox: SandboxProcess, seq: int) -> list[str]:
    """Paths of the calls since ``seq`` that started a create (a POST that started an operation, not a delete or the
    lease's metadata write)."""
    skip = ("/connections/-", ":exportData", "/setCommonInstanceMetadata")
    return [
        c["path"]
        for c in sandbox.calls(since=seq)
        if c["method"] == "POST" and c["operations"] and not c["path"].endswith(skip)
    ]


def _last_seq(sandbox: SandboxProcess) -> int:
    calls = sandbox.calls()
    return calls[-1]["seq"] if calls else 0


def _actions() -> dict[str, str]:
    from sandbox.demo import latest_run

    xcom = latest_run("nemo_rl_grpo_gke")["xcom"]
    return {task: value["action"] for (task, key), value in xcom.items() if key == t.RETURN and "action" in value}


def test_keep_policy_keeps_everything_a_second_run_creates_nothing_and_a_refused_delete_is_retried(
    sandbox: SandboxProcess, dag: Any
) -> None:
    first = run_in_process(dag, {**INFRA_ONLY, "teardown_policy": t.KEEP_ALL})
    assert first.state == "success"
    # A run that stops after the infrastructure skips the rest, and says so on the grid.
    assert {first.tasks[k] for k in SKIPPED} == {"skipped"}
    kept = sandbox.inventory()
    # Every resource of the run, plus the cluster's default pool (created with the cluster, not a resource of ours).
    assert len(kept) == len(KEYS) + 1 and "default-pool" in {i["name"] for i in kept}
    # Everything kept records its owner: labels where the API has labels, else the description's exact record. The
    # peering connection has neither: it is the group's through the marked range it uses.
    group = owner_of(SPEC)
    for item in (i for i in kept if i["name"] != "default-pool" and i["kind"] != "servicenetworking.connection"):
        found = owner_from_labels(item.get("labels")) or owner_from_description(item.get("description"))
        assert group.owns(found) and found.run and found.run != group.run, item

    seq = _last_seq(sandbox)
    second = run_in_process(dag, {**INFRA_ONLY, "teardown_policy": t.KEEP_ALL})
    assert second.state == "success"
    assert _creates_since(sandbox, seq) == []
    assert {_actions()[k] for k in KEYS} == {outcomes.EXISTS}
    assert len(sandbox.inventory()) == len(KEYS) + 1

    # The cleanup run's first delete of the network is refused: the teardown task's retry deletes it, and the run
    # still succeeds (the fault was one call).
    sandbox.add_fault(delete_match(REGISTRY[t.NET]), status=400, message="injected: delete refused")
    cleanup = run_in_process(dag, {**INFRA_ONLY, "teardown_policy": t.DELETE_ALL})
    assert cleanup.state == "success"
    assert cleanup.tries[t.DELETE_NET] >= 2 and cleanup.tasks[t.DELETE_NET] == "success"
    assert [f["fired"] for f in sandbox.faults()] == [1]
    assert sandbox.inventory() == []


def _raw_network(sandbox: SandboxProcess, method: str, name: str = "") -> None:
    """Someone else's network: created without the ownership marker, or deleted by them."""
    path = f"{sandbox.url}/compute/v1/projects/{SPEC.project}/global/networks"
    body = json.dumps({"name": name, "autoCreateSubnetworks": True, "routingConfig": {"routingMode": "REGIONAL"}})
    request = urllib.request.Request(
        path if method == "POST" else f"{path}/{SPEC.network}",
        data=body.encode() if method == "POST" else None,
        method=method,
        headers={"Content-Type": "application/json", **sandbox.auth_headers()},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def test_a_resource_the_run_did_not_create_survives_every_teardown(sandbox: SandboxProcess, dag: Any) -> None:
    _raw_network(sandbox, "POST", SPEC.network)
    try:
        refused = run_in_process(dag, INFRA_ONLY)
        assert refused.state == "failed"
        assert refused.tasks[t.NET] == "failed"
        assert [(i["kind"], i["name"]) for i in sandbox.inventory()] == [("compute.network", SPEC.network)]

        adopted = run_in_process(dag, {**INFRA_ONLY, "adopt_existing": True})
        assert adopted.state == "success"
        actions = _actions()
        assert actions[t.NET] == outcomes.ADOPTED
        assert actions[t.DELETE_NET] == outcomes.KEPT_UNOWNED
        assert [(i["kind"], i["name"]) for i in sandbox.inventory()] == [("compute.network", SPEC.network)]
    finally:
        _raw_network(sandbox, "DELETE")


# One fault of each kind in one whole run (each step's own are in the fault matrix): a refused create and an
# operation that ends in error, on two branches that run side by side; the failed tasks, teardown after them, the
# run's state.
FAULTS = {
    t.NODE_POOL: {"status": 400, "message": "injected: invalid request"},
    t.LUSTRE: {"operation": "error", "message": "injected: operation failed"},
}


def test_failed_provisioning_steps_fail_the_run_and_teardown_leaves_nothing(sandbox: SandboxProcess, dag: Any) -> None:
    for key, fault in FAULTS.items():
        sandbox.add_fault(create_match(REGISTRY[key]), **fault)
    result = run_in_process(dag, INFRA_ONLY)
    assert result.state == "failed"
    assert {k: (result.tasks[k], result.tries[k]) for k in FAULTS} == dict.fromkeys(FAULTS, ("failed", 1))
    # Teardown ran after the failures and deleted everything the run had created.
    assert all(result.tasks[d] == "success" for d in DELETES)
    assert [f["fired"] for f in sandbox.faults()] == [1, 1]
    assert sandbox.inventory() == []
