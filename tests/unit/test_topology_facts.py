"""The per-step facts live on the topology's steps, and agree with the DAG, the resources and the cost code."""

from __future__ import annotations

import ast

import pytest

from nemo_rl_gke.dag_factory import build_dag
from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.run import costs, topology
from nemo_rl_gke.run.spec import RunSpec
from tests.owners import owner_of
from tests.paths import ROOT

PLUGINS = ROOT / "plugins/nemo_rl_gke"


@pytest.fixture(scope="module")
def dag():
    return build_dag("facts_check", description="facts", doc_md="NeMo RL GRPO on GKE")


def test_the_steps_that_hold_the_lease_are_the_ones_that_act_and_all_run_after_it(dag) -> None:
    holders = {s.task_id for s in topology.STEPS.values() if s.holds_lease}
    acting = {s.task_id for s in (*topology.provisioning(), *topology.teardown_steps())} - {topology.RELEASE_LEASE}
    assert holders == acting
    # In the DAG the factory builds, every one of them runs after the lease is taken (as a setup's downstream).
    after_lease = dag.get_task(topology.LEASE).get_flat_relative_ids(upstream=False)
    assert holders <= after_lease
    # And nothing before the lease holds it: it does not exist yet.
    before = dag.get_task(topology.LEASE).get_flat_relative_ids(upstream=True) | {topology.LEASE}
    assert not holders & before


def test_the_operators_read_the_lease_and_policy_facts_from_the_steps() -> None:
    """No operator decides by itself which ops hold the lease or which policy scales or deletes: they ask the step."""
    policies = {"DELETE_ALL", "KEEP_WARM", "KEEP_ALL"}
    offenders = []
    for path in (PLUGINS / "operators").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in policies:
                offenders.append(f"{path.name}:{node.lineno}: a teardown policy compared by name ({node.attr})")
            if (
                isinstance(node, ast.Tuple)
                and sum(
                    isinstance(e, ast.Attribute) and isinstance(e.value, ast.Attribute) and e.value.attr == "Op"
                    for e in node.elts
                )
                > 1
            ):
                offenders.append(f"{path.name}:{node.lineno}: a list of ops (a per-step fact written outside topology)")
    assert offenders == []


@pytest.mark.parametrize("policy", topology.POLICIES)
def test_the_gpu_pool_goes_with_its_cluster_and_is_scaled_down_only_when_the_cluster_is_kept_warm(policy) -> None:
    pool = topology.step(topology.NODE_POOL)
    assert pool.teardown is None and pool.goes_with == topology.GKE_CLUSTER
    assert topology.deleted_by(topology.NODE_POOL) == topology.teardown_of(topology.GKE_CLUSTER)
    assert topology.deletes_under(topology.NODE_POOL, policy) == topology.deletes_under(topology.GKE_CLUSTER, policy)
    # Scaled down exactly when the cluster stays but the RayCluster (what runs on the pool) goes.
    warm = not topology.deletes_under(topology.GKE_CLUSTER, policy) and topology.deletes_under(
        topology.RAYCLUSTER, policy
    )
    assert topology.scales_down_under(topology.NODE_POOL, policy) == warm == (policy == topology.KEEP_WARM)
    assert not (
        topology.scales_down_under(topology.NODE_POOL, policy) and topology.deletes_under(topology.NODE_POOL, policy)
    )


def test_the_table_check_refuses_inconsistent_pool_facts(monkeypatch) -> None:
    import dataclasses

    pool = topology.step(topology.NODE_POOL)
    for bad in (
        dataclasses.replace(pool, scaled_down_under=frozenset({topology.DELETE_ALL})),  # deleted and scaled down
        dataclasses.replace(pool, deleted_under=frozenset()),  # not deleted with its cluster
        dataclasses.replace(pool, scaled_down_under=frozenset({"keep_some"})),  # no such policy
    ):
        steps = tuple(bad if s.task_id == topology.NODE_POOL else s for s in topology._STEPS)
        monkeypatch.setattr(topology, "_STEPS", steps)
        monkeypatch.setitem(topology.STEPS, topology.NODE_POOL, bad)
        with pytest.raises(ValueError, match=topology.NODE_POOL):
            topology.check()


def test_every_resource_the_banner_lists_has_a_cost_kind_a_kind_and_the_registry_s_name() -> None:
    spec = RunSpec()
    registry = resources(spec, owner_of(spec))
    costly = {s.task_id for s in topology.STEPS.values() if s.cost is not None}
    # Every Google Cloud resource and the RayCluster (what holds the GPU nodes); no other Kubernetes group.
    assert costly == {*registry, topology.RAYCLUSTER}
    for task_id in costly:
        step = topology.step(task_id)
        assert step.makes and "." not in step.makes, task_id
        assert step.name_attr == "" or hasattr(spec, step.name_attr), task_id
        price, basis = costs.hourly_cost(task_id, spec)
        assert basis and (price is None or price >= 0), task_id
        assert (price == 0.0) == (step.cost in (topology.Cost.FREE, topology.Cost.ON_NODES)), task_id
    # Without a name from the step, the banner names each resource as the registry does (the peering shows its
    # network: the peering's own name is derived from it).
    banner = {r.task_id: r.name for r in costs.still_running(spec, dict.fromkeys(costly, "success"), {})}
    for key, resource in registry.items():
        expected = spec.network if key == topology.PEERING else resource.name
        assert banner[key] == expected, key


def test_the_dag_s_edges_are_read_from_the_topology(monkeypatch) -> None:
    """The factory wires exactly :func:`topology.upstream`: an edge added there shows up in the built DAG."""
    plain = build_dag("edges_plain", description="e", doc_md="NeMo RL GRPO on GKE")
    assert {(up, t.task_id) for t in plain.tasks for up in t.upstream_task_ids} == topology.edges()
    upstream = topology.upstream

    def with_extra(task_id: str) -> tuple[str, ...]:
        extra = (topology.VALIDATE,) if task_id == topology.EXPORT else ()
        return (*upstream(task_id), *extra)

    monkeypatch.setattr(topology, "upstream", with_extra)
    extra = build_dag("edges_extra", description="e", doc_md="NeMo RL GRPO on GKE")
    assert topology.VALIDATE in extra.get_task(topology.EXPORT).upstream_task_ids
    assert topology.VALIDATE not in plain.get_task(topology.EXPORT).upstream_task_ids
