"""Flex-start with queued provisioning against the sandbox: the run's GPU pool takes nodes only through the
ProvisioningRequest its manifests carry, and its workers get them once the request is Provisioned.

Real HTTP throughout: the queued pool is created through the production resources (the sandbox refuses one GKE
would refuse), the PodTemplate, the ProvisioningRequest and the RayCluster are applied through the Kubernetes hook,
and the workers are real local Ray nodes once their nodes come.
"""

from __future__ import annotations

import asyncio

import pytest
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.kube.client import KubeHook, ObjectRef
from nemo_rl_gke.kube.objects import apply_objects, delete_objects, group_objects, lustre_ip
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.spec import RunSpec
from tests.gcp.conftest import ensure_done, first_event, raycluster_trigger
from tests.owners import owner_of

pytestmark = pytest.mark.airflow
REQUEST_GV = "autoscaling.x-k8s.io/v1"


@pytest.fixture
def queued(spec: RunSpec, hook: GcpHook, sandbox: SandboxProcess) -> RunSpec:
    """The run's resources with its GPU pool on queued provisioning; the queue provisions 1 s after a request."""
    queued = RunSpec.from_conf({**spec.to_conf(), "capacity": "queued", "flex_start_max_hours": 0.5})
    for resource in resources(queued, owner_of(queued)).values():
        ensure_done(resource, hook)
    sandbox.set_capacity(flex_start_delay_s=1.0)
    return queued


def test_the_workers_get_their_nodes_through_the_provisioning_request_and_teardown_deletes_it(
    queued: RunSpec, hook: GcpHook, sandbox: SandboxProcess
) -> None:
    pool = [r for r in sandbox.inventory() if r["path"] == queued.node_pool_path]
    assert pool, "the queued pool exists"
    kube = KubeHook(queued, hook)
    owner = owner_of(queued)
    storage = group_objects(queued, t.LUSTRE_STORAGE, owner, lustre_address=lustre_ip(queued, hook))
    raycluster = group_objects(queued, t.RAYCLUSTER, owner)
    kinds = [o["kind"] for o in raycluster]
    # The request and its template go before the RayCluster whose workers consume it.
    assert kinds.index("PodTemplate") < kinds.index("ProvisioningRequest") < kinds.index("RayCluster")
    name = queued.provisioning_request_name
    apply_objects(kube, [*storage, *raycluster], owner, adopt=False)
    try:
        event = asyncio.run(first_event(raycluster_trigger(queued, "workers")))
        assert event["status"] == "success", event
        request = kube.get(ObjectRef(REQUEST_GV, "ProvisioningRequest", name, queued.namespace))
        assert request is not None
        assert request["spec"]["podSets"] == [{"count": queued.worker_replicas, "podTemplateRef": {"name": name}}]
        assert request["spec"]["parameters"] == {"maxRunDurationSeconds": "1800"}
        conditions = {c["type"]: c["status"] for c in request["status"]["conditions"]}
        assert conditions == {"Accepted": "True", "Provisioned": "True"}
    finally:
        results = delete_objects(kube, [*storage, *raycluster], owner)
    deleted = {r.ref.kind for r in results if r.action == "deleted"}
    assert {"RayCluster", "ProvisioningRequest", "PodTemplate"} <= deleted
    assert kube.get(ObjectRef(REQUEST_GV, "ProvisioningRequest", name, queued.namespace)) is None


def test_workers_without_their_provisioning_request_wait_and_the_timeout_says_why(
    queued: RunSpec, hook: GcpHook
) -> None:
    # The same RayCluster with its request left out: a queued pool scales up for no pod that lacks one.
    kube = KubeHook(queued, hook)
    owner = owner_of(queued)
    storage = group_objects(queued, t.LUSTRE_STORAGE, owner, lustre_address=lustre_ip(queued, hook))
    raycluster = [o for o in group_objects(queued, t.RAYCLUSTER, owner) if o["kind"] != "ProvisioningRequest"]
    apply_objects(kube, [*storage, *raycluster], owner, adopt=False)
    try:
        event = asyncio.run(first_event(raycluster_trigger(queued, "workers", timeout=4.0)))
    finally:
        delete_objects(kube, [*storage, *raycluster], owner)
    assert event["status"] == "timeout", event
    assert "queued provisioning" in event["message"] and "does not exist" in event["message"], event
