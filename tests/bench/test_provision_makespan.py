"""The provisioning bench's own arithmetic and names, so the bench cannot rot between its (long) real runs."""

from __future__ import annotations

from bench.provision_makespan import KIND, resource_names
from bench.warm_cold import PROVISIONING, creates_between

from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec


def test_every_timed_ensure_task_has_the_name_the_run_gives_its_resource() -> None:
    names = resource_names()
    spec = RunSpec()
    assert set(KIND) <= set(names)
    assert (names[t.NET], names[t.GKE_CLUSTER], names[t.LUSTRE]) == (spec.network, spec.cluster_name, spec.lustre_name)


def test_warm_cold_counts_only_create_operations_inside_the_run() -> None:
    ops = [
        {"kind": "compute.networks.insert", "target": "projects/p/global/networks/net", "start": 10.0},
        {"kind": "container.nodePools.setSize", "target": "projects/p/x/nodePools/gpu", "start": 12.0},
        {"kind": "lustre.instances.create", "target": "projects/p/x/instances/lustre", "start": 99.0},
    ]
    assert creates_between(ops, 5.0, 50.0) == ["compute.networks.insert net"]
    assert t.LUSTRE in PROVISIONING and t.RAYCLUSTER in PROVISIONING and t.SUBMIT not in PROVISIONING
