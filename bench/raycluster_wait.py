"""Requests one RayCluster wait sends to the cluster's API: polling every interval versus watching between reads.

One sandbox and one GKE cluster; the tutorial's RayCluster (head and two GPU workers, real local Ray) applied and
waited for ``ready`` by the package's own trigger, ``--rounds`` times per mode, alternating: ``poll`` is the trigger
with its watch switched off (a read every ``--poll-interval``), ``watch`` is the trigger as it ships (a read, then
a watch from that version until the RayCluster changes). It prints, per mode, the requests on the RayCluster's path
per wait and per minute of waiting, and the ratio watch / poll measured side by side (target <= 0.5: the watch
must at least halve what a wait costs the API server). Exit 0 when it holds, 1 when it misses, 2 when the bench
failed.

    .venv/bin/python bench/raycluster_wait.py [--rounds 2] [--poll-interval 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins"))

from sandbox.testing import SandboxProcess, start_sandbox  # noqa: E402
from tests.gcp.conftest import FAST_RETRY, ZONE, ensure_cluster_with_gpu_pool  # noqa: E402
from tests.owners import owner_of  # noqa: E402

from nemo_rl_gke.gcp.hooks import GcpHook  # noqa: E402
from nemo_rl_gke.kube.client import KubeHook  # noqa: E402
from nemo_rl_gke.kube.objects import apply_objects, delete_objects, group_objects, lustre_ip  # noqa: E402
from nemo_rl_gke.run import topology as t  # noqa: E402
from nemo_rl_gke.run.spec import RunSpec  # noqa: E402
from nemo_rl_gke.triggers.raycluster import RayClusterTrigger  # noqa: E402

TARGET = 0.5


async def _wait(spec: RunSpec, wait_for: str, poll_interval: float, *, watch: bool) -> dict[str, Any]:
    trigger = RayClusterTrigger(
        cluster_path=spec.cluster_path,
        namespace=spec.namespace,
        name=spec.raycluster_name,
        wait_for=wait_for,
        poll_interval=poll_interval,
        timeout=600,
    )
    trigger._watching = watch
    async for event in trigger.run():
        return dict(event.payload)
    raise RuntimeError("the trigger ended without an event")


def one_wait(
    sandbox: SandboxProcess, spec: RunSpec, kube: KubeHook, poll_interval: float, *, watch: bool
) -> dict[str, Any]:
    """Apply the RayCluster, wait for it to be ready, count the requests of that wait; then delete it."""
    objects = group_objects(spec, t.RAYCLUSTER, owner_of(spec))
    apply_objects(kube, objects, owner_of(spec), adopt=False)
    since = sandbox.calls()[-1]["seq"]
    started = time.monotonic()
    event = asyncio.run(_wait(spec, "ready", poll_interval, watch=watch))
    waited = time.monotonic() - started
    path = f"/namespaces/{spec.namespace}/rayclusters"
    calls = [c for c in sandbox.calls(since) if path in c["path"]]
    delete_objects(kube, objects, owner_of(spec))
    asyncio.run(_wait(spec, "deleted", poll_interval, watch=True))
    if event["status"] != "success":
        raise RuntimeError(f"the wait ended {event}")
    return {"requests": len(calls), "watches": sum("watch=true" in c["query"] for c in calls), "waited_s": waited}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--poll-interval", type=float, default=1.0, help="the conf's poll_interval_s (local: 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir, start_sandbox(Path(workdir), latency_scale=0.01) as sandbox:
        project = "bench-rc-wait"
        os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = sandbox.connection_json(project)
        spec = RunSpec.from_conf({"project": project, "region": "us-central1", "zone": ZONE})
        hook = GcpHook(retry_policy=FAST_RETRY)
        ensure_cluster_with_gpu_pool(spec, hook)
        kube = KubeHook(spec, hook)
        # The head mounts the Lustre claim: its volume and claim stay for every round.
        storage = group_objects(spec, t.LUSTRE_STORAGE, owner_of(spec), lustre_address=lustre_ip(spec, hook))
        apply_objects(kube, storage, owner_of(spec), adopt=False)
        totals: dict[str, dict[str, float]] = {
            m: {"requests": 0, "waited_s": 0.0, "watches": 0} for m in ("poll", "watch")
        }
        for _ in range(args.rounds):
            for mode in ("poll", "watch"):
                result = one_wait(sandbox, spec, kube, args.poll_interval, watch=mode == "watch")
                for key, value in result.items():
                    totals[mode][key] += value
                requests, watches, waited = result["requests"], result["watches"], result["waited_s"]
                print(f"{mode:6} {requests:4d} requests ({watches} watches) in {waited:.1f} s")
    rate = {m: totals[m]["requests"] / max(totals[m]["waited_s"] / 60, 1e-9) for m in totals}
    for mode, total in totals.items():
        per_wait = total["requests"] / args.rounds
        print(f"{mode:6} {per_wait:6.1f} requests per wait, {rate[mode]:6.1f} per minute of waiting")
    ratio = rate["watch"] / rate["poll"]
    verdict = "ok" if ratio <= TARGET else "MISSED"
    print(f"watch / poll requests per minute of waiting: {ratio:.3f} (target <= {TARGET}) {verdict}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:
        print(f"the bench failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(2)
