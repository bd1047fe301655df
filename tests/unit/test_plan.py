"""The plan: order of requests, stages, manifests, the Ray job with secrets redacted, and the teardown order."""

from __future__ import annotations

import difflib
import json
import os

import pytest

from nemo_rl_gke.plan.build import SHARED_WHEN, build_plan
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.conf_schema import CAPACITIES, RESERVATION_CAPACITY
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.spec import RunSpec
from tests.paths import ROOT


@pytest.fixture(scope="module")
def plan():
    return build_plan(RunSpec(), dag_id="nemo_rl_grpo_gke", run_id="manual__2026-11-30T00:00:00+00:00")


def test_requests_come_in_dependency_order(plan) -> None:
    order = [(p.stage, p.request.method, p.request.resource) for p in plan.requests]
    assert order[0] == ("network", "networks.insert", "network nemo-rl-net")
    stages = [s for s, _, _ in order]
    # network first, then the storage chain, then the cluster chain (they run side by side in the DAG)
    assert stages == sorted(stages, key=["network", "storage", "cluster"].index)
    storage = [m for s, m, _ in order if s == "storage"]
    assert storage == [
        "globalAddresses.insert",
        "projects.get",
        "services.connections.list",
        "services.connections.create",
        "services.connections.patch",  # instead of the create, when another run group's connection exists
        "firewalls.insert",
        "projects.locations.instances.create",
    ]
    assert [p.when for p in plan.requests if p.when] == [SHARED_WHEN]
    cluster = [m for s, m, _ in order if s == "cluster"]
    assert cluster == ["projects.locations.clusters.create", "projects.locations.clusters.nodePools.create"]
    assert sum(m == "subnetworks.insert" for _, m, _ in order) == 9


def test_manifests_are_listed_in_apply_order(plan) -> None:
    kinds = [m.kind for m in plan.manifests]
    assert kinds[0] == "DaemonSet"
    assert kinds.count("Network") == kinds.count("GKENetworkParamSet") == 9
    assert kinds[-5:] == ["PersistentVolume", "PersistentVolumeClaim", "ServiceAccount", "ConfigMap", "RayCluster"]


def test_ray_job_has_its_submission_id_and_secret_references_only(plan) -> None:
    job = plan.job.to_dict()
    assert job["submission_id"] == RunSpec().submission_id("nemo_rl_grpo_gke", "manual__2026-11-30T00:00:00+00:00")
    env = job["runtime_env"]["env_vars"]
    assert env["HF_TOKEN"] == "<redacted: password of Airflow connection 'huggingface_default'>"
    assert env["WANDB_API_KEY"] == "<redacted: password of Airflow connection 'wandb_default'>"
    assert "examples/run_grpo_math.py" in job["entrypoint"]
    assert job["metadata"]["recipe"] == "gemma3-27b-gsm8k-v0.5.0"


def test_wandb_key_is_not_requested_without_wandb() -> None:
    plan = build_plan(RunSpec.from_conf({"wandb_enabled": False}))
    assert [s.name for s in plan.job.secrets] == ["HF_TOKEN"]


def test_teardown_order_and_policy(plan) -> None:
    tasks = list(dict.fromkeys(t.task_id for t in plan.teardown))
    # The topology's teardown order: RayCluster, other objects, Lustre, peering, range, cluster, networks last.
    assert tasks == [s.task_id for s in topology.teardown_steps() if s.deletes]
    assert tasks[:3] == [topology.DELETE_RAYCLUSTER, topology.DELETE_KUBE_OBJECTS, topology.DELETE_LUSTRE]
    assert all(t.performed for t in plan.teardown)
    assert plan.teardown[0].target == "RayCluster default/ray-cluster-kuberay"
    networks = [t.target for t in plan.teardown if t.task_id in (topology.DELETE_GVNIC_FW, topology.DELETE_NET)]
    assert "firewalls/nemo-rl-gvnic-internal" in networks[0]
    assert networks[-1].startswith("/compute/v1/projects/nemo-rl-demo/global/networks/nemo-rl-net ")
    assert plan.teardown[-1].task_id == topology.DELETE_NET
    lustre = next(t for t in plan.teardown if t.task_id == topology.DELETE_LUSTRE)
    assert "only after the checkpoint export to gs://nemo-rl-demo-nemo-rl-checkpoints succeeded" in lustre.note


def test_lustre_traffic_is_allowed_on_the_main_network_and_the_rule_goes_before_it(plan) -> None:
    # Google's GKE Managed Lustre guide: tcp 988 and 6988 from the peering range, on the network Lustre peers with.
    [rule] = [p.request for p in plan.requests if p.request.resource == "firewall nemo-rl-lustre-fw"]
    assert rule.body["network"].endswith("/global/networks/nemo-rl-net")
    assert rule.body["allowed"] == [{"IPProtocol": "tcp", "ports": ["988", "6988"]}]
    assert rule.body["sourceRanges"] == ["<PEERING_RANGE_CIDR>"]  # Google picks the range's address at create
    fixed = build_plan(RunSpec.from_conf({"peering_range_address": "10.90.0.0"}))
    [rule] = [p.request for p in fixed.requests if p.request.resource == "firewall nemo-rl-lustre-fw"]
    assert rule.body["sourceRanges"] == ["10.90.0.0/20"]
    tasks = [t.task_id for t in plan.teardown]
    order = [topology.DELETE_LUSTRE, topology.DELETE_LUSTRE_FW, topology.DELETE_NET]
    assert [tasks.index(task) for task in order] == sorted(tasks.index(task) for task in order)
    [delete] = [t for t in plan.teardown if t.task_id == topology.DELETE_LUSTRE_FW]
    assert delete.target.startswith("/compute/v1/projects/nemo-rl-demo/global/firewalls/nemo-rl-lustre-fw ")


