"""An operator's real ``kubectl`` against a sandbox GKE cluster holding a run's objects (issue #37).

The kubeconfig is written as ``gcloud container clusters get-credentials`` writes it (``python -m sandbox
get-credentials``: the cluster's endpoint and CA from ``clusters.get``, an exec plugin for the token), and every
command is the one an operator types. The tests run in file order on one cluster: the first applies the run's
manifests with ``kubectl apply --server-side``, the ones after it inspect what that started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.gcp.resources import resources
from nemo_rl_gke.kube.objects import GROUPS, group_objects, lustre_ip
from nemo_rl_gke.run.ownership import reader
from nemo_rl_gke.run.spec import RunSpec
from nemo_rl_gke.run.topology import GKE_CLUSTER
from tests.gcp.conftest import FAST_RETRY, ZONE, ensure_cluster_with_gpu_pool
from tests.owners import owner_of

pytestmark = pytest.mark.airflow
REPO = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


@dataclass(frozen=True)
class Operator:
    """kubectl with the sandbox cluster's kubeconfig, and the run it looks at."""

    spec: RunSpec
    kubeconfig: Path
    workdir: Path
    cluster: dict[str, Any]

    def run(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """``kubectl ARGS`` as an operator runs it; fails the test with kubectl's output when ``check`` and it fails."""
        done = subprocess.run(
            [KUBECTL, *args],
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if check and done.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def manifest(self, name: str, objects: list[dict[str, Any]]) -> str:
        """Write ``objects`` as one multi-document YAML file; its path."""
        path = self.workdir / name
        path.write_text(yaml.safe_dump_all(objects, sort_keys=False), encoding="utf-8")
        return str(path)


@pytest.fixture(scope="module")
def operator(sandbox: SandboxProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """A running cluster of the tutorial's run and a kubeconfig for it."""
    if not Path(KUBECTL).exists():
        pytest.fail("kubectl is not installed: `make test` installs it (make kubectl)")
    workdir = tmp_path_factory.mktemp("kubectl")
    project = f"kubectl-{os.getpid() % 100000}"
    saved = os.environ.get("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT")
    os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = sandbox.connection_json(project)
    try:
        spec = RunSpec.from_conf({"project": project, "region": "us-central1", "zone": ZONE})
        hook = GcpHook(retry_policy=FAST_RETRY)
        ensure_cluster_with_gpu_pool(spec, hook)
        cluster = resources(spec, reader())[GKE_CLUSTER].get(hook)
        assert cluster is not None
        key, kubeconfig = workdir / "key.json", workdir / "kubeconfig"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cli = [sys.executable, "-m", "sandbox"]
        subprocess.run([*cli, "credentials", "--url", sandbox.url, "--out", str(key)], env=env, check=True)
        where = ["--location", spec.region, "--project", project, "--url", sandbox.url]
        login = subprocess.run(
            [*cli, "get-credentials", spec.cluster_name, *where, "--key", str(key), "--kubeconfig", str(kubeconfig)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert f"kubeconfig entry generated for {spec.cluster_name}." in login.stderr
        objects = [
            o
            for group in GROUPS
            for o in group_objects(spec, group, owner_of(spec), lustre_address=lustre_ip(spec, hook))
        ]
        operator = Operator(spec, kubeconfig, workdir, cluster)
        operator.manifest("run.yaml", objects)
        yield operator
        operator.run("delete", "--ignore-not-found", "--wait=false", "-f", str(workdir / "run.yaml"), check=False)
    finally:
        if saved is None:
            os.environ.pop("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", None)
        else:
            os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = saved


def _configmap(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": data}


def test_the_kubeconfig_is_gclouds_and_holds_no_token(operator: Operator) -> None:
    config = yaml.safe_load(operator.kubeconfig.read_text(encoding="utf-8"))
    name = f"gke_{operator.spec.project}_{operator.spec.region}_{operator.spec.cluster_name}"
    assert config["current-context"] == name
    assert config["clusters"][0]["cluster"]["server"] == "https://" + operator.cluster["endpoint"]
    assert (
        config["clusters"][0]["cluster"]["certificate-authority-data"]
        == (operator.cluster["masterAuth"]["clusterCaCertificate"])
    )
    assert "token" not in config["users"][0]["user"] and "ya29." not in operator.kubeconfig.read_text(encoding="utf-8")


def test_version_namespaces_by_short_name_and_api_resources(operator: Operator) -> None:
    version = json.loads(operator.run("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v" + operator.cluster["currentMasterVersion"]
    out = operator.run("get", "ns").stdout.splitlines()
    assert out[0].split() == ["NAME", "STATUS", "AGE"]
    assert {line.split()[0] for line in out[1:]} >= {"default", "kube-system", "kube-public"}
    assert all(line.split()[1] == "Active" for line in out[1:])
    resources = operator.run("api-resources", "--no-headers").stdout.splitlines()
    rows = {line.split()[0]: line.split() for line in resources}
    assert rows["nodes"][1] == "no" and rows["rayclusters"][1:3] == ["ray.io/v1", "true"]
    assert rows["selfsubjectaccessreviews"][1] == "authorization.k8s.io/v1"


def test_every_manifest_the_run_applies_goes_in_with_apply_server_side(operator: Operator) -> None:
    done = operator.run("apply", "--server-side", "-f", str(operator.workdir / "run.yaml"))
    applied = [line for line in done.stdout.splitlines() if line.strip()]
    objects = list(yaml.safe_load_all((operator.workdir / "run.yaml").read_text(encoding="utf-8")))
    assert len(applied) == len(objects) and all(line.endswith("serverside-applied") for line in applied), done.stdout
    # Applied again, nothing changes: the same lines, and the RayCluster keeps its generation.
    again = operator.run("apply", "--server-side", "-f", str(operator.workdir / "run.yaml"))
    assert again.stdout.splitlines() == done.stdout.splitlines()
    name = operator.spec.raycluster_name
    rc = json.loads(operator.run("get", "raycluster", name, "-o", "json", "--show-managed-fields").stdout)
    assert rc["metadata"]["generation"] == 1
    assert [m["manager"] for m in rc["metadata"]["managedFields"]] == ["kubectl"]


def test_explain_reads_the_crds_schema(operator: Operator) -> None:
    out = operator.run("explain", "raycluster.spec").stdout
    assert "GROUP:      ray.io" in out and "headGroupSpec" in out and "workerGroupSpecs" in out
    assert "containers" in operator.run("explain", "pods.spec").stdout


def test_wait_for_the_rayclusters_condition_then_its_printer_columns(operator: Operator) -> None:
    name = operator.spec.raycluster_name
    done = operator.run("wait", "--for=condition=HeadPodReady", f"raycluster/{name}", "--timeout=150s")
    assert done.stdout.strip() == f"raycluster.ray.io/{name} condition met"
    operator.run("wait", "--for=condition=RayClusterProvisioned", f"raycluster/{name}", "--timeout=150s")
    header, row = operator.run("get", "rayclusters").stdout.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "DESIRED",
        "WORKERS",
        "AVAILABLE",
        "WORKERS",
        "CPUS",
        "MEMORY",
        "GPUS",
        "STATUS",
        "AGE",
    ]
    assert row.split()[0] == name and "ready" in row.split()


def test_wait_sees_a_change_made_while_it_watches(operator: Operator, sandbox: SandboxProcess) -> None:
    operator.run("create", "configmap", "watched", "--from-literal=phase=pending")
    since = sandbox.calls()[-1]["seq"]
    waiting = subprocess.Popen(
        [KUBECTL, "wait", "--for=jsonpath={.data.phase}=done", "configmap/watched", "--timeout=120s"],
        env={**os.environ, "KUBECONFIG": str(operator.kubeconfig)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Patched only once kubectl is watching: the condition can only be met through the watch stream.
        deadline = time.monotonic() + 60
        while not any("watch=" in c["query"] and "/configmaps" in c["path"] for c in sandbox.calls(since)):
            assert time.monotonic() < deadline and waiting.poll() is None, waiting.communicate()
            time.sleep(0.2)
        operator.run("patch", "configmap", "watched", "--type=merge", "-p", '{"data":{"phase":"done"}}')
        out, err = waiting.communicate(timeout=120)
    finally:
        waiting.kill()
    assert waiting.returncode == 0 and out.strip() == "configmap/watched condition met", err


def test_pods_by_set_based_selector_with_ready_and_status(operator: Operator) -> None:
    name = operator.spec.raycluster_name
    out = operator.run("get", "pods", "-l", f"ray.io/cluster={name},ray.io/node-type!=head").stdout.splitlines()
    assert out[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert len(out) - 1 == operator.spec.worker_replicas
    assert all("worker" in line and "Running" in line for line in out[1:]), out
    heads = operator.run("get", "pods", "-l", f"ray.io/cluster={name},ray.io/node-type in (head)", "-o", "name")
    assert len(heads.stdout.split()) == 1


def test_logs_of_the_head_and_a_worker_by_container(operator: Operator) -> None:
    cluster = operator.spec.raycluster_name
    head = operator.run("get", "pods", "-l", f"ray.io/cluster={cluster},ray.io/node-type=head", "-o", "name")
    head_pod = head.stdout.strip().removeprefix("pod/")
    done = operator.run("logs", f"pod/{head_pod}", "--tail=200")
    assert 'Defaulted container "ray-head" out of: ray-head, fluent-bit' in done.stderr
    assert "Ray runtime started" in done.stdout
    assert operator.run("logs", head_pod, "-c", "ray-head", "--tail=1").stdout.count("\n") <= 1
    # The fluent-bit sidecar runs no process here: an empty log, not an error.
    assert operator.run("logs", head_pod, "-c", "fluent-bit").stdout == ""
    refused = operator.run("logs", head_pod, "-c", "nope", check=False)
    assert refused.returncode == 1 and f"container nope is not valid for pod {head_pod}" in refused.stderr
    worker = operator.run("get", "pods", "-l", f"ray.io/cluster={cluster},ray.io/node-type=worker", "-o", "name")
    first = worker.stdout.split()[0]
    assert "Ray runtime started" in operator.run("logs", first, "-c", "ray-worker").stdout


def test_nodes_show_the_gpu_pool_as_on_gke(operator: Operator) -> None:
    nodes = json.loads(operator.run("get", "nodes", "-o", "json").stdout)["items"]
    gpu = [n for n in nodes if n["metadata"]["labels"].get("cloud.google.com/gke-accelerator")]
    assert gpu and all(int(n["status"]["allocatable"]["nvidia.com/gpu"]) > 0 for n in gpu)
    out = operator.run("get", "nodes", "-L", "cloud.google.com/gke-nodepool").stdout.splitlines()
    assert out[0].split()[:5] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert any(operator.spec.node_pool_name in line and "Ready" in line for line in out[1:]), out
    # Each worker pod is on a GPU node, the head on a node without GPUs, as the pods' NODE column says.
    wide = operator.run("get", "pods", "-o", "wide", "-l", f"ray.io/cluster={operator.spec.raycluster_name}")
    on = {line.split()[0]: line.split()[6] for line in wide.stdout.splitlines()[1:]}
    gpu_nodes = {n["metadata"]["name"] for n in gpu}
    assert all((node in gpu_nodes) == ("-worker-" in pod) for pod, node in on.items()), (on, gpu_nodes)
    # The nodes are the node pools': read-only through the Kubernetes API.
    refused = operator.run("delete", "node", gpu[0]["metadata"]["name"], check=False)
    assert refused.returncode == 1 and "MethodNotAllowed" in refused.stderr, refused.stderr


def test_auth_can_i_for_the_runs_identity(operator: Operator) -> None:
    assert operator.run("auth", "can-i", "create", "rayclusters.ray.io").stdout.strip() == "yes"
    assert operator.run("auth", "can-i", "delete", "pods", "-n", "kube-system").stdout.strip() == "yes"


def test_a_server_side_dry_run_stores_nothing(operator: Operator) -> None:
    path = operator.manifest("dry.yaml", [_configmap("dry-run-only", a="1")])
    done = operator.run("apply", "--server-side", "--dry-run=server", "-f", path)
    assert done.stdout.strip() == "configmap/dry-run-only serverside-applied (server dry run)"
    missing = operator.run("get", "configmap", "dry-run-only", check=False)
    assert missing.returncode == 1 and 'configmaps "dry-run-only" not found' in missing.stderr


def test_an_unknown_field_is_refused_by_a_strict_create_and_by_a_server_side_apply(operator: Operator) -> None:
    bad = _configmap("misspelt", a="1")
    bad["dataa"] = {"b": "2"}
    path = operator.manifest("bad.yaml", [bad])
    # kubectl's default --validate=strict asks the server for fieldValidation=Strict.
    created = operator.run("create", "-f", path, check=False)
    assert created.returncode == 1 and 'strict decoding error: unknown field "dataa"' in created.stderr, created.stderr
    # Server-side apply refuses a field the schema does not declare whatever fieldValidation says.
    applied = operator.run("apply", "--server-side", "-f", path, check=False)
    assert applied.returncode == 1 and ".dataa: field not declared in schema" in applied.stderr, applied.stderr
    assert operator.run("get", "configmap", "misspelt", check=False).returncode == 1
    # With --validate=warn the object is stored without the field, and kubectl prints the server's warning.
    warned = operator.run("create", "--validate=warn", "-f", path)
    assert 'Warning: unknown field "dataa"' in warned.stderr
    assert "dataa" not in operator.run("get", "configmap", "misspelt", "-o", "json").stdout


def test_an_apply_over_another_managers_field_conflicts_unless_forced(operator: Operator) -> None:
    operator.run(
        "apply",
        "--server-side",
        "--field-manager=nightly",
        "-f",
        operator.manifest("a.yaml", [_configmap("owned", a="1")]),
    )
    path = operator.manifest("b.yaml", [_configmap("owned", a="2")])
    done = operator.run("apply", "--server-side", "--field-manager=operator", "-f", path, check=False)
    assert done.returncode == 1 and 'conflict with "nightly"' in done.stderr and ".data.a" in done.stderr, done.stderr
    operator.run("apply", "--server-side", "--field-manager=operator", "--force-conflicts", "-f", path)
    cm = json.loads(operator.run("get", "configmap", "owned", "-o", "json").stdout)
    assert cm["data"] == {"a": "2"}


def test_patch_label_annotate_and_a_client_side_apply(operator: Operator) -> None:
    path = operator.manifest("c.yaml", [_configmap("edited", a="1")])
    assert operator.run("apply", "-f", path).stdout.strip() == "configmap/edited created"
    operator.run("label", "configmap", "edited", "team=rl")
    operator.run("annotate", "configmap", "edited", "note=nightly")
    operator.run("patch", "configmap", "edited", "--type=merge", "-p", '{"data":{"b":"2"}}')
    operator.run("patch", "configmap", "edited", "--type=json", "-p", '[{"op":"replace","path":"/data/a","value":"3"}]')
    cm = json.loads(operator.run("get", "configmap", "edited", "-o", "json").stdout)
    assert cm["data"] == {"a": "3", "b": "2"}
    assert cm["metadata"]["labels"] == {"team": "rl"} and cm["metadata"]["annotations"]["note"] == "nightly"
    # A second client-side apply patches: strategic merge for a built-in kind, merge patch for a custom resource
    # (the OpenAPI document lists no strategic merge for it, as the real one).
    assert operator.run("apply", "-f", operator.manifest("c2.yaml", [_configmap("edited", a="4")])).stdout.strip() == (
        "configmap/edited configured"
    )
    network = {
        "apiVersion": "networking.gke.io/v1",
        "kind": "GKENetworkParamSet",
        "metadata": {"name": "by-hand"},
        "spec": {"vpc": "vpc-a", "vpcSubnet": "subnet-a", "deviceMode": "NetDevice"},
    }
    assert operator.run("apply", "-f", operator.manifest("n1.yaml", [network])).returncode == 0
    network["spec"]["vpc"] = "vpc-b"
    done = operator.run("apply", "-f", operator.manifest("n2.yaml", [network]))
    assert done.stdout.strip() == "gkenetworkparamset.networking.gke.io/by-hand configured"
    refused = operator.run(
        "patch", "raycluster", operator.spec.raycluster_name, "--type=strategic", "-p", '{"spec":{}}', check=False
    )
    assert refused.returncode == 1, refused.stderr
    assert "application/strategic-merge-patch+json is not supported by ray.io/v1, Kind=RayCluster" in refused.stderr
