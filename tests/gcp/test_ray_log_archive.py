"""Teardown's copy of the Ray logs, against a real Ray head (and a real worker node) on the sandbox: a failed job's
driver, raylet and worker logs reach the export bucket through Ray's State API on the dashboard (the API server's
service proxy, with the Google and the Ray token), cut to their tail, indexed, the tokens blanked; the failure alert
links them; a retry after the delete keeps the first copy; and a copy that cannot reach Ray is recorded, not raised.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox.files import gcs_root
from sandbox.testing import SandboxProcess

from nemo_rl_gke.gcp.hooks import GcpHook
from nemo_rl_gke.kube.client import KubeHook, ObjectRef
from nemo_rl_gke.kube.objects import apply_objects, delete_objects, group_objects, lustre_ip
from nemo_rl_gke.observe.alert_messages import failure_alert
from nemo_rl_gke.plan.ray_job import JobRequest
from nemo_rl_gke.ray.hooks import RayJobsHook
from nemo_rl_gke.ray.log_archive import archive_before_delete
from nemo_rl_gke.run import topology as t
from nemo_rl_gke.run.console import gcs_url
from nemo_rl_gke.run.deployment import Deployment
from nemo_rl_gke.run.ray_logs import INDEX_NAME, LogCaps
from nemo_rl_gke.run.spec import RunSpec
from tests.gcp.conftest import FAST_RETRY, ZONE, ensure_cluster_with_gpu_pool, first_event, raycluster_trigger
from tests.owners import owner_of

pytestmark = pytest.mark.airflow
PROJECT = "raylogs-tests"
# One worker node: the head and a worker each have their own log directory, and each its own folder in the copy.
CONF = {"project": PROJECT, "region": "us-central1", "zone": ZONE, "recipe": "local-cpu-gsm8k", "worker_replicas": 1}
SECRET = "hf_s3cr3t-token-value-42"
JOB = "nemo-rl-raylogs-failed-1"
# A failing job: a marker, 4000 numbered lines (about 200 kB, over the per-file cap below), the token it was given
# (a job that prints its environment), then exit 1 with its last words.
FAILING = (
    "import os, sys\n"
    "print('marker: the driver ran', flush=True)\n"
    "for k in range(4000):\n"
    "    print(f'line {k:05d} ' + 'x' * 40, flush=True)\n"
    "print('token', os.environ['HF_TOKEN'], flush=True)\n"
    "raise SystemExit('the last words of a failed night')\n"
)
CAPS = LogCaps(per_file_bytes=64 * 1024, total_bytes=2 * 1024 * 1024, tail_lines=100_000, deadline_s=120)


@pytest.fixture(scope="module")
def hook(sandbox: SandboxProcess) -> Iterator[GcpHook]:
    """The module's hook on google_cloud_default -> the sandbox, with the project's export bucket seeded."""
    sandbox.seed_bucket(PROJECT)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", sandbox.connection_json(PROJECT))
        yield GcpHook(retry_policy=FAST_RETRY)


@pytest.fixture(scope="module")
def failed_run(hook: GcpHook) -> Iterator[tuple[RunSpec, list[dict[str, Any]]]]:
    """A ready RayCluster (its fluent-bit ConfigMap applied with it) on which the failing job ran and FAILED."""
    spec = RunSpec.from_conf(CONF)
    ensure_cluster_with_gpu_pool(spec, hook)
    kube = KubeHook(spec, hook)
    objects = [
        *group_objects(spec, t.LUSTRE_STORAGE, owner_of(spec), lustre_address=lustre_ip(spec, hook)),
        *group_objects(spec, t.RAYCLUSTER, owner_of(spec)),
    ]
    apply_objects(kube, objects, owner_of(spec), adopt=False)
    assert kube.get(ObjectRef("v1", "ConfigMap", spec.fluentbit_config_name, spec.namespace)) is not None
    assert asyncio.run(first_event(raycluster_trigger(spec)))["status"] == "success"
    ray = RayJobsHook.for_run(spec, hook, Deployment())
    entrypoint = f"python -c {shlex.quote(FAILING)}"
    ray.submit(JobRequest(JOB, entrypoint, {}, (), (), {"airflow_dag_id": "t"}), {"HF_TOKEN": SECRET})
    deadline = time.monotonic() + 60
    while (status := ray.status(JOB)) != "FAILED":
        assert time.monotonic() < deadline and status in ("PENDING", "RUNNING"), status
        time.sleep(0.2)
    yield spec, objects
    delete_objects(kube, objects, owner_of(spec))


def _objects(sandbox: SandboxProcess, uri: str) -> dict[str, Path]:
    """The archive's objects as the sandbox's bucket holds them, by name under ``uri``."""
    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    root = gcs_root(sandbox.state_dir) / bucket / prefix
    return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file()}


def test_a_failed_jobs_logs_are_copied_before_the_delete_and_the_alert_links_them(
    sandbox: SandboxProcess, hook: GcpHook, failed_run: tuple[RunSpec, list[dict[str, Any]]]
) -> None:
    spec, objects = failed_run
    kube = KubeHook(spec, hook)
    uri = spec.ray_logs_uri("nightly", "scheduled__2026-05-01T02:00:00+00:00")
    assert (
        uri == f"gs://{PROJECT}-nemo-rl-checkpoints/nemo-rl-gke/ray-logs/nightly/scheduled__2026-05-01T02-00-00-00-00/"
    )
    ray = RayJobsHook.for_run(spec, hook, Deployment())
    tokens = [v.removeprefix("Bearer ") for v in ray.headers.values()]
    assert len(tokens) == 2  # the Google token to the API server, the Ray token to Ray

    started = time.monotonic()
    summary = archive_before_delete(
        spec, hook, kube, owner_of(spec), Deployment(), uri=uri, secrets=[SECRET], caps=CAPS
    )
    took = time.monotonic() - started
    written = _objects(sandbox, uri)
    index = json.loads(written[INDEX_NAME].read_text())
    print(f"copied {summary['files']} files, {summary['bytes']} bytes in {took:.1f} s; index {written[INDEX_NAME]}")

    # Both nodes, each in its own folder; the job's driver log whole up to the cap, its tail kept.
    assert {n["folder"] for n in index["nodes"]} >= {"head"} and len(index["nodes"]) == 2, index["nodes"]
    folders = {name.split("/", 1)[0] for name in written if name != INDEX_NAME}
    assert "head" in folders and any(f.startswith("worker-") for f in folders), folders
    driver = f"head/job-driver-{JOB}.log"
    text = written[driver].read_text()
    assert "the last words of a failed night" in text and "line 03999" in text
    assert "marker: the driver ran" not in text  # cut: only the last 64 KiB are kept
    assert len(text.encode()) <= CAPS.per_file_bytes and text.startswith("line ")  # cut at a line's start
    row = next(f for f in index["files"] if f["node"] == "head" and f["file"] == f"job-driver-{JOB}.log")
    assert row["truncated"] and row["dropped_bytes"] > 100_000 and row["bytes"] == len(text.encode())
    assert any(name.startswith("head/raylet.") for name in written) and any(
        name.split("/", 1)[1].startswith("raylet.") for name in written if name.startswith("worker-")
    )
    # Bounded in all; every object has its row; nothing skipped below the total cap.
    assert index["total_bytes"] == summary["bytes"] <= CAPS.total_bytes
    assert {f["object"].removeprefix(uri.split("/", 3)[3]) for f in index["files"] if f["object"]} == set(written) - {
        INDEX_NAME
    }
    assert summary["files"] == len(written) - 1 and summary["truncated"] >= 1 and summary["errors"] == 0, summary
    # The job's token, the Google token and the Ray token are nowhere in what was written (the job printed its own).
    for path in written.values():
        content = path.read_text(errors="replace")
        assert SECRET not in content and not any(token in content for token in tokens), path
    assert "\ntoken ***\n" in text  # blanked, not dropped
    assert not any(token in json.dumps(summary) for token in [SECRET, *tokens])

    # The failure alert names them, with the console page, as it names everything else.
    alert = failure_alert("nightly", "r1", {t.WAIT: "failed"}, errors={t.WAIT: "job FAILED"}, ray_logs=summary)
    line = next(line for line in alert.text().splitlines() if line.startswith("Ray logs: "))
    assert uri in line and gcs_url(uri) in line and f"{summary['files']} file(s)" in line, line
    assert alert.payload()["ray_logs"]["uri"] == uri and alert.payload()["ray_logs"]["index"] == uri + INDEX_NAME

    # A retry after the RayCluster went finds no RayCluster: it reports the first copy, and leaves it as it was.
    delete_objects(kube, [o for o in objects if o["kind"] == "RayCluster"], owner_of(spec))
    before = written[INDEX_NAME].read_bytes()
    again = archive_before_delete(spec, hook, kube, owner_of(spec), Deployment(), uri=uri, caps=CAPS)
    assert again["earlier_try"] and again["files"] == summary["files"] and again["uri"] == uri, again
    assert written[INDEX_NAME].read_bytes() == before


def test_a_copy_that_cannot_reach_ray_is_recorded_not_raised(sandbox: SandboxProcess, hook: GcpHook) -> None:
    # No RayCluster in this project's cluster (and no cluster at all): nothing to copy, said so, nothing raised.
    spec = RunSpec.from_conf({**CONF, "project": "raylogs-none", "raycluster_name": "rc-none"})
    uri = spec.ray_logs_uri("d", "r")
    kube = KubeHook(spec, hook)
    summary = archive_before_delete(spec, hook, kube, owner_of(spec), Deployment(), uri=uri, caps=CAPS)
    assert summary["files"] == 0 and summary["copied"] is False and summary["errors"] == 1, summary
    alert = failure_alert("d", "r", {t.NET: "failed"}, ray_logs=summary)
    assert "Ray logs: not copied (" in alert.text()
