"""Operator extra links: the URLs, which task shows which link, and what the worker pushes for them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

import pytest

from nemo_rl_gke import links
from nemo_rl_gke.dag_factory import OPERATORS
from nemo_rl_gke.run import topology
from nemo_rl_gke.run.recipes import load_recipe
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.steps import final_step

SPEC = RunSpec(project="p-1", region="europe-west4", zone="europe-west4-b", cluster_name="c-1", lustre_name="l-1")
ALL = [*links.GCP_RESOURCE_LINKS, *links.WAIT_LINKS, *links.EXPORT_LINKS, *links.DELETE_KUBE_LINKS]


def test_console_urls_name_the_resource_the_spec_derives() -> None:
    assert links.gke_cluster_url(SPEC) == (
        "https://console.cloud.google.com/kubernetes/clusters/details/europe-west4/c-1/details?project=p-1"
    )
    assert links.node_pool_url(SPEC).endswith(f"/europe-west4/c-1/{SPEC.node_pool_name}?project=p-1")
    assert "/locations/europe-west4-b/instances/l-1/" in links.lustre_url(SPEC)
    query = unquote(links.job_logs_url(SPEC))
    assert 'resource.labels.cluster_name="c-1"' in query and f'"{SPEC.raycluster_name}"' in query
    assert (
        links.gcs_url("gs://b/d/run-1/step_10/")
        == "https://console.cloud.google.com/storage/browser/b/d/run-1/step_10/"
    )
    assert links.gcs_url("/data/x") == ""


def test_the_ray_dashboard_is_reached_through_the_api_server_proxy() -> None:
    proxied = {"dashboard": f"https://34.1.2.3{SPEC.dashboard_proxy_path}"}
    assert links.ray_dashboard_url(SPEC, proxied) == f"http://127.0.0.1:8001{SPEC.dashboard_proxy_path}/"
    assert links.ray_dashboard_url(SPEC, None) == f"http://127.0.0.1:8001{SPEC.dashboard_proxy_path}/"
    # A dashboard the deployment configured is linked directly.
    assert links.ray_dashboard_url(SPEC, {"dashboard": "https://ray.example.com"}) == "https://ray.example.com/"


def test_a_wandb_link_only_for_an_https_url() -> None:
    assert links.wandb_url({"wandb_url": "https://wandb.ai/t/p/runs/x"}) == "https://wandb.ai/t/p/runs/x"
    assert links.wandb_url({"wandb_url": "javascript:alert(1)"}) == links.wandb_url(None) == ""


def test_every_link_sits_on_the_operator_of_each_of_its_steps() -> None:
    for link in ALL:
        assert link.steps, link.name
        for step_id in link.steps:
            operator = OPERATORS[topology.step(step_id).op]
            assert link in operator.operator_extra_links, (link.name, step_id)
    assert len({link.xcom_key for link in ALL}) == len({type(link) for link in ALL})
    # The topology's makers each get theirs.
    wanted = {
        topology.GKE_CLUSTER,
        topology.NODE_POOL,
        topology.LUSTRE,
        topology.SUBMIT,
        topology.WAIT,
        topology.EXPORT,
        topology.DELETE_RAYCLUSTER,
    }
    assert set().union(*(link.steps for link in ALL)) == wanted


def test_each_task_declares_only_its_own_links() -> None:
    # Airflow writes one XCom per declared link at every try end and deferral: another step's link would be a write.
    for step_id, names in ((topology.NET, set()), (topology.GKE_CLUSTER, {"GKE cluster"}),
                           (topology.NODE_POOL, {"GPU node pool"})):  # fmt: skip
        operator = OPERATORS[topology.step(step_id).op](step=step_id)
        assert {link.name for link in operator.operator_extra_links} == names, step_id
    assert len(OPERATORS[topology.step(topology.NET).op].operator_extra_links) == 3  # the class keeps all of them


class _TI:
    def __init__(self, xcoms: dict[tuple[str | None, str], Any]) -> None:
        self.xcoms = xcoms
        self.pushed: dict[str, Any] = {}

    def xcom_pull(self, task_ids: str, key: str = topology.RETURN) -> Any:
        return self.xcoms.get((task_ids, key))

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def _context(ti: _TI) -> dict[str, Any]:
    return {"ti": ti, "dag": SimpleNamespace(dag_id="d"), "run_id": "manual__1"}


@pytest.mark.parametrize(
    "step_id", [topology.GKE_CLUSTER, topology.NET, topology.EXPORT, topology.WAIT, topology.DELETE_RAYCLUSTER]
)
def test_a_step_persists_its_own_links_when_it_starts(step_id: str) -> None:
    ti = _TI({(topology.VALIDATE, topology.RETURN): SPEC.to_conf()})
    operator = OPERATORS[topology.step(step_id).op](step=step_id)
    operator.persist_links(_context(ti))
    expected = {link.xcom_key for link in operator.operator_extra_links if step_id in link.steps}
    if step_id == topology.WAIT:
        expected.discard(links.WandbRunLink().xcom_key)  # known only once the job printed it
    assert set(ti.pushed) == expected
    if step_id == topology.GKE_CLUSTER:
        assert ti.pushed[links.GkeClusterLink().xcom_key] == links.gke_cluster_url(SPEC)
    if step_id == topology.EXPORT:
        uri = SPEC.export_uri("d", "manual__1", final_step(SPEC, load_recipe(SPEC.recipe)))
        assert ti.pushed[links.ExportedCheckpointLink().xcom_key] == links.gcs_url(uri)
    if step_id == topology.DELETE_RAYCLUSTER:
        uri = "gs://p-1-nemo-rl-checkpoints/nemo-rl-gke/ray-logs/d/manual__1/"
        assert (
            ti.pushed[links.RayLogsLink().xcom_key]
            == links.gcs_url(uri)
            == links.gcs_url(SPEC.ray_logs_uri("d", "manual__1"))
        )


def test_get_link_finishes_a_link_from_the_tasks_own_xcom(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.execution_time import xcom

    stored: dict[str, Any] = {
        links.WandbRunLink().xcom_key: None,
        topology.JOB_SUMMARY: {"wandb_url": "https://wandb.ai/t/p/runs/abc"},
        links.ExportedCheckpointLink().xcom_key: "https://early",
        topology.RETURN: {"uri": "gs://b/x/step_3/", "action": "exported"},
        links.GkeClusterLink().xcom_key: links.gke_cluster_url(SPEC),
    }
    monkeypatch.setattr(xcom.XCom, "get_value", lambda ti_key, key: stored.get(key))
    wait = OPERATORS[topology.step(topology.WAIT).op](step=topology.WAIT)
    export = OPERATORS[topology.step(topology.EXPORT).op](step=topology.EXPORT)
    cluster = OPERATORS[topology.step(topology.GKE_CLUSTER).op](step=topology.GKE_CLUSTER)
    net = OPERATORS[topology.step(topology.NET).op](step=topology.NET)
    key = object()
    assert links.WandbRunLink().get_link(wait, ti_key=key) == "https://wandb.ai/t/p/runs/abc"
    assert links.ExportedCheckpointLink().get_link(export, ti_key=key) == links.gcs_url("gs://b/x/step_3/")
    assert links.GkeClusterLink().get_link(cluster, ti_key=key) == links.gke_cluster_url(SPEC)
    # The same class on another step of its operator: empty, which the UI hides.
    assert links.GkeClusterLink().get_link(net, ti_key=key) == ""
    # The Ray logs: where they went once copied, nothing when no file was (a link to an empty folder misleads).
    delete = OPERATORS[topology.step(topology.DELETE_RAYCLUSTER).op](step=topology.DELETE_RAYCLUSTER)
    stored[links.RayLogsLink().xcom_key] = "https://early"
    stored[topology.RETURN] = {"action": "deleted", "ray_logs": {"uri": "gs://b/nemo-rl-gke/ray-logs/d/r/", "files": 3}}
    assert links.RayLogsLink().get_link(delete, ti_key=key) == links.gcs_url("gs://b/nemo-rl-gke/ray-logs/d/r/")
    stored[topology.RETURN] = {"action": "deleted", "ray_logs": {"uri": "gs://b/x/", "files": 0, "error": "gone"}}
    assert links.RayLogsLink().get_link(delete, ti_key=key) == ""
    stored[topology.RETURN] = None  # deferred: not finished yet
    assert links.RayLogsLink().get_link(delete, ti_key=key) == "https://early"