@pytest.mark.parametrize(
    ("policy", "deleted"),
    [(topology.KEEP_WARM, {topology.DELETE_RAYCLUSTER}), (topology.KEEP_ALL, set())],
)
def test_keep_policies_keep_everything_else(policy: str, deleted: set[str]) -> None:
    plan = build_plan(RunSpec.from_conf({"teardown_policy": policy}))
    assert {t.task_id for t in plan.teardown if t.performed} == deleted


def test_json_and_text_forms(plan) -> None:
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["conf"] == RunSpec().to_conf()
    assert len(data["gcp_requests"]) == len(plan.requests)
    assert data["manifests"][-1]["object"]["kind"] == "RayCluster"
    text = plan.to_text()
    for heading in ("1. Google Cloud requests", "2. Kubernetes objects", "3. Ray job", "4. Secrets", "5. Teardown"):
        assert heading in text
    assert "Nothing has been created" in text


def test_nothing_in_the_plan_carries_a_token_value() -> None:
    # The plan is built from the spec alone: no connection is read, so no secret value can reach it.
    spec = RunSpec.from_conf({"hf_conn_id": "hf_conn", "wandb_conn_id": "wb_conn"})
    deployment = Deployment(hf_conn_ids=("huggingface_default", "hf_conn"), wandb_conn_ids=("wb_conn",))
    plan = build_plan(spec, deployment=deployment)
    blob = json.dumps(plan.to_dict()) + plan.to_text()
    assert "password of Airflow connection 'hf_conn'" in blob
    assert "hf_" + "abc" not in blob


def test_the_plan_names_the_deployments_connections_and_refuses_others() -> None:
    # '' picks the deployment's first allowed connection; a conf naming any other cannot even be planned.
    spec = RunSpec.from_conf({"hf_conn_id": "", "wandb_conn_id": ""})
    deployment = Deployment(hf_conn_ids=("hf_prod", "hf_dev"), wandb_conn_ids=("wandb_team",))
    secrets = {s.name: s.conn_id for s in build_plan(spec, deployment=deployment).job.secrets}
    assert secrets == {"HF_TOKEN": "hf_prod", "WANDB_API_KEY": "wandb_team"}
    with pytest.raises(ValueError, match="allows only hf_prod, hf_dev"):
        build_plan(RunSpec.from_conf({"hf_conn_id": "huggingface_default"}), deployment=deployment)


GOLDEN = ROOT / "tests/fixtures/golden"


@pytest.mark.parametrize("form", ["txt", "json"])
def test_the_tutorial_plan_is_byte_for_byte_the_golden_one(form: str) -> None:
    # Refactors must not change what a run sends. A deliberate change: UPDATE_GOLDEN=1 rewrites the golden files;
    # review their diff in the commit.
    conf = json.loads((ROOT / "include/conf/tutorial.json").read_text())
    plan = build_plan(RunSpec.from_conf(conf))
    rendered = plan.to_text() if form == "txt" else json.dumps(plan.to_dict(), indent=2) + "\n"
    path = GOLDEN / f"plan-tutorial.{form}"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(rendered)
    golden = path.read_text()
    assert rendered == golden, "".join(
        difflib.unified_diff(golden.splitlines(True), rendered.splitlines(True), "golden", "now", n=1)
    )[:4000]


@pytest.mark.parametrize("capacity", [c for c in CAPACITIES if c != RESERVATION_CAPACITY])
def test_each_capacity_s_node_pool_is_the_golden_one(capacity: str) -> None:
    # The tutorial's plan with the GPU nodes from elsewhere: only the node pool request differs (its golden file),
    # and every other request is the reservation plan's.
    conf = json.loads((ROOT / "include/conf/tutorial.json").read_text())
    reserved = build_plan(RunSpec.from_conf(conf)).to_dict()
    other = build_plan(RunSpec.from_conf({**conf, "capacity": capacity, "flex_start_max_hours": 20})).to_dict()
    pool = [r for r in other["gcp_requests"] if r["method"] == "projects.locations.clusters.nodePools.create"]
    rendered = json.dumps(pool, indent=2) + "\n"
    path = GOLDEN / f"node-pool-{capacity}.json"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(rendered)
    assert rendered == path.read_text()
    unchanged = [r for r in reserved["gcp_requests"] if r["method"] != "projects.locations.clusters.nodePools.create"]
    assert [r for r in other["gcp_requests"] if r not in pool] == unchanged
