"""LeaseTrigger in the provider style: exact serialize() and a round trip that keeps the deadline and the GPU bound.

Its events (free, still held, held by too many GPU nodes, timeout) are exercised against the sandbox through the
lease operator in tests/operators/test_ownership.py.
"""

from __future__ import annotations

from nemo_rl_gke.triggers.lease import CLASSPATH, LeaseTrigger


def test_serialize_is_exact() -> None:
    trigger = LeaseTrigger(
        "proj-1",
        "nemo-rl-cluster-8fe9df50",
        gcp_conn_id="gcp",
        poll_interval=2,
        timeout=60,
        started_at=1000,
        deployment="team-a",
        gpu_nodes=2,
        max_gpu_nodes_total=4,
    )
    assert trigger.serialize() == (
        CLASSPATH,
        {
            "project": "proj-1",
            "group": "nemo-rl-cluster-8fe9df50",
            "gcp_conn_id": "gcp",
            "poll_interval": 2.0,
            "timeout": 60.0,
            "started_at": 1000.0,
            "deployment": "team-a",
            "gpu_nodes": 2,
            "max_gpu_nodes_total": 4,
        },
    )


def test_serialize_round_trip_keeps_the_deadline_and_the_bound() -> None:
    original = LeaseTrigger("proj-1", "g", gpu_nodes=3, max_gpu_nodes_total=8, deployment="default")
    classpath, kwargs = original.serialize()
    assert classpath == CLASSPATH == f"{LeaseTrigger.__module__}.{LeaseTrigger.__name__}"
    assert LeaseTrigger(**kwargs).serialize() == (classpath, kwargs)
    # A trigger serialized before the GPU bound existed still loads, and waits only for the group.
    old = {k: v for k, v in kwargs.items() if k not in ("deployment", "gpu_nodes", "max_gpu_nodes_total")}
    assert LeaseTrigger(**old).max_gpu_nodes_total == 0
