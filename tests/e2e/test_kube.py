"""The kube task group end to end on the sandbox: Kubernetes objects, a real Ray head behind the service proxy,
idempotent re-apply, and teardown that leaves no Ray process. A RayCluster that never gets ready is a trigger test
(tests/gcp/test_kube.py) and an operator test (tests/operators/test_gcp.py): a whole run would only add a teardown
that the failed-provisioning runs of tests/e2e/test_apply.py already prove.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sandbox.testing import SandboxProcess, pid_alive

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.ray.hooks import RayJobsHook
from nemo_rl_gke.ray.submit import RAY_TOKEN_HEADER
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.spec import RunSpec
from tests.e2e.harness import run_in_process

pytestmark = pytest.mark.airflow
# The names the harness's runs use (include/conf/local.json: the defaults) and its recipe, whose Ray has token auth.
SPEC = RunSpec.from_conf({"recipe": "local-cpu-gsm8k"})
KUBE_TASKS = [t.NCCL_INSTALLER, t.NETWORK_MAPPING, t.LUSTRE_STORAGE, t.RAYCLUSTER]


def _kube_results() -> dict[str, dict[str, Any]]:
    from sandbox.demo import latest_run

    xcom = latest_run("nemo_rl_grpo_gke")["xcom"]
    return {task: value for (task, key), value in xcom.items() if key == "return_value" and task in KUBE_TASKS}


def _ray_log_tail(heads: list[dict[str, Any]]) -> str:
    """What a head that is not ready said last: its problem and the end of its ``ray start`` log."""
    lines = [json.dumps(heads)]
    for head in heads:
        log = Path(head["log"]) if head.get("log") else None
        if log is not None and log.exists():
            lines += log.read_text(errors="replace").splitlines()[-40:]
    return "\n".join(lines)


def test_kube_group_brings_up_objects_and_a_real_ray_then_teardown_leaves_nothing(
    sandbox: SandboxProcess, dag: Any
) -> None:
    sandbox.reset()
    kept = run_in_process(dag, {"stop_after": t.KUBE, "teardown_policy": t.KEEP_ALL})
    assert kept.state == "success"
    assert all(kept.tasks[t] == "success" for t in KUBE_TASKS)
    first = _kube_results()
    assert {o["action"] for r in first.values() for o in r["objects"]} == {"created"}
    inventory = sandbox.full_inventory()
    assert len(inventory["kubernetes"]) >= 22  # 21 applied + the service account + KubeRay's pods and service
    heads = inventory["ray_heads"]
    assert len(heads) == 1 and heads[0]["ready"] and pid_alive(heads[0]["pid"]), _ray_log_tail(heads)

    # The dashboard, resolved the way later tasks resolve it: the API server's service proxy.
    ray = RayJobsHook.for_run(SPEC, GcpHook(), Deployment())
    address, headers = ray.address, ray.headers
    assert address.url.endswith("/api/v1/namespaces/default/services/ray-cluster-kuberay-head-svc:8265/proxy")
    # Over https, verified against the cluster's CA.
    assert address.url.startswith("https://127.0.0.1:") and address.ca_pem
    request = urllib.request.Request(address.url + "/api/version", headers=headers)
    context = ssl.create_default_context(cadata=address.ca_pem)
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        assert json.loads(response.read())["ray_version"] == "2.60.0"
    # The local recipe's Ray has token auth: without KubeRay's token, Ray itself refuses.
    others = {k: v for k, v in headers.items() if k != RAY_TOKEN_HEADER}
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(
            urllib.request.Request(address.url + "/api/version", headers=others), timeout=30, context=context
        )
    assert refused.value.code == 401

    # A second run re-applies every object and changes nothing (same objects, same resourceVersions), then its
    # teardown deletes everything and stops that Ray.
    before = {
        (f"{i['kind']} {i['namespace'] + '/' if i['namespace'] else ''}{i['name']}", i["resourceVersion"])
        for i in sandbox.full_inventory()["kubernetes"]
    }
    again = run_in_process(dag, {"stop_after": t.KUBE, "teardown_policy": t.DELETE_ALL})
    assert again.state == "success"
    second = _kube_results()
    assert {o["action"] for r in second.values() for o in r["objects"]} == {"unchanged"}
    assert {(o["object"], o["resourceVersion"]) for r in second.values() for o in r["objects"]} <= before
    assert again.tasks[t.DELETE_RAYCLUSTER] == "success"
    after = sandbox.full_inventory()
    assert after["resources"] == [] and after["kubernetes"] == [] and after["ray_heads"] == []
    assert not pid_alive(heads[0]["pid"])
    # Both runs' Google, Kubernetes and service-proxy calls all carried a valid token the sandbox issued.
    logged = sandbox.calls()
    assert {c["auth"] for c in logged} == {"valid"}, sandbox.unauthenticated_calls()[:5]
    assert any(c["service"] == "kubernetes" and "/proxy" in c["path"] for c in logged)
