"""The sandbox's GPU capacity model on its own: which worker pod gets a node, when, and what a refused one is told.

Store-level (no server, no Ray): the RayCluster runs that go through it are tests/gcp/test_kube.py and the e2e
capacity and recovery runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sandbox.capacity import CapacityModel
from sandbox.config import SeedError
from sandbox.store import Resource, Store

CLUSTER = "projects/p/locations/us-central1/clusters/c"
ZONE = "us-central1-b"
RESERVATION = f"projects/p/zones/{ZONE}/reservations/res"


def _store(tmp_path: Path, *, count: int = 2, in_use: int = 0, **capacity: object) -> Store:
    store = Store(tmp_path)
    seed: dict[str, object] = {
        "reservations": [
            {"project": "p", "zone": ZONE, "name": "res", "machine_type": "a4-highgpu-8g", "count": count,
             "in_use_count": in_use}
        ]
    }  # fmt: skip
    if capacity:
        seed["capacity"] = capacity
    store.config.apply_seed(seed, 0.0)
    return store


def _pool(store: Store, option: str, *, name: str = "gpu", max_run_s: int | None = None) -> Resource:
    config: dict[str, object] = {"accelerators": [{"acceleratorType": "nvidia-b200", "acceleratorCount": "8"}]}
    if option == "reservation":
        config["reservationAffinity"] = {"consumeReservationType": "SPECIFIC_RESERVATION", "values": ["res"]}
    else:
        config["reservationAffinity"] = {"consumeReservationType": "NO_RESERVATION"}
    if option == "spot":
        config["spot"] = True
    if option == "flex_start":
        config["flexStart"] = True
        if max_run_s is not None:
            config["maxRunDuration"] = f"{max_run_s}s"
    pool = Resource(
        "container.nodePool",
        f"{CLUSTER}/nodePools/{name}",
        {"name": name, "config": config, "locations": [ZONE]},
        phase="ready",
    )
    store.put(pool)
    return pool


def test_a_reservation_gives_a_node_per_free_machine_and_then_a_stockout(tmp_path: Path) -> None:
    store = _store(tmp_path, count=3, in_use=1)
    model = CapacityModel(store)
    pool = _pool(store, "reservation")
    assert model.request(CLUSTER, "w-0", 0.0).granted
    assert model.request(CLUSTER, "w-1", 0.0).granted
    assert model.free(RESERVATION) == 0
    refused = model.request(CLUSTER, "w-2", 0.0)
    assert not refused.granted and refused.reason == "Unschedulable"
    assert "GCE out of resources (the specific reservation has no free machine)" in refused.message
    assert model.stocked_out(pool) == [RESERVATION]
    # A node given back (its pod gone) is a free machine again, and the refused pod gets it.
    model.release("w-0")
    assert model.request(CLUSTER, "w-2", 1.0).granted and model.stocked_out(pool) == []


def test_a_reservation_others_use_up_is_stocked_out_before_any_pod_asks(tmp_path: Path) -> None:
    store = _store(tmp_path, count=2, in_use=2)
    model = CapacityModel(store)
    pool = _pool(store, "reservation")
    assert model.stocked_out(pool) == [RESERVATION]
    assert not model.request(CLUSTER, "w-0", 0.0).granted


def test_flex_start_nodes_come_after_the_queue_delay_counted_from_the_first_ask(tmp_path: Path) -> None:
    store = _store(tmp_path, flex_start_delay_s=10.0)
    model = CapacityModel(store)
    _pool(store, "flex_start", max_run_s=3600)
    waiting = model.request(CLUSTER, "w-0", 100.0)
    assert not waiting.granted and "Dynamic Workload Scheduler" in waiting.message
    assert not model.request(CLUSTER, "w-1", 105.0).granted  # the queue started at the first ask, not this one
    assert model.request(CLUSTER, "w-1", 110.0).granted and model.request(CLUSTER, "w-0", 110.0).granted
    # Each node ends maxRunDuration after it started; a node that ended queues its replacement anew.
    assert model.ends_at("w-1") == 110.0 + 3600
    model.release("w-1", requeue=True)
    assert not model.request(CLUSTER, "w-1", 111.0).granted
    assert model.request(CLUSTER, "w-1", 121.0).granted


def test_a_flex_start_pool_without_max_run_duration_ends_after_seven_days(tmp_path: Path) -> None:
    store = _store(tmp_path, flex_start_delay_s=0.0)
    model = CapacityModel(store)
    _pool(store, "flex_start")
    assert model.request(CLUSTER, "w-0", 5.0).granted
    assert model.ends_at("w-0") == 5.0 + 7 * 86400


def test_a_flex_start_queue_that_never_serves_keeps_the_pod_pending(tmp_path: Path) -> None:
    store = _store(tmp_path, flex_start_delay_s=None)
    model = CapacityModel(store)
    _pool(store, "flex_start")
    assert not any(model.request(CLUSTER, "w-0", t).granted for t in (0.0, 1e6, 1e9))


@pytest.mark.parametrize("option", ["spot", "on_demand"])
def test_spot_and_on_demand_serve_unless_stocked_out(tmp_path: Path, option: str) -> None:
    store = _store(tmp_path)
    model = CapacityModel(store)
    _pool(store, option)
    assert model.request(CLUSTER, "w-0", 0.0).granted and model.ends_at("w-0") is None
    assert model.capacity_of("w-0") == option
    store.config.apply_seed({"capacity": {f"{option}_stockout": True}}, 0.0)
    refused = model.request(CLUSTER, "w-1", 0.0)
    assert not refused.granted
    assert f"GCE out of resources (no {option.replace('_', '-')} capacity in the zone)" in refused.message
    # The other option's switch does not touch this pool.
    other = "on_demand" if option == "spot" else "spot"
    store.config.apply_seed({"capacity": {f"{option}_stockout": False, f"{other}_stockout": True}}, 0.0)
    assert model.request(CLUSTER, "w-1", 0.0).granted


def test_a_deleted_pool_takes_its_nodes_and_its_flex_start_request(tmp_path: Path) -> None:
    store = _store(tmp_path, count=1, flex_start_delay_s=10.0)
    model = CapacityModel(store)
    pool = _pool(store, "reservation")
    assert model.request(CLUSTER, "w-0", 0.0).granted and model.free(RESERVATION) == 0
    model.forget_pool(pool.key)
    assert model.free(RESERVATION) == 1 and model.capacity_of("w-0") is None
    flex = _pool(store, "flex_start", name="gpu")
    assert not model.request(CLUSTER, "w-0", 0.0).granted
    model.forget_pool(flex.key)
    assert not model.request(CLUSTER, "w-0", 9.0).granted  # a new request: the queue starts again at 9 s


def test_no_gpu_pool_is_said_plainly(tmp_path: Path) -> None:
    model = CapacityModel(_store(tmp_path))
    answer = model.request(CLUSTER, "w-0", 0.0)
    assert not answer.granted and "No node pool with GPUs can scale up" in answer.message


@pytest.mark.parametrize(
    "record",
    [{"flex_start_delay_s": -1}, {"flex_start_delay_s": "soon"}, {"spot_stockout": "yes"}, {"queue": 1}, []],
)
def test_a_bad_capacity_seed_is_refused(tmp_path: Path, record: object) -> None:
    with pytest.raises(SeedError, match="capacity"):
        Store(tmp_path).config.apply_seed({"capacity": record}, 0.0)


def _queued_request(count: int = 2, created: float = 0.0, **parameters: str) -> dict[str, object]:
    from sandbox.formats import rfc3339

    spec: dict[str, object] = {
        "provisioningClassName": "queued-provisioning.gke.io",
        "podSets": [{"count": count, "podTemplateRef": {"name": "workers"}}],
    }
    if parameters:
        spec["parameters"] = parameters
    return {"metadata": {"name": "workers", "uid": "u1", "creationTimestamp": rfc3339(created)}, "spec": spec}


def test_a_queued_pool_gives_nodes_only_through_a_provisioned_request_and_never_twice(tmp_path: Path) -> None:
    from sandbox.capacity import Claim

    store = _store(tmp_path, flex_start_delay_s=5.0)
    model = CapacityModel(store)
    pool = _pool(store, "flex_start", max_run_s=None)
    pool.body["queuedProvisioning"] = {"enabled": True}
    request = _queued_request(count=2, created=1000.0, maxRunDurationSeconds="600")
    # No request, or a pod that does not tolerate the queued nodes' taint: no scale-up at all.
    assert "only through a ProvisioningRequest" in model.request(CLUSTER, "w-0", 1010.0).message
    untolerated = model.request(CLUSTER, "w-0", 1010.0, Claim("workers", request, tolerates_taint=False))
    assert "cloud.google.com/gke-queued" in untolerated.message and not untolerated.granted
    missing = model.request(CLUSTER, "w-0", 1010.0, Claim("workers", None, tolerates_taint=True))
    assert "does not exist" in missing.message
    # Accepted, not yet Provisioned: the queue's delay runs from the request's creation.
    claim = Claim("workers", request, tolerates_taint=True)
    waiting = model.request(CLUSTER, "w-0", 1004.0, claim)
    assert not waiting.granted and waiting.provisioned is False and "Provisioned=False" in waiting.message
    assert model.request(CLUSTER, "w-0", 1005.0, claim).provisioned is True
    assert model.request(CLUSTER, "w-1", 1005.0, claim).granted
    # Each node ends maxRunDurationSeconds after it started.
    assert model.ends_at("w-0") == 1005.0 + 600
    # The request's count is spent: a lost node's replacement needs a new request.
    model.release("w-0")
    spent = model.request(CLUSTER, "w-2", 1006.0, claim)
    assert not spent.granted and "more take a new request" in spent.message
    assert model.request(CLUSTER, "w-2", 1006.0, Claim("workers", {**request, "metadata": {
        **request["metadata"], "uid": "u2"}}, tolerates_taint=True)).granted  # fmt: skip
