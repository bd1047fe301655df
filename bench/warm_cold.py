"""Warm against cold provisioning of the real DAG on a real Airflow, measured side by side in one session.

One sandbox with its latency model (scaled by ``--scale``; 1.0 is the model as configured: cluster create 420 s,
node pool 300 s, Lustre 600 s) and the components ``airflow standalone`` runs (scheduler with the LocalExecutor,
triggerer, dag-processor, api-server) in a private temp AIRFLOW_HOME, everything on 127.0.0.1 only. The bench
triggers ``nemo_rl_grpo_gke`` twice over the REST API with the same conf, ``mode=apply, stop_after=kube,
teardown_policy=keep_cluster_and_storage``:

- run 1 is **cold**: it creates the networks, peering, Lustre, the cluster and its GPU pool, applies the RayCluster,
  then teardown deletes the RayCluster, takes the GPU pool to 0 nodes and keeps the rest warm under the group's lease;
- run 2 is **warm**: the same group, so it finds everything its own and creates nothing on Google's side.

For each run it prints the provisioning makespan (first start to last end among the network, storage, cluster and
kube tasks), the Google create operations the sandbox saw during the run, and the run report's GPU nodes left up;
then the ratio warm/cold (target <= 0.05). Exit status: 0 when the target is met and the warm run created nothing,
1 when not, 2 when the bench itself failed. Everything it starts is stopped and its temp dir removed on exit.

    .venv/bin/python bench/warm_cold.py [--scale 1.0] [--poll-interval 2.0] [--keep]

What the sandbox does not model: on GKE the warm run's RayCluster pods wait for the pool's autoscaler to bring GPU
nodes back from 0 (minutes, like any scale-up); here pods schedule at once, so the ratio counts Google's
provisioning API work and Airflow's own overhead, not node boot.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "plugins"))

from bench.airflow_components import (  # noqa: E402
    Airflow,
    BenchError,
    http_json,
    run_bench,
    start_airflow,
    wait_ready,
    xcom_value,
)
from bench.provision_makespan import SEED, run_dag, when  # noqa: E402
from sandbox.testing import start_sandbox  # noqa: E402

from nemo_rl_gke.run import topology as t  # noqa: E402

TARGET = 0.05
STAGES = (t.NETWORK, t.STORAGE, t.CLUSTER, t.KUBE)
PROVISIONING = frozenset(s.task_id for s in t.provisioning() if s.stage in STAGES)


def provisioning_window(tis: list[dict[str, Any]]) -> tuple[float, float]:
    """First start and last end among the run's network, storage, cluster and kube tasks (all must succeed)."""
    ours = [ti for ti in tis if ti["task_id"] in PROVISIONING]
    bad = {ti["task_id"]: ti["state"] for ti in ours if ti["state"] != "success" or not ti["end_date"]}
    if bad or len(ours) != len(PROVISIONING):
        raise BenchError(f"provisioning tasks did not all succeed: {bad or sorted(ti['task_id'] for ti in ours)}")
    return min(when(ti["start_date"]) for ti in ours), max(when(ti["end_date"]) for ti in ours)  # type: ignore[type-var]


def creates_between(operations: list[dict[str, Any]], start: float, end: float) -> list[str]:
    """The sandbox's create operations that started in ``[start, end]``, as ``kind target``."""
    return [
        f"{op['kind']} {op['target'].rsplit('/', 1)[-1]}"
        for op in operations
        if op["kind"].endswith((".insert", ".create")) and start <= float(op["start"]) <= end
    ]


def report_of(airflow: Airflow, run_id: str) -> dict[str, Any]:
    """The run report's JSON (the report task's return value)."""
    return xcom_value(airflow, run_id, t.RUN_REPORT)


def one_run(airflow: Airflow, sandbox_url: str, label: str, conf: dict[str, Any], timeout: float) -> float:
    """Run the DAG once, print its line, return its provisioning makespan."""
    run, tis = run_dag(airflow, conf, timeout)
    if run["state"] != "success":
        bad = {ti["task_id"]: ti["state"] for ti in tis if ti["state"] not in {"success", "skipped"}}
        raise BenchError(f"{label} run {run['dag_run_id']} failed; tasks not successful: {bad}")
    start, end = provisioning_window(tis)
    _, ops = http_json(f"{sandbox_url}/sandbox/operations")
    created = creates_between(ops["operations"], when(run["start_date"]) or start, end)  # type: ignore[arg-type]
    gpu = report_of(airflow, run["dag_run_id"])["gpu"]
    print(
        f"{label}: provisioning {end - start:.1f} s ({len(PROVISIONING)} tasks), run "
        f"{when(run['end_date']) - when(run['start_date']):.1f} s, {len(created)} Google create operation(s), "  # type: ignore[operator]
        f"GPU nodes left up {gpu['nodes_left_up']} (pool scaled to 0: {gpu['scaled_to_zero']})",
        flush=True,
    )
    for line in created:
        print(f"  created: {line}")
    if label == "warm" and created:
        raise BenchError(f"the warm run created {len(created)} resource(s): {created}")
    return end - start


def measure(scale: float, poll_interval: float, workdir: Path, running: dict[str, Any]) -> bool:
    """Start the sandbox and Airflow (recorded in ``running`` for the caller to stop), run cold then warm; pass?"""
    sandbox = running["sandbox"] = start_sandbox(workdir / "sandbox", latency_scale=scale, seed=SEED)
    print(f"sandbox {sandbox.url} (pid {sandbox.pid}, latency scale {scale})", flush=True)
    airflow = running["airflow"] = start_airflow(workdir, sandbox.url)
    wait_ready(airflow, 120.0)
    _, latency = http_json(f"{sandbox.url}/sandbox/latency")
    scaled = latency["scaled_seconds"]
    print(
        f"latency model x{scale}: cluster create {scaled['container.clusters.create']:.0f} s, node pool "
        f"{scaled['container.nodePools.create']:.0f} s, Lustre {scaled['lustre.instances.create']:.0f} s",
        flush=True,
    )
    conf = {
        "mode": "apply",
        "stop_after": t.KUBE,
        "teardown_policy": t.KEEP_WARM,
        "poll_interval_s": poll_interval,
    }
    # The cold critical path is about 1,000 s at scale 1 (NET, then Lustre's 600 s or the cluster and its pool).
    timeout = 300.0 + 1.5 * 1000.0 * scale
    cold = one_run(airflow, sandbox.url, "cold", conf, timeout)
    warm = one_run(airflow, sandbox.url, "warm", conf, timeout)
    ratio = warm / cold
    verdict = "OK" if ratio <= TARGET else "MISSED"
    print(f"warm/cold provisioning ratio {ratio:.4f} ({warm:.1f} s / {cold:.1f} s), target <= {TARGET}: {verdict}")
    return ratio <= TARGET


def main() -> int:
    """Run the bench; 0 when the ratio meets its target, 1 when it misses, 2 when the bench failed."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="sandbox latency scale (default 1.0: the model)")
    parser.add_argument("--poll-interval", type=float, default=2.0, help="the runs' poll_interval_s (default 2.0)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, Airflow home) for inspection")
    args = parser.parse_args()
    if args.scale <= 0:
        parser.error("--scale must be > 0: the bench measures against the latency model")
    return run_bench(
        "warm-cold-", args.keep, lambda workdir, running: measure(args.scale, args.poll_interval, workdir, running)
    )


if __name__ == "__main__":
    sys.exit(main())
